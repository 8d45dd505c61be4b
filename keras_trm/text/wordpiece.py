"""Joint source/target WordPiece vocabulary and in-graph (de)tokenization:
keras-hub's ``compute_word_piece_vocabulary`` learns it, its
``WordPieceTokenizer`` (tensorflow-text ops) runs in the graph, so a
SavedModel takes raw strings.
"""

import pathlib

import tensorflow as tf

from keras_trm.text.sentencepiece import check_str_list
from keras_trm.utils import checks as v
from keras_trm.utils.files import atomic_write
from keras_trm.utils.ids import (END, END_ID, PAD, PAD_ID, RESERVED_TOKENS,
                                 START, START_ID, UNK)

# END, PAD and START are re-exported (keras_trm.export.litert takes them here).
__all__ = ["END", "PAD", "START", "TextTokenizer", "content_ids", "dense_ids",
           "learn_vocabulary", "load_vocabulary", "save_vocabulary"]

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
        vocabulary_size: int, the target size (the learner may give fewer).
        path: optional file to write, one token a line; written atomically.

    Returns:
        list of str tokens.

    Raises:
        TypeError: ``sentences`` is a str (not a list of them) or holds a
            non-str item; ``vocabulary_size`` not an int.
        ValueError: ``vocabulary_size`` <= 4 (the reserved tokens), or no
            sentence with text.
    """
    import keras_hub

    sentences = check_str_list("sentences", sentences, "an iterable of str")
    vocabulary_size = v.positive_int("vocabulary_size", vocabulary_size)
    if vocabulary_size <= len(RESERVED_TOKENS):
        raise ValueError(f"`vocabulary_size` must exceed {len(RESERVED_TOKENS)}, "
                         f"got vocabulary_size={vocabulary_size}")
    if not any(s.strip() for s in sentences):
        raise ValueError(f"`sentences` has no text: its {len(sentences)} sentence(s) "
                         "are all blank, nothing to learn a vocabulary from")
    data = tf.data.Dataset.from_tensor_slices(sentences).batch(1000)
    vocab = keras_hub.tokenizers.compute_word_piece_vocabulary(
        data, vocabulary_size=vocabulary_size, lowercase=False,
        strip_accents=False, reserved_tokens=list(RESERVED_TOKENS))
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
    if tuple(vocab[:len(RESERVED_TOKENS)]) != RESERVED_TOKENS:
        raise ValueError(f"vocabulary {str(path)!r} must start with "
                         f"{RESERVED_TOKENS}, got {tuple(vocab[:4])}")
    return vocab


def dense_ids(ids):
    """int32 ``(batch, T)`` ids from a dense or ragged tensor (0-padded)."""
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.to_tensor(default_value=PAD_ID)
    return tf.cast(ids, tf.int32)


def _check_ids_below(content, size):
    """ValueError naming the first id of eager ragged ``content`` that is
    >= ``size``, and its row."""
    too_big = content.flat_values.numpy() >= size
    if too_big.any():
        i = int(too_big.argmax())
        raise ValueError(
            f"`ids` must be token ids below the vocabulary size {size}, got "
            f"id {int(content.flat_values[i])} in row {int(content.value_rowids()[i])}")


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
    str ``(batch,)``; reads up to the first END, drops reserved ids. An id
    it reads >= ``vocabulary_size`` raises (``ValueError`` eagerly,
    ``tf.errors.InvalidArgumentError`` in a graph), never crashes the op.
    ``start_id``, ``end_id``, ``pad_id``: the reserved ids the searches take.

    Raises:
        TypeError: ``vocabulary`` is a str or holds a non-str token.
        ValueError: ``vocabulary`` does not start with ``RESERVED_TOKENS``.

    Example:

    >>> tokenizer = TextTokenizer(["[PAD]", "[UNK]", "[START]", "[END]", "a", "dog"])
    >>> tokenizer.detokenize(tokenizer.tokenize(tf.constant(["a dog"]))).numpy()
    array([b'a dog'], dtype=object)
    """

    start_id, end_id, pad_id = START_ID, END_ID, PAD_ID

    def __init__(self, vocabulary, name=None):
        super().__init__(name=name)
        import keras_hub

        self.vocabulary = check_str_list("vocabulary", vocabulary,
                                         "a list of str tokens")
        if tuple(self.vocabulary[:len(RESERVED_TOKENS)]) != RESERVED_TOKENS:
            raise ValueError(
                f"`vocabulary` must start with {RESERVED_TOKENS} (ids "
                f"0-{len(RESERVED_TOKENS) - 1}), got "
                f"{tuple(self.vocabulary[:len(RESERVED_TOKENS)])}")
        self.tokenizer = keras_hub.tokenizers.WordPieceTokenizer(
            vocabulary=self.vocabulary, lowercase=False, strip_accents=False,
            oov_token=UNK, dtype="int32")

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
        ids = dense_ids(ids)
        if tf.executing_eagerly():  # in a graph: _detokenize's assertion
            _check_ids_below(content_ids(ids), self.vocabulary_size)
        return self._detokenize(ids)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def _detokenize(self, ids):
        # An id past the vocabulary crashes the detokenize op (a
        # segmentation fault): checked before it runs, in the graph too.
        content = content_ids(ids)
        check = tf.debugging.assert_less(
            content.flat_values, tf.constant(self.vocabulary_size, tf.int32),
            message=(f"TextTokenizer.detokenize: an id is >= the vocabulary "
                     f"size {self.vocabulary_size} (ids must be in [0, "
                     f"{self.vocabulary_size}))"),
            summarize=8)
        with tf.control_dependencies([check]):
            content = tf.identity(content)
        text = self.tokenizer.detokenize(content)
        for pattern, rewrite in _DETOK_RULES:
            text = tf.strings.regex_replace(text, pattern, rewrite)
        return tf.strings.strip(text)
