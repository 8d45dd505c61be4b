"""Parallel corpora: Multi30k (task 1), WMT14 EN-DE and the user's own
files, in either direction, from ``<data_dir>/multi30k`` and
``<data_dir>/wmt14_en_de`` (``keras_trm.data.paths``). Online, Multi30k is
downloaded from its official repository (six gzip files, 1.3 MB, checked
against ``MULTI30K_SHA256``) and WMT14 read from tfds
(``wmt14_translate/de-en``). ``load_translation_splits`` resolves a
dataset name, split files and a direction into (train, validation, test).
"""

import collections
import dataclasses
import gzip
import itertools
import os
import pathlib
import random
import zlib

import numpy as np

from keras_trm.data.download import fetch
from keras_trm.data.paths import resolve_data_dir
from keras_trm.utils import checks as v

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


class CorpusError(ValueError):
    """A corpus that cannot be learned from, found before anything is
    written: invalid UTF-8, an unreadable gzip file, no text, line counts
    that differ, or a setting it rules out (a ``vocabulary_size`` too small
    for its characters). The CLI reports it as a usage error (exit 2)."""


def _existing(*paths):
    """``paths`` as ``pathlib.Path``; the first that is not a file raises
    ``FileNotFoundError`` naming it."""
    for path in paths:
        if not pathlib.Path(path).is_file():
            raise FileNotFoundError(f"corpus file {str(path)!r} does not exist")
    return [pathlib.Path(p) for p in paths]


def _decoded(path):
    """The lines of ``path`` (plain or ``.gz``), line ends kept; invalid
    UTF-8 or a damaged gzip file raises ``CorpusError`` naming the file and
    the line, not a bare ``UnicodeDecodeError`` / ``EOFError``."""
    gz = path.name.endswith(".gz")
    n = offset = 0
    with (gzip.open if gz else open)(path, "rb") as f:
        try:
            for n, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise CorpusError(
                        f"corpus file {str(path)!r} is not valid UTF-8: line {n}, byte "
                        f"{err.start + 1} of the line (byte offset {offset + err.start} "
                        f"in the {'decompressed ' if gz else ''}file): {err.reason} "
                        f"(0x{raw[err.start:err.start + 1].hex()})") from None
                offset += len(raw)
                yield line
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise CorpusError(f"corpus file {str(path)!r} is not a readable gzip "
                              f"file (after line {n}): {err}") from None


def iter_lines(path):
    """Yields the lines of a UTF-8 text file (plain or ``.gz``) one at a
    time, without their trailing newline.

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
    (path,) = _existing(path)
    for line in _decoded(path):
        yield line.rstrip("\r\n")


def read_lines(path):
    """``list(iter_lines(path))``: the lines of a UTF-8 text file (plain or
    ``.gz``) without their newline; raises as ``iter_lines``.

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
        ``(sources, targets)``: two equal-length lists of raw str (blank
        lines kept).

    Raises:
        FileNotFoundError: a file is missing (the message names it).
        CorpusError: (a ``ValueError``) the line counts differ (both files
            and counts named), no line has text on both sides (both files
            named), or as ``iter_lines``.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "x.en").write_text("A dog.\\nTwo cats.\\n")
        >>> _ = (d / "x.de").write_text("Ein Hund.\\nZwei Katzen.\\n")
        >>> load_parallel(d / "x.en", d / "x.de")
        (['A dog.', 'Two cats.'], ['Ein Hund.', 'Zwei Katzen.'])
    """
    sources, targets = read_lines(source_path), read_lines(target_path)
    _check_alignment(source_path, target_path, len(sources), len(targets),
                     any(s.strip() and t.strip() for s, t in zip(sources, targets)))
    return sources, targets


def _check_alignment(source_path, target_path, n_source, n_target, pairs):
    """Refuses files of different line counts, or without a pair with text
    on both sides (``pairs`` falsy), naming both files."""
    source, target = str(source_path), str(target_path)
    if n_source != n_target:
        raise CorpusError(f"parallel corpus line counts differ: {source!r} has "
                          f"{n_source} lines but {target!r} has {n_target} lines")
    if not pairs:
        raise CorpusError(f"parallel corpus is empty: {source!r} ({n_source} lines) "
                          f"and {target!r} ({n_target} lines) have no line with text "
                          "on both sides")


def _find(directory, *stems):
    """``directory / stem`` or ``stem.gz`` for each stem (None: neither)."""
    return [next((p for p in (directory / s, directory / f"{s}.gz") if p.is_file()), None)
            for s in stems]


def multi30k_url():
    """The base URL Multi30k is downloaded from: ``$KERAS_TRM_MULTI30K_URL``
    if set, else ``MULTI30K_URL``."""
    url = os.environ.get(MULTI30K_URL_ENV) or MULTI30K_URL
    return url if url.endswith("/") else url + "/"


def _multi30k_files(split, data_dir, source, target, download, url=None):
    """The two files of a Multi30k split (checked arguments), downloading
    the missing ones if ``download``."""
    v.one_of("split", split, MULTI30K_SPLITS)
    for name, lang in (("source", source), ("target", target)):
        if lang not in ("en", "de", "fr", "cs"):
            raise ValueError(f"`{name}` must be a Multi30k language, got {lang!r}")
    if source == target:
        raise ValueError(f"`source` and `target` must differ, got source={source!r} "
                         f"and target={target!r}")
    directory = resolve_data_dir(data_dir, must_exist=not download) / "multi30k"
    stems = (f"{split}.{source}", f"{split}.{target}")
    paths = _find(directory, *stems)
    if None in paths and download:
        for stem, path in zip(stems, paths):
            if path is None:
                name = stem + ".gz"
                fetch((url or multi30k_url()) + name, directory / name,
                      sha256=MULTI30K_SHA256.get(name))
        paths = _find(directory, *stems)
    if None in paths:
        raise FileNotFoundError(
            f"Multi30k split {split!r} not found: expected "
            f"{split}.{source}[.gz] and {split}.{target}[.gz] in "
            f"{directory} (when online, load_multi30k(download=True) or "
            f"`keras-trm train-translation --download true` fetches it from "
            f"{multi30k_url()})")
    return paths


def load_multi30k(split="train", data_dir=None, source="en", target="de",
                  download=False, url=None):
    """Loads one split of Multi30k task 1 as (source, target) string lists.

    Args:
        split: ``"train"`` (29,000 pairs), ``"val"`` (1,014) or
            ``"test_2016_flickr"`` (1,000).
        data_dir: data directory (see ``resolve_data_dir``); files are read
            from ``<data_dir>/multi30k/{split}.{lang}[.gz]``.
        source, target: language codes (``"en"``/``"de"``, or reversed).
        download: fetch missing files into ``<data_dir>/multi30k``
            (``~/keras_trm_data`` if no data folder exists).
        url: base URL to download from (default ``multi30k_url()``).

    Returns:
        ``(sources, targets)``: two lists of raw (cased, untokenized) str.

    Raises:
        ValueError: unknown ``split`` or language; ``source`` equal to
            ``target``; line counts differ; a checksum that did not match.
        FileNotFoundError: files missing and not downloaded (the files
            expected and the directory named); a ``data_dir`` that is a file.
        OSError: the download failed (``keras_trm.data.download.fetch``).

    Example:
        >>> src, tgt = load_multi30k("val", source="de", target="en")  # doctest: +SKIP
        >>> len(src), src[0][:20]  # doctest: +SKIP
        (1014, 'Eine Gruppe von Männ')
    """
    return load_parallel(*_multi30k_files(split, data_dir, source, target,
                                          download, url))


def _wmt14_stem(split, source, target):
    """The file stem of a WMT14 split (checked arguments); ``"train"`` for
    the training role."""
    if {source, target} != {"en", "de"}:
        raise ValueError(
            f"WMT14 EN-DE languages must be 'en' and 'de' (either direction), "
            f"got source={source!r}, target={target!r}")
    v.one_of("split", split, tuple(WMT14_ROLES) + tuple(WMT14_SPLITS))
    return WMT14_ROLES.get(split, split)


def _wmt14_files(split, data_dir, source, target):
    """The two local files of a WMT14 split."""
    stem = _wmt14_stem(split, source, target)
    stem = WMT14_TRAIN_STEM if stem == "train" else stem
    directory = resolve_data_dir(data_dir) / "wmt14_en_de"
    paths = _find(directory, f"{stem}.{source}", f"{stem}.{target}")
    if None in paths:
        raise FileNotFoundError(
            f"WMT14 {split!r} not found: expected {stem}.{source}[.gz] and "
            f"{stem}.{target}[.gz] in {directory} (online: online=True, or "
            "`keras-trm train-translation --dataset wmt14_tfds`, reads tfds "
            "wmt14_translate/de-en)")
    return paths


def load_wmt14(split="newstest2014", data_dir=None, source="en", target="de",
               online=False):
    """Loads a WMT14 English-German split, in either direction.

    Offline it reads ``<data_dir>/wmt14_en_de``: ``"train"`` is the first
    20,000 pairs of Europarl v7 (``europarl-v7.de-en.first20000.{lang}.gz``,
    0.4% of the full training data), ``"validation"`` newstest2013 (3,000
    pairs), ``"test"`` newstest2014 (3,003). Online the same roles come
    from tfds ``wmt14_translate/de-en`` (train: ~4.5M pairs, ~1.4 GB).

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
        FileNotFoundError: missing local files (folder and files named).

    Example:
        >>> src, tgt = load_wmt14("test", source="de", target="en")  # doctest: +SKIP
        >>> len(src)  # doctest: +SKIP
        3003
    """
    if not online:
        return load_parallel(*_wmt14_files(split, data_dir, source, target))
    import tensorflow_datasets as tfds

    tfds_split = {"train": "train", "newstest2013": "validation",
                  "newstest2014": "test"}[_wmt14_stem(split, source, target)]
    src, tgt = [], []
    for ex in tfds.as_numpy(tfds.load("wmt14_translate/de-en", split=tfds_split)):
        src.append(ex[source].decode("utf-8"))
        tgt.append(ex[target].decode("utf-8"))
    return src, tgt


def check_parallel_corpus(source_path, target_path, characters=True,
                          character_lines=0):
    """Checks a parallel corpus in one streaming pass, before anything is
    learned or written from it: both files decode as UTF-8, have the same
    number of lines and hold text. Only counts are kept (plus about 1 MB of
    text at a time when counting characters); Multi30k's training pair
    takes about 0.15 s.

    Args:
        source_path, target_path: str or ``pathlib.Path``, line-aligned
            UTF-8 text (plain or ``.gz``).
        characters: also count the characters of both files (what a
            vocabulary learned from them must hold).
        character_lines: > 0: count the characters of the first n lines of
            each file only (what a ``limit`` run learns from); 0: all.

    Returns:
        dict: ``lines`` (int, of each file), ``pairs`` (int, lines with
        text on both sides) and ``characters`` (``collections.Counter`` of
        both files, newlines excepted; empty if ``characters`` is False).

    Raises:
        FileNotFoundError: a file is missing (the message names it).
        CorpusError: (a ``ValueError``) a file is not valid UTF-8 (named
            with the line and byte offset, in the decompressed file for
            ``.gz``), not a readable gzip file, or without text (named with
            its line count); line counts that differ (both files and
            counts); no line with text on both sides.

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
    paths = _existing(source_path, target_path)
    lines, text, pairs = [0, 0], [0, 0], 0
    counts, pending = collections.Counter(), []

    def count_pending():  # numpy counts a MB of text ~3x faster than Counter
        codes = np.frombuffer("".join(pending).encode("utf-32-le"), np.uint32)
        found, times = np.unique(codes, return_counts=True)
        counts.update(dict(zip(map(chr, found.tolist()), times.tolist())))
        pending.clear()

    size = 0
    for pair in itertools.zip_longest(*map(_decoded, paths)):
        for i, line in enumerate(pair):
            if line is None:
                continue
            lines[i] += 1
            text[i] += bool(line.strip())
            if characters and (not character_lines or lines[i] <= character_lines):
                pending.append(line)
                size += len(line)
        pairs += all(line and line.strip() for line in pair)
        if size > 1 << 20:
            count_pending()
            size = 0
    count_pending()
    counts.pop("\n", None)
    for path, n, with_text in zip(paths, lines, text):
        if not with_text:
            raise CorpusError(
                f"corpus file {str(path)!r} has no text: "
                + (f"its {n} lines are all blank" if n else "it is empty (0 lines)"))
    _check_alignment(*paths, *lines, pairs)
    return {"lines": lines[0], "pairs": pairs, "characters": counts}


def sample_lines(paths, sample_size, seed=0):
    """At most ``sample_size`` non-blank lines of the files ``paths``,
    drawn uniformly (seeded reservoir sampling, Vitter's algorithm R) and
    returned in file order; memory is bounded by the sample (what a
    vocabulary is learned from).

    Args:
        paths: list of text files (plain or ``.gz``).
        sample_size: int > 0, the most lines returned; 0: all lines.
        seed: int, the sampling seed.

    Returns:
        list of str.

    Raises:
        FileNotFoundError: a missing file. ValueError: ``sample_size`` < 0.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> _ = p.write_text("a\\n\\nb\\nc\\n")
        >>> sample_lines([p], 5), len(sample_lines([p, p], 4))
        (['a', 'b', 'c'], 4)
    """
    sample_size = int(sample_size)
    if sample_size < 0:
        raise ValueError(f"`sample_size` must be >= 0, got sample_size={sample_size}")
    rng = random.Random(seed)
    kept, seen = [], 0  # kept: (index, line)
    for line in itertools.chain.from_iterable(map(iter_lines, paths)):
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


def _split_name(path, language):
    """``dir/newstest2014.de.gz`` -> ``newstest2014`` (the name reported)."""
    name = pathlib.Path(path).name
    name = name[:-3] if name.endswith(".gz") else name
    return name[: -len(language) - 1] if name.endswith("." + language) else name


def _files_role(files, role):
    """The ``(source, target)`` paths (str) of ``role`` in a ``files`` dict;
    ``("", "")`` for an absent test split (there is none then)."""
    source = str(files.get(f"{role}_source") or "")
    target = str(files.get(f"{role}_target") or "")
    if (source or target or role != "test") and not (source and target):
        raise ValueError(
            f"dataset='files' needs both --{role}-source and "
            f"--{role}-target, got {role}_source={source!r}, "
            f"{role}_target={target!r}")
    return source, target


def _file_dataset_error(dataset, what):
    return ValueError(f"`dataset` must be 'multi30k', 'wmt14' or 'files' for "
                      f"file-based {what}, got dataset={dataset!r}")


def translation_train_files(dataset="multi30k", data_dir=None,
                            source_language="en", target_language="de",
                            files=None, download=False):
    """The training corpora of a dataset as files, for streaming
    (``keras_trm.data.prepare_translation_data``): nothing is read here.

    Args:
        dataset: ``"multi30k"`` (train), ``"wmt14"`` (the local Europarl
            slice and, if present, the newstest2008-2022 pool) or
            ``"files"`` (``files["train_source"]`` / ``["train_target"]``,
            comma-separated lists for several corpora).
        data_dir, source_language, target_language, files, download: as
            for ``load_translation_splits``.

    Returns:
        list of ``(name, source_path, target_path)``, one per corpus.

    Raises:
        ValueError: unknown dataset, or source and target lists of
            different lengths. FileNotFoundError: a missing file.

    Example:
        >>> [n for n, _, _ in translation_train_files("wmt14")]  # doctest: +SKIP
        ['europarl_v7_first20000', 'newstest2008-2022-pool']
    """
    src, tgt = source_language, target_language
    if dataset == "multi30k":
        return [("train", *_multi30k_files("train", data_dir, src, tgt, download))]
    if dataset == "wmt14":
        train = _wmt14_files("train", data_dir, src, tgt)
        pool = _find(train[0].parent, f"{WMT14_POOL_STEM}.{src}", f"{WMT14_POOL_STEM}.{tgt}")
        return [("europarl_v7_first20000", *train)] + (
            [(WMT14_POOL_STEM, *pool)] if None not in pool else [])
    if dataset != "files":
        raise _file_dataset_error(dataset, "training data")
    files = files or {}
    sources = [x for x in str(files.get("train_source") or "").split(",") if x]
    targets = [x for x in str(files.get("train_target") or "").split(",") if x]
    if not sources or len(sources) != len(targets):
        raise ValueError(
            f"dataset='files' needs as many --data.train_source as --data.train_target "
            f"files (comma-separated), got train_source={files.get('train_source')!r}, "
            f"train_target={files.get('train_target')!r}")
    return [(_split_name(s, src), *_existing(s, t)) for s, t in zip(sources, targets)]


def translation_eval_files(dataset="multi30k", data_dir=None,
                           source_language="en", target_language="de",
                           files=None, download=False):
    """The validation and test files of a translation corpus, without
    reading them (what ``keras_trm.jobs.translation.check_inputs`` checks).

    Args:
        dataset: ``"multi30k"`` (val, test_2016_flickr), ``"wmt14"`` (local
            newstest2013, newstest2014) or ``"files"`` (no test files: no
            test split).
        data_dir, source_language, target_language, files, download: as in
            ``load_translation_splits``.

    Returns:
        list of ``(role, name, source_path, target_path)``, ``role`` being
        ``"validation"`` or ``"test"``.

    Raises:
        ValueError: ``dataset="files"`` with one file of a pair missing;
            ``"wmt14_tfds"`` (no files); an unknown one.
        FileNotFoundError: a missing file (files expected and folder named).

    Example:
        >>> [(r, n) for r, n, _, _ in translation_eval_files("multi30k")]  # doctest: +SKIP
        [('validation', 'val'), ('test', 'test_2016_flickr')]
    """
    src, tgt = source_language, target_language
    if dataset == "multi30k":
        return [(role, split, *_multi30k_files(split, data_dir, src, tgt, download))
                for role, split in (("validation", "val"), ("test", "test_2016_flickr"))]
    if dataset == "wmt14":
        return [(role, WMT14_ROLES[role], *_wmt14_files(role, data_dir, src, tgt))
                for role in ("validation", "test")]
    if dataset != "files":
        raise _file_dataset_error(dataset, "validation and test data")
    out = []
    for role in ("validation", "test"):
        source, target = _files_role(files or {}, role)
        if source:
            out.append((role, _split_name(source, src), *_existing(source, target)))
    return out


@dataclasses.dataclass
class TranslationSplits:
    """Train / validation / test ``(sources, targets)`` pairs of str lists
    of one corpus and direction; ``names``: each split's reported name."""

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
            newstest2014), ``"wmt14_tfds"`` (the same roles from tfds, with
            the full ~4.5M training pairs) or ``"files"`` (the user's own).
        data_dir: data directory for ``multi30k``/``wmt14``.
        source_language, target_language: language codes (the direction).
        files: for ``dataset="files"``, a dict of paths (plain or ``.gz``):
            ``{train,validation,test}_{source,target}``; no ``test_*``: no
            test split (``test == ([], [])``).
        online: ``wmt14`` reads tfds, as ``"wmt14_tfds"`` does (and
            ``multi30k`` is downloaded if missing).
        include_train: False: ``train`` is ``([], [])``, not read (a job
            streaming it, ``translation_train_files``).
        download: missing ``multi30k`` files are downloaded. Local
            ``wmt14`` is never silently replaced by the 4.5M-pair tfds
            corpus: that is ``"wmt14_tfds"``.

    Returns:
        ``TranslationSplits``.

    Raises:
        ValueError: unknown ``dataset``, a missing path for ``files``, a
            same-language direction, mismatched line counts, empty corpus.
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
            f"target_language={target_language!r}")
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
    files = files or {}
    loaded, names = {}, {}
    for role in ("train", "validation", "test"):
        if role == "train" and not include_train:
            first = str(files.get("train_source") or "").split(",")[0]
            loaded[role], names[role] = ([], []), _split_name(first, source_language)
            continue
        src, tgt = _files_role(files, role)
        loaded[role] = load_parallel(src, tgt) if src else ([], [])
        names[role] = _split_name(src, source_language)
    return TranslationSplits(**loaded, names=names)
