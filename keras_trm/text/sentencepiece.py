"""Joint SentencePiece vocabulary (BPE or unigram) and in-graph
(de)tokenization.

The model is learned with the ``sentencepiece`` package (Kudo & Richardson,
2018) from a sample of the training sentences (``input_sentence_size``, so
millions of lines stay fast); tokenization runs in the graph with
tensorflow-text's ``SentencepieceTokenizer``, whose model proto is a tracked
resource: a SavedModel that holds a ``SentencePieceTokenizer`` takes raw
strings and loads with ``tensorflow`` + ``tensorflow_text`` only.

Text is normalized as SentencePiece does by default (``nmt_nfkc``: NFKC
plus whitespace clean-up), so ``detokenize(tokenize(x))`` is ``x`` for
ordinary text and its NFKC form otherwise ("½" -> "1⁄2").

Ids follow ``keras_trm.text.wordpiece``: 0 PAD, 1 UNK, 2 START (BOS),
3 END (EOS), so ``Translator``, the search and the loss use either
tokenizer unchanged.
"""

import os
import pathlib
import random

import tensorflow as tf

from keras_trm.utils.files import atomic_write
from keras_trm.text.wordpiece import (
    END,
    END_ID,
    PAD,
    PAD_ID,
    START,
    START_ID,
    UNK,
    UNK_ID,
    content_ids,
    dense_ids,
)

MODEL_TYPES = ("bpe", "unigram")


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
        >>> SentencePieceTokenizer(p).vocabulary[:4]
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
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    import io

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


class SentencePieceTokenizer(tf.Module):
    """Raw text <-> SentencePiece ids, all in TensorFlow ops (exportable).

    Same interface as ``keras_trm.text.TextTokenizer``:
    ``tokenize(strings)``: str ``(batch,)`` -> ragged int32
    ``(batch, None)`` ids (no START/END);
    ``detokenize(ids)``: int ``(batch, T)`` (dense, padded, or ragged) ->
    str ``(batch,)``, reading up to the first END and dropping PAD/START/END.

    Args:
        model: path of a ``.model`` file written by ``learn_sentencepiece``
            (or its serialized bytes).

    ``start_id``, ``end_id``, ``pad_id``: its special ids (the reserved
    ``START_ID``, ``END_ID``, ``PAD_ID``, checked at load), what the
    searches take.

    Raises:
        FileNotFoundError: ``model`` path missing.
        ValueError: the model's ids 0-3 are not PAD, UNK, START, END.

    Example:
        >>> import tempfile, pathlib, tensorflow as tf
        >>> text = ["Ein Hund läuft.", "A dog runs."] * 50
        >>> p = learn_sentencepiece(text, 300, pathlib.Path(tempfile.mkdtemp()) / "sp.model")
        >>> tok = SentencePieceTokenizer(p)
        >>> ids = tok.tokenize(tf.constant(["Ein Hund läuft."]))
        >>> tok.detokenize(ids).numpy()[0].decode()
        'Ein Hund läuft.'
    """

    start_id, end_id, pad_id = START_ID, END_ID, PAD_ID

    def __init__(self, model, name=None):
        super().__init__(name=name)
        import sentencepiece as spm
        import tensorflow_text as tf_text

        if isinstance(model, (bytes, bytearray)):
            proto = bytes(model)
        else:
            path = pathlib.Path(model)
            if not path.is_file():
                raise FileNotFoundError(f"SentencePiece model {str(path)!r} does not exist")
            proto = path.read_bytes()
        processor = spm.SentencePieceProcessor(model_proto=proto)
        self.vocabulary = [processor.id_to_piece(i)
                           for i in range(processor.get_piece_size())]
        if self.vocabulary[:4] != [PAD, UNK, START, END]:
            raise ValueError(
                f"SentencePiece model must have ids 0-3 = {[PAD, UNK, START, END]} "
                f"(learn it with learn_sentencepiece), got {self.vocabulary[:4]}"
            )
        self.model_proto = proto
        self.tokenizer = tf_text.SentencepieceTokenizer(model=proto, out_type=tf.int32)

    @property
    def vocabulary_size(self):
        return len(self.vocabulary)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def tokenize(self, strings):
        return tf.cast(self.tokenizer.tokenize(strings), tf.int32)

    def detokenize(self, ids):
        return self._detokenize(dense_ids(ids))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def _detokenize(self, ids):
        return self.tokenizer.detokenize(content_ids(ids))
