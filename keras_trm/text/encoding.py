"""Lowercased WordPiece ids of many texts at once (the IMDB preprocessing,
outside the exported graph)."""

import tensorflow as tf

from keras_trm.utils import checks as v
from keras_trm.text.sentencepiece import check_str_list
from keras_trm.text.truncation import truncate_head_tail


def lowercase(texts):
    """``texts`` lowercased as the graph does it (``tf.strings.lower``,
    UTF-8), so a vocabulary learned from them matches what an exported
    classifier sees.

    Args:
        texts: list of str.

    Returns:
        list of str, the same length.

    Raises:
        TypeError: ``texts`` is a str (not a list of them) or holds a
            non-str item.

    Example:

    >>> lowercase(["Ein GROSSER Film", "ÉTÉ"])
    ['ein grosser film', 'été']
    """
    texts = check_str_list("texts", texts)
    if not texts:
        return []
    lowered = tf.strings.lower(tf.constant(texts), encoding="utf-8").numpy()
    return [t.decode("utf-8") for t in lowered]


def encode_lowercase(tokenizer, texts, max_length=None, chunk=2000):
    """Token ids of every text: lowercased as ``lowercase``, tokenized by
    ``tokenizer``, cut to ``max_length`` tokens by ``truncate_head_tail``,
    ``chunk`` texts per TensorFlow call.

    Args:
        tokenizer: an object whose ``tokenize(strings)`` maps str
            ``(batch,)`` to ragged int ids (``keras_trm.text.TextTokenizer``).
        texts: list of str.
        max_length: int > 0 or None (no truncation).
        chunk: int > 0, texts tokenized per call.

    Returns:
        ``tf.RaggedTensor`` int32 ``(len(texts), None)``.

    Raises:
        ValueError/TypeError: ``max_length`` or ``chunk`` not a positive int.

    Example:

    >>> from keras_trm.text import RESERVED_TOKENS, TextTokenizer
    >>> tokenizer = TextTokenizer(list(RESERVED_TOKENS) + ["a", "good", "film"])
    >>> encode_lowercase(tokenizer, ["A good film", "", "Good"]).to_list()
    [[4, 5, 6], [], [5]]
    >>> encode_lowercase(tokenizer, ["A good film"], max_length=2).to_list()  # head 0, tail 2
    [[5, 6]]
    """
    chunk = v.positive_int("chunk", chunk)
    if max_length is not None:
        max_length = v.positive_int("max_length", max_length)
    parts = []
    for start in range(0, len(texts), chunk):
        strings = tf.constant(texts[start:start + chunk], tf.string)
        ids = tokenizer.tokenize(tf.strings.lower(strings, encoding="utf-8"))
        if max_length is not None:
            ids = truncate_head_tail(ids, max_length)
        parts.append(tf.cast(ids, tf.int32))
    if not parts:
        return tf.RaggedTensor.from_row_lengths(
            tf.zeros([0], tf.int32), tf.zeros([0], tf.int64))
    return tf.concat(parts, axis=0)
