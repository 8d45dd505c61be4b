"""Token-count batching with length bucketing (Vaswani et al. 2017, §5.1).

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately
25000 source tokens and 25000 target tokens." Here each pair goes to the
smallest bucket whose boundary fits both sides; a bucket of boundary L holds
``tokens_per_batch // L`` pairs, padded to exactly ``(batch, L)``. Short last
batches are filled with all-padding rows (which the loss ignores), so every
bucket has one static shape and XLA compiles once per bucket.
"""

import numpy as np
import tensorflow as tf

DEFAULT_BOUNDARIES = (8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256)


def _pad(rows, length):
    out = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def bucket_index(lengths, boundaries):
    """The bucket of each length: the index of the smallest boundary that
    holds it (``boundaries`` sorted ascending).

    Raises:
        ValueError: a length above the last boundary.

    Example:

    >>> bucket_index([3, 8, 9], (8, 16)).tolist()
    [0, 0, 1]
    """
    lengths = np.asarray(lengths)
    if lengths.size and lengths.max() > boundaries[-1]:
        raise ValueError(
            f"a sequence of length {int(lengths.max())} exceeds the last "
            f"bucket boundary {boundaries[-1]}; filter or truncate first"
        )
    return np.searchsorted(boundaries, lengths, side="left")


def bucket_plan(lengths, tokens_per_batch, boundaries):
    """Assigns examples to buckets.

    Args:
        lengths: int array ``(n,)``, the longer side of each pair (tokens).
        tokens_per_batch: int, padded tokens per side per batch.
        boundaries: sorted ints; the last must be >= every length.

    Returns:
        list of ``(boundary, batch_size, example_indices)``.

    Raises:
        ValueError: ``tokens_per_batch`` < a boundary, or a length above the
            last boundary.
    """
    boundaries = sorted(int(b) for b in boundaries)
    which = bucket_index(lengths, boundaries)
    plan = []
    for b, boundary in enumerate(boundaries):
        idx = np.nonzero(which == b)[0]
        if not idx.size:
            continue
        batch_size = tokens_per_batch // boundary
        if batch_size < 1:
            raise ValueError(
                f"`tokens_per_batch`={tokens_per_batch} is smaller than the "
                f"bucket boundary {boundary}"
            )
        plan.append((boundary, batch_size, idx))
    return plan


def token_bucket_batches(
    sources,
    targets,
    tokens_per_batch=4096,
    boundaries=DEFAULT_BOUNDARIES,
    shuffle=True,
    seed=0,
    repeat=False,
    position=None,
):
    """A ``tf.data.Dataset`` of token-count batches for teacher forcing.

    Args:
        sources: list of int sequences (source ids, END appended).
        targets: list of int sequences that start with START and end with
            END; decoder inputs are ``target[:-1]``, labels ``target[1:]``.
        tokens_per_batch: padded tokens per side in one batch.
        boundaries: bucket lengths; pairs longer than the last are rejected.
        shuffle: reshuffle examples within buckets and the batch order every
            epoch (seeded).
        repeat: repeat epochs forever.
        position: optional object with int attributes ``epoch`` and
            ``skip`` (``keras_trm.training.DataPosition``), read each time
            an epoch's iteration starts: the batch order is then that of
            epoch ``epoch`` of an uninterrupted run with this ``seed`` (the
            shuffles of the earlier epochs are replayed, nothing is padded
            for them), and its first ``skip`` batches are left out. This is
            how a resumed run (``keras_trm.training.TrainingBackup``) sees
            exactly the batches the interrupted one had not trained on.
            Without it, epochs simply follow one another.

    Yields:
        ``({"encoder_tokens": int32 (B, L), "decoder_tokens": int32 (B, L)},
        labels int32 (B, L))``, 0 = padding.

    Raises:
        ValueError: different numbers of sources and targets, or a pair
            longer than the last boundary.
    """
    if len(sources) != len(targets):
        raise ValueError(
            f"`sources` and `targets` differ in length: {len(sources)} vs "
            f"{len(targets)}"
        )
    sources = [np.asarray(s, np.int32) for s in sources]
    dec_in = [np.asarray(t[:-1], np.int32) for t in targets]
    labels = [np.asarray(t[1:], np.int32) for t in targets]
    lengths = np.array(
        [max(len(s), len(d)) for s, d in zip(sources, dec_in)], np.int64
    )
    plan = bucket_plan(lengths, tokens_per_batch, boundaries)
    rng = np.random.default_rng(seed)

    def epoch_order(rng):
        epoch = []
        for boundary, batch_size, idx in plan:
            idx = rng.permutation(idx) if shuffle else idx
            for start in range(0, len(idx), batch_size):
                epoch.append((boundary, batch_size, idx[start:start + batch_size]))
        order = rng.permutation(len(epoch)) if shuffle else range(len(epoch))
        return [epoch[k] for k in order]

    def batches():
        nonlocal rng
        skip = 0
        if position is not None:
            # Same draws as an uninterrupted run: replay the earlier epochs.
            rng = np.random.default_rng(seed)
            for _ in range(int(position.epoch)):
                epoch_order(rng)
            skip = int(position.skip)
        while True:
            for boundary, batch_size, chunk in epoch_order(rng)[skip:]:
                fill = [[]] * (batch_size - len(chunk))
                enc = _pad([sources[i] for i in chunk] + fill, boundary)
                dec = _pad([dec_in[i] for i in chunk] + fill, boundary)
                lab = _pad([labels[i] for i in chunk] + fill, boundary)
                yield {"encoder_tokens": enc, "decoder_tokens": dec}, lab
            skip = 0
            if not repeat:
                return

    spec = tf.TensorSpec((None, None), tf.int32)
    ds = tf.data.Dataset.from_generator(
        batches,
        output_signature=(
            {"encoder_tokens": spec, "decoder_tokens": spec},
            spec,
        ),
    )
    return ds.prefetch(2)


def steps_per_epoch(targets_lengths, tokens_per_batch, boundaries=DEFAULT_BOUNDARIES):
    """Number of batches in one epoch for the given pair lengths."""
    plan = bucket_plan(targets_lengths, tokens_per_batch, boundaries)
    return sum(-(-len(idx) // bs) for _, bs, idx in plan)


# -- fixed-size batches of labelled sequences (the classification recipes) --


def bucket_widths(max_length, step=64):
    """Padded widths of the length buckets: ``step``, ``2 step``, ...,
    ``max_length``.

    Example:

    >>> bucket_widths(320), bucket_widths(100)
    ((64, 128, 192, 256, 320), (64, 100))
    """
    widths = list(range(step, max_length, step))
    return tuple(widths) + (max_length,)


def labelled_bucket_batches(ids, labels, batch_size, max_length,
                            shuffle=False, drop_remainder=False, seed=0):
    """Length-bucketed batches of ``batch_size`` labelled sequences.

    Each sequence goes to the smallest bucket width (``bucket_widths``)
    that holds it and is right-padded with 0 to that width, so a batch has
    one of a few static shapes (cheap XLA) and little padding. With
    ``drop_remainder`` every batch has ``batch_size`` rows (the last partial
    batch of each bucket is dropped, a different one each shuffled epoch).

    Args:
        ids: ragged int ``tf.RaggedTensor (N, None)``, rows of at most
            ``max_length`` ids.
        labels: int ``(N,)``.
        batch_size: int > 0; max_length: int > 0.
        shuffle: reshuffle every epoch (seeded by ``seed``).

    Returns:
        ``tf.data.Dataset`` of ``(int32 (batch, width), int32 (batch,))``
        with a known cardinality (``labelled_bucket_steps``).

    Example:

    >>> import tensorflow as tf
    >>> ids = tf.ragged.constant([[5, 6], [7], [8, 9, 10]])
    >>> ds = labelled_bucket_batches(ids, [0, 1, 0], 2, max_length=4)
    >>> [tuple(x.shape) for x, _ in ds]
    [(2, 4), (1, 4)]
    """
    widths = bucket_widths(max_length)
    lengths = tf.cast(ids.row_lengths(), tf.int32)
    dense = ids.to_tensor(default_value=0, shape=[None, max_length])
    ds = tf.data.Dataset.from_tensor_slices((dense, lengths, labels))
    if shuffle:
        ds = ds.shuffle(len(labels), seed=seed, reshuffle_each_iteration=True)
    ds = ds.map(lambda x, n, y: (x[:n], y))
    ds = ds.bucket_by_sequence_length(
        element_length_func=lambda x, y: tf.shape(x)[0],
        bucket_boundaries=[w + 1 for w in widths],
        bucket_batch_sizes=[batch_size] * (len(widths) + 1),
        pad_to_bucket_boundary=True,
        drop_remainder=drop_remainder,
    )
    steps = labelled_bucket_steps(lengths.numpy(), batch_size, max_length,
                                  drop_remainder)
    ds = ds.apply(tf.data.experimental.assert_cardinality(steps))
    return ds.prefetch(tf.data.AUTOTUNE)


def labelled_bucket_steps(lengths, batch_size, max_length,
                          drop_remainder=True):
    """Batches per epoch of ``labelled_bucket_batches`` for sequences of
    ``lengths``.

    Example:

    >>> labelled_bucket_steps([2, 1, 3, 70], 2, 128, drop_remainder=False)
    3
    """
    counts = np.bincount(bucket_index(lengths, bucket_widths(max_length)))
    if drop_remainder:
        return int(sum(c // batch_size for c in counts))
    return int(sum(-(-c // batch_size) for c in counts))
