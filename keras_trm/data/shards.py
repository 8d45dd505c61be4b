"""Streaming translation data: prepared TFRecord shards and token-count
batches read from them, with memory flat in the corpus size. This is the
one input pipeline of translation training: the jobs, the library example
of the README, the notebooks and the tests all train on its batches.

The work is split in two:

``prepare_shards`` (once per corpus and vocabulary)
    reads a line-aligned parallel corpus (plain or ``.gz``) line by line,
    tokenizes it in chunks with the job's in-graph tokenizer
    (``TextTokenizer`` or ``SentencePieceTokenizer``), applies the job's
    filters (pairs blank on either side are dropped; pairs whose source
    ids + END or START + target ids + END exceed ``max_train_length`` are
    dropped) and writes the kept pairs, in corpus order, to TFRecord
    shards of ``pairs_per_shard`` pairs. Each shard is written under a
    temporary name and renamed into place; ``manifest.json`` is written
    last. A later call with the same key (corpus files' paths, sizes and
    modification times, the tokenizer's vocabulary hash, ``max_train_length``,
    ``pairs_per_shard``, ``limit``) reuses the files; a folder without a valid
    manifest (an interrupted run) is rewritten. ``shards_from_pairs`` does
    the same for pairs held in memory (lists of strings): it writes them,
    in chunks, as a line-aligned corpus into a (temporary) folder and
    prepares that.

``stream_batches`` (every run)
    a ``tf.data`` pipeline over the shards with token-count batches
    (Vaswani et al. 2017, §5.1: "Sentence pairs were batched together by
    approximate sequence length. Each training batch contained a set of
    sentence pairs containing approximately 25000 source tokens and 25000
    target tokens."): each pair goes to the smallest bucket boundary ``L``
    that holds ``max(len(source ids), len(target ids) - 1)``; a bucket of
    boundary ``L`` holds ``tokens_per_batch // L`` pairs padded to exactly
    ``(batch, L)``, so each bucket has one static shape (XLA compiles once
    per bucket). ``stream_steps`` counts one epoch's batches;
    ``mix_batches`` samples several prepared corpora with weights.

Record format: each TFRecord record is one pair, the little-endian int32
vector ``[n_source, n_target, source ids (END last)..., target ids (START
first, END last)...]``; the ids are those ``_encode`` in the job builds.

Order and batches (documented, tested):

- Shuffling is local, not global: every epoch the shard order is permuted
  (seeded), ``cycle_length`` shards are read interleaved, and the pairs are
  permuted in consecutive blocks of ``shuffle_buffer`` pairs with a
  stateless seeded permutation (seed, epoch, block). Order depends on
  ``seed`` and the epoch only (not on TensorFlow's global seed), so a
  restarted process reproduces it.
- Bucketing is done block by block, vectorized (no per-pair Python, no
  ``group_by_window`` dataset per window, which measured several times
  slower here): a ``tf.data`` ``scan`` sorts each block of
  ``shuffle_buffer`` pairs into buckets, emits every full batch and
  carries each bucket's unfilled rest (< one batch) into the next block,
  so the batches are exactly those of grouping the whole epoch by bucket.
  A block's batches come out in a seeded permuted order (not a
  permutation of all the epoch's batches).
- Partial last windows: at the end of each epoch every bucket's unfilled
  rest is emitted as one short batch filled with all-padding rows to
  ``(batch, L)``, so every pair of the epoch is seen once and shapes stay
  static; the loss ignores padding rows. Nothing is dropped.

Memory: blocks of encoded pairs (``shuffle_buffer`` records of about 0.27
KB each), their decoded batches in flight (tf.data AUTOTUNE), the carried
rests and the prefetch buffer: about 200 MB above the process baseline in
``bench/bench_data_pipeline.py`` at 0.2M and at 5M pairs alike (peak RSS
grew 12 MB from 0.2M to 5M pairs).

In a job: ``prepare_shards`` on the chief (or once before the run; two
processes writing one folder at once is not supported), then every worker
``stream_batches(folder, ..., worker_index=i, num_workers=n, repeat=True,
position=position)`` with ``stream_steps`` (the minimum over workers) as
the steps per epoch.

Resume: ``stream_batches`` iterators can be saved with
``tf.train.Checkpoint(iterator=iterator)`` (exact: the restored iterator
yields exactly the remaining batches, also from the middle of a shard);
or, without a checkpoint, ``start_epoch`` / ``skip_batches`` (or a
``position`` object, ``keras_trm.training.DataPosition``) give the batches
of an uninterrupted run from that point, since every epoch's order is a
pure function of ``(seed, epoch)``.
"""

import atexit
import filecmp
import hashlib
import itertools
import json
import os
import pathlib
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from keras_trm.data.batching import DEFAULT_BOUNDARIES
from keras_trm.data.translation import CorpusError, decoded_lines
from keras_trm.utils import checks as v
from keras_trm.utils.files import usual_permissions, write_json

FORMAT = "keras_trm.shards/1"
MANIFEST = "manifest.json"
_SHARD_GLOB = "shard-*.tfrecord"
_START_ID, _END_ID = 2, 3  # keras_trm.text.START_ID / END_ID (no import cycle)


# -- preparation --------------------------------------------------------------


def tokenizer_fingerprint(tokenizer):
    """SHA-256 of what defines a tokenizer's ids: a SentencePiece model's
    bytes (``model_proto``, the ``.model`` file), else the vocabulary as
    ``save_vocabulary`` writes it (one token a line), so it equals the
    hash of the vocabulary file.

    Args:
        tokenizer: ``keras_trm.text.TextTokenizer`` or
            ``SentencePieceTokenizer`` (or any object with ``vocabulary``).

    Returns:
        str, 64 hex digits.

    Example:

    >>> class Tok:
    ...     vocabulary = ["[PAD]", "[UNK]", "[START]", "[END]", "a"]
    >>> tokenizer_fingerprint(Tok())[:12]
    '220285505c53'
    """
    proto = getattr(tokenizer, "model_proto", None)
    if proto is not None:
        return hashlib.sha256(bytes(proto)).hexdigest()
    text = "\n".join(tokenizer.vocabulary) + "\n"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _file_identity(path):
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {str(path)!r} does not exist")
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _key(files, fingerprint, max_train_length, pairs_per_shard, skip_blank,
         limit):
    # "max_length": the name before the rename, kept in the hashed blob so
    # that shards prepared before it stay valid (not rewritten).
    blob = json.dumps({
        "format": FORMAT, "files": files, "tokenizer": fingerprint,
        "max_length": int(max_train_length),
        "pairs_per_shard": int(pairs_per_shard),
        "skip_blank": bool(skip_blank), "limit": int(limit)}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _line_chunks(source_path, target_path, chunk_size, limit=0):
    """Yields lists of (source, target) lines, ``chunk_size`` at a time (the
    first ``limit`` lines only if ``limit`` > 0). Invalid UTF-8 or a damaged
    gzip file raises ``CorpusError`` naming the file and the line."""
    missing = object()
    readers = [decoded_lines(source_path), decoded_lines(target_path)]
    try:
        chunk, n = [], 0
        for s, t in itertools.zip_longest(*readers, fillvalue=missing):
            if s is missing or t is missing:
                longer = source_path if t is missing else target_path
                raise ValueError(
                    f"parallel corpus line counts differ: "
                    f"{str(source_path)!r} and {str(target_path)!r} "
                    f"agree on {n} lines, then {str(longer)!r} goes on")
            chunk.append((s, t))
            n += 1
            if len(chunk) == chunk_size:
                yield chunk
                chunk = []
            if limit and n >= limit:
                break
        if chunk:
            yield chunk
    finally:
        for reader in readers:
            reader.close()


def read_manifest(directory):
    """The manifest of a prepared folder, or ``None`` when the folder holds
    no complete preparation (no or unreadable ``manifest.json``, or a
    listed shard missing or of another size than recorded).

    Args:
        directory: the folder given to ``prepare_shards``.

    Returns:
        dict (see ``prepare_shards``) or ``None``.

    Example:

    >>> import tempfile
    >>> read_manifest(tempfile.mkdtemp()) is None
    True
    """
    directory = pathlib.Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None
    for shard in manifest.get("shards", ()):
        path = directory / shard["file"]
        if not path.is_file() or path.stat().st_size != shard["bytes"]:
            return None
    manifest["directory"] = str(directory)
    return manifest


def prepare_shards(source_path, target_path, tokenizer, directory,
                   max_train_length=128, pairs_per_shard=100_000, chunk_size=10_000,
                   skip_blank=True, limit=0, max_length=None):
    """Tokenizes a parallel corpus into TFRecord shards, streaming (never
    the whole corpus in memory); reuses an earlier preparation with the
    same key.

    Ids are those of the translation job: source ids + END, START + target
    ids + END. Dropped, as the job does: pairs blank on either side
    (``skip_blank``), then pairs whose source or target ids (with START /
    END) are longer than ``max_train_length``. Kept pairs go to the shards in
    corpus order, ``pairs_per_shard`` per shard (the last one shorter).

    Args:
        source_path, target_path: UTF-8 text files, plain or ``.gz``, line
            *i* of one translating line *i* of the other.
        tokenizer: ``keras_trm.text.TextTokenizer`` or
            ``SentencePieceTokenizer``: ``tokenize(str (n,))`` -> ragged
            int32 ``(n, None)`` without START/END.
        directory: output folder (created). Holds ``shard-NNNNN.tfrecord``
            files and ``manifest.json``; other shard files found there are
            deleted when it is (re)written.
        max_train_length: int >= 2, the longest id sequence kept
            (START/END included). ``max_length``: its old name, deprecated.
        pairs_per_shard: int > 0. For ``num_workers`` workers reading
            their own shards, make the corpus give at least that many
            shards (and a multiple of it for balanced workers).
        chunk_size: lines tokenized per call (bounds the memory).
        skip_blank: drop pairs blank on either side.
        limit: int > 0: only the first ``limit`` lines (the job's smoke
            runs, ``TranslationConfig.limit``); 0: all.

    Returns:
        dict, the manifest: ``format``, ``key``, ``files`` (path, size,
        mtime_ns of each corpus file), ``tokenizer`` (vocabulary SHA-256),
        ``max_train_length``, ``lines`` (read), ``blank`` and ``too_long``
        (dropped), ``pairs`` (kept), ``source_tokens`` and
        ``target_tokens`` (ids of the kept pairs: source + END, and the
        labels, target + END, the job's ``real_tokens``),
        ``max_pair_length`` (longest
        ``max(len(source), len(target) - 1)``), ``shards``: list of
        ``{"file", "pairs", "bytes", "length_counts"}`` where
        ``length_counts[n]`` is the number of pairs of that pair length
        (what ``stream_steps`` counts batches from), and ``directory``.
        ``reused`` is True when nothing was written.

    An earlier preparation in ``directory`` stays as it was until the new
    one is complete: the new shards are written into a hidden staging
    folder there and swapped in last, so an error (no pair left, a corrupt
    file, a tokenizer error) leaves the old shards and manifest usable.

    Raises:
        FileNotFoundError: a corpus file is missing.
        TypeError: ``max_train_length``, ``pairs_per_shard``,
            ``chunk_size`` or ``limit`` not an int (the message names it).
        ValueError: the files' line counts differ, ``max_train_length`` < 2,
            ``pairs_per_shard`` or ``chunk_size`` < 1, ``limit`` < 0, or no
            pair is left after filtering.
        CorpusError: (a ``ValueError``) a file is not valid UTF-8 or not a
            readable gzip file (the message names it and the line).

    Example:

    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "x.en").write_text("a b\\n\\nb a a\\n")
    >>> _ = (d / "x.de").write_text("b\\nb\\na\\n")
    >>> class Tok:  # stands in for TextTokenizer: one id per letter
    ...     vocabulary = ["[PAD]", "[UNK]", "[START]", "[END]", "a", "b"]
    ...     def tokenize(self, s):
    ...         return tf.ragged.constant([[4 + "ab".index(w) for w in x.split()]
    ...                                    for x in s.numpy().astype(str)], tf.int32)
    >>> m = prepare_shards(d / "x.en", d / "x.de", Tok(), d / "shards")
    >>> m["lines"], m["blank"], m["pairs"], len(m["shards"]), m["reused"]
    (3, 1, 2, 1, False)
    >>> prepare_shards(d / "x.en", d / "x.de", Tok(), d / "shards")["reused"]
    True
    """
    max_train_length = _prepare_args(
        v.renamed("max_length", max_length, "max_train_length",
                  max_train_length), pairs_per_shard, chunk_size, limit)
    files = [_file_identity(source_path), _file_identity(target_path)]
    return _prepare(source_path, target_path, files, tokenizer, directory,
                    max_train_length, int(pairs_per_shard), int(chunk_size),
                    skip_blank, int(limit))


def _prepare_args(max_train_length, pairs_per_shard, chunk_size, limit):
    """Checks ``prepare_shards``' numbers (before anything is written);
    returns ``max_train_length``."""
    max_train_length = v.positive_int("max_train_length", max_train_length)
    if max_train_length < 2:
        raise ValueError("`max_train_length` must be >= 2 (an END and a "
                         f"token), got max_train_length={max_train_length}")
    v.positive_int("pairs_per_shard", pairs_per_shard)
    v.positive_int("chunk_size", chunk_size)
    v.non_negative_int("limit", limit)
    return max_train_length


def _prepare(source_path, target_path, files, tokenizer, directory,
             max_train_length, pairs_per_shard, chunk_size, skip_blank, limit,
             before_swap=None, shown=None):
    """``prepare_shards`` reading ``source_path`` / ``target_path`` under
    the key of ``files`` (their identities). The new shards are written
    into a hidden staging folder inside ``directory`` and swapped in only
    once the whole corpus is read and some pair is kept: an error (a
    corrupt file, no pair left, a tokenizer error) leaves an earlier
    preparation there as it was. ``before_swap()`` runs just before the
    swap (``shards_from_pairs`` moves its text files into place);
    ``shown``: the two paths its messages name (default: those read)."""
    directory = pathlib.Path(directory)
    fingerprint = tokenizer_fingerprint(tokenizer)
    key = _key(files, fingerprint, max_train_length, pairs_per_shard, skip_blank,
               limit)
    old = read_manifest(directory)
    if old is not None and old.get("key") == key:
        if before_swap is not None:
            before_swap()
        old["reused"] = True
        if "max_length" in old:  # written before the rename
            old.setdefault("max_train_length", old.pop("max_length"))
        return old

    directory.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(dir=directory, prefix=".prepare-"))

    stats = {"lines": 0, "blank": 0, "too_long": 0, "pairs": 0,
             "source_tokens": 0, "target_tokens": 0, "max_pair_length": 0}
    shards = []
    writer = None

    def open_shard():
        fd, tmp = tempfile.mkstemp(dir=staging, prefix=".shard-",
                                   suffix=".tmp")
        os.close(fd)
        usual_permissions(tmp)
        return {"tmp": tmp, "writer": tf.io.TFRecordWriter(tmp), "pairs": 0,
                "counts": np.zeros(max_train_length + 1, np.int64)}

    def close_shard(shard):
        shard["writer"].close()
        name = f"shard-{len(shards):05d}.tfrecord"
        os.replace(shard["tmp"], staging / name)
        counts = shard["counts"]
        last = int(np.max(np.nonzero(counts)[0])) if counts.any() else 0
        shards.append({"file": name, "pairs": shard["pairs"],
                       "bytes": (staging / name).stat().st_size,
                       "length_counts": counts[: last + 1].tolist()})

    try:
        for chunk in _line_chunks(source_path, target_path, chunk_size, limit):
            stats["lines"] += len(chunk)
            if skip_blank:
                kept = [p for p in chunk if p[0].strip() and p[1].strip()]
                stats["blank"] += len(chunk) - len(kept)
                chunk = kept
            if not chunk:
                continue
            records, lengths, tokens = _encode_chunk(tokenizer, chunk,
                                                     max_train_length)
            stats["source_tokens"] += tokens[0]
            stats["target_tokens"] += tokens[1]
            stats["too_long"] += len(chunk) - len(records)
            for record, length in zip(records, lengths):
                if writer is None:
                    writer = open_shard()
                writer["writer"].write(record)
                writer["pairs"] += 1
                writer["counts"][length] += 1
                if writer["pairs"] == pairs_per_shard:
                    close_shard(writer)
                    writer = None
            stats["pairs"] += len(records)
            if len(lengths):
                stats["max_pair_length"] = max(stats["max_pair_length"],
                                               int(np.max(lengths)))
        if writer is not None:
            close_shard(writer)
            writer = None

        if not stats["pairs"]:
            shown = shown or (source_path, target_path)
            raise ValueError(
                f"no pair of {str(shown[0])!r} / {str(shown[1])!r} is "
                f"left after dropping blank pairs and pairs over "
                f"{max_train_length} tokens ({stats})")
        manifest = {"format": FORMAT, "key": key, "files": files,
                    "tokenizer": fingerprint,
                    "max_train_length": max_train_length,
                    "pairs_per_shard": pairs_per_shard,
                    "skip_blank": bool(skip_blank), **stats, "shards": shards}

        # The swap. Invalidate first: a crash from here on leaves no
        # manifest (the folder is rewritten by the next call).
        (directory / MANIFEST).unlink(missing_ok=True)
        if before_swap is not None:
            before_swap()
        for stale in list(directory.glob(_SHARD_GLOB)) + list(
                directory.glob(".shard-*.tmp")):
            stale.unlink()
        for stage in directory.glob(".prepare-*"):  # of a crashed run
            if stage != staging:
                shutil.rmtree(stage, ignore_errors=True)
        for shard in shards:
            os.replace(staging / shard["file"], directory / shard["file"])
        write_json(directory / MANIFEST, manifest)  # last: marks it complete
    finally:
        if writer is not None:
            writer["writer"].close()
        shutil.rmtree(staging, ignore_errors=True)
    return dict(manifest, directory=str(directory), reused=False)


# The line-aligned corpus ``shards_from_pairs`` writes beside the shards.
PAIR_FILES = ("source.txt", "target.txt")


def shards_from_pairs(sources, targets, tokenizer, directory=None,
                      max_train_length=128, pairs_per_shard=100_000,
                      chunk_size=10_000, skip_blank=True, max_length=None):
    """``prepare_shards`` for translation pairs held in memory: a small
    corpus (a notebook's, a test's, the README's example) goes through the
    jobs' own input pipeline, so ``stream_batches`` gives it the batches
    the jobs train on.

    The pairs are written ``chunk_size`` at a time (never copied whole) as
    a line-aligned UTF-8 corpus, ``source.txt`` and ``target.txt``
    (``PAIR_FILES``), into ``directory``, and ``prepare_shards`` tokenizes
    it into shards beside them: the same ids (source ids + END; START +
    target ids + END), the same filters (blank pairs; pairs whose ids
    exceed ``max_train_length``) and the same manifest. A text file whose
    content did not change is left as it was, so the same pairs into the
    same ``directory`` reuse the earlier preparation (``reused`` is True).

    Args:
        sources, targets: iterables of ``str`` of equal length (lists, or
            generators read once, in step); pair *i* is ``(sources[i],
            targets[i])``. A string must not hold a line break (``"\\n"``).
        tokenizer: as for ``prepare_shards`` (``TextTokenizer`` or
            ``SentencePieceTokenizer``).
        directory: folder for the text files and the shards (created);
            None: a new temporary folder, removed when the process exits
            (pass a folder to keep the shards or reuse them).
        max_train_length, pairs_per_shard, chunk_size, skip_blank: as for
            ``prepare_shards`` (``max_length``: the old name of
            ``max_train_length``, deprecated).

    Returns:
        dict, the manifest of ``prepare_shards`` (``directory`` the
        folder, ``pairs`` the kept pairs, ``blank`` and ``too_long`` the
        dropped ones, ``reused``): what ``stream_batches``,
        ``stream_steps`` and ``mix_batches`` take.

    An earlier preparation in ``directory`` (text files, shards and
    manifest) stays as it was when the call fails.

    Raises:
        TypeError: ``sources`` or ``targets`` is a single ``str`` (not one
            per pair), a source or target that is not a ``str``, or
            ``max_train_length``, ``pairs_per_shard`` or ``chunk_size`` not
            an int.
        ValueError: ``sources`` and ``targets`` differ in length, a string
            holds a line break, ``chunk_size`` or ``pairs_per_shard`` < 1,
            or an error of ``prepare_shards`` (``max_train_length`` < 2, no
            pair left after filtering, ...).

    Example:

    >>> from keras_trm.text import TextTokenizer
    >>> tokenizer = TextTokenizer(["[PAD]", "[UNK]", "[START]", "[END]", "a", "b"])
    >>> shards = shards_from_pairs(["a b", "b", "b a a", " "], ["b", "b a", "a", "a"],
    ...                            tokenizer)
    >>> shards["pairs"], shards["blank"]
    (3, 1)
    >>> ds = stream_batches(shards, tokens_per_batch=8, boundaries=(4, 8))
    >>> [(tuple(x["encoder_tokens"].shape), y.dtype.name) for x, y in ds]
    [((2, 4), 'int32'), ((2, 4), 'int32')]
    >>> x, y = next(iter(stream_batches(shards, 8, (4, 8), shuffle=False)))
    >>> x["encoder_tokens"][0].numpy().tolist(), y[0].numpy().tolist()
    ([4, 5, 3, 0], [5, 3, 0, 0])
    >>> d = tempfile.mkdtemp()
    >>> [shards_from_pairs(["a"], ["b"], tokenizer, d)["reused"] for _ in range(2)]
    [False, True]
    """
    max_train_length = _prepare_args(
        v.renamed("max_length", max_length, "max_train_length",
                  max_train_length), pairs_per_shard, chunk_size, 0)
    for name, texts in (("sources", sources), ("targets", targets)):
        if isinstance(texts, (str, bytes)):
            raise TypeError(
                f"`{name}` must be an iterable of str (one per pair), got one "
                f"{type(texts).__name__}: {name}={texts[:50]!r}")
    if (hasattr(sources, "__len__") and hasattr(targets, "__len__")
            and len(sources) != len(targets)):
        raise ValueError(f"`sources` and `targets` differ in length: "
                         f"{len(sources)} vs {len(targets)}")
    if directory is None:
        directory = tempfile.mkdtemp(prefix="keras_trm_shards_")
        atexit.register(shutil.rmtree, directory, True)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / name for name in PAIR_FILES]
    tmps = []
    try:
        for _ in paths:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".pairs-",
                                       suffix=".tmp")
            os.close(fd)
            usual_permissions(tmp)
            tmps.append(tmp)
        _write_pairs(sources, targets, tmps, int(chunk_size))
        # A changed text file is read from its temporary, under the key of
        # its final name (a rename keeps size and mtime), and moved into
        # place only when the new shards are: a failed preparation leaves
        # the old text files, shards and manifest as they were.
        read, files, moves = [], [], []
        for tmp, path in zip(tmps, paths):
            if path.is_file() and filecmp.cmp(tmp, path, shallow=False):
                read.append(path)  # unchanged: same size and mtime, same key
                files.append(_file_identity(path))
            else:
                read.append(tmp)
                files.append(dict(_file_identity(tmp),
                                  path=str(path.resolve())))
                moves.append((tmp, path))

        def move_texts():
            for tmp, path in moves:
                os.replace(tmp, path)

        return _prepare(read[0], read[1], files, tokenizer, directory,
                        max_train_length, int(pairs_per_shard),
                        int(chunk_size), skip_blank, 0,
                        before_swap=move_texts, shown=paths)
    finally:
        for tmp in tmps:
            pathlib.Path(tmp).unlink(missing_ok=True)


def _write_pairs(sources, targets, paths, chunk_size):
    """Writes the pairs as two line-aligned UTF-8 files, ``chunk_size``
    pairs at a time; returns the number of pairs."""
    missing = object()
    pairs = itertools.zip_longest(sources, targets, fillvalue=missing)
    n = 0
    with open(paths[0], "w", encoding="utf-8", newline="\n") as fs, \
            open(paths[1], "w", encoding="utf-8", newline="\n") as ft:
        while True:
            chunk = list(itertools.islice(pairs, chunk_size))
            if not chunk:
                return n
            for i, pair in enumerate(chunk, n):
                for side, text in zip(("source", "target"), pair):
                    if text is missing:
                        longer = "targets" if side == "source" else "sources"
                        raise ValueError(
                            f"`sources` and `targets` differ in length: "
                            f"`{side}s` ends after {i} strings, `{longer}` "
                            f"goes on")
                    if not isinstance(text, str):
                        raise TypeError(f"{side} {i} is a "
                                        f"{type(text).__name__}, not a str")
                    if "\n" in text:
                        raise ValueError(f"{side} {i} holds a line break: "
                                         f"{text!r}")
            fs.write("".join(s + "\n" for s, _ in chunk))
            ft.write("".join(t + "\n" for _, t in chunk))
            n += len(chunk)


def _encode_chunk(tokenizer, chunk, max_train_length):
    """Tokenizes (source, target) pairs; returns the kept pairs' records
    (bytes) and pair lengths, in order, and their (source, label) id
    counts."""
    src = tokenizer.tokenize(tf.constant([p[0] for p in chunk]))
    tgt = tokenizer.tokenize(tf.constant([p[1] for p in chunk]))
    n = len(chunk)
    end = tf.fill([n, 1], _END_ID)
    start = tf.fill([n, 1], _START_ID)
    ns = src.row_lengths().numpy() + 1  # + END
    nt = tgt.row_lengths().numpy() + 2  # START + END
    keep = (ns <= max_train_length) & (nt <= max_train_length)
    header = tf.RaggedTensor.from_tensor(
        tf.stack([tf.constant(ns, tf.int32), tf.constant(nt, tf.int32)], 1))
    rows = tf.concat([header, tf.cast(src, tf.int32), end, start,
                      tf.cast(tgt, tf.int32), end], axis=1)
    buf = rows.flat_values.numpy().astype("<i4").tobytes()
    splits = rows.row_splits.numpy() * 4
    idx = np.nonzero(keep)[0]
    records = [buf[splits[i]:splits[i + 1]] for i in idx]
    lengths = np.maximum(ns, nt - 1)[idx]
    return records, lengths, (int(ns[idx].sum()), int((nt[idx] - 1).sum()))


# -- streaming ----------------------------------------------------------------


def _as_manifest(prepared):
    if isinstance(prepared, dict):
        return prepared
    manifest = read_manifest(prepared)
    if manifest is None:
        raise ValueError(
            f"{str(prepared)!r} holds no complete preparation (no valid "
            f"{MANIFEST}); run prepare_shards first")
    return manifest


def _check_boundaries(boundaries):
    """``boundaries`` as a sorted tuple of distinct ints >= 1 (the bucket
    lengths), else a ValueError/TypeError naming them."""
    if isinstance(boundaries, (str, bytes)) or not hasattr(
            boundaries, "__iter__"):
        raise TypeError(f"`boundaries` must be a sequence of positive ints "
                        f"(bucket lengths), got boundaries={boundaries!r}")
    values = list(boundaries)
    if not values:
        raise ValueError("`boundaries` is empty: it needs at least one bucket "
                         "length, got boundaries=()")
    for b in values:
        if isinstance(b, (bool, np.bool_)) or not isinstance(
                b, (int, np.integer)):
            raise TypeError(f"`boundaries` must be positive ints (bucket "
                            f"lengths), got {b!r} in boundaries={values!r}")
        if b < 1:
            raise ValueError(f"`boundaries` must be positive ints (bucket "
                             f"lengths >= 1), got {b!r} in "
                             f"boundaries={values!r}")
    return tuple(sorted({int(b) for b in values}))


def _check_weights(weights, count):
    """``weights`` as a float64 array: one per corpus, finite, >= 0, with a
    positive sum (a NaN or inf would make every draw, or the step count,
    meaningless)."""
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise TypeError(f"`weights` must be a list of numbers, one per corpus, "
                        f"got weights={weights!r}")
    if count != len(weights) or not count:
        raise ValueError(f"{count} corpora but {len(weights)} weights: "
                         f"`weights` needs one per corpus, got "
                         f"weights={list(weights)!r}")
    try:
        array = np.asarray(weights, np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"`weights` must be numbers, got "
                        f"weights={list(weights)!r}") from None
    if array.ndim != 1 or not np.isfinite(array).all() or (
            array < 0).any() or array.sum() <= 0:
        raise ValueError(f"`weights` must be finite numbers >= 0 with a "
                         f"positive sum, got weights={array.tolist()}")
    return array


def _check(boundaries, tokens_per_batch, manifests):
    boundaries = _check_boundaries(boundaries)
    tokens_per_batch = v.positive_int("tokens_per_batch", tokens_per_batch)
    if tokens_per_batch < boundaries[-1]:
        raise ValueError(
            f"`tokens_per_batch`={tokens_per_batch} is smaller than the "
            f"bucket boundary {boundaries[-1]}")
    for m in manifests:
        if m["max_pair_length"] > boundaries[-1]:
            raise ValueError(
                f"a pair of length {m['max_pair_length']} in "
                f"{m.get('directory')!r} exceeds the last bucket boundary "
                f"{boundaries[-1]}; prepare with a smaller max_train_length")
    return boundaries


def _worker_shards(manifest, worker_index, num_workers):
    shards = manifest["shards"]
    v.positive_int("num_workers", num_workers)
    v.non_negative_int("worker_index", worker_index)
    if not 0 <= int(worker_index) < int(num_workers):
        raise ValueError(f"`worker_index` must be in [0, {num_workers}), got "
                         f"{worker_index}")
    if int(num_workers) > len(shards):
        raise ValueError(
            f"{num_workers} workers but {len(shards)} shard(s) in "
            f"{manifest.get('directory')!r}: prepare with a smaller "
            f"pairs_per_shard")
    return shards[int(worker_index)::int(num_workers)]


def _records(files, seed, epoch, cycle_length, chunk=256):
    """One epoch of the raw records of ``files`` (a tensor of paths), in
    vectors of up to ``chunk`` consecutive records of one shard (handing
    records one by one between the interleave's threads cost 4x more); the
    shard order permuted by ``(seed, epoch)`` when ``seed`` is not None."""
    if seed is not None:
        files = tf.random.experimental.stateless_shuffle(
            files, seed=tf.stack([_mix(seed, epoch), tf.constant(-2, tf.int64)]))
    ds = tf.data.Dataset.from_tensor_slices(files)

    def read(path):
        return tf.data.TFRecordDataset(path).batch(chunk)

    if cycle_length > 1:
        return ds.interleave(read, cycle_length=cycle_length,
                             num_parallel_calls=cycle_length, deterministic=True)
    return ds.flat_map(read)


def _mix(seed, epoch):
    return tf.cast(seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64)


def _blocks(records, block, seed=None, epoch=0):
    """``(index, records of one block)``; with a ``seed`` each block is
    permuted by the stateless seed ``(seed, epoch, index)``, so the order is
    reproducible in a new process and an iterator checkpoint holds no RNG."""
    ds = records.rebatch(block).enumerate()
    if seed is None:
        return ds
    mixed = _mix(seed, epoch)
    return ds.map(
        lambda i, recs: (i, tf.random.experimental.stateless_shuffle(
            recs, seed=tf.stack([mixed, i]))),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _pair_lengths(records):
    """int32 ``(n,)`` ``max(len(source), len(target) - 1)`` of records."""
    header = tf.io.decode_raw(records, tf.int32, little_endian=True,
                              fixed_length=8)
    return tf.maximum(header[:, 0], header[:, 1] - 1)


def _bucket(blocks, boundaries, tokens_per_batch, seed=None, epoch=0):
    """Token-count batches from a dataset of ``(index, records)`` blocks.

    A ``scan`` carries each bucket's unfilled rest from block to block (at
    most ``batch - 1`` records per bucket), so batches are exactly those of
    grouping the whole stream by bucket; after the last block a flush
    element empties every bucket (a short batch per bucket, filled with
    all-padding rows). Each block's batches are decoded together, one dense
    ``(batches, batch, L)`` tensor per bucket, and emitted in an order
    permuted by ``(seed, epoch, index)`` (bucket by bucket without a seed).
    Vectorized: no per-pair or per-window Python or dataset work.
    """
    bounds = tf.constant(boundaries, tf.int32)
    sizes = [tokens_per_batch // b for b in boundaries]
    flush = tf.data.Dataset.from_tensors(
        (tf.constant(-1, tf.int64), tf.zeros([0], tf.string)))
    blocks = blocks.concatenate(flush)

    def bucket_of(lengths):
        return tf.reduce_sum(tf.cast(bounds[None, :] < lengths[:, None],
                                     tf.int32), axis=1)

    def step(carry, element):
        index, block = element
        last = index < 0
        recs = tf.concat([carry, block], 0)
        which = bucket_of(_pair_lengths(recs))
        emit, counts, keep = [], [], []
        for k, size in enumerate(sizes):
            idx = tf.where(tf.equal(which, k))[:, 0]
            n = tf.size(idx)
            take = tf.where(last, n, n // size * size)
            emit.append(tf.gather(recs, idx[:take]))
            keep.append(tf.gather(recs, idx[take:]))
            counts.append(-(-take // size))  # batches (a short one at the end)
        return tf.concat(keep, 0), (index, tuple(emit), tf.stack(counts))

    def decode(index, emitted, counts):
        out = []
        for k, (recs, size) in enumerate(zip(emitted, sizes)):
            length = boundaries[k]
            header = tf.io.decode_raw(recs, tf.int32, little_endian=True,
                                      fixed_length=8)
            ns, nt = header[:, 0], header[:, 1]
            flat = tf.io.decode_raw(tf.strings.reduce_join(recs), tf.int32,
                                    little_endian=True)
            starts = tf.cumsum(2 + ns + nt, exclusive=True) + 2
            parts = (tf.ragged.range(starts, starts + ns),
                     tf.ragged.range(starts + ns, starts + ns + nt - 1),
                     tf.ragged.range(starts + ns + 1, starts + ns + nt))
            shape = tf.stack([counts[k] * size, length])
            dense = [tf.reshape(tf.gather(flat, p).to_tensor(0, shape=shape),
                                [-1, size, length]) for p in parts]
            out.append(tuple(dense))
        return index, tuple(out), counts

    def split(index, per_bucket, counts):
        choice = tf.repeat(tf.range(len(sizes), dtype=tf.int64),
                           tf.cast(counts, tf.int64))
        if seed is not None:
            choice = tf.random.experimental.stateless_shuffle(
                choice, seed=tf.stack([_mix(seed, epoch), index + (1 << 40)]))
        streams = [tf.data.Dataset.from_tensor_slices(
            ({"encoder_tokens": s, "decoder_tokens": d}, y))
            for s, d, y in per_bucket]
        return tf.data.Dataset.choose_from_datasets(
            streams, tf.data.Dataset.from_tensor_slices(choice))

    ds = blocks.scan(tf.zeros([0], tf.string), step)
    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.flat_map(split)


def _finish(ds):
    options = tf.data.Options()
    # Workers already read their own shards: no tf.distribute re-sharding.
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


def stream_batches(prepared, tokens_per_batch=4096,
                   boundaries=DEFAULT_BOUNDARIES, shuffle=True, seed=0,
                   repeat=False, worker_index=0, num_workers=1,
                   shuffle_buffer=16_384, cycle_length=4, start_epoch=0,
                   skip_batches=0, position=None):
    """Token-count batches (Vaswani et al. 2017, §5.1) streamed from shards
    written by ``prepare_shards``; memory does not grow with the corpus.

    The bucket of a pair is the smallest boundary ``L >= max(len(source),
    len(target) - 1)``; a batch is ``tokens_per_batch // L`` pairs padded
    to exactly ``(batch, L)``; the short last batch of a bucket in an
    epoch is filled with all-padding rows. The order is shuffled locally
    (see the module docstring). One epoch holds every pair of this
    worker's shards exactly once.

    Args:
        prepared: the folder given to ``prepare_shards``, or its manifest.
        tokens_per_batch: int, padded tokens per side of one batch.
        boundaries: sorted bucket lengths; the last must be >= the
            manifest's ``max_pair_length``.
        shuffle: permute shards and pairs every epoch (seeded by ``seed``
            and the epoch; independent of TensorFlow's global seed).
        repeat: epochs ``start_epoch``, ``start_epoch + 1``, ... forever;
            otherwise only epoch ``start_epoch`` (iterated again, the
            dataset gives that epoch again, in the same order: for several
            epochs of ``fit`` use ``repeat=True`` with
            ``steps_per_epoch=stream_steps(...)``).
        worker_index, num_workers: worker ``i`` of ``n`` reads shards
            ``i, i + n, ...`` (file-level sharding; workers get different
            batch counts, see ``stream_steps``). The dataset's auto-shard
            policy is OFF, so ``tf.distribute`` does not shard it again.
        shuffle_buffer: pairs per block: permuted together (if
            ``shuffle``) and bucketed together; the memory bound and the
            reach of the shuffle. The first batch needs one block read.
        cycle_length: shards read at once (interleaved pair by pair).
        start_epoch, skip_batches: start in epoch ``start_epoch`` after its
            first ``skip_batches`` batches (what an uninterrupted run gave).
        position: optional object with int ``epoch`` and ``skip``
            (``keras_trm.training.DataPosition``), read when iteration
            starts, replacing ``start_epoch`` / ``skip_batches`` (how a
            resumed job, ``keras_trm.training.TrainingBackup``, sees
            exactly the batches the interrupted one had not trained on;
            such an iterator cannot be saved with ``tf.train.Checkpoint``,
            one without ``position`` can).

    Returns:
        ``tf.data.Dataset`` of ``({"encoder_tokens": int32 (B, L),
        "decoder_tokens": int32 (B, L)}, labels int32 (B, L))``, 0 =
        padding, ``B = tokens_per_batch // L``; decoder tokens are the
        target ids without the last (START first), labels without the
        first.

    Raises:
        ValueError: no complete preparation in ``prepared``, a pair longer
            than the last boundary, ``tokens_per_batch`` below a boundary,
            ``boundaries`` empty or holding a length < 1, a bad
            ``worker_index`` or ``num_workers``, more workers than shards,
            or a negative ``start_epoch`` / ``skip_batches``.
        TypeError: ``boundaries``, ``tokens_per_batch``, ``worker_index``,
            ``num_workers``, ``start_epoch`` or ``skip_batches`` not ints.

    Example:

    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "x.en").write_text("a b\\nb\\nb a a\\n")
    >>> _ = (d / "x.de").write_text("b\\nb a\\na\\n")
    >>> class Tok:
    ...     vocabulary = ["[PAD]", "[UNK]", "[START]", "[END]", "a", "b"]
    ...     def tokenize(self, s):
    ...         return tf.ragged.constant([[4 + "ab".index(w) for w in x.split()]
    ...                                    for x in s.numpy().astype(str)], tf.int32)
    >>> _ = prepare_shards(d / "x.en", d / "x.de", Tok(), d / "shards")
    >>> ds = stream_batches(d / "shards", tokens_per_batch=8, boundaries=(4, 8))
    >>> [(tuple(x["encoder_tokens"].shape), y.dtype.name) for x, y in ds]
    [((2, 4), 'int32'), ((2, 4), 'int32')]
    >>> x, y = next(iter(stream_batches(d / "shards", 8, (4, 8), shuffle=False)))
    >>> x["encoder_tokens"][0].numpy().tolist(), x["decoder_tokens"][0].numpy().tolist()
    ([4, 5, 3, 0], [2, 5, 0, 0])
    """
    manifest = _as_manifest(prepared)
    boundaries = _check(boundaries, tokens_per_batch, [manifest])
    shards = _worker_shards(manifest, worker_index, num_workers)
    if position is None:
        v.non_negative_int("start_epoch", start_epoch)
        v.non_negative_int("skip_batches", skip_batches)
    folder = pathlib.Path(manifest["directory"])
    files = tf.constant([str(folder / s["file"]) for s in shards])
    cycle = max(1, min(int(cycle_length), len(shards)))
    tokens_per_batch = int(tokens_per_batch)

    block = max(int(shuffle_buffer), 1)
    order_seed = int(seed) if shuffle else None

    def epoch_batches(epoch):
        records = _records(files, order_seed, epoch, cycle)
        return _bucket(_blocks(records, block, order_seed, epoch), boundaries,
                       tokens_per_batch, order_seed, epoch)

    def from_position(epoch, skip):
        epoch = tf.cast(epoch, tf.int64)
        epochs = (tf.data.Dataset.range(epoch, tf.int64.max) if repeat
                  else tf.data.Dataset.range(epoch, epoch + 1))
        # One epoch at a time, in order; the parallel interleave builds the
        # next epoch's pipeline while this one is read (no stall between).
        return epochs.interleave(epoch_batches, cycle_length=1,
                                 num_parallel_calls=1,
                                 deterministic=True).skip(skip)

    if position is None:
        ds = from_position(int(start_epoch), int(skip_batches))
    else:
        def read_position():
            return tf.constant([int(position.epoch), int(position.skip)],
                               tf.int64)

        start = tf.data.Dataset.from_tensors(0).map(
            lambda _: tf.py_function(read_position, [], tf.int64))
        ds = start.flat_map(lambda p: from_position(p[0], p[1]))
    return _finish(ds)


def stream_steps(prepared, tokens_per_batch=4096,
                 boundaries=DEFAULT_BOUNDARIES, worker_index=0,
                 num_workers=1):
    """Batches in one epoch of ``stream_batches`` for one worker, from the
    manifest's length counts (nothing is read).

    Args:
        prepared: the folder given to ``prepare_shards``, or its manifest.
        tokens_per_batch, boundaries, worker_index, num_workers: as for
            ``stream_batches``.

    Returns:
        int. With several workers the counts differ: a synchronous job runs
        ``min`` over workers steps per epoch with ``repeat=True``.

    Raises:
        ValueError, TypeError: as ``stream_batches`` (the same check of
            ``boundaries``, so both refuse what one refuses).

    Example:

    >>> m = {"max_pair_length": 5, "directory": "-",
    ...      "shards": [{"length_counts": [0, 0, 3, 0, 0, 1]}]}
    >>> stream_steps(m, tokens_per_batch=8, boundaries=(4, 8))  # 3 pairs / 2 + 1 / 1
    3
    """
    manifest = _as_manifest(prepared)
    boundaries = _check(boundaries, tokens_per_batch, [manifest])
    counts = np.zeros(boundaries[-1] + 1, np.int64)
    for shard in _worker_shards(manifest, worker_index, num_workers):
        c = np.asarray(shard["length_counts"], np.int64)
        counts[: len(c)] += c
    which = np.searchsorted(boundaries, np.arange(len(counts)), side="left")
    steps = 0
    for b, boundary in enumerate(boundaries):
        n = int(counts[which == b].sum())
        steps += -(-n // (int(tokens_per_batch) // boundary))
    return steps


def mix_batches(prepared, weights, tokens_per_batch=4096,
                boundaries=DEFAULT_BOUNDARIES, seed=0, repeat=True,
                pairs_per_epoch=None, worker_index=0, num_workers=1,
                shuffle_buffer=16_384, cycle_length=4, skip_batches=0,
                position=None, batches_per_epoch=None):
    """Token-count batches of several prepared corpora sampled with
    weights: each pair is drawn from corpus ``i`` with probability
    ``weights[i] / sum(weights)`` (seeded, stateless), then batched as in
    ``stream_batches``, so a batch mixes corpora.

    Every corpus streams its own shuffled epochs one after another, never
    running out; what "an epoch" of the mixture is is a number of drawn
    pairs, ``pairs_per_epoch`` (default: all corpora's pairs together), of
    which corpus ``i`` gives ``pairs_per_epoch * w_i / sum(w)`` on average
    -- an up-weighted small corpus is seen several times, a down-weighted
    big one partly. With ``repeat`` the stream is endless (the job counts
    epochs in steps, ``stream_steps``-like estimates); otherwise it stops
    after ``pairs_per_epoch`` pairs, partial windows filled with padding.

    Args:
        prepared: list of folders (or manifests) of ``prepare_shards``,
            prepared with the same tokenizer.
        weights: list of non-negative numbers, one per corpus, sum > 0.
        tokens_per_batch, boundaries, seed: as for ``stream_batches``.
        worker_index, num_workers, shuffle_buffer, cycle_length: as for
            ``stream_batches``; the mixed pairs are bucketed in blocks of
            ``min(shuffle_buffer, pairs_per_epoch)``.
        repeat: endless stream (True) or one epoch of ``pairs_per_epoch``.
        pairs_per_epoch: int or None (sum of the corpora's pairs).
        skip_batches: leave out the first batches (resume without an
            iterator checkpoint; an iterator of this dataset can also be
            saved with ``tf.train.Checkpoint``).
        position, batches_per_epoch: optional object with int ``epoch``
            and ``skip`` (``keras_trm.training.DataPosition``), read when
            iteration starts: the stream starts after its first
            ``epoch * batches_per_epoch + skip`` batches (the job's resume;
            replaces ``skip_batches``; those batches are computed and
            dropped).

    Returns:
        ``tf.data.Dataset`` with the element structure of
        ``stream_batches``.

    Raises:
        ValueError: ``weights`` and ``prepared`` differ in length, a
            negative, NaN or infinite weight or a zero sum, corpora
            prepared with different tokenizers, ``pairs_per_epoch`` < 1,
            ``skip_batches`` < 0, or an error of ``stream_batches``.
        TypeError: a weight that is not a number, ``pairs_per_epoch`` or
            ``skip_batches`` not an int, or an error of ``stream_batches``.

    Example:

    >>> import pathlib, tempfile
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> class Tok:
    ...     vocabulary = ["[PAD]", "[UNK]", "[START]", "[END]", "a", "b"]
    ...     def tokenize(self, s):
    ...         return tf.ragged.constant([[4 + "ab".index(w) for w in x.split()]
    ...                                    for x in s.numpy().astype(str)], tf.int32)
    >>> for name, word in (("one", "a"), ("two", "b")):
    ...     _ = (d / f"{name}.en").write_text(f"{word}\\n" * 10)
    ...     _ = (d / f"{name}.de").write_text(f"{word}\\n" * 10)
    ...     _ = prepare_shards(d / f"{name}.en", d / f"{name}.de", Tok(), d / name)
    >>> ds = mix_batches([d / "one", d / "two"], [0, 1], 8, (4, 8), repeat=False)
    >>> sorted({int(v) for x, _ in ds for v in x["encoder_tokens"][:, 0]})
    [5]
    """
    manifests = [_as_manifest(p) for p in prepared]
    weights = _check_weights(weights, len(manifests))
    if len({m["tokenizer"] for m in manifests}) > 1:
        raise ValueError("the corpora were prepared with different tokenizers")
    boundaries = _check(boundaries, tokens_per_batch, manifests)
    if pairs_per_epoch is None:
        pairs_per_epoch = sum(m["pairs"] for m in manifests)
    pairs_per_epoch = v.positive_int("pairs_per_epoch", pairs_per_epoch)
    if position is None:
        v.non_negative_int("skip_batches", skip_batches)

    # Pairs are bucketed a block at a time, and the first batch waits for a
    # whole block drawn pair by pair: a block larger than the mixture's
    # epoch would only delay it (262,144 draws took about 30 s here).
    block = max(1, min(int(shuffle_buffer), int(pairs_per_epoch)))
    streams = []
    for i, manifest in enumerate(manifests):
        shards = _worker_shards(manifest, worker_index, num_workers)
        folder = pathlib.Path(manifest["directory"])
        files = tf.constant([str(folder / s["file"]) for s in shards])
        cycle = max(1, min(int(cycle_length), len(shards)))
        corpus_seed = int(seed) * 7919 + i

        def corpus_epoch(epoch, files=files, cycle=cycle, corpus_seed=corpus_seed):
            records = _records(files, corpus_seed, epoch, cycle)
            return _blocks(records, block, corpus_seed, epoch).map(
                lambda i, recs: recs).unbatch()  # pairs, to be mixed

        streams.append(tf.data.Dataset.range(tf.int64.max).flat_map(corpus_epoch))
    logits = tf.constant(np.log(np.maximum(weights, 1e-30))[None, :], tf.float32)
    mixed_seed = int(seed) * 1_000_003 + 17

    def choose(i):
        draw = tf.random.stateless_categorical(
            logits, 1, seed=tf.stack([tf.constant(mixed_seed, tf.int64), i]))
        return tf.cast(draw[0, 0], tf.int64)

    def batches(skip):
        selector = tf.data.Dataset.range(tf.int64.max).map(choose)
        pairs = tf.data.Dataset.choose_from_datasets(streams, selector)
        if not repeat:
            pairs = pairs.take(int(pairs_per_epoch))
        blocks = pairs.batch(block).enumerate()  # already permuted per corpus
        return _bucket(blocks, boundaries, int(tokens_per_batch), int(seed) + 1,
                       0).skip(skip)

    if position is None:
        return _finish(batches(int(skip_batches)))
    if not batches_per_epoch or int(batches_per_epoch) < 1:
        raise ValueError(f"`position` needs `batches_per_epoch` >= 1, got "
                         f"batches_per_epoch={batches_per_epoch!r}")

    def read_skip():
        return tf.constant(int(position.epoch) * int(batches_per_epoch)
                           + int(position.skip), tf.int64)

    start = tf.data.Dataset.from_tensors(0).map(
        lambda _: tf.py_function(read_skip, [], tf.int64))
    return _finish(start.flat_map(batches))


def mix_steps(prepared, weights, tokens_per_batch=4096,
              boundaries=DEFAULT_BOUNDARIES, pairs_per_epoch=None,
              worker_index=0, num_workers=1):
    """Expected batches in ``pairs_per_epoch`` pairs of ``mix_batches``
    (what the job calls an epoch of a weighted mixture): corpus ``i``
    gives ``pairs_per_epoch * w_i / sum(w)`` pairs with its own length
    distribution (the manifests' length counts), batched per bucket.

    Args:
        prepared, weights, pairs_per_epoch: as for ``mix_batches``.
        tokens_per_batch, boundaries, worker_index, num_workers: as for
            ``mix_batches``.

    Returns:
        int >= 1.

    Raises:
        ValueError, TypeError: as ``mix_batches`` (the same checks of
            ``weights``, ``pairs_per_epoch`` and ``boundaries``).

    Example:

    >>> m = {"max_pair_length": 5, "directory": "-", "pairs": 4,
    ...      "shards": [{"length_counts": [0, 0, 3, 0, 0, 1]}]}
    >>> mix_steps([m, m], [1, 1], tokens_per_batch=8, boundaries=(4, 8))
    5
    """
    manifests = [_as_manifest(p) for p in prepared]
    weights = _check_weights(weights, len(manifests))
    boundaries = _check(boundaries, tokens_per_batch, manifests)
    if pairs_per_epoch is None:
        pairs_per_epoch = sum(m["pairs"] for m in manifests)
    pairs_per_epoch = v.positive_int("pairs_per_epoch", pairs_per_epoch)
    counts = np.zeros(boundaries[-1] + 1, np.float64)
    for manifest, weight in zip(manifests, weights / weights.sum()):
        own = np.zeros_like(counts)
        for shard in _worker_shards(manifest, worker_index, num_workers):
            c = np.asarray(shard["length_counts"], np.float64)
            own[: len(c)] += c
        if own.sum():
            counts += own / own.sum() * weight * float(pairs_per_epoch) / num_workers
    which = np.searchsorted(boundaries, np.arange(len(counts)), side="left")
    steps = 0
    for b, boundary in enumerate(boundaries):
        steps += int(np.ceil(counts[which == b].sum() / (int(tokens_per_batch) // boundary)))
    return max(1, steps)
