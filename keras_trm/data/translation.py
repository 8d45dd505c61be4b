"""Parallel corpora: Multi30k (task 1, EN-DE) and WMT14 EN-DE.

Local files are read from ``<data_dir>/multi30k`` and
``<data_dir>/wmt14_en_de`` (see ``keras_trm.data.paths``); online, Multi30k
comes from its official repository and WMT14 training data from tfds
(``wmt14_translate/de-en``).
"""

import gzip

from keras_trm.data.paths import resolve_data_dir

MULTI30K_URL = (
    "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
)
MULTI30K_SPLITS = ("train", "val", "test_2016_flickr")
WMT14_SPLITS = {"newstest2013": "newstest2013", "newstest2014": "newstest2014"}


def _read_lines(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _find(directory, stem):
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def _download_multi30k(directory, files):
    import keras

    directory.mkdir(parents=True, exist_ok=True)
    for name in files:
        keras.utils.get_file(
            fname=name, origin=MULTI30K_URL + name,
            cache_dir=str(directory), cache_subdir="",
        )


def load_multi30k(split="train", data_dir=None, source="en", target="de",
                  download=False):
    """Loads one split of Multi30k task 1 as (source, target) string lists.

    Args:
        split: ``"train"`` (29,000 pairs), ``"val"`` (1,014) or
            ``"test_2016_flickr"`` (1,000).
        data_dir: data directory (see ``resolve_data_dir``); files are read
            from ``<data_dir>/multi30k/{split}.{lang}[.gz]``.
        source, target: language codes, ``"en"``/``"de"``.
        download: if the files are missing, fetch them from the official
            repository (needs internet) into ``<data_dir>/multi30k``.

    Returns:
        ``(sources, targets)``: two lists of raw (cased, untokenized) str.

    Raises:
        ValueError: unknown ``split`` or language.
        FileNotFoundError: files missing (and not downloaded); the message
            names the files expected and the directory searched.
    """
    if split not in MULTI30K_SPLITS:
        raise ValueError(
            f"`split` must be one of {MULTI30K_SPLITS}, got split={split!r}"
        )
    for name, lang in (("source", source), ("target", target)):
        if lang not in ("en", "de", "fr", "cs"):
            raise ValueError(f"`{name}` must be a Multi30k language, got {lang!r}")
    root = resolve_data_dir(data_dir, must_exist=not download)
    directory = root / "multi30k"
    paths = [_find(directory, f"{split}.{lang}") for lang in (source, target)]
    if None in paths and download:
        _download_multi30k(directory, [f"{split}.{lang}.gz" for lang in (source, target)])
        paths = [_find(directory, f"{split}.{lang}") for lang in (source, target)]
    if None in paths:
        raise FileNotFoundError(
            f"Multi30k split {split!r} not found: expected "
            f"{split}.{source}[.gz] and {split}.{target}[.gz] in "
            f"{directory} (pass download=True / --download when online)"
        )
    src, tgt = (_read_lines(p) for p in paths)
    if len(src) != len(tgt):
        raise ValueError(
            f"Multi30k {split}: {paths[0]} has {len(src)} lines but "
            f"{paths[1]} has {len(tgt)}"
        )
    return src, tgt


def load_wmt14(split="newstest2014", data_dir=None, source="en", target="de"):
    """Loads a WMT14 EN-DE set.

    ``newstest2013``/``newstest2014`` are read from
    ``<data_dir>/wmt14_en_de/{split}.{lang}``; ``"train"`` comes from tfds
    ``wmt14_translate/de-en`` (downloads ~1.4 GB when online).

    Returns:
        ``(sources, targets)`` lists of str.

    Raises:
        ValueError: unknown split. FileNotFoundError: missing local files.
    """
    if split == "train":
        import tensorflow_datasets as tfds

        ds = tfds.load("wmt14_translate/de-en", split="train")
        src, tgt = [], []
        for ex in tfds.as_numpy(ds):
            src.append(ex[source].decode("utf-8"))
            tgt.append(ex[target].decode("utf-8"))
        return src, tgt
    if split not in WMT14_SPLITS:
        raise ValueError(
            f"`split` must be 'train' or one of {tuple(WMT14_SPLITS)}, "
            f"got split={split!r}"
        )
    directory = resolve_data_dir(data_dir) / "wmt14_en_de"
    paths = [_find(directory, f"{split}.{lang}") for lang in (source, target)]
    if None in paths:
        raise FileNotFoundError(
            f"WMT14 {split} not found: expected {split}.{source} and "
            f"{split}.{target} in {directory}"
        )
    return tuple(_read_lines(p) for p in paths)
