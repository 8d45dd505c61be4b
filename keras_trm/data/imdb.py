"""IMDB movie reviews (Large Movie Review Dataset v1.0, Maas et al. 2011).

Local files (``keras_trm.data.paths``; provenance in
``shared/data/README.md``): ``<data_dir>/imdb/imdb_{train,test}.jsonl.gz``,
gzip JSON Lines, one review per line with ``text``, ``label`` (0 =
negative, rating <= 4; 1 = positive, rating >= 7), ``split``, ``file`` and
``rating``; 25,000 reviews a split, 12,500 per label, negative first.
Online, the same data come from tfds ``imdb_reviews``.
"""

import json

import numpy as np

from keras_trm.data.paths import resolve_data_dir
from keras_trm.data.translation import CorpusError, iter_lines
from keras_trm.utils import checks as v

IMDB_SPLITS = ("train", "test")
HTML_BREAK = "<br />"


def _clean(text, replace_breaks):
    return text.replace(HTML_BREAK, " ") if replace_breaks else text


def _load_tfds(split, root, replace_breaks):
    import tensorflow_datasets as tfds

    ds = tfds.load("imdb_reviews", split=split, data_dir=str(root / "tensorflow_datasets"))
    texts, labels = [], []
    for ex in tfds.as_numpy(ds):
        texts.append(_clean(ex["text"].decode("utf-8"), replace_breaks))
        labels.append(int(ex["label"]))
    return texts, np.asarray(labels, dtype=np.int32)


def load_imdb(split="train", data_dir=None, download=False,
              replace_breaks=True):
    """Loads one split of IMDB sentiment as ``(texts, labels)``.

    The text is kept raw (cased, untokenized) but for every HTML line break
    ``"<br />"`` replaced by a space (``replace_breaks=False``: byte for
    byte as in the original ``.txt`` file).

    Args:
        split: ``"train"`` or ``"test"``.
        data_dir: data directory (see ``resolve_data_dir``).
        download: if the local file is missing, load the split from tfds
            ``imdb_reviews`` (cached under ``<data_dir>/tensorflow_datasets``;
            another record order).
        replace_breaks: bool, replace ``"<br />"`` by a space.

    Returns:
        ``(texts, labels)``: a list of 25,000 str and an ``np.int32`` array
        ``(25,000,)`` with 0 = negative, 1 = positive (12,500 each).

    Raises:
        ValueError: unknown ``split``.
        CorpusError: (a ``ValueError``) not a readable gzip file, not
            UTF-8, a line not a JSON object with ``text`` and a 0/1
            ``label``, or no review (file and line named).
        FileNotFoundError: the file is missing and not downloaded (the
            expected file and folder named).
    """
    v.one_of("split", split, IMDB_SPLITS)
    root = resolve_data_dir(data_dir, must_exist=not download)
    directory = root / "imdb"
    name = f"imdb_{split}.jsonl.gz"
    path = directory / name
    if not path.is_file():
        if download:
            return _load_tfds(split, root, replace_breaks)
        raise FileNotFoundError(
            f"IMDB split {split!r} not found: expected {name} in {directory} "
            "(gzip JSON Lines with fields 'text' and 'label'; pass "
            "download=True, or --download true to keras-trm train-imdb, to use "
            "tfds 'imdb_reviews' when online)")
    texts, labels = [], []
    for n, line in enumerate(iter_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            raise CorpusError(f"{path}, line {n}: not a JSON record ({err})") from None
        if not isinstance(record, dict):
            raise CorpusError(f"{path}, line {n}: a record must be a JSON object with "
                              f"'text' and 'label', got {type(record).__name__} "
                              f"{line[:40]!r}")
        try:
            text, label = record["text"], record["label"]
        except KeyError as e:
            raise CorpusError(f"{path}, line {n}: record has no field {e}") from None
        if isinstance(label, bool) or label not in (0, 1):
            raise CorpusError(f"{path}, line {n}: label must be 0 or 1, got {label!r}")
        if not isinstance(text, str):
            raise CorpusError(f"{path}, line {n}: text must be a string, got {text!r:.40}")
        texts.append(_clean(text, replace_breaks))
        labels.append(label)
    if not texts:
        raise CorpusError(f"{path} holds no review (an empty file: copy it again)")
    return texts, np.asarray(labels, dtype=np.int32)
