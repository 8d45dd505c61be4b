"""The files of portable training (``keras_trm.jobs.portable_training``)
and the numpy code that writes and reads them, with no TensorFlow: pairs
of token ids, token-count batches over them, weights.

File formats (numpy ``.npz``, uncompressed, no pickles):

- pairs, ``<split>-NNNNN.npz``: ``source`` int32 ``(tokens,)``, the
  source ids of the file's pairs one after another (each ends with END);
  ``source_offsets`` int64 ``(pairs + 1,)``, pair ``i``'s ids being
  ``source[source_offsets[i]:source_offsets[i + 1]]``; ``target`` and
  ``target_offsets`` likewise (START first, END last). The ids are those
  of the translation job's TFRecord shards (``keras_trm.data.
  prepare_shards``), in corpus order.
- weights, ``weights-NNNNN.npz``: arrays ``a0``, ``a1``, ... holding
  consecutive pieces of the flattened weights (float32, or bfloat16 as
  its uint16 bit pattern); ``weights.json`` says, for each of
  ``model.weights`` in order, its path, shape and which pieces make it
  (a weight larger than a file is split over several).
- ``manifest.json`` / ``weights.json`` list every file with its size and
  SHA-256; readers check both before using a file.
"""

import hashlib
import json
import pathlib
import queue
import threading

import keras
import numpy as np

from keras_trm.models import transformer
from keras_trm.utils import checks as v
from keras_trm.utils.files import atomic_file, write_json
from keras_trm.utils.ids import END_ID, PAD_ID, START_ID, UNK_ID

FORMAT = "keras_trm.portable/1"
WEIGHTS_FORMAT = "keras_trm.portable_weights/1"
MANIFEST = "manifest.json"
WEIGHTS_MANIFEST = "weights.json"
MIB = 1 << 20
DEFAULT_MAX_FILE_MIB = 16.0
MIN_FILE_BYTES = 16 * 1024
# The translation job's bucket lengths (keras_trm.jobs.translation), cut at
# the longest training pair.
BOUNDARIES = (8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)
SPECIAL_IDS = {"pad": PAD_ID, "unk": UNK_ID, "start": START_ID, "end": END_ID}
# npz overhead: a zip entry (local header + central directory, ~150 bytes
# with the name) and the .npy header (128 bytes) per array, and the zip end.
_ARRAY_OVERHEAD = 512
_FILE_OVERHEAD = 1024


# -- files ----------------------------------------------------------------------


def sha256_file(path, chunk=MIB):
    """SHA-256 of a file's bytes (64 hex digits), read ``chunk`` bytes at a
    time.

    Example:

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = p.write_text("abc")
    >>> sha256_file(p)[:16]
    'ba7816bf8f01cfea'
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def file_entry(path):
    """``{"bytes": size, "sha256": hex}`` of a file (how ``manifest.json``
    and ``weights.json`` list their files)."""
    path = pathlib.Path(path)
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def check_files(directory, files, what="prepared folder"):
    """Checks that each file listed in ``files`` (``{name: {"bytes",
    "sha256"}}``) is in ``directory`` with that size and SHA-256.

    Raises:
        FileNotFoundError: a listed file is missing (named).
        ValueError: a file's size or SHA-256 differs (the file, what was
            expected and what was found are named): it was cut short or
            changed after it was written.

    Example:

    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.txt").write_text("abc")
    >>> check_files(d, {"a.txt": file_entry(d / "a.txt")})
    >>> _ = (d / "a.txt").write_text("abd")
    >>> changed = {"a.txt": file_entry(d / "a.txt") | {"sha256": "0" * 64}}
    >>> check_files(d, changed)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: prepared folder ...: a.txt has SHA-256 ..., the manifest says 000000000000...; the file changed after it was written (copy it again)
    """
    directory = pathlib.Path(directory)
    for name, entry in files.items():
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(
                f"{what} {str(directory)!r}: {name} is missing (listed in its "
                "manifest); copy the whole folder")
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise ValueError(
                f"{what} {str(directory)!r}: {name} has {size} bytes, the "
                f"manifest says {entry['bytes']}; the copy is incomplete")
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            raise ValueError(
                f"{what} {str(directory)!r}: {name} has SHA-256 {digest[:12]}..., "
                f"the manifest says {entry['sha256'][:12]}...; the file changed "
                "after it was written (copy it again)")


def max_file_bytes(max_file_mib):
    """``max_file_mib`` (MiB, float) as bytes, checked.

    Raises:
        ValueError/TypeError: not a number, or below 16 KiB (0.015625 MiB).

    Example:

    >>> max_file_bytes(16)
    16777216
    """
    mib = v.positive_float("max_file_mib", max_file_mib)
    size = int(mib * MIB)
    if size < MIN_FILE_BYTES:
        raise ValueError(
            f"`max_file_mib` must be at least {MIN_FILE_BYTES / MIB} "
            f"(16 KiB), got max_file_mib={max_file_mib!r}")
    return size


def _write_npz(path, arrays, limit):
    with atomic_file(path, suffix=".npz") as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
    size = path.stat().st_size
    if size > limit:  # the overhead estimate is too low: a bug, not bad input
        path.unlink()
        raise RuntimeError(f"{path} came out at {size} bytes, over the "
                           f"{limit}-byte limit")
    return size


class PairWriter:
    """Writes token-id pairs to ``<prefix>-NNNNN.npz`` files of at most
    ``max_bytes`` each (the pairs format of the module docstring), pairs
    in the order given; holds at most one file's pairs in memory.

    Args:
        directory: output folder (created).
        prefix: file name prefix, e.g. ``"train"``.
        max_bytes: int, the largest file (bytes; >= 16 KiB).

    ``add(source, source_lengths, target, target_lengths)`` takes a chunk
    of pairs: ``source`` int ``(tokens,)`` their source ids one after the
    other, ``source_lengths`` int ``(pairs,)``; the same for the target.
    ``close()`` writes the last file and returns the list of files written:
    ``{"file", "pairs", "source_ids", "target_ids", "bytes", "sha256"}``
    (ids stored: END, and START for the target, included).

    Raises:
        ValueError: ``max_bytes`` under 16 KiB; one pair larger than a
            file; lengths that do not add up to the ids given.

    Example:

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> w = PairWriter(d, "train", max_bytes=16 * 1024)
    >>> w.add(np.array([5, 3, 6, 7, 3]), [2, 3], np.array([2, 8, 3, 2, 9, 9, 3]), [3, 4])
    >>> [(f["file"], f["pairs"]) for f in w.close()]
    [('train-00000.npz', 2)]
    >>> pairs = load_pairs_files(d, ["train-00000.npz"])
    >>> pairs.source_ids(1).tolist(), pairs.target_ids(1).tolist()
    ([6, 7, 3], [2, 9, 9, 3])
    """

    def __init__(self, directory, prefix, max_bytes=16 * MIB):
        self.directory = pathlib.Path(directory)
        self.prefix = str(prefix)
        if int(max_bytes) < MIN_FILE_BYTES:
            raise ValueError(f"`max_bytes` must be >= {MIN_FILE_BYTES}, got "
                             f"max_bytes={max_bytes!r}")
        self.max_bytes = int(max_bytes)
        self.budget = self.max_bytes - _FILE_OVERHEAD - 4 * _ARRAY_OVERHEAD
        self.files = []
        self._pending = []  # (source, source_lengths, target, target_lengths)
        self._pending_bytes = 0

    def add(self, source, source_lengths, target, target_lengths):
        source = np.asarray(source, np.int32).ravel()
        target = np.asarray(target, np.int32).ravel()
        ns = np.asarray(source_lengths, np.int64).ravel()
        nt = np.asarray(target_lengths, np.int64).ravel()
        if ns.shape != nt.shape or ns.sum() != source.size or nt.sum() != target.size:
            raise ValueError(
                f"lengths do not match the ids: {ns.size} source and {nt.size} "
                f"target lengths summing to {int(ns.sum())} and {int(nt.sum())}, "
                f"for {source.size} source and {target.size} target ids")
        # Bytes each pair takes: its ids and two offsets.
        cost = 4 * (ns + nt) + 16
        s_end, t_end = np.cumsum(ns), np.cumsum(nt)
        first = 0
        while first < ns.size:
            room = self.budget - self._pending_bytes
            spent = np.cumsum(cost[first:])
            take = int(np.searchsorted(spent, room, side="right"))
            if take == 0:
                if not self._pending:
                    raise ValueError(
                        f"pair {first} takes {int(cost[first])} bytes, more "
                        f"than a file of {self.max_bytes} bytes holds")
                self._flush()
                continue
            last = first + take
            s0 = int(s_end[first - 1]) if first else 0
            t0 = int(t_end[first - 1]) if first else 0
            self._pending.append((source[s0:int(s_end[last - 1])], ns[first:last],
                                  target[t0:int(t_end[last - 1])], nt[first:last]))
            self._pending_bytes += int(spent[take - 1])
            first = last
            if first < ns.size:
                self._flush()

    def _flush(self):
        if not self._pending:
            return
        parts = list(zip(*self._pending))
        arrays = {}
        for side, ids, lengths in (("source", parts[0], parts[1]),
                                   ("target", parts[2], parts[3])):
            lengths = np.concatenate(lengths)
            arrays[side] = np.concatenate(ids).astype(np.int32)
            arrays[f"{side}_offsets"] = np.concatenate(
                [[0], np.cumsum(lengths)]).astype(np.int64)
        name = f"{self.prefix}-{len(self.files):05d}.npz"
        path = self.directory / name
        self.directory.mkdir(parents=True, exist_ok=True)
        _write_npz(path, arrays, self.max_bytes)
        self.files.append({
            "file": name, "pairs": int(arrays["source_offsets"].size - 1),
            "source_ids": int(arrays["source"].size),
            "target_ids": int(arrays["target"].size), **file_entry(path)})
        self._pending, self._pending_bytes = [], 0

    def close(self):
        self._flush()
        return list(self.files)


class Pairs:
    """Token-id pairs held as flat numpy arrays (what ``load_pairs``
    returns): ``source`` int32 ``(tokens,)`` and ``source_offsets`` int64
    ``(pairs + 1,)``, the same for ``target``.

    ``len(pairs)``; ``source_ids(i)`` / ``target_ids(i)``: pair ``i``'s
    ids; ``pair_lengths()``: int64 ``(pairs,)``, ``max(len(source),
    len(target) - 1)``, the length a pair is bucketed by (tokens).
    """

    def __init__(self, source, source_offsets, target, target_offsets):
        self.source = np.asarray(source, np.int32)
        self.source_offsets = np.asarray(source_offsets, np.int64)
        self.target = np.asarray(target, np.int32)
        self.target_offsets = np.asarray(target_offsets, np.int64)
        if self.source_offsets.shape != self.target_offsets.shape:
            raise ValueError(
                f"source and target offsets differ in length: "
                f"{self.source_offsets.size} and {self.target_offsets.size}")

    def __len__(self):
        return int(self.source_offsets.size - 1)

    def source_ids(self, i):
        return self.source[self.source_offsets[i]:self.source_offsets[i + 1]]

    def target_ids(self, i):
        return self.target[self.target_offsets[i]:self.target_offsets[i + 1]]

    def source_lengths(self):
        return np.diff(self.source_offsets)

    def target_lengths(self):
        return np.diff(self.target_offsets)

    def pair_lengths(self):
        return np.maximum(self.source_lengths(), self.target_lengths() - 1)

    def padded_sources(self, rows=None, width=None):
        """int32 ``(len(rows), width)`` source ids (END included), 0-padded:
        what the searches take. ``rows``: pair indices (default all);
        ``width``: default the longest."""
        rows = np.arange(len(self)) if rows is None else np.asarray(rows)
        lengths = self.source_lengths()[rows]
        width = int(lengths.max()) if width is None else int(width)
        return _gather_rows(self.source, self.source_offsets, rows, width,
                            len(rows), 0, 0)


def load_pairs_files(directory, names):
    """``Pairs`` of the pair files ``names`` in ``directory``, concatenated
    in that order (no checksum check: ``load_pairs`` does that)."""
    parts = {"source": [], "target": []}
    offsets = {"source": [np.zeros(1, np.int64)], "target": [np.zeros(1, np.int64)]}
    base = {"source": 0, "target": 0}
    for name in names:
        path = pathlib.Path(directory) / name
        data = _load_npz(path, f"prepared folder {str(directory)!r}")
        for side in parts:
            try:
                ids, off = data[side], data[f"{side}_offsets"]
            except KeyError as err:
                raise ValueError(f"prepared folder {str(directory)!r}: {name} has "
                                 f"no array {err}; not a pair file") from None
            parts[side].append(ids)
            offsets[side].append(off[1:] + base[side])
            base[side] += int(ids.size)
    return Pairs(*(np.concatenate(x) if len(x) else np.zeros(0, np.int32)
                   for side in ("source", "target")
                   for x in (parts[side], offsets[side])))


def _read_manifest(path, hint, keys):
    """The JSON object in ``path`` (``manifest.json`` / ``weights.json``),
    with ``keys`` (``{name: type}``) present and of that type.

    Raises:
        ValueError: not valid JSON (cut short), not a JSON object, or a key
            missing or of another type (the file and the key named; then
            ``hint``).
    """
    try:
        data = json.loads(path.read_text("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); {hint}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object (got a "
                         f"{type(data).__name__}); {hint}")
    for key, kind in keys.items():
        if not isinstance(data.get(key), kind):
            problem = ("has no" if key not in data
                       else f"has a {type(data[key]).__name__} as its")
            raise ValueError(f"{path} {problem} {key!r} entry; {hint}")
    return data


def _load_npz(path, what):
    """The arrays of an ``.npz`` file as a dict; a damaged file raises
    ``ValueError`` naming it (``verify=False`` reads skip the SHA-256)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: {path} is missing (listed in its "
                                "manifest); copy the whole folder") from None
    except Exception as err:  # BadZipFile, EOFError, zlib.error, ValueError
        raise ValueError(f"{what}: {path} is damaged ({type(err).__name__}: "
                         f"{err}); copy it again") from None


def read_prepared(directory, verify=True):
    """The manifest of a prepared folder (``keras-trm prepare-translation``).

    Args:
        directory: the folder.
        verify: check every listed file's size and SHA-256 first.

    Returns:
        dict: ``format``, ``config`` (the ``TranslationConfig`` fields),
        ``model`` (the ``transformer()`` arguments), ``vocabulary``,
        ``special_ids``, ``max_train_length``, ``splits`` and ``files``
        (see ``keras_trm.jobs.portable_tensorflow.prepare_translation``).

    Raises:
        FileNotFoundError: no such folder, no ``manifest.json`` in it, or a
            listed file missing.
        NotADirectoryError: ``directory`` is a file.
        ValueError: not a prepared folder of this format (also a
            ``manifest.json`` cut short, not a JSON object or without its
            ``files``), or a file whose size or SHA-256 differs from the
            manifest's.
    """
    directory = pathlib.Path(directory)
    hint = ("run `keras-trm prepare-translation --output_dir "
            f"{directory}` on a machine with TensorFlow and copy the folder here")
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"prepared folder {str(directory)!r} is a file, "
                                 f"not a folder; {hint}")
    if not directory.is_dir():
        raise FileNotFoundError(f"prepared folder {str(directory)!r} does not "
                                f"exist; {hint}")
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"prepared folder {str(directory)!r} has no "
                                f"{MANIFEST}; {hint}")
    manifest = _read_manifest(path, hint, {})
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a prepared folder's manifest: format "
                         f"{manifest.get('format')!r}, expected {FORMAT!r}")
    _read_manifest(path, hint, {"files": dict})  # the keys every reader needs
    if verify:
        check_files(directory, manifest["files"])
    return manifest


def load_pairs(directory, split, manifest=None):
    """The ``Pairs`` of one split (``"train"`` or ``"validation"``) of a
    prepared folder, all its files concatenated (int32 ids: about 4 bytes
    per token of memory per side).

    Raises:
        ValueError: an unknown ``split``; a manifest without that split's
            files; a damaged pair file (named); errors of ``read_prepared``.
    """
    manifest = manifest or read_prepared(directory)
    if split not in ("train", "validation"):
        raise ValueError(f"`split` must be 'train' or 'validation', got "
                         f"split={split!r}")
    splits = manifest.get("splits")
    entry = splits.get(split) if isinstance(splits, dict) else None
    files = entry.get("files") if isinstance(entry, dict) else None
    if not isinstance(files, list) or not all(
            isinstance(f, dict) and isinstance(f.get("file"), str) for f in files):
        raise ValueError(
            f"{pathlib.Path(directory) / MANIFEST} lists no {split!r} split "
            "files (its 'splits' entry is missing or damaged); prepare the "
            "folder again with `keras-trm prepare-translation`")
    return load_pairs_files(directory, [f["file"] for f in files])


# -- token-count batches ---------------------------------------------------------


def bucket_boundaries(max_pair_length, boundaries=()):
    """Bucket lengths for pairs up to ``max_pair_length`` tokens: the
    translation job's ``(8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)``
    below it, then ``max_pair_length`` itself; or the given
    ``boundaries`` (sorted), with ``max_pair_length`` appended when the
    last is shorter.

    Example:

    >>> bucket_boundaries(50)
    (8, 12, 16, 20, 24, 32, 40, 48, 50)
    >>> bucket_boundaries(64, (24, 32))
    (24, 32, 64)
    """
    limit = v.positive_int("max_pair_length", max_pair_length)
    chosen = sorted({v.positive_int("boundaries", int(b))
                     for b in (boundaries or BOUNDARIES)})
    return tuple(b for b in chosen if b < limit) + (limit,)


def parse_boundaries(text):
    """``"24,64"`` -> ``(24, 64)``; ``""`` -> ``()``.

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


def _gather_rows(flat, offsets, rows, width, batch, trim_start, trim_end):
    """int32 ``(batch, width)``: row ``j < len(rows)`` holds the ids of
    pair ``rows[j]`` less ``trim_start`` first and ``trim_end`` last ids,
    0-padded; the other rows are all padding."""
    out = np.zeros((batch, width), np.int32)
    if len(rows) == 0:
        return out
    start = offsets[rows] + trim_start
    length = offsets[np.asarray(rows) + 1] - trim_end - start
    cols = np.arange(width)
    mask = cols[None, :] < length[:, None]
    index = np.where(mask, start[:, None] + cols[None, :], 0)
    out[:len(rows)] = np.where(mask, flat[index], 0)
    return out


class TokenBatches:
    """Token-count batches with length buckets (Vaswani et al. 2017, §5.1),
    in numpy: the batches of ``keras_trm.data.stream_batches`` without
    TensorFlow.

    A pair goes to the smallest boundary ``L >= max(len(source),
    len(target) - 1)``; a batch of bucket ``L`` holds ``tokens_per_batch
    // L`` pairs padded to exactly ``(batch, L)`` (one shape per bucket,
    so ``jax.jit`` compiles once per bucket); a bucket's last batch of an
    epoch is filled with all-padding rows (the loss ignores them). Every
    pair is in one batch of each epoch.

    Order (``shuffle``): epoch ``e`` permutes the pairs with
    ``numpy.random.default_rng([seed, e])``, groups them by bucket, cuts
    the batches, and permutes the batches; a pure function of ``(seed,
    e)``, so a resumed run sees the batches of an uninterrupted one. The
    whole split is shuffled each epoch (it is in memory as numpy arrays).

    Args:
        pairs: ``Pairs``.
        tokens_per_batch: int, padded tokens per side of a batch.
        boundaries: sorted bucket lengths (tokens); the last must hold the
            longest pair.
        seed: int >= 0.
        shuffle: permute pairs and batches (else corpus order, buckets in
            order: validation).

    Attributes:
        batches_per_epoch: int.
        shapes: the ``(batch, L)`` shapes the epoch's batches take.

    Yields (``epoch(e)``, ``stream(e, skip)``): ``({"encoder_tokens":
    int32 (B, L), "decoder_tokens": int32 (B, L)}, labels int32 (B, L))``,
    0 = padding; decoder tokens are the target ids without the last
    (START first), labels without the first.

    Raises:
        ValueError: a pair longer than the last boundary,
            ``tokens_per_batch`` below it, or no pairs.

    Example:

    >>> pairs = Pairs([4, 5, 3, 5, 3], [0, 3, 5], [2, 5, 3, 2, 5, 4, 3], [0, 3, 7])
    >>> batches = TokenBatches(pairs, tokens_per_batch=8, boundaries=(4,), shuffle=False)
    >>> batches.batches_per_epoch, batches.shapes
    (1, [(2, 4)])
    >>> x, y = next(batches.epoch(0))
    >>> x["encoder_tokens"].tolist(), x["decoder_tokens"][1].tolist(), y[1].tolist()
    ([[4, 5, 3, 0], [5, 3, 0, 0]], [2, 5, 4, 0], [5, 4, 3, 0])
    """

    def __init__(self, pairs, tokens_per_batch, boundaries, seed=0, shuffle=True):
        if not len(pairs):
            raise ValueError("`pairs` is empty: no pair to batch")
        self.pairs = pairs
        self.tokens_per_batch = v.positive_int("tokens_per_batch", tokens_per_batch)
        self.boundaries = np.array(sorted({int(b) for b in boundaries}), np.int64)
        if not self.boundaries.size or self.boundaries[0] < 1:
            raise ValueError(f"`boundaries` must be lengths >= 1, got "
                             f"boundaries={tuple(boundaries)!r}")
        self.seed = v.non_negative_int("seed", seed)
        self.shuffle = bool(shuffle)
        lengths = pairs.pair_lengths()
        longest = int(lengths.max())
        if longest > self.boundaries[-1]:
            raise ValueError(
                f"a pair is {longest} tokens long, more than the last of "
                f"`boundaries`={tuple(self.boundaries.tolist())}")
        if self.tokens_per_batch < self.boundaries[-1]:
            raise ValueError(
                f"`tokens_per_batch` must be at least the longest bucket "
                f"({int(self.boundaries[-1])} tokens), got tokens_per_batch="
                f"{self.tokens_per_batch}")
        self.bucket = np.searchsorted(self.boundaries, lengths, side="left")
        self.batch_sizes = self.tokens_per_batch // self.boundaries
        self.counts = np.bincount(self.bucket, minlength=self.boundaries.size)
        self.batches_per_epoch = int(np.sum(-(-self.counts // self.batch_sizes)))
        self.shapes = [(int(b), int(L)) for b, L, c in zip(
            self.batch_sizes, self.boundaries, self.counts) if c]

    def plan(self, epoch):
        """Epoch ``epoch``'s batches as ``(bucket index, pair indices)``."""
        n = len(self.pairs)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, int(epoch)])
            order = rng.permutation(n)
        else:
            rng, order = None, np.arange(n)
        order = order[np.argsort(self.bucket[order], kind="stable")]
        batches, start = [], 0
        for b, count in enumerate(self.counts):
            rows = order[start:start + count]
            start += count
            size = int(self.batch_sizes[b])
            batches += [(b, rows[i:i + size]) for i in range(0, int(count), size)]
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def batch(self, bucket, rows):
        """The arrays of one batch (see the class docstring)."""
        p, size = self.pairs, int(self.batch_sizes[bucket])
        width = int(self.boundaries[bucket])
        x = {"encoder_tokens": _gather_rows(p.source, p.source_offsets, rows,
                                            width, size, 0, 0),
             "decoder_tokens": _gather_rows(p.target, p.target_offsets, rows,
                                            width, size, 0, 1)}
        y = _gather_rows(p.target, p.target_offsets, rows, width, size, 1, 0)
        return x, y

    def epoch(self, epoch, skip=0):
        for bucket, rows in self.plan(epoch)[int(skip):]:
            yield self.batch(bucket, rows)

    def stream(self, epoch=0, skip=0):
        """Endless: epoch ``epoch`` from batch ``skip``, then the next
        epochs (what ``fit(steps_per_epoch=batches_per_epoch)`` takes)."""
        while True:
            yield from self.epoch(epoch, skip)
            epoch, skip = epoch + 1, 0


def prefetch(iterator, size=4):
    """Runs ``iterator`` in a background thread, ``size`` items ahead (the
    numpy batch assembly overlaps the accelerator's step). An exception in
    the iterator is raised in the consumer; the thread ends when the
    returned generator is closed or collected.

    Example:

    >>> list(prefetch(iter(range(5)), size=2))
    [0, 1, 2, 3, 4]
    """
    items = queue.Queue(maxsize=int(size))
    stop = threading.Event()
    done = object()

    def work():
        try:
            for item in iterator:
                while not stop.is_set():
                    try:
                        items.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put((done, None))
        except BaseException as error:  # noqa: BLE001 -- handed to the consumer
            items.put((done, error))

    thread = threading.Thread(target=work, daemon=True, name="prefetch")
    thread.start()

    def consume():
        try:
            while True:
                item, error = items.get()
                if error is not None:
                    raise error
                if item is done:
                    return
                yield item
        finally:
            stop.set()

    return consume()


# -- weights ----------------------------------------------------------------------


def to_bfloat16_bits(values):
    """float32 -> bfloat16 as its uint16 bit pattern (round to nearest,
    ties to even): the top half of the float32.

    Example:

    >>> to_bfloat16_bits(np.array([1.0, -2.5, 1 + 2**-8], "float32")).tolist()
    [16256, 49184, 16256]
    >>> from_bfloat16_bits(to_bfloat16_bits(np.array([3.140625], "float32")))
    array([3.140625], dtype=float32)
    """
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def from_bfloat16_bits(bits):
    """uint16 bfloat16 bit patterns -> float32 (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(
        np.float32)


WEIGHT_DTYPES = ("float32", "bfloat16")


def write_weights(model, directory, dtype="float32", max_bytes=16 * MIB,
                  extra=None):
    """Writes ``model.weights`` (in order) to ``directory`` as
    ``weights-NNNNN.npz`` files of at most ``max_bytes`` each and
    ``weights.json`` (the format of the module docstring); a weight larger
    than a file is split over several. Earlier weight files there are
    removed first (``weights.json`` first, so a crash never leaves a
    manifest naming missing pieces).

    Args:
        model: a built Keras model.
        directory: output folder (created).
        dtype: ``"float32"`` (exact) or ``"bfloat16"`` (half the bytes;
            floating weights rounded to nearest even, others kept).
        max_bytes: int >= 16 KiB, the largest file (bytes).
        extra: dict merged into ``weights.json`` (e.g. the model config).

    Returns:
        dict, the contents of ``weights.json``.

    Raises:
        ValueError: a bad ``dtype`` or ``max_bytes``; a weight holding NaN
            or inf (named; nothing is written: the run diverged).

    Example:

    >>> import tempfile
    >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    >>> d = tempfile.mkdtemp()
    >>> info = write_weights(m, d, "bfloat16")
    >>> sorted(info["files"]), info["weights"][0]["shape"]
    (['weights-00000.npz'], [3, 2])
    >>> back = read_weights(d)[0]
    >>> bool(np.allclose(back[0], m.get_weights()[0], rtol=2**-8))
    True
    """
    v.one_of("dtype", dtype, WEIGHT_DTYPES)
    if int(max_bytes) < MIN_FILE_BYTES:
        raise ValueError(f"`max_bytes` must be >= {MIN_FILE_BYTES}, got "
                         f"max_bytes={max_bytes!r}")
    max_bytes = int(max_bytes)
    directory = pathlib.Path(directory)
    values = []
    for variable in model.weights:
        value = np.asarray(keras.ops.convert_to_numpy(variable))
        if np.issubdtype(value.dtype, np.floating):
            if not np.isfinite(value).all():
                raise ValueError(
                    f"weight {variable.path!r} holds NaN or inf: the training "
                    "diverged; no weights were written")
            value = (to_bfloat16_bits(value) if dtype == "bfloat16"
                     else value.astype(np.float32))
            stored = dtype
        else:
            stored = value.dtype.name
        values.append((variable.path, value, stored))

    directory.mkdir(parents=True, exist_ok=True)
    (directory / WEIGHTS_MANIFEST).unlink(missing_ok=True)
    for old in directory.glob("weights-*.npz"):
        old.unlink()
    files, entries = {}, []
    current, used = {}, _FILE_OVERHEAD

    def flush():
        nonlocal current, used
        if current:
            name = f"weights-{len(files):05d}.npz"
            _write_npz(directory / name, current, max_bytes)
            files[name] = file_entry(directory / name)
        current, used = {}, _FILE_OVERHEAD

    for path, value, stored in values:
        flat = value.ravel()
        parts, start = [], 0
        while True:
            room = (max_bytes - used - _ARRAY_OVERHEAD) // flat.itemsize
            if current and room < min(flat.size - start, 1024):
                flush()  # (almost) full: the piece starts a new file
                continue
            take = min(room, flat.size - start)
            key = f"a{len(current)}"
            current[key] = flat[start:start + take]
            parts.append({"file": f"weights-{len(files):05d}.npz", "array": key,
                          "start": int(start), "size": int(take)})
            used += take * flat.itemsize + _ARRAY_OVERHEAD
            start += take
            if start >= flat.size:
                break
            flush()
        entries.append({"path": path, "shape": list(value.shape),
                        "dtype": stored, "parts": parts})
    flush()
    info = {"format": WEIGHTS_FORMAT, "dtype": dtype, **(extra or {}),
            "parameters": int(sum(int(np.prod(e["shape"])) for e in entries)),
            "weights": entries, "files": files}
    write_json(directory / WEIGHTS_MANIFEST, info)
    return info


def read_weights(directory, verify=True):
    """Reads what ``write_weights`` wrote.

    Args:
        directory: the weights folder.
        verify: check every file's size and SHA-256 first.

    Returns:
        ``(arrays, info)``: the weights in ``model.weights`` order, float32
        for floating ones (bfloat16 widened exactly), and the
        ``weights.json`` dict.

    Raises:
        FileNotFoundError: no ``weights.json`` or a listed file missing.
        ValueError: another format; a ``weights.json`` cut short, not a
            JSON object or without ``files``/``weights``; a file whose size
            or SHA-256 differs; (also with ``verify=False``) a damaged
            ``.npz`` or one whose values do not fit a weight's shape (the
            file and the weight named).
    """
    directory = pathlib.Path(directory)
    info = _read_weights_info(directory)
    if verify:
        check_files(directory, info["files"], what="weights folder")
    loaded = {}
    what = f"weights folder {str(directory)!r}"

    def array(file, key):
        if file not in loaded:
            loaded[file] = _load_npz(directory / file, what)
        if key not in loaded[file]:
            raise ValueError(f"{what}: {file} has no array {key!r} (listed in "
                             f"{WEIGHTS_MANIFEST}); copy the folder again")
        return loaded[file][key]

    arrays = []
    for i, entry in enumerate(info["weights"]):
        try:
            parts = [(p["file"], p["array"]) for p in entry["parts"]]
            shape = tuple(int(d) for d in entry["shape"])
            dtype = entry["dtype"]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{what}: {WEIGHTS_MANIFEST}'s weight {i} entry is "
                             f"damaged ({type(err).__name__}: {err})") from None
        pieces = [array(file, key) for file, key in parts]
        flat = np.concatenate(pieces) if pieces else np.zeros(0)
        if flat.size != int(np.prod(shape)):
            raise ValueError(
                f"{what}: weight {i} ({entry.get('path')!r}) has {flat.size} "
                f"values in {', '.join(sorted({file for file, _ in parts}))}, "
                f"its shape {shape} needs {int(np.prod(shape))}; the files do "
                f"not match {WEIGHTS_MANIFEST} (copy the folder again)")
        if dtype == "bfloat16":
            flat = from_bfloat16_bits(flat)
        arrays.append(flat.reshape(shape))
    return arrays, info


def _read_weights_info(directory, keys=None):
    """``weights.json`` of a weights folder, checked: valid JSON, an
    object of the weights format with ``files`` and ``weights`` (and
    ``keys``)."""
    directory = pathlib.Path(directory)
    path = directory / WEIGHTS_MANIFEST
    hint = ("copy the weights folder again (or write it with `keras-trm "
            "train-portable`)")
    if not path.is_file():
        raise FileNotFoundError(
            f"weights folder {str(directory)!r} has no {WEIGHTS_MANIFEST} (write "
            "it with `keras-trm train-portable`; its <workdir>/weights)")
    info = _read_manifest(path, hint, {})
    if info.get("format") != WEIGHTS_FORMAT:
        raise ValueError(f"{path}: format {info.get('format')!r}, expected "
                         f"{WEIGHTS_FORMAT!r}")
    return _read_manifest(path, hint, {"files": dict, "weights": list, **(keys or {})})


def load_weights(model, directory, verify=True):
    """Sets ``model``'s weights from a weights folder (``read_weights``).

    Raises:
        ValueError: the folder holds another number of weights, or a
            weight of another shape (the first mismatch is named), than
            ``model.weights``; errors of ``read_weights``.
    """
    arrays, info = read_weights(directory, verify=verify)
    weights = model.weights
    if len(arrays) != len(weights):
        raise ValueError(
            f"weights folder {str(directory)!r} holds {len(arrays)} weights, "
            f"the model {len(weights)}: not the same architecture")
    for i, (value, variable, entry) in enumerate(zip(arrays, weights, info["weights"])):
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"weight {i} ({entry['path']!r}) has shape {tuple(value.shape)} "
                f"in {str(directory)!r}, the model's ({variable.path!r}) is "
                f"{tuple(variable.shape)}: not the same architecture")
    model.set_weights(arrays)
    return model


def build_model(model_config, dtype=None):
    """The ``keras_trm.models.transformer`` of a manifest's ``model``
    entry (``vocabulary_size``, ``num_layers``, ``d_model``, ``num_heads``,
    ``d_ff``, ``dropout_rate``, ``max_sequence_length``, ``name``, and
    ``attention_dropout_rate`` in manifests since it became a flag);
    ``dtype``: its dtype policy (default: the global one)."""
    return transformer(**model_config, dtype=dtype)


def load_portable_model(weights_dir, dtype="float32"):
    """The model a weights folder holds (its ``weights.json``'s ``model``
    entry, built in ``dtype``) with those weights; any backend.

    Example (after ``keras-trm train-portable``)::

        model = load_portable_model("runs/portable/weights")
        ids = keras_trm.decoding.beam_search(model, source_ids)

    Raises:
        FileNotFoundError / ValueError: as ``read_weights`` (also a
            ``weights.json`` without its ``model`` entry); ``load_weights``'
            architecture mismatch.
    """
    info = _read_weights_info(weights_dir, {"model": dict})
    model = build_model(info["model"], dtype=dtype)
    return load_weights(model, weights_dir)
