"""Language-modelling corpora (PTB, Tiny Shakespeare) and ordered batching.

Two local corpora (see ``keras_trm.data.paths`` for where ``data_dir`` is
looked up, and ``shared/data/README.md`` for their provenance):

* **Penn Treebank**, Mikolov's language-modelling version:
  ``<data_dir>/ptb/ptb.{train,valid,test}.txt[.gz]``. Word level; each line
  is split on whitespace and followed by ``"<eos>"``, as in Mikolov's RNNLM
  examples and the Transformer-XL reference code (``add_eos=True``). Token
  counts (words + one ``<eos>`` per line): train 887,521 + 42,068 =
  929,589; valid 70,390 + 3,370 = 73,760; test 78,669 + 3,761 = 82,430. The
  training vocabulary has 10,000 types including ``<eos>`` (``<unk>`` is
  already in the text).
* **Tiny Shakespeare** (char-rnn): ``<data_dir>/tinyshakespeare/input.txt``,
  1,115,394 characters, character level. There is no official split; here
  the text is cut *by character offset*, 90 % / 5 % / 5 %: train
  ``text[:int(0.9 n)]`` (1,003,854 chars), valid
  ``text[int(0.9 n):int(0.95 n)]`` (55,770), test ``text[int(0.95 n):]``
  (55,770), with ``n = len(text)``.

Online (``download=True``), a missing corpus is fetched from its official
source into the same place: PTB from Mikolov's RNNLM page
(``PTB_URL``, the ``simple-examples.tgz`` archive whose ``data/ptb.*.txt``
are these files), Tiny Shakespeare from the char-rnn repository
(``SHAKESPEARE_URL``).

Ordered batching follows the Transformer-XL reference data iterator
(``LMOrderedIterator``): the token stream is cut into ``batch_size``
contiguous streams (``batchify``), and training/evaluation walks all streams
in parallel, ``seg_len`` tokens at a time, the target of position t being
position t + 1 of the same stream (``segments``). Consecutive segments of a
row continue each other, which is what segment-level recurrence needs.
"""

import collections
from typing import Literal, get_args
import tarfile
import tempfile

import pathlib

import numpy as np

from keras_trm.data.download import _make_folders, _remove_empty, fetch
from keras_trm.data.paths import resolve_data_dir
from keras_trm.data.translation import CorpusError, decoded_lines
from keras_trm.utils import checks as v
from keras_trm.utils.files import atomic_write

PTB_SPLITS = ("train", "valid", "test")
SHAKESPEARE_SPLITS = ("train", "valid", "test")
SHAKESPEARE_FRACTIONS = (0.9, 0.05, 0.05)
EOS = "<eos>"
UNK = "<unk>"
PTB_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/"
                   "master/data/tinyshakespeare/input.txt")


# SHA-256 of the official Tiny Shakespeare file (karpathy/char-rnn).
SHAKESPEARE_SHA256 = (
    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed")


def _download_ptb(directory):
    """Extracts ``data/ptb.{train,valid,test}.txt`` of ``PTB_URL`` into
    ``directory`` (each file written whole, then renamed into place)."""
    created = _make_folders(directory)
    try:
        with tempfile.TemporaryDirectory(dir=directory, prefix=".download-") as tmp:
            archive = fetch(PTB_URL, pathlib.Path(tmp) / "simple-examples.tgz")
            with tarfile.open(archive, "r:gz") as tar:
                for split in PTB_SPLITS:
                    member = tar.extractfile(f"./simple-examples/data/ptb.{split}.txt")
                    atomic_write(directory / f"ptb.{split}.txt", member.read())
    except BaseException:
        _remove_empty(created)  # offline: no empty ptb folder left behind
        raise


def _download_shakespeare(directory):
    fetch(SHAKESPEARE_URL, directory / "input.txt", sha256=SHAKESPEARE_SHA256)


def _split_arg(split, allowed):
    if split not in allowed:
        raise ValueError(f"`split` must be one of {allowed}, got split={split!r}")
    return split


def load_ptb(split="train", data_dir=None, download=False):
    """The tokens of one split of the Mikolov Penn Treebank, one at a time.

    Every line is split on whitespace and ``"<eos>"`` is appended to it
    (empty lines give a lone ``"<eos>"``). The file is found (or fetched)
    when this is called and read a line at a time as the tokens are
    taken, so nothing holds the split (``load_lm_corpus`` turns it into
    int32 ids).

    Args:
        split: ``"train"``, ``"valid"`` or ``"test"``.
        data_dir: data directory (see ``resolve_data_dir``); the file is
            ``<data_dir>/ptb/ptb.{split}.txt`` or ``ptb.{split}.txt.gz``.
        download: if the file is missing, fetch the three splits from
            ``PTB_URL`` into ``<data_dir>/ptb/`` first (needs internet).

    Returns:
        an iterator of str: 929,589 / 73,760 / 82,430 tokens for train /
        valid / test.

    Raises:
        ValueError: unknown ``split``.
        FileNotFoundError: the file is missing (and ``download`` is
            False); the message names both accepted file names and the
            directory searched.
        CorpusError: (a ``ValueError``, while the tokens are read) the file
            is not a readable gzip file, not UTF-8 (file and line named),
            or holds no word.

    Example:

    >>> import itertools, pathlib, tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "ptb").mkdir()
    >>> _ = (root / "ptb" / "ptb.valid.txt").write_text(" a b\\n c\\n")
    >>> list(load_ptb("valid", root))
    ['a', 'b', '<eos>', 'c', '<eos>']
    """
    _split_arg(split, PTB_SPLITS)
    directory = resolve_data_dir(data_dir, must_exist=not download) / "ptb"
    stem = f"ptb.{split}.txt"
    if download and not any(
            (directory / n).is_file() for n in (stem, stem + ".gz")):
        _download_ptb(directory)
    path = None
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            path = directory / name
            break
    if path is None:
        raise FileNotFoundError(
            f"Penn Treebank split {split!r} not found: expected {stem} or "
            f"{stem}.gz in {directory} (pass download=True, or --download "
            f"true to keras-trm train-lm, to fetch {PTB_URL} when online)"
        )
    return _ptb_tokens(split, path)


def _ptb_tokens(split, path):
    words = blank = 0
    for line in decoded_lines(path):  # CorpusError: damaged gzip, not UTF-8
        line = line.split()
        words += len(line)
        blank += not line
        yield from line
        yield EOS
    if not words:
        raise CorpusError(f"Penn Treebank split {split!r}: {path} holds no "
                          f"word ({blank} blank lines): copy it again")


def tiny_shakespeare_bounds(n):
    """Character offsets ``(train_end, valid_end)`` of the 90/5/5 split."""
    return int(n * SHAKESPEARE_FRACTIONS[0]), int(
        n * (SHAKESPEARE_FRACTIONS[0] + SHAKESPEARE_FRACTIONS[1])
    )


def load_tiny_shakespeare(split="train", data_dir=None, download=False):
    """Loads one split of Tiny Shakespeare as a string (character level).

    The file is cut by character offset into 90 % train, 5 % valid and 5 %
    test (``tiny_shakespeare_bounds``): 1,003,854 / 55,770 / 55,770
    characters of the 1,115,394 in ``input.txt``.

    Args:
        split: ``"train"``, ``"valid"`` or ``"test"``.
        data_dir: data directory; the file is
            ``<data_dir>/tinyshakespeare/input.txt``.
        download: if the file is missing, fetch it from
            ``SHAKESPEARE_URL`` first (needs internet).

    Returns:
        str.

    Raises:
        ValueError: unknown ``split``.
        FileNotFoundError: ``input.txt`` is missing and ``download`` is
            False (the message names it).
        CorpusError: (a ``ValueError``) ``input.txt`` is not UTF-8 (the
            line named), or the split is empty (too short a file).
    """
    _split_arg(split, SHAKESPEARE_SPLITS)
    root = resolve_data_dir(data_dir, must_exist=not download)
    path = root / "tinyshakespeare" / "input.txt"
    if download and not path.is_file():
        _download_shakespeare(path.parent)
    if not path.is_file():
        raise FileNotFoundError(
            f"Tiny Shakespeare not found: expected input.txt at {path} (pass "
            f"download=True, or --download true to keras-trm train-lm, to "
            f"fetch {SHAKESPEARE_URL} when online)"
        )
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise CorpusError(
            f"{path} is not valid UTF-8: line {line}, byte offset {err.start} "
            f"in the file: {err.reason} (0x{data[err.start:err.start + 1].hex()})"
        ) from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # as text mode read it
    train_end, valid_end = tiny_shakespeare_bounds(len(text))
    chosen = {
        "train": text[:train_end],
        "valid": text[train_end:valid_end],
        "test": text[valid_end:],
    }[split]
    if not chosen:
        raise CorpusError(
            f"Tiny Shakespeare split {split!r} of {path} is empty (the file "
            f"holds {len(text)} characters; the {split} split is "
            f"{'90' if split == 'train' else '5'}% of them): copy it again")
    return chosen


TEXT_FILE_FRACTIONS = (0.9, 0.05, 0.05)
Level = Literal["char", "word"]
LEVELS = get_args(Level)


def _line_tokens(level):
    if level == "char":
        return lambda line: line + "\n"  # a str: one token per character
    return lambda line: line.split() + [EOS]


def load_text_file(path, level="char"):
    """A UTF-8 text file of one's own as the three splits' ids and the
    training split's vocabulary, for ``keras-trm train-lm --data.corpus
    file``.

    The token stream (``level="char"``: every character, each line ended by
    ``"\\n"``, as Tiny Shakespeare; ``"word"``: whitespace words, each line
    ended by ``"<eos>"``, as PTB) is cut by position into 90 % train, 5 %
    valid and 5 % test (``TEXT_FILE_FRACTIONS``; nanoGPT's split is
    90/10 without a test part). The vocabulary is ``"<unk>"`` (id 0), then
    the training tokens by decreasing count (ties: first occurrence);
    valid and test tokens not in it become ``"<unk>"``.

    The file is read three times, a line at a time (count, vocabulary,
    ids): memory is the ids (int32, 4 bytes a token), the vocabulary and
    one line, whatever the file's size.

    Args:
        path: str or ``pathlib.Path``, UTF-8 text (plain or ``.gz``).
        level: ``"char"`` or ``"word"``.

    Returns:
        ``({"train": ids, "valid": ids, "test": ids}, vocabulary)``, the ids
        int32 ``(n,)`` arrays.

    Raises:
        ValueError: ``level`` not ``"char"`` or ``"word"``.
        FileNotFoundError: ``path`` is not a file (named).
        CorpusError: (a ``ValueError``) the file is not UTF-8 (file and
            line named) or too short for three non-empty splits.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "text.txt"
        >>> _ = path.write_text("to be or not to be\\n" * 20)
        >>> splits, vocabulary = load_text_file(path, level="word")
        >>> [len(splits[s]) for s in ("train", "valid", "test")], len(vocabulary)
        ([126, 7, 7], 6)
    """
    v.one_of("level", level, LEVELS)
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {path}")
    tokens_of = _line_tokens(level)
    total = sum(len(tokens_of(line)) for line in decoded_lines(path))
    train_end = int(total * TEXT_FILE_FRACTIONS[0])
    valid_end = int(total * (TEXT_FILE_FRACTIONS[0] + TEXT_FILE_FRACTIONS[1]))
    if not 0 < train_end < valid_end < total:
        raise CorpusError(f"{path} holds {total} {level} tokens: too few for "
                          "three non-empty splits (90/5/5 %)")
    counts, seen = collections.Counter(), 0
    for line in decoded_lines(path):
        tokens = tokens_of(line)
        counts.update(tokens[:max(0, train_end - seen)])
        seen += len(tokens)
        if seen >= train_end:
            break
    counts.pop(UNK, None)
    vocabulary = Vocabulary([UNK] + [t for t, _ in counts.most_common()])
    ids, at, get = np.empty(total, np.int32), 0, vocabulary.token_to_id.get
    for line in decoded_lines(path):
        tokens = tokens_of(line)
        ids[at:at + len(tokens)] = [get(t, 0) for t in tokens]
        at += len(tokens)
    return ({"train": ids[:train_end], "valid": ids[train_end:valid_end],
             "test": ids[valid_end:]}, vocabulary)


class Vocabulary:
    """A token <-> id map built from a training corpus.

    Ids are assigned to ``reserved`` tokens first (in the given order), then
    to the other tokens by decreasing frequency, ties broken by first
    occurrence, so the map is deterministic for a given corpus. Tokens may
    be words (a list of str) or characters (a str is a sequence of
    one-character tokens).

    Unknown tokens map to ``unk_token`` if it is in the vocabulary (PTB has
    ``<unk>``), otherwise ``encode`` raises.

    Args:
        tokens: the id -> token list (use ``from_corpus`` to build it).
        unk_token: token used for out-of-vocabulary input (if present).

    Raises:
        ValueError: duplicate tokens.
    """

    def __init__(self, tokens, unk_token=UNK):
        self.tokens = list(tokens)
        self.token_to_id = {t: i for i, t in enumerate(self.tokens)}
        if len(self.token_to_id) != len(self.tokens):
            dup = [t for t, c in collections.Counter(self.tokens).items()
                   if c > 1]
            raise ValueError(f"`tokens` has duplicates: {dup[:10]!r}")
        self.unk_token = unk_token
        self.unk_id = self.token_to_id.get(unk_token)

    @classmethod
    def from_corpus(cls, corpus, reserved=(), unk_token=UNK):
        """Builds the vocabulary of ``corpus`` (a str of characters, or any
        iterable of str, read once)."""
        counts = collections.Counter(corpus)  # insertion = first occurrence
        order = sorted(
            (t for t in counts if t not in set(reserved)),
            key=lambda t: -counts[t],  # stable: ties keep first occurrence
        )
        return cls(list(reserved) + order, unk_token=unk_token)

    def __len__(self):
        return len(self.tokens)

    def __contains__(self, token):
        return token in self.token_to_id

    def encode(self, corpus):
        """Tokens (a str of characters, or any iterable of str, read once)
        -> int32 ids."""
        get = self.token_to_id.get

        def ids():
            for i, t in enumerate(corpus):
                idx = get(t, self.unk_id)
                if idx is None:
                    raise ValueError(
                        f"token {t!r} (position {i}) is not in the "
                        f"vocabulary of {len(self)} tokens, which has no "
                        f"{self.unk_token!r}")
                yield idx

        return np.fromiter(ids(), dtype=np.int32)

    def decode(self, ids):
        """Ids -> list of tokens (``"".join`` them for characters).

        Raises:
            TypeError: ids that are not integers.
            ValueError: an id outside ``[0, len(self))`` (-1 read the last
                token), naming its position.
        """
        ids = np.asarray(ids)
        if ids.size and ids.dtype.kind not in "iu":
            raise TypeError(f"`ids` must be integer ids, got dtype {ids.dtype}")
        v.host_ids_in_range("ids", ids, len(self), "the vocabulary")
        return [self.tokens[int(i)] for i in ids.reshape(-1)]

    def get_config(self):
        return {"tokens": self.tokens, "unk_token": self.unk_token}


def load_lm_corpus(name, split="train", vocabulary=None, data_dir=None,
                   download=False):
    """Loads a corpus split as ids, with the vocabulary of its train split.

    Args:
        name: ``"ptb"`` (words) or ``"tinyshakespeare"`` (characters).
        split: ``"train"``, ``"valid"`` or ``"test"``.
        vocabulary: a ``Vocabulary``; default built from the train split.
        data_dir, download: as the loaders.

    Returns:
        ``(ids int32 (n,), vocabulary)``.

    Raises:
        ValueError: unknown ``name`` or ``split``. FileNotFoundError: as the
            loaders.
    """
    loaders = {"ptb": load_ptb, "tinyshakespeare": load_tiny_shakespeare}
    if name not in loaders:
        raise ValueError(
            f"`name` must be one of {sorted(loaders)}, got name={name!r}"
        )
    load = loaders[name]
    if vocabulary is None:  # PTB's tokens are read once for each use
        vocabulary = Vocabulary.from_corpus(
            load("train", data_dir=data_dir, download=download))
    return vocabulary.encode(
        load(split, data_dir=data_dir, download=download)), vocabulary


def batchify(ids, batch_size):
    """Cuts a token stream into ``batch_size`` contiguous streams.

    As the Transformer-XL reference iterator: with ``n = len(ids) //
    batch_size``, the trailing ``len(ids) - batch_size * n`` tokens are
    dropped and row b is ``ids[b * n:(b + 1) * n]``.

    Args:
        ids: 1-D int array-like, the whole corpus in order.
        batch_size: int > 0.

    Returns:
        int32 array ``(batch_size, n)``.

    Raises:
        ValueError: ``ids`` not 1-D, ``batch_size`` not a positive int, or
            fewer than ``batch_size`` tokens.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"`ids` must be 1-D, got ids.shape={ids.shape}")
    if isinstance(batch_size, bool) or not isinstance(
        batch_size, (int, np.integer)
    ) or batch_size <= 0:
        raise ValueError(
            f"`batch_size` must be a positive int, got batch_size={batch_size!r}"
        )
    n = len(ids) // batch_size
    if n == 0:
        raise ValueError(
            f"`ids` has {len(ids)} tokens, fewer than batch_size={batch_size}"
        )
    return ids[: n * batch_size].reshape(batch_size, n).astype(np.int32)


def num_segments(streams, seg_len):
    """How many pairs ``segments(streams, seg_len)`` yields (with the last)."""
    n = np.shape(streams)[1]
    return max(0, -(-(n - 1) // seg_len))


def segments(streams, seg_len, drop_remainder=False):
    """Consecutive ``(inputs, targets)`` segments of ordered streams.

    For ``i = 0, seg_len, 2 seg_len, ...``: ``inputs = streams[:, i:i+L]``
    and ``targets = streams[:, i+1:i+1+L]`` with ``L = min(seg_len,
    n - 1 - i)``; so every position but the last of each stream is predicted
    exactly once, and segment k + 1 of a row continues segment k. Each pair
    has shape ``(batch_size, seg_len)`` except possibly the last, which is
    shorter (``L < seg_len``) unless ``drop_remainder=True`` drops it.

    Args:
        streams: int array ``(batch_size, n)`` from ``batchify``.
        seg_len: int > 0.
        drop_remainder: skip a final segment shorter than ``seg_len``.

    Yields:
        ``(inputs, targets)`` int32 NumPy arrays of equal shape.

    Raises:
        ValueError: ``streams`` not 2-D, ``seg_len`` not a positive int.
    """
    streams = np.asarray(streams)
    if streams.ndim != 2:
        raise ValueError(
            "`streams` must be 2-D (batch_size, n) as made by batchify, got "
            f"streams.shape={streams.shape}"
        )
    if isinstance(seg_len, bool) or not isinstance(
        seg_len, (int, np.integer)
    ) or seg_len <= 0:
        raise ValueError(
            f"`seg_len` must be a positive int, got seg_len={seg_len!r}"
        )
    n = streams.shape[1]
    for i in range(0, n - 1, seg_len):
        length = min(seg_len, n - 1 - i)
        if drop_remainder and length < seg_len:
            return
        yield (streams[:, i:i + length].astype(np.int32),
               streams[:, i + 1:i + 1 + length].astype(np.int32))
