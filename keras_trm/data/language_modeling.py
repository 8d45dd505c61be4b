"""Language-modelling corpora (PTB, Tiny Shakespeare) and ordered batching.

Two local corpora (``keras_trm.data.paths`` says where ``data_dir`` is
looked up, ``shared/data/README.md`` their provenance):

* **Penn Treebank**, Mikolov's language-modelling version:
  ``<data_dir>/ptb/ptb.{train,valid,test}.txt[.gz]``. Word level; each line
  is split on whitespace and followed by ``"<eos>"``, as in Mikolov's RNNLM
  examples and the Transformer-XL reference code (``add_eos=True``): train
  887,521 words + 42,068 ``<eos>``, valid 70,390 + 3,370, test 78,669 +
  3,761; 10,000 training types with ``<eos>`` (``<unk>`` is in the text).
* **Tiny Shakespeare** (char-rnn): ``<data_dir>/tinyshakespeare/input.txt``,
  1,115,394 characters, character level, cut (no official split) *by
  character offset* 90 % / 5 % / 5 %: 1,003,854 / 55,770 / 55,770 chars
  (``tiny_shakespeare_bounds``).

Online (``download=True``) a missing corpus is fetched into the same place
(``PTB_URL``, Mikolov's ``simple-examples.tgz``; ``SHAKESPEARE_URL``).

Ordered batching follows the Transformer-XL reference iterator
(``LMOrderedIterator``): the token stream is cut into ``batch_size``
contiguous streams (``batchify``), walked in parallel ``seg_len`` tokens at
a time, the target of position t being position t + 1 of the same stream
(``segments``); consecutive segments of a row continue each other, as
segment-level recurrence needs.
"""

import collections
import itertools
import pathlib
import tarfile
from typing import Literal, get_args

import numpy as np

from keras_trm.data.download import fetch
from keras_trm.data.paths import resolve_data_dir
from keras_trm.data.translation import CorpusError, _find, iter_lines
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
    archive = fetch(PTB_URL, directory / ".simple-examples.tgz")  # no folder left if it fails
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for split in PTB_SPLITS:
                member = tar.extractfile(f"./simple-examples/data/ptb.{split}.txt")
                atomic_write(directory / f"ptb.{split}.txt", member.read())
    finally:
        archive.unlink(missing_ok=True)


def load_ptb(split="train", data_dir=None, download=False):
    """The tokens of one split of the Mikolov Penn Treebank, one at a time:
    each line's whitespace words, then ``"<eos>"``. The file is found (or
    fetched) at the call and read lazily, a line at a time.

    Args:
        split: ``"train"``, ``"valid"`` or ``"test"``.
        data_dir: data directory (see ``resolve_data_dir``); the file is
            ``<data_dir>/ptb/ptb.{split}.txt[.gz]``.
        download: if the file is missing, fetch the three splits from
            ``PTB_URL`` into ``<data_dir>/ptb/`` first.

    Returns:
        an iterator of str: 929,589 / 73,760 / 82,430 tokens for train /
        valid / test.

    Raises:
        ValueError: unknown ``split``.
        FileNotFoundError: the file is missing and not downloaded (both
            accepted file names and the directory named).
        CorpusError: (a ``ValueError``, while the tokens are read) not a
            readable gzip file, not UTF-8 (file and line named), no word.

    Example:

    >>> import pathlib, tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "ptb").mkdir()
    >>> _ = (root / "ptb" / "ptb.valid.txt").write_text(" a b\\n c\\n")
    >>> list(load_ptb("valid", root))
    ['a', 'b', '<eos>', 'c', '<eos>']
    """
    v.one_of("split", split, PTB_SPLITS)
    directory = resolve_data_dir(data_dir, must_exist=not download) / "ptb"
    stem = f"ptb.{split}.txt"
    (path,) = _find(directory, stem)
    if path is None and download:
        _download_ptb(directory)
        (path,) = _find(directory, stem)
    if path is None:
        raise FileNotFoundError(
            f"Penn Treebank split {split!r} not found: expected {stem} or "
            f"{stem}.gz in {directory} (pass download=True, or --download "
            f"true to keras-trm train-lm, to fetch {PTB_URL} when online)")
    return _ptb_tokens(split, path)


def _ptb_tokens(split, path):
    words = blank = 0
    for line in iter_lines(path):  # CorpusError: damaged gzip, not UTF-8
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
    train, valid, _ = SHAKESPEARE_FRACTIONS
    return int(n * train), int(n * (train + valid))


def load_tiny_shakespeare(split="train", data_dir=None, download=False):
    """Loads one split of Tiny Shakespeare as a string (character level):
    90 % / 5 % / 5 % of ``input.txt`` by character offset
    (``tiny_shakespeare_bounds``), 1,003,854 / 55,770 / 55,770 characters.

    Args:
        split: ``"train"``, ``"valid"`` or ``"test"``.
        data_dir: data directory (``<data_dir>/tinyshakespeare/input.txt``).
        download: if the file is missing, fetch ``SHAKESPEARE_URL`` first.

    Returns:
        str.

    Raises:
        ValueError: unknown ``split``.
        FileNotFoundError: ``input.txt`` is missing and not downloaded
            (named).
        CorpusError: (a ``ValueError``) ``input.txt`` is not UTF-8 (the
            line named), or the split is empty (too short a file).
    """
    v.one_of("split", split, SHAKESPEARE_SPLITS)
    root = resolve_data_dir(data_dir, must_exist=not download)
    path = root / "tinyshakespeare" / "input.txt"
    if download and not path.is_file():
        fetch(SHAKESPEARE_URL, path, sha256=SHAKESPEARE_SHA256)
    if not path.is_file():
        raise FileNotFoundError(
            f"Tiny Shakespeare not found: expected input.txt at {path} (pass "
            f"download=True, or --download true to keras-trm train-lm, to "
            f"fetch {SHAKESPEARE_URL} when online)")
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
    chosen = {"train": text[:train_end], "valid": text[train_end:valid_end],
              "test": text[valid_end:]}[split]
    if not chosen:
        raise CorpusError(
            f"Tiny Shakespeare split {split!r} of {path} is empty (the file "
            f"holds {len(text)} characters; the {split} split is "
            f"{'90' if split == 'train' else '5'}% of them): copy it again")
    return chosen


Level = Literal["char", "word"]
LEVELS = get_args(Level)


def _line_tokens(level):
    if level == "char":
        return lambda line: line + "\n"  # a str: one token per character
    return lambda line: line.split() + [EOS]


def load_text_file(path, level="char"):
    """A UTF-8 text file of one's own as the three splits' ids and the
    training split's vocabulary (``keras-trm train-lm --data.corpus file``).

    The token stream (``level="char"``: characters, each line ended by
    ``"\\n"``; ``"word"``: whitespace words, each line ended by
    ``"<eos>"``) is cut by position 90/5/5 % (``tiny_shakespeare_bounds``).
    The vocabulary is ``"<unk>"`` (id 0), then the training tokens by
    decreasing count (ties: first occurrence); other tokens become
    ``"<unk>"``. The file is read a line at a time (three passes).

    Args:
        path: str or ``pathlib.Path``, UTF-8 text (plain or ``.gz``).
        level: ``"char"`` or ``"word"``.

    Returns:
        ``({"train": ids, "valid": ids, "test": ids}, vocabulary)``, int32
        ``(n,)`` ids.

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

    def tokens():  # the file again, a line at a time
        return itertools.chain.from_iterable(map(tokens_of, iter_lines(path)))

    total = sum(len(tokens_of(line)) for line in iter_lines(path))
    train_end, valid_end = tiny_shakespeare_bounds(total)
    if not 0 < train_end < valid_end < total:
        raise CorpusError(f"{path} holds {total} {level} tokens: too few for "
                          "three non-empty splits (90/5/5 %)")
    vocabulary = Vocabulary.from_corpus(itertools.islice(tokens(), train_end),
                                        reserved=[UNK])
    ids = vocabulary.encode(tokens())
    return ({"train": ids[:train_end], "valid": ids[train_end:valid_end],
             "test": ids[valid_end:]}, vocabulary)


class Vocabulary:
    """A token <-> id map built from a training corpus.

    Ids go to ``reserved`` tokens first (in order), then to the others by
    decreasing frequency, ties by first occurrence (deterministic). Tokens
    are words (a list of str) or characters (a str). Unknown tokens map to
    ``unk_token`` if it is in the vocabulary, otherwise ``encode`` raises.

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
            dup = [t for t, c in collections.Counter(self.tokens).items() if c > 1]
            raise ValueError(f"`tokens` has duplicates: {dup[:10]!r}")
        self.unk_token = unk_token
        self.unk_id = self.token_to_id.get(unk_token)

    @classmethod
    def from_corpus(cls, corpus, reserved=(), unk_token=UNK):
        """Builds the vocabulary of ``corpus`` (a str of characters, or any
        iterable of str, read once)."""
        counts = collections.Counter(corpus)  # insertion = first occurrence
        order = sorted((t for t in counts if t not in set(reserved)),
                       key=lambda t: -counts[t])  # stable: ties keep first occurrence
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
        """Ids -> list of tokens (``"".join`` them for characters); a
        TypeError for non-integer ids, a ValueError naming the position of
        an id outside ``[0, len(self))``."""
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
        ValueError, FileNotFoundError: as the loaders; an unknown ``name``.
    """
    loaders = {"ptb": load_ptb, "tinyshakespeare": load_tiny_shakespeare}
    if name not in loaders:
        raise ValueError(f"`name` must be one of {sorted(loaders)}, got name={name!r}")
    load = loaders[name]
    if vocabulary is None:  # PTB's tokens are read once for each use
        vocabulary = Vocabulary.from_corpus(
            load("train", data_dir=data_dir, download=download))
    return vocabulary.encode(
        load(split, data_dir=data_dir, download=download)), vocabulary


def _positive(name, value):
    """``value`` if a positive int, else a ValueError (not TypeError: the
    callers' contract) naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"`{name}` must be a positive int, got {name}={value!r}")
    return value


def batchify(ids, batch_size):
    """Cuts a token stream into ``batch_size`` contiguous streams, as the
    Transformer-XL reference iterator: with ``n = len(ids) // batch_size``,
    row b is ``ids[b * n:(b + 1) * n]`` (the trailing tokens are dropped).

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
    n = len(ids) // _positive("batch_size", batch_size)
    if n == 0:
        raise ValueError(f"`ids` has {len(ids)} tokens, fewer than batch_size={batch_size}")
    return ids[: n * batch_size].reshape(batch_size, n).astype(np.int32)


def num_segments(streams, seg_len):
    """How many pairs ``segments(streams, seg_len)`` yields (with the last)."""
    n = np.shape(streams)[1]
    return max(0, -(-(n - 1) // seg_len))


def segments(streams, seg_len, drop_remainder=False):
    """Consecutive ``(inputs, targets)`` segments of ordered streams.

    For ``i = 0, seg_len, 2 seg_len, ...``: ``inputs = streams[:, i:i+L]``
    and ``targets = streams[:, i+1:i+1+L]`` with ``L = min(seg_len, n - 1 -
    i)``: every position but the last is predicted once, and segment k + 1
    of a row continues segment k. Only the last may be shorter than
    ``seg_len`` (dropped with ``drop_remainder=True``).

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
        raise ValueError("`streams` must be 2-D (batch_size, n) as made by batchify, got "
                         f"streams.shape={streams.shape}")
    _positive("seg_len", seg_len)
    n = streams.shape[1]
    for i in range(0, n - 1, seg_len):
        length = min(seg_len, n - 1 - i)
        if drop_remainder and length < seg_len:
            return
        yield (streams[:, i:i + length].astype(np.int32),
               streams[:, i + 1:i + 1 + length].astype(np.int32))
