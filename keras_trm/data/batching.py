"""Length-bucketed batches of a fixed number of labelled sequences (the
classification jobs: ``labelled_bucket_batches``, tf.data). Translation's
token-count batches are ``keras_trm.data.TokenBatches``.
"""

import numpy as np
import tensorflow as tf


def bucket_widths(max_length, step=64):
    """Padded widths of the length buckets: ``step``, ``2 step``, ...,
    ``max_length``.

    Example:

    >>> bucket_widths(320), bucket_widths(100)
    ((64, 128, 192, 256, 320), (64, 100))
    """
    return tuple(range(step, max_length, step)) + (max_length,)


def labelled_bucket_batches(ids, labels, batch_size, max_length,
                            shuffle=False, drop_remainder=False, seed=0):
    """Length-bucketed batches of ``batch_size`` labelled sequences.

    Each sequence is right-padded with 0 to the smallest bucket width
    (``bucket_widths``) that holds it: a few static shapes (cheap XLA),
    little padding. ``drop_remainder`` drops each bucket's partial batch.

    Args:
        ids: ``tf.RaggedTensor (N, None)`` of int, rows of at most
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

    Raises:
        ValueError: a length above ``max_length``.

    Example:

    >>> labelled_bucket_steps([2, 1, 3, 70], 2, 128, drop_remainder=False)
    3
    """
    lengths = np.asarray(lengths)
    if lengths.size and lengths.max() > max_length:
        raise ValueError(f"a sequence of length {int(lengths.max())} exceeds the last "
                         f"bucket boundary {max_length}; filter or truncate first")
    counts = np.bincount(np.searchsorted(bucket_widths(max_length), lengths))
    full = counts // batch_size if drop_remainder else -(-counts // batch_size)
    return int(full.sum())
