"""Joint SentencePiece vocabulary (BPE or unigram) and host-side
(de)tokenization, without TensorFlow.

The model is learned with the ``sentencepiece`` package (Kudo & Richardson,
2018) from a sample of the training sentences. ``HostSentencePieceTokenizer``
runs it on the host (data preparation, training and evaluation on every Keras
backend); ``keras_trm.text.SentencePieceTokenizer`` runs the same model in a
TensorFlow graph (what a SavedModel carries), with the same ids and text
(tested over whole Multi30k splits, ``tests/test_host_sentencepiece.py``).

Text is normalized as SentencePiece does by default (``nmt_nfkc``), so
``detokenize(tokenize(x))`` is ``x`` for ordinary text and its NFKC form
otherwise ("½" -> "1⁄2"). Ids follow ``keras_trm.utils.ids`` (0 PAD, 1 UNK,
2 START, 3 END), so ``Translator``, the search and the loss take any of the
tokenizers.
"""

import io
import os
import pathlib
import random

import numpy as np

from keras_trm.utils import checks as v
from keras_trm.utils.files import atomic_write
from keras_trm.utils.ids import (END, END_ID, PAD, PAD_ID, RESERVED_TOKENS,
                                 START, START_ID, UNK, UNK_ID)

MODEL_TYPES = ("bpe", "unigram")


def check_str_list(name, values, what="a list of str"):
    """``values`` as a list; TypeError if it is one str/bytes (it would be
    read as its characters) or holds a non-str item."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"`{name}` must be {what}, got one "
                        f"{type(values).__name__}: {name}={values[:50]!r}")
    values = list(values)
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise TypeError(f"`{name}` must hold str, got {name}[{i}]={value!r} "
                            f"({type(value).__name__})")
    return values


def learn_sentencepiece(sentences, vocabulary_size, path, model_type="bpe",
                        sample_size=1_000_000, character_coverage=0.9999,
                        seed=0, num_threads=None):
    """Learns a cased SentencePiece model (ids 0-3: PAD, UNK, START, END).

    The paper's EN-DE vocabulary is a shared BPE of about 37,000 tokens
    (Vaswani et al., 2017, §5.1); learn a joint one by passing source and
    target sentences together.

    Args:
        sentences: iterable of str (blank lines are skipped).
        vocabulary_size: int, the number of pieces (a small corpus may
            give fewer; it must exceed 4 + 256 byte pieces + the characters
            kept, or ``sentencepiece`` raises).
        path: the ``.model`` file to write (atomically, temp file + rename).
        model_type: ``"bpe"`` or ``"unigram"``.
        sample_size: at most this many sentences, drawn uniformly at random
            (``seed``) from ``sentences``, are used to learn (0: all).
        character_coverage: share of characters covered by single-character
            pieces; rarer characters are spelled as UTF-8 bytes
            (``byte_fallback``), so no input maps to UNK.
        seed: int, the sampling seed.
        num_threads: learner threads (default: ``os.cpu_count()``).

    Returns:
        ``pathlib.Path`` of the written model.

    Raises:
        ValueError: unknown ``model_type``, ``vocabulary_size`` <= 4, or no
            non-blank sentence.

    Example:
        >>> import tempfile, pathlib
        >>> text = ["Ein Hund läuft.", "A dog runs.", "Zwei Hunde laufen."] * 50
        >>> p = learn_sentencepiece(text, 300, pathlib.Path(tempfile.mkdtemp()) / "sp.model")
        >>> HostSentencePieceTokenizer(p).vocabulary[:4]
        ['[PAD]', '[UNK]', '[START]', '[END]']
    """
    import sentencepiece as spm

    if model_type not in MODEL_TYPES:
        raise ValueError(f"`model_type` must be one of {MODEL_TYPES}, got {model_type!r}")
    if int(vocabulary_size) <= 4:
        raise ValueError(f"`vocabulary_size` must exceed 4, got {vocabulary_size}")
    lines = [s for s in sentences if s.strip()]
    if not lines:
        raise ValueError("`sentences` has no non-blank sentence to learn from")
    if sample_size and len(lines) > sample_size:
        lines = random.Random(seed).sample(lines, int(sample_size))
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=proto,
        vocab_size=int(vocabulary_size),
        model_type=model_type,
        character_coverage=character_coverage,
        byte_fallback=True,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=START_ID, eos_id=END_ID,
        pad_piece=PAD, unk_piece=UNK, bos_piece=START, eos_piece=END,
        input_sentence_size=0,
        hard_vocab_limit=False,  # a small corpus may give fewer pieces
        shuffle_input_sentence=False,  # sampled above, reproducibly
        max_sentence_length=1 << 14,
        num_threads=num_threads or os.cpu_count() or 1,
        minloglevel=2,
    )
    return atomic_write(path, proto.getvalue())


def read_sentencepiece_model(model):
    """``(proto bytes, SentencePieceProcessor, list of str pieces)`` of a
    ``.model`` path or its bytes; raises as ``HostSentencePieceTokenizer``."""
    import sentencepiece as spm

    if isinstance(model, (bytes, bytearray)):
        proto = bytes(model)
    elif isinstance(model, (str, os.PathLike)):
        path = pathlib.Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"SentencePiece model {str(path)!r} does not exist")
        proto = path.read_bytes()
    else:
        raise TypeError(f"`model` must be a .model path or its bytes, got "
                        f"model={model!r} ({type(model).__name__})")
    processor = spm.SentencePieceProcessor(model_proto=proto)
    vocabulary = [processor.id_to_piece(i)
                  for i in range(processor.get_piece_size())]
    if tuple(vocabulary[:len(RESERVED_TOKENS)]) != RESERVED_TOKENS:
        raise ValueError(
            f"SentencePiece model must have ids 0-3 = {list(RESERVED_TOKENS)} "
            f"(learn it with learn_sentencepiece), got {vocabulary[:4]}")
    return proto, processor, vocabulary


class HostSentencePieceTokenizer:
    """Raw text <-> SentencePiece ids on the host (numpy, no TensorFlow).

    The ids and text of ``keras_trm.text.SentencePieceTokenizer`` for the
    same model, from ``sentencepiece.SentencePieceProcessor`` with its
    default options (no sampling, no BOS/EOS added).

    Args:
        model: path of a ``.model`` file written by ``learn_sentencepiece``
            (or its serialized bytes).
        num_threads: int >= 1, the threads ``encode`` uses for a list of
            lines, or None (``sentencepiece``'s default: every core).

    Attributes:
        vocabulary: list of str pieces, id order.
        model_proto: bytes, the serialized model.
        start_id, end_id, pad_id: the reserved ids the searches take.

    Raises:
        TypeError: ``model`` neither a path nor bytes; ``num_threads`` not an int.
        FileNotFoundError: ``model`` path missing.
        ValueError: the model's ids 0-3 are not PAD, UNK, START, END;
            ``num_threads`` < 1.

    Example:
        >>> import tempfile, pathlib
        >>> text = ["Ein Hund läuft.", "A dog runs."] * 50
        >>> p = learn_sentencepiece(text, 300, pathlib.Path(tempfile.mkdtemp()) / "sp.model")
        >>> tokenizer = HostSentencePieceTokenizer(p)
        >>> ids = tokenizer.encode(["Ein Hund läuft.", ""])
        >>> [a.dtype.name for a in ids], len(ids[1])
        (['int32', 'int32'], 0)
        >>> tokenizer.detokenize(ids)
        ['Ein Hund läuft.', '']
    """

    start_id, end_id, pad_id = START_ID, END_ID, PAD_ID

    def __init__(self, model, num_threads=None):
        self.model_proto, self._processor, self.vocabulary = (
            read_sentencepiece_model(model))
        if num_threads is not None:
            num_threads = v.positive_int("num_threads", num_threads)
        self.num_threads = num_threads

    @property
    def vocabulary_size(self):
        return len(self.vocabulary)

    def encode(self, lines):
        """list (or tuple) of str -> list of int32 ``(n_i,)`` content ids
        (no START/END), the fast path for preparing data; TypeError if
        ``lines`` is one str or holds a non-str."""
        if isinstance(lines, (str, bytes)):
            check_str_list("lines", lines)  # raises
        lines = list(lines)
        options = {} if self.num_threads is None else {"num_threads": self.num_threads}
        try:
            ids = self._processor.encode(lines, **options)
        except TypeError:  # items are checked only then: a corpus is long
            check_str_list("lines", lines)
            raise
        return [np.array(row, np.int32) for row in ids]

    def tokenize(self, sentences):
        """``encode`` of a list or 1-D array of str or UTF-8 bytes (as
        ``tf.Tensor.numpy()`` gives): the in-graph tokenizers' interface.
        TypeError if ``sentences`` is one str or an item neither str nor bytes."""
        if isinstance(sentences, (str, bytes)):
            check_str_list("sentences", sentences)  # raises
        return self.encode([s.decode("utf-8") if isinstance(s, bytes) else s
                            for s in sentences])

    def content_ids(self, ids):
        """The ids ``detokenize`` reads of each row of an int ``(batch, T)``
        array or a list of 1-D rows: those before its first END, reserved
        ids dropped; a list of ``batch`` int32 arrays.

        Raises:
            TypeError: ``ids`` not integer ids.
            ValueError: ``ids`` not 2-D (nor a list of 1-D rows), or an id
                read is >= ``vocabulary_size`` (naming it and its row).
        """
        if isinstance(ids, np.ndarray) and ids.ndim != 2:
            raise ValueError(f"`ids` must be 2-D (batch, T) or a list of 1-D "
                             f"rows, got shape {ids.shape}")
        rows = []
        for i, row in enumerate(ids):
            row = np.asarray(row)
            if row.ndim != 1:
                raise ValueError(f"`ids` rows must be 1-D, got row {i} of "
                                 f"shape {row.shape}")
            if row.size and not np.issubdtype(row.dtype, np.integer):
                raise TypeError(f"`ids` must be integer token ids, got dtype "
                                f"{row.dtype} in row {i}")
            # As the graph's content_ids: before the first END, no reserved id.
            row = row[(np.cumsum(row == END_ID) == 0) & (row > END_ID)].astype(np.int32)
            if row.size and row.max() >= self.vocabulary_size:
                raise ValueError(
                    f"`ids` must be token ids below the vocabulary size "
                    f"{self.vocabulary_size}, got id {int(row.max())} in row {i}")
            rows.append(row)
        return rows

    def detokenize(self, ids):
        """list of ``batch`` str: the text of each row's ``content_ids``
        (``ids`` and errors as there)."""
        rows = self.content_ids(ids)
        return self._processor.decode([row.tolist() for row in rows]) if rows else []

    def in_graph(self, name=None):
        """The in-graph ``SentencePieceTokenizer`` of this model (needs TensorFlow)."""
        from keras_trm import text  # its TensorFlow part, imported lazily

        return text.SentencePieceTokenizer(self.model_proto, name=name)
