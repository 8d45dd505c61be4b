"""The one prepared format of translation training: token ids written
once, memory-mapped by every trainer on every backend (fairseq's
``MMapIndexedDataset`` shape). A *prepared folder* holds
``manifest.json`` and, per split (one per training corpus), chunk files
of at most ``max_file_mib`` each (easy to move between machines):

- ``<split>-NNNNN.ids.npy``: int32 ``(tokens,)``, for each pair its source
  ids (END last), then its target ids (START first, END last);
- ``<split>-NNNNN.offsets.npy``: int64 ``(pairs + 1,)``, pair ``i``'s ids
  being ``ids[offsets[i]:offsets[i + 1]]``;
- ``<split>-NNNNN.source_lengths.npy``: int32 ``(pairs,)``, how many of
  them are the source's.

``manifest.json`` records the format, the *key* (what the ids depend on:
the corpus files' paths, sizes and modification times, the vocabulary's
SHA-256 and size, ``max_train_length``, ``limit``), each split's counts
(lines, pairs kept, blank and too-long pairs dropped, tokens, the longest
pair) and every file's size and SHA-256.

``prepare_translation_data`` writes a staging folder and swaps it in only
when complete; ``read_prepared`` checks a folder and opens its splits
memory-mapped (``PreparedSplit``). numpy only: any Keras backend.
"""

import contextlib
import hashlib
import itertools
import json
import os
import pathlib
import shutil
import tempfile

import numpy as np

from keras_trm.utils import checks as v
from keras_trm.utils.files import usual_permissions, write_json
from keras_trm.utils.ids import END_ID, START_ID

FORMAT = "keras_trm.prepared/1"
MANIFEST = "manifest.json"
MIB = 1 << 20
ARRAYS = ("ids", "offsets", "source_lengths")
_CHUNK_LINES = 8192


def sha256_file(path):
    """SHA-256 of a file's bytes (64 hex digits), read a MiB at a time.

    Example:

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = p.write_text("abc")
    >>> sha256_file(p)[:16]
    'ba7816bf8f01cfea'
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def file_identity(path):
    """``{"path", "size", "mtime_ns"}`` of a corpus file (in a prepared
    folder's key: a changed file is prepared again); FileNotFoundError
    (named) if ``path`` is not a file."""
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {str(path)!r} does not exist")
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


# -- writing ----------------------------------------------------------------------


class _SplitWriter:
    """Appends pairs to one split's chunk files, starting a new chunk
    before one would pass ``max_bytes`` (its three files together)."""

    def __init__(self, directory, split, max_bytes):
        self.directory, self.split, self.max_bytes = directory, split, max_bytes
        self.chunks, self._pending, self._bytes = [], [], 0
        self._room = max_bytes - 3 * 128 - 8  # three .npy headers, offsets[0]

    def add(self, ids, source_lengths, target_lengths):
        """Pairs laid out one after the other in ``ids`` (int32: source
        with END, then START, target, END), with their lengths."""
        n_source = np.asarray(source_lengths, np.int64)
        n_pair = n_source + np.asarray(target_lengths, np.int64)
        cost = 4 * n_pair + 12  # ids, an offset, a source length
        if cost.size and cost.max() > self._room:
            raise ValueError(f"one pair takes {int(cost.max())} bytes, more than a "
                             f"file of max_file_mib={self.max_bytes / MIB:g} holds")
        ends, first = np.concatenate([[0], np.cumsum(n_pair)]), 0
        while first < len(cost):
            spent = np.cumsum(cost[first:])
            take = int(np.searchsorted(spent, self._room - self._bytes, side="right"))
            if take:  # the pairs that fit in this chunk
                last = first + take
                self._pending.append((ids[ends[first]:ends[last]], n_source[first:last],
                                      n_pair[first:last]))
                self._bytes += int(spent[take - 1])
                first = last
            if first < len(cost):
                self.flush()

    def flush(self):
        if not self._pending:
            return
        ids, n_source, n_pair = (np.concatenate(x) for x in zip(*self._pending))
        arrays = {"ids": ids.astype(np.int32),
                  "offsets": np.concatenate([[0], np.cumsum(n_pair)]).astype(np.int64),
                  "source_lengths": n_source.astype(np.int32)}
        stem = f"{self.split}-{len(self.chunks):05d}"
        chunk = {"pairs": len(n_source)}
        for name, array in arrays.items():
            file = f"{stem}.{name}.npy"
            np.save(self.directory / file, array, allow_pickle=False)
            chunk[name] = file
        self.chunks.append(chunk)
        self._pending, self._bytes = [], 0


def _pairs(source_path, target_path, limit):
    from keras_trm.data.translation import CorpusError, iter_lines

    sources, targets = iter_lines(source_path), iter_lines(target_path)
    for n, (s, t) in enumerate(itertools.zip_longest(sources, targets), 1):
        if limit and n > limit:
            return
        if s is None or t is None:
            short = source_path if s is None else target_path
            raise CorpusError(f"corpus files {str(source_path)!r} and "
                              f"{str(target_path)!r} differ in length: "
                              f"{str(short)!r} ends at line {n - 1}")
        yield s, t


def _outside(ids, vocabulary_size):
    """An id of ``ids`` outside ``[0, vocabulary_size)`` (the largest
    first), or None."""
    if not len(ids):
        return None
    low, high = int(ids.min()), int(ids.max())
    return high if high >= vocabulary_size else (low if low < 0 else None)


def _prepare_split(writer, source_path, target_path, encode, vocabulary_size,
                   max_train_length, limit):
    counts = {"lines": 0, "pairs": 0, "blank": 0, "too_long": 0,
              "source_tokens": 0, "target_tokens": 0, "max_pair_length": 0}
    pairs = _pairs(source_path, target_path, limit)
    while chunk := list(itertools.islice(pairs, _CHUNK_LINES)):
        counts["lines"] += len(chunk)
        kept = [(s, t) for s, t in chunk if s.strip() and t.strip()]
        counts["blank"] += len(chunk) - len(kept)
        if not kept:
            continue
        sources = encode([s for s, _ in kept])
        targets = encode([t for _, t in kept])
        n_source = np.fromiter(map(len, sources), np.int64, len(kept)) + 1  # + END
        n_target = np.fromiter(map(len, targets), np.int64, len(kept)) + 2  # START, END
        keep = (n_source <= max_train_length) & (n_target <= max_train_length)
        counts["too_long"] += int(len(kept) - keep.sum())
        rows, n_source, n_target = np.flatnonzero(keep), n_source[keep], n_target[keep]
        if not len(rows):
            continue
        end, start = np.array([END_ID], np.int32), np.array([START_ID], np.int32)
        parts = []
        for r in rows:  # source, END, START, target, END: one concatenation
            parts += (sources[r], end, start, targets[r], end)
        ids = np.concatenate(parts).astype(np.int32)
        bad = _outside(ids, vocabulary_size)
        if bad is not None:
            raise ValueError(f"`encode` gave id {bad} outside the vocabulary of "
                             f"{vocabulary_size} ids")
        writer.add(ids, n_source, n_target)
        counts["pairs"] += len(rows)
        counts["source_tokens"] += int(n_source.sum())
        counts["target_tokens"] += int(n_target.sum()) - len(rows)  # labels
        counts["max_pair_length"] = max(counts["max_pair_length"], int(n_source.max()),
                                        int(n_target.max()) - 1)
    writer.flush()
    return counts


def prepare_translation_data(directory, corpora, encode, vocabulary_size,
                             vocabulary_sha256, max_train_length=256, limit=0,
                             max_file_mib=16.0, reuse=True):
    """Tokenizes parallel corpora once into a prepared folder (the module
    docstring's format), or reuses the folder when its key matches.

    Pairs blank on either side are dropped, and pairs whose source ids +
    END or START + target ids + END exceed ``max_train_length`` tokens;
    the rest keep the corpus order. 8,192 lines are in memory at a time.

    Args:
        directory: the prepared folder.
        corpora: ``(split, source_path, target_path)`` tuples: line-aligned
            UTF-8 files, plain or ``.gz``.
        encode: callable, a list of str -> a list of int sequences (content
            ids, no START/END), e.g. ``sentencepiece``'s ``encode``.
        vocabulary_size: int, ids must be below it.
        vocabulary_sha256: str, the vocabulary file's hash (in the key: another
            vocabulary is prepared again, never mixed).
        max_train_length: int >= 2, the longest kept sequence (tokens).
        limit: int >= 0, the first ``limit`` lines of each corpus (0: all).
        max_file_mib: float > 0, the largest chunk file (MiB).
        reuse: reuse a folder whose manifest has the same key.

    Returns:
        dict: the manifest, plus ``"reused"`` (bool) and ``"directory"``.

    Raises:
        ValueError: a bad argument (named), an id outside the vocabulary,
            no pair kept in a corpus, a pair larger than a file.
        FileNotFoundError / CorpusError: a corpus file missing, not UTF-8,
            damaged gzip, or line counts that differ (file and line named).

    Example:

    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "x.en").write_text("a b\\nb\\n\\nb a a\\n")
    >>> _ = (d / "x.de").write_text("b\\nb a\\nc\\na\\n")
    >>> def encode(lines):
    ...     return [[4 + "ab".index(w) for w in line.split()] for line in lines]
    >>> m = prepare_translation_data(d / "prepared", [("train", d / "x.en", d / "x.de")],
    ...                              encode, 6, "0" * 64)
    >>> m["splits"]["train"]["pairs"], m["splits"]["train"]["blank"]
    (3, 1)
    >>> split = read_prepared(d / "prepared", vocabulary_size=6).splits["train"]
    >>> split.source_ids(0).tolist(), split.target_ids(0).tolist()
    ([4, 5, 3], [2, 5, 3])
    """
    directory = pathlib.Path(directory)
    max_train_length = v.positive_int("max_train_length", max_train_length)
    if max_train_length < 2:
        raise ValueError("`max_train_length` must be >= 2 (a token and END), "
                         f"got max_train_length={max_train_length}")
    limit = v.non_negative_int("limit", limit)
    vocabulary_size = v.positive_int("vocabulary_size", vocabulary_size)
    max_bytes = int(v.positive_float("max_file_mib", max_file_mib) * MIB)
    if max_bytes < 4096:
        raise ValueError(f"`max_file_mib` must be at least 4 KiB, got "
                         f"max_file_mib={max_file_mib!r}")
    corpora = [(str(split), pathlib.Path(s), pathlib.Path(t))
               for split, s, t in corpora]
    names = [c[0] for c in corpora]
    if not corpora or len(set(names)) != len(names) or not all(
            n and not n.startswith(".") and all(c.isalnum() or c in "_.-" for c in n)
            for n in names):
        raise ValueError("`corpora` must name each split once, with letters, digits, "
                         f"'_', '-' or '.' (a file name), got splits {names!r}")
    key = {"format": FORMAT,
           "corpora": {n: [file_identity(s), file_identity(t)] for n, s, t in corpora},
           "vocabulary_sha256": str(vocabulary_sha256),
           "vocabulary_size": vocabulary_size,
           "max_train_length": max_train_length, "limit": limit}
    if reuse:
        current = _read_manifest_or_none(directory)
        if current is not None and current.get("key") == key:
            return {**current, "reused": True, "directory": str(directory)}
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(dir=directory.parent,
                                            prefix=f".{directory.name}.staging-"))
    try:
        splits = {}
        for split, source_path, target_path in corpora:
            writer = _SplitWriter(staging, split, max_bytes)
            counts = _prepare_split(writer, source_path, target_path, encode,
                                    vocabulary_size, max_train_length, limit)
            if not counts["pairs"]:
                raise ValueError(
                    f"corpus {split!r} ({str(source_path)!r}, {str(target_path)!r}) "
                    f"kept no pair: {counts['lines']} lines, {counts['blank']} "
                    f"blank, {counts['too_long']} over max_train_length="
                    f"{max_train_length}")
            splits[split] = {**counts, "chunks": writer.chunks}
        files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
                 for p in sorted(staging.glob("*.npy"))}
        manifest = {"format": FORMAT, "key": key, "splits": splits, "files": files}
        write_json(staging / MANIFEST, manifest)
        _swap_in(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {**manifest, "reused": False, "directory": str(directory)}


def _swap_in(staging, directory):
    """Replaces ``directory`` by the complete ``staging`` folder; the old
    one is renamed aside first and removed last, so a kill never leaves a
    mix of both."""
    for p in staging.iterdir():
        usual_permissions(p)
    usual_permissions(staging)
    old = None
    if directory.exists():
        old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
        os.rename(directory, old)
    os.rename(staging, directory)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- reading ----------------------------------------------------------------------


def _read_manifest_or_none(directory):
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((pathlib.Path(directory) / MANIFEST).read_text("utf-8"))
        if isinstance(data, dict) and data.get("format") == FORMAT:
            return data
    return None


_DTYPES = {"ids": np.int32, "offsets": np.int64, "source_lengths": np.int32}
_MISFIT = "does not fit its ids and source lengths"


def _open_array(directory, file, kind):
    """One chunk file, memory-mapped; a file numpy cannot map (cut short,
    a damaged header) or of another dtype or rank is refused, named."""
    try:
        array = np.load(directory / file, mmap_mode="r", allow_pickle=False)
    except ValueError as err:
        raise _refuse(file, f"cannot be read ({err})", directory) from None
    if array.ndim != 1 or array.dtype != _DTYPES[kind]:
        raise _refuse(file, f"holds {array.dtype} {array.shape}, not 1-D "
                      f"{np.dtype(_DTYPES[kind])}", directory)
    return array


class PreparedSplit:
    """One split of a prepared folder, memory-mapped: what is read stays
    in the page cache, not in Python objects.

    Attributes:
        pairs: int, the number of pairs.
        pair_lengths: int32 ``(pairs,)``, ``max(len(source), len(target)
            - 1)`` of each pair (tokens, what it is bucketed by); the one
            per-pair array held in memory.

    Methods: ``source_ids(i)``, ``target_ids(i)``: int32 ids of pair ``i``;
    ``chunk_of(rows)``: the chunk and the row within it of global rows.
    ``vocabulary_size``, ``check_ids``: as in ``read_prepared``.
    """

    def __init__(self, directory, name, chunks, vocabulary_size=None, check_ids=False):
        self.name = name
        self.chunks = [{k: _open_array(directory, c[k], k) for k in ARRAYS}
                       for c in chunks]
        self.bases = np.cumsum([0] + [len(c["source_lengths"]) for c in self.chunks])
        self.pairs = int(self.bases[-1])
        parts = []
        for i, (names, c) in enumerate(zip(chunks, self.chunks)):
            offsets, n_source = c["offsets"], np.asarray(c["source_lengths"], np.int32)
            n_pair = np.diff(np.asarray(offsets)).astype(np.int32)
            if (len(offsets) != len(n_source) + 1 or offsets[0] != 0
                    or offsets[-1] != len(c["ids"]) or check_ids and (
                        np.any(n_pair < n_source) or np.any(n_source < 1))):
                raise _refuse(names["offsets"], _MISFIT, directory)
            bad = None if not check_ids or vocabulary_size is None else _outside(
                c["ids"], vocabulary_size)
            if bad is not None:
                raise _refuse(names["ids"], f"holds id {bad}, outside the vocabulary of "
                              f"{vocabulary_size} ids", directory)
            parts.append(np.maximum(n_source, n_pair - n_source - 1))
            self.release(i)  # one chunk's pages resident at a time
        self.pair_lengths = (np.concatenate(parts) if parts
                             else np.zeros(0, np.int32))

    def __len__(self):
        return self.pairs

    def release(self, chunk=None):
        """Drops the pages of the mapped files (of one ``chunk``, default
        all) from this process's resident memory (``madvise(MADV_DONTNEED)``
        on read-only mappings: the next read maps them again from the page
        cache). The loader calls it after each batch, so the RSS stays flat
        in the corpus size."""
        import mmap

        for arrays in self.chunks if chunk is None else [self.chunks[chunk]]:
            for array in arrays.values():
                handle = getattr(array, "_mmap", None)
                if handle is not None and hasattr(mmap, "MADV_DONTNEED"):
                    handle.madvise(mmap.MADV_DONTNEED)

    def chunk_of(self, rows):
        rows = np.asarray(rows, np.int64)
        chunk = np.searchsorted(self.bases, rows, side="right") - 1
        return chunk, rows - self.bases[chunk]

    def _ids(self, i):
        (chunk,), (row,) = self.chunk_of([i])
        c = self.chunks[chunk]
        start, end = int(c["offsets"][row]), int(c["offsets"][row + 1])
        return np.asarray(c["ids"][start:end]), int(c["source_lengths"][row])

    def source_ids(self, i):
        ids, n = self._ids(i)
        return ids[:n]

    def target_ids(self, i):
        ids, n = self._ids(i)
        return ids[n:]


class Prepared:
    """A checked prepared folder: ``manifest`` (dict), ``splits`` (``{name:
    PreparedSplit}``), ``directory``."""

    def __init__(self, directory, manifest, splits):
        self.directory, self.manifest, self.splits = directory, manifest, splits


def _refuse(path, problem, directory):
    return ValueError(f"prepared folder {str(directory)!r}: {path} {problem}; "
                      "prepare it again (the translation job does so when its "
                      "folder is removed)")


def read_prepared(directory, vocabulary_size=None, key=None, verify=True,
                  check_ids=True):
    """Opens and checks a prepared folder (``prepare_translation_data``).

    Args:
        directory: the folder.
        vocabulary_size: int or None: every id must be below it.
        key: dict or None: the key the caller expects; a folder made under
            another is refused.
        verify: check every file's size and SHA-256 against the manifest.
        check_ids: read every split's ids once to check their range and
            offsets.

    Returns:
        ``Prepared``.

    Raises:
        FileNotFoundError: no folder, no manifest or a listed file missing.
        NotADirectoryError: ``directory`` is a file.
        ValueError: a damaged or foreign manifest, a file whose size or
            SHA-256 differs, another key or vocabulary, an id outside the
            vocabulary (the file named).
    """
    directory = pathlib.Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"prepared folder {str(directory)!r} is a file, "
                                 "not a folder")
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"prepared folder {str(directory)!r} has no {MANIFEST}")
    try:
        manifest = json.loads(path.read_text("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise _refuse(MANIFEST, f"is not valid JSON ({err})", directory) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _refuse(MANIFEST, f"is not a manifest of format {FORMAT!r}", directory)
    for entry, kind in (("key", dict), ("splits", dict), ("files", dict)):
        if not isinstance(manifest.get(entry), kind):
            raise _refuse(MANIFEST, f"has no {entry!r} object", directory)
    if key is not None and manifest["key"] != key:
        differ = sorted(k for k in set(key) | set(manifest["key"])
                        if key.get(k) != manifest["key"].get(k))
        raise _refuse(MANIFEST, f"was prepared with other settings ({', '.join(differ)})",
                      directory)
    if vocabulary_size is not None and manifest["key"].get("vocabulary_size") != vocabulary_size:
        raise _refuse(MANIFEST, f"is for a vocabulary of "
                      f"{manifest['key'].get('vocabulary_size')} ids, not {vocabulary_size}",
                      directory)
    for name, entry in manifest["files"].items():
        file = directory / name
        if not file.is_file():
            raise FileNotFoundError(f"prepared folder {str(directory)!r}: {name} "
                                    "is missing (listed in its manifest); copy the "
                                    "whole folder")
        if verify and (file.stat().st_size != entry.get("bytes")
                       or sha256_file(file) != entry.get("sha256")):
            raise _refuse(name, "differs from its manifest entry (size or SHA-256): "
                          "damaged or cut short", directory)
    splits = {}
    for name, entry in manifest["splits"].items():
        chunks = entry.get("chunks") if isinstance(entry, dict) else None
        if not isinstance(chunks, list) or not all(
                isinstance(c, dict) and all(c.get(k) in manifest["files"] for k in ARRAYS)
                for c in chunks):
            raise _refuse(MANIFEST, f"lists damaged chunks for split {name!r}", directory)
        splits[name] = PreparedSplit(directory, name, chunks, vocabulary_size, check_ids)
    return Prepared(directory, manifest, splits)
