"""Parallel corpora: Multi30k (task 1), WMT14 EN-DE, and the user's own
files, in either direction.

Local files are read from ``<data_dir>/multi30k`` and
``<data_dir>/wmt14_en_de`` (see ``keras_trm.data.paths``); online, Multi30k
is downloaded from its official repository (``download=True``: the six
gzip files, 1.3 MB, checked against ``MULTI30K_SHA256``, into
``<data_dir>/multi30k``, by default ``~/keras_trm_data``) and WMT14 read
from tfds (``wmt14_translate/de-en``). ``load_translation_splits`` resolves a dataset
name, split files and a direction into (train, validation, test) pairs.
"""

import dataclasses
import gzip
import os
import pathlib

from keras_trm.data.download import fetch
from keras_trm.data.paths import resolve_data_dir

# The official files (multi30k/dataset, data/task1/raw/); the environment
# variable replaces this base URL (a mirror, or a test's local server).
MULTI30K_URL = (
    "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
)
MULTI30K_URL_ENV = "KERAS_TRM_MULTI30K_URL"
# SHA-256 of the official files (repository commit a3d2e0d).
MULTI30K_SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "test_2016_flickr.en.gz":
        "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz":
        "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
}
MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
# Local WMT14 files: the split name, or its role (tfds names), -> file stem.
WMT14_SPLITS = {"newstest2013": "newstest2013", "newstest2014": "newstest2014"}
WMT14_TRAIN_STEM = "europarl-v7.de-en.first20000"
WMT14_POOL_STEM = "newstest2008-2022-pool"  # extra in-domain training text
WMT14_ROLES = {"train": "train", "validation": "newstest2013",
               "test": "newstest2014"}
DATASETS = ("multi30k", "wmt14", "wmt14_tfds", "files")


def read_lines(path):
    """All lines of a UTF-8 text file, plain or gzip (``.gz``), without
    their trailing newline.

    Args:
        path: str or ``pathlib.Path``.

    Returns:
        list of str, one per line.

    Raises:
        FileNotFoundError: ``path`` is not a file (the message names it).
        CorpusError: (a ``ValueError``) the file is not valid UTF-8 or not
            a readable gzip file (the message names it and the line).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> _ = p.write_text("Hallo\\nWelt\\n")
        >>> read_lines(p)
        ['Hallo', 'Welt']
    """
    return list(iter_lines(path))


def load_parallel(source_path, target_path):
    """Reads a parallel corpus: line *i* of ``source_path`` translates to
    line *i* of ``target_path``.

    Args:
        source_path, target_path: UTF-8 text files (plain or ``.gz``), one
            sentence per line.

    Returns:
        ``(sources, targets)``: two lists of str of equal length (raw text,
        as in the files; blank lines are kept, so line numbers match).

    Raises:
        FileNotFoundError: a file is missing (the message names it).
        ValueError: the two files have different line counts (the message
            names both files and both counts), or the corpus is empty (no
            line with text on both sides; the message names both files).
        CorpusError: (a ``ValueError``) a file is not valid UTF-8 or not a
            readable gzip file (the message names it and the line).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "x.en").write_text("A dog.\\nTwo cats.\\n")
        >>> _ = (d / "x.de").write_text("Ein Hund.\\nZwei Katzen.\\n")
        >>> load_parallel(d / "x.en", d / "x.de")
        (['A dog.', 'Two cats.'], ['Ein Hund.', 'Zwei Katzen.'])
    """
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise ValueError(
            f"parallel corpus line counts differ: {str(source_path)!r} has "
            f"{len(sources)} lines but {str(target_path)!r} has "
            f"{len(targets)} lines"
        )
    if not any(s.strip() and t.strip() for s, t in zip(sources, targets)):
        raise ValueError(
            f"parallel corpus is empty: {str(source_path)!r} ({len(sources)} "
            f"lines) and {str(target_path)!r} ({len(targets)} lines) have no "
            "line with text on both sides"
        )
    return sources, targets


def _find(directory, stem):
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def multi30k_url():
    """The base URL Multi30k is downloaded from: ``$KERAS_TRM_MULTI30K_URL``
    if set, else ``MULTI30K_URL``."""
    url = os.environ.get(MULTI30K_URL_ENV) or MULTI30K_URL
    return url if url.endswith("/") else url + "/"


def _download_multi30k(directory, files, url=None):
    for name in files:
        fetch((url or multi30k_url()) + name, directory / name,
              sha256=MULTI30K_SHA256.get(name))


def load_multi30k(split="train", data_dir=None, source="en", target="de",
                  download=False, url=None):
    """Loads one split of Multi30k task 1 as (source, target) string lists.

    Args:
        split: ``"train"`` (29,000 pairs), ``"val"`` (1,014) or
            ``"test_2016_flickr"`` (1,000).
        data_dir: data directory (see ``resolve_data_dir``); files are read
            from ``<data_dir>/multi30k/{split}.{lang}[.gz]``.
        source, target: language codes (``"en"``, ``"de"``; ``"de"``,
            ``"en"`` for the reverse direction).
        download: if the files are missing, fetch them from the official
            repository (needs internet) into ``<data_dir>/multi30k``
            (``~/keras_trm_data/multi30k`` when no data folder exists),
            checking each file's SHA-256 (``MULTI30K_SHA256``); a file is
            written only once complete and verified.
        url: base URL to download from (default ``multi30k_url()``).

    Returns:
        ``(sources, targets)``: two lists of raw (cased, untokenized) str.

    Raises:
        ValueError: unknown ``split`` or language; ``source`` equal to
            ``target``; line counts differ.
        FileNotFoundError: files missing (and not downloaded); the message
            names the files expected and the directory searched; a
            ``data_dir`` that is a file.
        OSError, ValueError: the download failed or a file's checksum did
            not match (see ``keras_trm.data.download.fetch``).

    Example:
        >>> src, tgt = load_multi30k("val", source="de", target="en")  # doctest: +SKIP
        >>> len(src), src[0][:20]  # doctest: +SKIP
        (1014, 'Eine Gruppe von Männ')
    """
    if split not in MULTI30K_SPLITS:
        raise ValueError(
            f"`split` must be one of {MULTI30K_SPLITS}, got split={split!r}"
        )
    for name, lang in (("source", source), ("target", target)):
        if lang not in ("en", "de", "fr", "cs"):
            raise ValueError(f"`{name}` must be a Multi30k language, got {lang!r}")
    if source == target:
        raise ValueError(f"`source` and `target` must differ, got source={source!r} "
                         f"and target={target!r}")
    root = resolve_data_dir(data_dir, must_exist=not download)
    directory = root / "multi30k"
    paths = [_find(directory, f"{split}.{lang}") for lang in (source, target)]
    if None in paths and download:
        missing = [f"{split}.{lang}.gz" for lang, p in
                   zip((source, target), paths) if p is None]
        _download_multi30k(directory, missing, url)
        paths = [_find(directory, f"{split}.{lang}") for lang in (source, target)]
    if None in paths:
        raise FileNotFoundError(
            f"Multi30k split {split!r} not found: expected "
            f"{split}.{source}[.gz] and {split}.{target}[.gz] in "
            f"{directory} (when online, load_multi30k(download=True) or "
            f"`keras-trm train-translation --download true` fetches it from "
            f"{multi30k_url()})"
        )
    return load_parallel(*paths)


def load_wmt14(split="newstest2014", data_dir=None, source="en", target="de",
               online=False):
    """Loads a WMT14 English-German split, in either direction.

    Offline (default) it reads ``<data_dir>/wmt14_en_de``: ``"train"`` is
    the first 20,000 pairs of Europarl v7
    (``europarl-v7.de-en.first20000.{lang}.gz``, 0.4% of the full training
    data), ``"validation"`` is newstest2013 (3,000 pairs) and ``"test"`` is
    newstest2014 (3,003 pairs); ``"newstest2013"``/``"newstest2014"`` name
    them directly. Online (``online=True``) the same roles come from tfds
    ``wmt14_translate/de-en`` (train: about 4.5M pairs, downloads ~1.4 GB;
    validation: newstest2013; test: newstest2014).

    Args:
        split: ``"train"``, ``"validation"``, ``"test"``, ``"newstest2013"``
            or ``"newstest2014"``.
        data_dir: data directory (see ``resolve_data_dir``), offline only.
        source, target: ``"en"``/``"de"`` or ``"de"``/``"en"``.
        online: read tfds instead of local files.

    Returns:
        ``(sources, targets)`` lists of raw str.

    Raises:
        ValueError: unknown split or language.
        FileNotFoundError: missing local files (the message names the
            folder and the files expected).

    Example:
        >>> src, tgt = load_wmt14("test", source="de", target="en")  # doctest: +SKIP
        >>> len(src)  # doctest: +SKIP
        3003
    """
    if {source, target} != {"en", "de"}:
        raise ValueError(
            f"WMT14 EN-DE languages must be 'en' and 'de' (either direction), "
            f"got source={source!r}, target={target!r}"
        )
    names = tuple(WMT14_ROLES) + tuple(WMT14_SPLITS)
    if split not in names:
        raise ValueError(f"`split` must be one of {names}, got split={split!r}")
    stem = WMT14_ROLES.get(split, split)
    if online:
        import tensorflow_datasets as tfds

        tfds_split = {"train": "train", "newstest2013": "validation",
                      "newstest2014": "test"}[stem]
        ds = tfds.load("wmt14_translate/de-en", split=tfds_split)
        src, tgt = [], []
        for ex in tfds.as_numpy(ds):
            src.append(ex[source].decode("utf-8"))
            tgt.append(ex[target].decode("utf-8"))
        return src, tgt
    if stem == "train":
        stem = WMT14_TRAIN_STEM
    directory = resolve_data_dir(data_dir) / "wmt14_en_de"
    paths = [_find(directory, f"{stem}.{lang}") for lang in (source, target)]
    if None in paths:
        raise FileNotFoundError(
            f"WMT14 {split!r} not found: expected {stem}.{source}[.gz] and "
            f"{stem}.{target}[.gz] in {directory} (online: online=True, or "
            "`keras-trm train-translation --dataset wmt14_tfds`, reads tfds "
            "wmt14_translate/de-en)"
        )
    return load_parallel(*paths)


def iter_lines(path):
    """Yields the lines of a UTF-8 text file (plain or ``.gz``) one at a
    time, without their trailing newline (``read_lines`` streaming).

    Raises:
        FileNotFoundError: ``path`` is not a file (the message names it).
        CorpusError: (a ``ValueError``) the file is not valid UTF-8 or not
            a readable gzip file (the message names it and the line).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> _ = p.write_text("Hallo\\nWelt\\n")
        >>> list(iter_lines(p))
        ['Hallo', 'Welt']
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {str(path)!r} does not exist")
    yield from decoded_lines(path)



class CorpusError(ValueError):
    """A corpus the translation job cannot learn from, found before anything
    is learned or written: invalid UTF-8, an unreadable gzip file, no text,
    line counts that differ (``check_parallel_corpus``), or a setting the
    corpus rules out (a ``vocabulary_size`` too small for its characters).
    A ``ValueError``; ``keras-trm train-translation`` reports it as a usage
    error (exit 2, one line)."""


def _raw_lines(path):
    """The lines of ``path`` as bytes, newline included; a damaged gzip
    file raises ``CorpusError`` naming it and the line reached."""
    import zlib

    gz = path.name.endswith(".gz")
    with (gzip.open if gz else open)(path, "rb") as f:
        n = 0
        try:
            for n, raw in enumerate(f, 1):
                yield raw
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise CorpusError(
                f"corpus file {str(path)!r} is not a readable gzip file "
                f"(after line {n}): {err}") from None


def _not_utf8(path, line, offset, raw, err):
    """The ``CorpusError`` of an undecodable line: the file, the 1-based
    line, the byte within the line and the file (decompressed for .gz)."""
    bad = raw[err.start:err.start + 1].hex()
    return CorpusError(
        f"corpus file {str(path)!r} is not valid UTF-8: line {line}, byte "
        f"{err.start + 1} of the line (byte offset {offset + err.start} in "
        f"the {'decompressed ' if path.name.endswith('.gz') else ''}file): "
        f"{err.reason} (0x{bad})")


def decoded_lines(path):
    """The lines of a UTF-8 file (plain or ``.gz``) without their line
    end, one at a time; invalid UTF-8 or a damaged gzip file raises
    ``CorpusError`` (a ``ValueError``) naming the file and the line, not a
    bare ``UnicodeDecodeError`` / ``EOFError`` / ``BadGzipFile``."""
    path = pathlib.Path(path)
    offset = 0
    for n, raw in enumerate(_raw_lines(path), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise _not_utf8(path, n, offset, raw, err) from None
        offset += len(raw)
        yield line.rstrip("\r\n")


def check_parallel_corpus(source_path, target_path, characters=True,
                          character_lines=0):
    """Checks a parallel corpus in one streaming pass, before anything is
    learned or written from it: both files decode as UTF-8, have the same
    number of lines and hold text.

    Both files (plain or ``.gz``) are read once, together, a line at a time;
    only counts are kept (memory: a line of each file, plus about 1 MB of
    text at a time when counting characters). Multi30k's training pair
    (2 x 29,000 lines) takes about 0.15 s.

    Args:
        source_path, target_path: str or ``pathlib.Path``; UTF-8 text, one
            sentence per line, line *i* of one translating line *i* of the
            other.
        characters: also count the characters of both files (what a
            vocabulary learned from them must hold).
        character_lines: > 0: count the characters of the first n lines of
            each file only (lines; the lines a ``limit`` smoke run learns
            from); 0: of all lines. The other checks read every line.

    Returns:
        dict: ``lines`` (int, the lines of each file), ``pairs`` (int,
        lines with text on both sides) and ``characters``
        (``collections.Counter``, character -> occurrences in both files,
        newlines excepted; empty when ``characters`` is False).

    Raises:
        FileNotFoundError: a file is missing (the message names it).
        CorpusError: (a ``ValueError``) a file is not valid UTF-8 (the
            message names it, the 1-based line and the byte offset, within
            the line and the file -- the decompressed file for ``.gz``), is
            not a readable gzip file, or has no line with text (it names
            the file and its line count); the line counts differ (both
            files, both counts); no line has text on both sides.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "x.en").write_text("A dog.\\nTwo cats.\\n")
        >>> _ = (d / "x.de").write_text("Ein Hund.\\n")
        >>> check_parallel_corpus(d / "x.en", d / "x.de")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        keras_trm.data.translation.CorpusError: parallel corpus line counts differ: '...x.en' has 2 lines but '...x.de' has 1 lines
        >>> _ = (d / "x.de").write_text("Ein Hund.\\nZwei Katzen.\\n")
        >>> r = check_parallel_corpus(d / "x.en", d / "x.de")
        >>> r["lines"], r["pairs"], r["characters"]["a"]
        (2, 2, 2)
    """
    import collections
    import itertools

    import numpy as np

    paths = (pathlib.Path(source_path), pathlib.Path(target_path))
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {str(path)!r} does not exist")
    lines, text, offset = [0, 0], [0, 0], [0, 0]
    pairs = 0
    counts = collections.Counter()
    pending, pending_chars = [], 0

    def count_pending():
        codes = np.frombuffer("".join(pending).encode("utf-32-le"), np.uint32)
        found, times = np.unique(codes, return_counts=True)
        counts.update(dict(zip(map(chr, found.tolist()), times.tolist())))
        pending.clear()

    for raws in itertools.zip_longest(*map(_raw_lines, paths)):
        has_text = []
        for i, raw in enumerate(raws):
            if raw is None:
                has_text.append(False)
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise _not_utf8(paths[i], lines[i] + 1, offset[i], raw,
                                err) from None
            lines[i] += 1
            offset[i] += len(raw)
            has_text.append(bool(line.strip()))
            text[i] += has_text[-1]
            if characters and (not character_lines or lines[i] <= character_lines):
                pending.append(line)
                pending_chars += len(line)
                if pending_chars > 1 << 20:
                    count_pending()
                    pending_chars = 0
        pairs += all(has_text)
    if pending:
        count_pending()
    counts.pop("\n", None)
    for path, n, with_text in zip(paths, lines, text):
        if not with_text:
            raise CorpusError(
                f"corpus file {str(path)!r} has no text: "
                + (f"its {n} lines are all blank" if n else "it is empty (0 lines)"))
    if lines[0] != lines[1]:
        raise CorpusError(
            f"parallel corpus line counts differ: {str(paths[0])!r} has "
            f"{lines[0]} lines but {str(paths[1])!r} has {lines[1]} lines")
    if not pairs:
        raise CorpusError(
            f"parallel corpus is empty: {str(paths[0])!r} ({lines[0]} lines) "
            f"and {str(paths[1])!r} ({lines[1]} lines) have no line with text "
            "on both sides")
    return {"lines": lines[0], "pairs": pairs, "characters": counts}

def sample_lines(paths, sample_size, seed=0):
    """At most ``sample_size`` non-blank lines drawn uniformly at random
    (seeded reservoir sampling, Vitter's algorithm R) from the files
    ``paths`` read one after another, returned in file order; memory is
    bounded by the sample, not the files (what a vocabulary is learned
    from).

    Args:
        paths: list of text files (plain or ``.gz``).
        sample_size: int > 0, the most lines returned; 0: all lines.
        seed: int, the sampling seed.

    Returns:
        list of str; all non-blank lines, in order, when there are no more
        than ``sample_size``.

    Raises:
        FileNotFoundError: a missing file.
        ValueError: ``sample_size`` < 0.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> _ = p.write_text("a\\n\\nb\\nc\\n")
        >>> sample_lines([p], 5), len(sample_lines([p, p], 4))
        (['a', 'b', 'c'], 4)
    """
    import random

    sample_size = int(sample_size)
    if sample_size < 0:
        raise ValueError(f"`sample_size` must be >= 0, got sample_size={sample_size}")
    rng = random.Random(seed)
    kept = []  # (index, line)
    seen = 0
    for path in paths:
        for line in iter_lines(path):
            if not line.strip():
                continue
            if not sample_size or len(kept) < sample_size:
                kept.append((seen, line))
            else:
                j = rng.randrange(seen + 1)
                if j < sample_size:
                    kept[j] = (seen, line)
            seen += 1
    return [line for _, line in sorted(kept)]


def translation_train_files(dataset="multi30k", data_dir=None,
                            source_language="en", target_language="de",
                            files=None, download=False):
    """The training corpora of a dataset as files, for streaming
    (``keras_trm.data.prepare_translation_data``): nothing is read here.

    Args:
        dataset: ``"multi30k"`` (train), ``"wmt14"`` (the local Europarl
            slice and, if present, the newstest2008-2022 pool) or
            ``"files"`` (``files["train_source"]`` / ``["train_target"]``,
            comma-separated lists for several corpora). ``"wmt14_tfds"``
            is not file-based (see the translation job).
        data_dir, download: as for ``load_translation_splits``.
        source_language, target_language: the direction.
        files: for ``"files"``, a dict with ``train_source`` and
            ``train_target``.

    Returns:
        list of ``(name, source_path, target_path)``, one per corpus.

    Raises:
        ValueError: unknown dataset, or source and target lists of
            different lengths.
        FileNotFoundError: a missing file.

    Example:
        >>> [n for n, _, _ in translation_train_files("wmt14")]  # doctest: +SKIP
        ['europarl_v7_first20000', 'newstest2008-2022-pool']
    """
    src, tgt = source_language, target_language
    if dataset == "multi30k":
        root = resolve_data_dir(data_dir, must_exist=not download)
        directory = root / "multi30k"
        paths = [_find(directory, f"train.{lang}") for lang in (src, tgt)]
        if None in paths:
            load_multi30k("train", data_dir, src, tgt, download=download)
            paths = [_find(directory, f"train.{lang}") for lang in (src, tgt)]
        return [("train", *paths)]
    if dataset == "wmt14":
        if {src, tgt} != {"en", "de"}:
            load_wmt14("train", data_dir, src, tgt)  # raises the language error
        directory = resolve_data_dir(data_dir) / "wmt14_en_de"
        out = []
        for name, stem in (("europarl_v7_first20000", WMT14_TRAIN_STEM),
                           (WMT14_POOL_STEM, WMT14_POOL_STEM)):
            paths = [_find(directory, f"{stem}.{lang}") for lang in (src, tgt)]
            if None not in paths:
                out.append((name, *paths))
            elif stem == WMT14_TRAIN_STEM:
                load_wmt14("train", data_dir, src, tgt)  # raises FileNotFoundError
        return out
    if dataset != "files":
        raise ValueError(f"`dataset` must be 'multi30k', 'wmt14' or 'files' for "
                         f"file-based training data, got dataset={dataset!r}")
    files = files or {}
    sources = [x for x in str(files.get("train_source") or "").split(",") if x]
    targets = [x for x in str(files.get("train_target") or "").split(",") if x]
    if not sources or len(sources) != len(targets):
        raise ValueError(
            f"dataset='files' needs as many --train-source as --train-target "
            f"files (comma-separated), got train_source={files.get('train_source')!r}, "
            f"train_target={files.get('train_target')!r}")
    out = []
    for s, t in zip(sources, targets):
        for path in (s, t):
            if not pathlib.Path(path).is_file():
                raise FileNotFoundError(f"corpus file {path!r} does not exist")
        out.append((_split_name(s, src), pathlib.Path(s), pathlib.Path(t)))
    return out


def translation_eval_files(dataset="multi30k", data_dir=None,
                           source_language="en", target_language="de",
                           files=None, download=False):
    """The validation and test files of a translation corpus, without
    reading them (``translation_train_files``' counterpart; what a job
    checks before it starts, ``keras_trm.jobs.translation.check_inputs``).

    Args:
        dataset: ``"multi30k"`` (val, test_2016_flickr), ``"wmt14"`` (local
            newstest2013, newstest2014) or ``"files"``
            (``files["validation_source"]`` ... ``["test_target"]``; no
            test files: no test split).
        data_dir, source_language, target_language, download: as in
            ``load_translation_splits``.

    Returns:
        list of ``(role, name, source_path, target_path)``, ``role`` being
        ``"validation"`` or ``"test"``.

    Raises:
        ValueError: ``dataset="files"`` with one file of a pair missing;
            ``"wmt14_tfds"`` (read through tfds: no files); an unknown one.
        FileNotFoundError: a missing file (the message names the files
            expected and the folder).

    Example:
        >>> [(r, n) for r, n, _, _ in translation_eval_files("multi30k")]  # doctest: +SKIP
        [('validation', 'val'), ('test', 'test_2016_flickr')]
    """
    src, tgt = source_language, target_language
    out = []
    if dataset == "multi30k":
        directory = resolve_data_dir(data_dir, must_exist=not download) / "multi30k"
        for role, split in (("validation", "val"), ("test", "test_2016_flickr")):
            paths = [_find(directory, f"{split}.{lang}") for lang in (src, tgt)]
            if None in paths:  # downloads it, or names what is missing
                load_multi30k(split, data_dir, src, tgt, download=download)
                paths = [_find(directory, f"{split}.{lang}") for lang in (src, tgt)]
            out.append((role, split, *paths))
        return out
    if dataset == "wmt14":
        directory = resolve_data_dir(data_dir) / "wmt14_en_de"
        for role in ("validation", "test"):
            stem = WMT14_ROLES[role]
            paths = [_find(directory, f"{stem}.{lang}") for lang in (src, tgt)]
            if None in paths:
                load_wmt14(role, data_dir, src, tgt)  # raises, naming the files
            out.append((role, stem, *paths))
        return out
    if dataset != "files":
        raise ValueError(f"`dataset` must be 'multi30k', 'wmt14' or 'files' for "
                         f"file-based validation and test data, got dataset={dataset!r}")
    files = files or {}
    for role in ("validation", "test"):
        source = str(files.get(f"{role}_source") or "")
        target = str(files.get(f"{role}_target") or "")
        if role == "test" and not source and not target:
            continue  # no test split
        if not source or not target:
            raise ValueError(
                f"dataset='files' needs both --{role}-source and "
                f"--{role}-target, got {role}_source={source!r}, "
                f"{role}_target={target!r}")
        for path in (source, target):
            if not pathlib.Path(path).is_file():
                raise FileNotFoundError(f"corpus file {path!r} does not exist")
        out.append((role, _split_name(source, src), pathlib.Path(source),
                    pathlib.Path(target)))
    return out

def _split_name(path, language):
    """``dir/newstest2014.de.gz`` -> ``newstest2014`` (the name reported)."""
    name = pathlib.Path(path).name
    name = name[:-3] if name.endswith(".gz") else name
    return name[: -len(language) - 1] if name.endswith("." + language) else name


@dataclasses.dataclass
class TranslationSplits:
    """Train / validation / test pairs of one corpus and direction.

    Each field is a ``(sources, targets)`` pair of equal-length str lists;
    ``names`` gives each split's name as reported (e.g. ``"newstest2014"``).
    """

    train: tuple
    validation: tuple
    test: tuple
    names: dict


def load_translation_splits(dataset="multi30k", data_dir=None,
                            source_language="en", target_language="de",
                            files=None, online=False, download=False,
                            include_train=True):
    """Resolves a corpus name and direction into train / validation / test.

    Args:
        dataset: ``"multi30k"`` (train / val / test_2016_flickr),
            ``"wmt14"`` (local: the Europarl slice / newstest2013 /
            newstest2014), ``"wmt14_tfds"`` (online: tfds
            ``wmt14_translate/de-en``, the full ~4.5M training pairs /
            newstest2013 / newstest2014) or ``"files"`` (the user's own).
        data_dir: data directory for ``multi30k``/``wmt14``.
        source_language, target_language: language codes; the corpus is
            read in that direction.
        files: for ``dataset="files"``, a dict with keys ``train_source``,
            ``train_target``, ``validation_source``, ``validation_target``,
            ``test_source``, ``test_target`` (paths; plain or ``.gz``).
            ``test_*`` may be empty: then there is no test split
            (``test == ([], [])``).
        online: ``wmt14`` reads tfds, as ``"wmt14_tfds"`` does (and
            ``multi30k`` is downloaded if missing).
        include_train: False: ``train`` is ``([], [])`` and nothing of it
            is read (a job streaming it, ``translation_train_files``).
        download: ``multi30k`` files that are missing are downloaded (see
            ``load_multi30k``). Local ``wmt14`` is never replaced by the
            4.5M-pair tfds corpus behind the user's back: that is
            ``"wmt14_tfds"``.

    Returns:
        ``TranslationSplits``.

    Raises:
        ValueError: unknown ``dataset``, a missing path for ``files``, a
            same-language direction, or the reader's errors (mismatched
            line counts, empty corpus).
        FileNotFoundError: a missing file.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> for n in ("tr", "va"):
        ...     _ = (d / f"{n}.de").write_text("Ein Hund.\\n")
        ...     _ = (d / f"{n}.en").write_text("A dog.\\n")
        >>> s = load_translation_splits("files", None, "de", "en", files=dict(
        ...     train_source=d / "tr.de", train_target=d / "tr.en",
        ...     validation_source=d / "va.de", validation_target=d / "va.en"))
        >>> s.train, s.test, s.names["validation"]
        ((['Ein Hund.'], ['A dog.']), ([], []), 'va')
    """
    if dataset not in DATASETS:
        raise ValueError(f"`dataset` must be one of {DATASETS}, got dataset={dataset!r}")
    if source_language == target_language:
        raise ValueError(
            f"source and target languages must differ, got "
            f"source_language={source_language!r}, "
            f"target_language={target_language!r}"
        )
    pair = dict(source=source_language, target=target_language)
    if dataset == "multi30k":
        roles = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
        loaded = {role: load_multi30k(split, data_dir,
                                      download=download or online, **pair)
                  if include_train or role != "train" else ([], [])
                  for role, split in roles.items()}
        return TranslationSplits(**loaded, names=roles)
    if dataset == "wmt14_tfds":
        dataset, online = "wmt14", True
    if dataset == "wmt14":
        names = {"train": "europarl_v7_first20000" if not online else "wmt14_train",
                 "validation": "newstest2013", "test": "newstest2014"}
        loaded = {role: load_wmt14(role, data_dir, online=online, **pair)
                  if include_train or role != "train" else ([], [])
                  for role in names}
        return TranslationSplits(**loaded, names=names)
    files = {k: str(v) if v else "" for k, v in (files or {}).items()}
    loaded, names = {}, {}
    for role in ("train", "validation", "test"):
        src, tgt = files.get(f"{role}_source", ""), files.get(f"{role}_target", "")
        if role == "test" and not src and not tgt:
            loaded[role], names[role] = ([], []), ""
            continue
        if role == "train" and not include_train:
            loaded[role], names[role] = ([], []), _split_name(src.split(",")[0],
                                                               source_language)
            continue
        if not src or not tgt:
            raise ValueError(
                f"dataset='files' needs both --{role}-source and "
                f"--{role}-target, got {role}_source={src!r}, "
                f"{role}_target={tgt!r}"
            )
        loaded[role] = load_parallel(src, tgt)
        names[role] = _split_name(src, source_language)
    return TranslationSplits(**loaded, names=names)
