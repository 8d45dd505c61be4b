"""The one loader of translation training: token-count batches in length
buckets over prepared folders (``keras_trm.data.prepared``), as a
``keras.utils.PyDataset``: JAX's and PyTorch's ``fit`` take it as it is,
TensorFlow's through ``keras_trm.jobs.translation.tf_dataset`` (Keras' own
PyDataset adapter fixes the batch shape from the first two batches).

Vaswani et al. (2017, §5.1): "Sentence pairs were batched together by
approximate sequence length. Each training batch contained [...]
approximately 25000 source tokens and 25000 target tokens." A pair goes to
the smallest boundary ``L >= max(len(source ids), len(target ids) - 1)``; a
batch of bucket ``L`` holds ``tokens_per_batch // L`` pairs padded to
exactly ``(batch, L)`` (one XLA compilation per bucket), its last batch of
an epoch filled with all-padding rows (the loss ignores them).
"""

import keras
import numpy as np

from keras_trm.utils import checks as v

# The translation job's bucket lengths (tokens), below its longest pair.
DEFAULT_BOUNDARIES = (8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)


def bucket_boundaries(max_pair_length, boundaries=()):
    """Bucket lengths for pairs up to ``max_pair_length`` tokens: those of
    ``boundaries`` (default ``DEFAULT_BOUNDARIES``) below it, then
    ``max_pair_length`` itself.

    Raises:
        TypeError / ValueError: a length that is not an int >= 1.

    Example:

    >>> bucket_boundaries(50)
    (8, 12, 16, 20, 24, 32, 40, 48, 50)
    >>> bucket_boundaries(64, (24, 32))
    (24, 32, 64)
    """
    limit = v.positive_int("max_pair_length", max_pair_length)
    chosen = sorted({v.positive_int("boundaries", b)
                     for b in (boundaries or DEFAULT_BOUNDARIES)})
    return tuple(b for b in chosen if b < limit) + (limit,)


def parse_boundaries(text):
    """``"24,64"`` -> ``(24, 64)``; ``""`` -> ``()`` (the default lengths).

    Raises:
        ValueError: not comma-separated ints >= 1 (the value is named).

    Example:

    >>> parse_boundaries("24, 64")
    (24, 64)
    """
    try:
        values = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        values = (0,)
    if any(b < 1 for b in values):
        raise ValueError("`boundaries` must be comma-separated lengths >= 1 "
                         f"(tokens), got boundaries={text!r}")
    return values


def _check_weights(weights, count):
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise TypeError(f"`weights` must be a list of numbers, one per split, "
                        f"got weights={weights!r}")
    try:
        array = np.asarray(weights, np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"`weights` must be numbers, got weights={weights!r}") from None
    if array.shape != (count,) or not np.isfinite(array).all() or (
            array < 0).any() or array.sum() <= 0:
        raise ValueError(f"`weights` must be {count} finite numbers >= 0 (one per "
                         f"split) with a positive sum, got weights={list(weights)!r}")
    return array


def _position(position):
    """``(epoch, skip)`` of a ``position`` (None: the start), checked."""
    if position is None:
        return 0, 0
    return (v.non_negative_int("position.epoch", position.epoch),
            v.non_negative_int("position.skip", position.skip))


class TokenBatches(keras.utils.PyDataset):
    """Token-count batches over prepared splits, seeded, resumable,
    sharded per process, optionally mixing several corpora by weight.

    Epoch ``e`` is a pure function of ``(seed, e)`` (``default_rng([seed,
    e])`` permutes each bucket's pairs, then the batches, the buckets'
    short remainder batches last, as tf.data and the TFRecord pipeline
    before this loader emit them), so a restarted process reproduces it
    and ``position`` resumes mid-epoch. With
    ``weights``, an epoch holds ``pairs_per_epoch`` pairs (default: all),
    ``weights[i] / sum(weights)`` of them from split ``i``, drawn per length
    bucket in proportion to the split's bucket counts (a split smaller than
    its share is repeated). A global batch has ``num_processes`` blocks of
    ``tokens_per_batch // L`` rows, process ``k`` taking the ``k``-th, so all
    processes step through the same shapes. Memory: 4 bytes a pair
    (``pair_lengths``) and 8 an epoch's plan; the ids stay memory-mapped.

    Args:
        splits: a ``PreparedSplit`` or a list of them.
        tokens_per_batch: int, padded tokens per side of one process's
            batch; at least the last boundary.
        boundaries: bucket lengths (tokens); the last must hold the
            longest pair (``bucket_boundaries``).
        weights: None, or one number >= 0 per split (mixing).
        pairs_per_epoch: int >= 1 or None, with ``weights`` only.
        seed: int >= 0.
        shuffle: permute pairs and batches (else corpus order).
        repeat: endless (``fit(steps_per_epoch=batches_per_epoch)``; no
            ``len()``), from ``position``; else one epoch,
            ``position.epoch`` (advanced by ``on_epoch_end``).
        process_index, num_processes: this process's share of each batch.
        position: an object with int ``epoch`` and ``skip`` (e.g.
            ``keras_trm.training.DataPosition``), read at index 0.

    Yields (``self[i]``): ``({"encoder_tokens": int32 (B, L),
    "decoder_tokens": int32 (B, L)}, labels int32 (B, L))``, 0 = padding;
    decoder tokens are the target ids but the last, labels but the first.

    Raises:
        TypeError / ValueError: a bad argument (named); a pair longer than
            the last boundary; no pairs.

    Example:

    >>> import pathlib, tempfile
    >>> from keras_trm.data.prepared import prepare_translation_data, read_prepared
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "x.en").write_text("a b\\nb\\nb a a\\n")
    >>> _ = (d / "x.de").write_text("b\\nb a\\na\\n")
    >>> encode = lambda lines: [[4 + "ab".index(w) for w in s.split()] for s in lines]
    >>> _ = prepare_translation_data(d / "p", [("train", d / "x.en", d / "x.de")],
    ...                              encode, 6, "0" * 64)
    >>> split = read_prepared(d / "p").splits["train"]
    >>> batches = TokenBatches(split, tokens_per_batch=8, boundaries=(4,),
    ...                        shuffle=False, repeat=False)
    >>> len(batches), batches.shapes
    (2, [(2, 4)])
    >>> x, y = batches[0]
    >>> x["encoder_tokens"].tolist(), x["decoder_tokens"][0].tolist(), y[0].tolist()
    ([[4, 5, 3, 0], [5, 3, 0, 0]], [2, 5, 0, 0], [5, 3, 0, 0])
    """

    def __init__(self, splits, tokens_per_batch=4096, boundaries=DEFAULT_BOUNDARIES,
                 weights=None, pairs_per_epoch=None, seed=0, shuffle=True,
                 repeat=True, process_index=0, num_processes=1, position=None):
        super().__init__(workers=1, use_multiprocessing=False)
        self.splits = [splits] if hasattr(splits, "pair_lengths") else list(splits)
        if not self.splits or not all(hasattr(s, "pair_lengths") for s in self.splits):
            raise TypeError("`splits` must be a PreparedSplit or a list of them, got "
                            f"splits={splits!r}")
        self.tokens_per_batch = v.positive_int("tokens_per_batch", tokens_per_batch)
        if isinstance(boundaries, (str, bytes)) or not hasattr(boundaries, "__iter__"):
            raise TypeError("`boundaries` must be a sequence of ints >= 1 (bucket "
                            f"lengths), got boundaries={boundaries!r}")
        bounds = sorted({v.positive_int("boundaries", b) for b in boundaries})
        if not bounds:
            raise ValueError("`boundaries` is empty: it needs at least one bucket "
                             "length, got boundaries=()")
        self.boundaries = np.array(bounds, np.int64)
        if self.tokens_per_batch < bounds[-1]:
            raise ValueError(f"`tokens_per_batch` must be at least the longest bucket "
                             f"({bounds[-1]} tokens), got tokens_per_batch="
                             f"{self.tokens_per_batch}")
        self.seed = v.non_negative_int("seed", seed)
        self.shuffle, self.repeat = bool(shuffle), bool(repeat)
        self.num_processes = v.positive_int("num_processes", num_processes)
        self.process_index = v.non_negative_int("process_index", process_index)
        if self.process_index >= self.num_processes:
            raise ValueError(f"`process_index` must be in [0, {self.num_processes}), "
                             f"got process_index={process_index}")
        self.position = position
        self.batch_sizes = self.tokens_per_batch // self.boundaries
        self._buckets = []
        for split in self.splits:
            if not len(split):
                raise ValueError(f"split {split.name!r} has no pairs")
            longest = int(split.pair_lengths.max())
            if longest > bounds[-1]:
                raise ValueError(f"split {split.name!r} has a pair of {longest} tokens, "
                                 f"more than the last of boundaries={tuple(bounds)}")
            self._buckets.append(np.searchsorted(self.boundaries, split.pair_lengths,
                                                 side="left").astype(np.uint8))
        self.bases = np.cumsum([0] + [len(s) for s in self.splits])
        counts = np.array([np.bincount(b, minlength=len(bounds)) for b in self._buckets])
        if weights is None:
            if pairs_per_epoch is not None:
                raise ValueError("`pairs_per_epoch` needs `weights`, got "
                                 f"pairs_per_epoch={pairs_per_epoch!r}")
            self.take = counts
        else:
            w = _check_weights(weights, len(self.splits))
            total = (int(self.bases[-1]) if pairs_per_epoch is None
                     else v.positive_int("pairs_per_epoch", pairs_per_epoch))
            share = total * w / w.sum()
            self.take = np.rint(share[:, None] * counts / counts.sum(1, keepdims=True)
                                ).astype(np.int64)
        rows = self.batch_sizes * self.num_processes
        per_bucket = self.take.sum(0)
        self.batches_per_epoch = int(np.sum(-(-per_bucket // rows)))
        if not self.batches_per_epoch:
            raise ValueError("no batch in an epoch: `weights` / `pairs_per_epoch` "
                             "leave no pair")
        self.shapes = [(int(b), int(L)) for b, L, c in zip(
            self.batch_sizes, self.boundaries, per_bucket) if c]
        self.epoch = _position(position)[0]
        self._plan_epoch, self._plan = None, None
        self._start = 0

    def __len__(self):
        if self.repeat:
            raise TypeError("an endless TokenBatches (repeat=True) has no len(); "
                            "use batches_per_epoch")
        return self.batches_per_epoch

    @property
    def num_batches(self):
        return None if self.repeat else self.batches_per_epoch

    def __getitem__(self, index):
        index = v.non_negative_int("index", index)
        if not self.repeat:
            if index >= self.batches_per_epoch:
                raise IndexError(f"batch {index} of an epoch of {self.batches_per_epoch}")
            return self.batch(self.epoch, index)
        if index == 0:  # the stream starts: where does it start?
            epoch, skip = _position(self.position)
            self._start = epoch * self.batches_per_epoch + skip
        epoch, at = divmod(self._start + index, self.batches_per_epoch)
        return self.batch(epoch, at)

    def shape_at(self, index):
        """The ``(batch, L)`` shape of stream batch ``index``, unassembled."""
        epoch, at = divmod(self._start + index, self.batches_per_epoch)
        b = int(self.plan(epoch)[0][at])
        return int(self.batch_sizes[b]), int(self.boundaries[b])

    def on_epoch_end(self):
        if not self.repeat:
            self.epoch += 1

    def plan(self, epoch):
        """Epoch ``epoch``'s batches: ``(buckets, starts, rows)``, batch
        ``j`` being bucket ``buckets[j]``'s global rows ``rows[starts[j]:
        starts[j] + size]`` (-1: a padding row)."""
        if self._plan_epoch == epoch:
            return self._plan
        rng = np.random.default_rng([self.seed, int(epoch)]) if self.shuffle else None
        buckets, starts, short, parts, at = [], [], [], [], 0
        for b, size in enumerate(self.batch_sizes * self.num_processes):
            chosen = []
            for i, bucket in enumerate(self._buckets):
                n = int(self.take[i, b])
                if not n:
                    continue
                rows = np.flatnonzero(bucket == b)
                if rng is not None:
                    rows = rng.permutation(rows)
                chosen.append(np.resize(rows, n) + self.bases[i])
            if not chosen:
                continue
            rows = np.concatenate(chosen)
            if rng is not None and len(chosen) > 1:
                rows = rng.permutation(rows)
            full = -(-len(rows) // size) * size
            parts.append(np.concatenate([rows, np.full(full - len(rows), -1)]))
            buckets += [b] * (full // size)
            starts += list(range(at, at + full, size))
            short += [False] * (full // size - 1) + [full > len(rows)]
            at += full
        buckets, starts = np.array(buckets), np.array(starts, np.int64)
        if rng is not None:  # the short batches last, as tf.data puts a remainder
            order = rng.permutation(len(buckets))
            order = order[np.argsort(np.array(short)[order], kind="stable")]
            buckets, starts = buckets[order], starts[order]
        self._plan_epoch, self._plan = epoch, (buckets, starts, np.concatenate(parts))
        return self._plan

    def batch(self, epoch, index):
        """Batch ``index`` of epoch ``epoch`` (this process's rows)."""
        buckets, starts, rows = self.plan(epoch)
        b = int(buckets[index])
        size = int(self.batch_sizes[b])
        first = int(starts[index]) + self.process_index * size
        return self._assemble(rows[first:first + size], int(self.boundaries[b]))

    def _assemble(self, rows, width):
        encoder, decoder, labels = np.zeros((3, len(rows), width), np.int32)
        real = np.flatnonzero(rows >= 0)
        split_of = np.searchsorted(self.bases, rows[real], side="right") - 1
        cols = np.arange(width)
        for i in np.unique(split_of):
            split = self.splits[i]
            mine = real[split_of == i]
            chunk, local = split.chunk_of(rows[mine] - self.bases[i])
            for c in np.unique(chunk):
                out = mine[chunk == c]
                r = local[chunk == c]
                arrays = split.chunks[c]
                start = np.asarray(arrays["offsets"][r])
                end = np.asarray(arrays["offsets"][r + 1])
                middle = start + np.asarray(arrays["source_lengths"][r])
                for target, first, last in ((encoder, start, middle),
                                            (decoder, middle, end - 1),
                                            (labels, middle + 1, end)):
                    keep = cols < (last - first)[:, None]
                    index = np.where(keep, first[:, None] + cols, 0)
                    target[out] = np.where(keep, arrays["ids"][index], 0)
                split.release(c)  # random rows faulted in whole pages: let go
        return {"encoder_tokens": encoder, "decoder_tokens": decoder}, labels
