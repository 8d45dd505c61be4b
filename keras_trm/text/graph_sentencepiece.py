"""SentencePiece (de)tokenization in a TensorFlow graph (tensorflow-text),
what a SavedModel that takes raw strings carries: the model proto is a
tracked resource, so it loads with ``tensorflow`` + ``tensorflow_text`` only.
"""

import tensorflow as tf

from keras_trm.text.sentencepiece import read_sentencepiece_model
from keras_trm.text.wordpiece import content_ids, dense_ids
from keras_trm.utils.ids import END_ID, PAD_ID, START_ID


class SentencePieceTokenizer(tf.Module):
    """Raw text <-> SentencePiece ids, all in TensorFlow ops (exportable).

    The interface of ``keras_trm.text.TextTokenizer``, the ids and text of
    ``HostSentencePieceTokenizer`` (whose ``in_graph()`` gives this):
    ``tokenize(strings)``: str ``(batch,)`` -> ragged int32
    ``(batch, None)`` ids (no START/END);
    ``detokenize(ids)``: int ``(batch, T)`` (dense, padded, or ragged) ->
    str ``(batch,)``, reading up to the first END, reserved ids dropped.
    ``start_id``, ``end_id``, ``pad_id``: the reserved ids the searches take.

    Args:
        model: path of a ``.model`` file written by ``learn_sentencepiece``
            (or its serialized bytes).

    Raises:
        TypeError, FileNotFoundError, ValueError: as
            ``HostSentencePieceTokenizer``.

    Example:
        >>> import tempfile, pathlib, tensorflow as tf
        >>> from keras_trm.text import learn_sentencepiece
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
        import tensorflow_text as tf_text

        self.model_proto, _, self.vocabulary = read_sentencepiece_model(model)
        self.tokenizer = tf_text.SentencepieceTokenizer(
            model=self.model_proto, out_type=tf.int32)

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
