"""Joint source/target WordPiece vocabulary and in-graph (de)tokenization.

The vocabulary is learned with keras-hub's ``compute_word_piece_vocabulary``
(tensorflow-text's BERT vocabulary learner); tokenization runs in the graph
with keras-hub's ``WordPieceTokenizer`` (tensorflow-text's
FastWordpieceTokenizer ops), so a SavedModel takes raw strings.
"""

import pathlib

import tensorflow as tf

from keras_trm.utils.files import atomic_write
from keras_trm.utils.ids import END_ID, PAD_ID, START_ID, UNK_ID  # noqa: F401

PAD, UNK, START, END = "[PAD]", "[UNK]", "[START]", "[END]"
RESERVED_TOKENS = (PAD, UNK, START, END)

# Detokenization: WordPiece splits punctuation off words; these RE2 rules
# re-attach it so output reads like the references ("läuft." not "läuft .").
# BLEU with the 13a tokenizer is unaffected by this spacing.
_DETOK_RULES = (
    (r" ([.,!?;:%)\]}“])", r"\1"),
    (r"([(\[{„]) ", r"\1"),
    (r"([\pL\pN]) ([-'/]) ([\pL\pN])", r"\1\2\3"),
)


def learn_vocabulary(sentences, vocabulary_size, path=None):
    """Learns a cased WordPiece vocabulary (ids 0-3: PAD, UNK, START, END).

    Args:
        sentences: iterable of str (source and target together for a joint
            vocabulary).
        vocabulary_size: int, the target size (the learner may return a few
            fewer tokens).
        path: optional file to write, one token a line; written atomically.

    Returns:
        list of str tokens.

    Raises:
        ValueError: ``vocabulary_size`` <= number of reserved tokens, or no
            sentences.
    """
    import keras_hub

    sentences = list(sentences)
    if vocabulary_size <= len(RESERVED_TOKENS):
        raise ValueError(
            f"`vocabulary_size` must exceed {len(RESERVED_TOKENS)}, got "
            f"vocabulary_size={vocabulary_size}"
        )
    if not sentences:
        raise ValueError("`sentences` is empty: nothing to learn a vocabulary from")
    data = tf.data.Dataset.from_tensor_slices(sentences).batch(1000)
    vocab = keras_hub.tokenizers.compute_word_piece_vocabulary(
        data,
        vocabulary_size=vocabulary_size,
        lowercase=False,
        strip_accents=False,
        reserved_tokens=list(RESERVED_TOKENS),
    )
    if path is not None:
        save_vocabulary(vocab, path)
    return vocab


def save_vocabulary(vocab, path):
    """Writes one token a line, atomically (temp file + rename)."""
    atomic_write(path, "\n".join(vocab) + "\n")


def load_vocabulary(path):
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"vocabulary file {str(path)!r} does not exist")
    with open(path, encoding="utf-8") as f:
        vocab = [line.rstrip("\n") for line in f if line.rstrip("\n")]
    if tuple(vocab[: len(RESERVED_TOKENS)]) != RESERVED_TOKENS:
        raise ValueError(
            f"vocabulary {str(path)!r} must start with {RESERVED_TOKENS}, got "
            f"{tuple(vocab[:4])}"
        )
    return vocab


def dense_ids(ids):
    """int32 ``(batch, T)`` ids from a dense or ragged tensor (0-padded)."""
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.to_tensor(default_value=PAD_ID)
    return tf.cast(ids, tf.int32)


def content_ids(ids):
    """The ids a detokenizer reads: those before each row's first END,
    reserved ids (PAD, UNK, START, END) dropped; int32 ``(batch, T)`` ->
    ragged ``(batch, None)``."""
    before_end = tf.cumsum(tf.cast(ids == END_ID, tf.int32), axis=1) == 0
    return tf.ragged.boolean_mask(ids, before_end & (ids > END_ID))


class TextTokenizer(tf.Module):
    """Raw text <-> token ids, all in TensorFlow ops (exportable).

    Args:
        vocabulary: list of str tokens, the first four ``RESERVED_TOKENS``.

    ``tokenize(strings)``: str ``(batch,)`` -> ragged int32
    ``(batch, None)`` WordPiece ids (no START/END).
    ``detokenize(ids)``: int ``(batch, T)`` (dense, padded, or ragged) ->
    str ``(batch,)``; reads up to the first END, drops PAD/START/END.

    ``start_id``, ``end_id``, ``pad_id``: its special ids (the reserved
    ``START_ID``, ``END_ID``, ``PAD_ID``), what the searches take.
    """

    start_id, end_id, pad_id = START_ID, END_ID, PAD_ID

    def __init__(self, vocabulary, name=None):
        super().__init__(name=name)
        import keras_hub

        self.vocabulary = list(vocabulary)
        self.tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=self.vocabulary,
            lowercase=False,
            strip_accents=False,
            oov_token=UNK,
            dtype="int32",
        )

    @property
    def vocabulary_size(self):
        return len(self.vocabulary)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def tokenize(self, strings):
        ids = self.tokenizer(strings)
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        return tf.cast(ids, tf.int32)

    def detokenize(self, ids):
        return self._detokenize(dense_ids(ids))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def _detokenize(self, ids):
        text = self.tokenizer.detokenize(content_ids(ids))
        for pattern, rewrite in _DETOK_RULES:
            text = tf.strings.regex_replace(text, pattern, rewrite)
        return tf.strings.strip(text)
