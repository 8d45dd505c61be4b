"""SavedModel wrappers of the IMDB and MNIST classifiers (raw reviews or
uint8 images in, probabilities out). Export either with
``export_module(wrapper, export_dir, name, signatures={"serving_default":
wrapper.classify})``.
"""

import tensorflow as tf

from keras_trm.utils import checks as v
from keras_trm.models.classifiers import check_images
from keras_trm.text import TextTokenizer, truncate_head_tail


class ReviewClassifier(tf.Module):
    """Raw review strings -> class probabilities, all in TensorFlow ops.

    Args:
        model: a classifier taking int32 token ids ``(batch, T)`` (id 0 =
            padding) and returning probabilities ``(batch, num_classes)``.
        vocabulary: list of str, the lowercase WordPiece vocabulary (ids 0-3
            reserved, ``keras_trm.text.RESERVED_TOKENS``).
        max_length: int > 0, the most tokens kept per review.

    ``encode(strings)``: str ``(batch,)`` -> int32 ``(batch, T)``, ``1 <= T
    <= max_length`` (an all-padding row for an empty review).
    ``classify(strings)``: str ``(batch,)`` -> ``{"probabilities": float32
    (batch, num_classes)}``; the exported ``serving_default``.

    Example:

    >>> import tensorflow as tf
    >>> from keras_trm.models import lstm_classifier
    >>> from keras_trm.text import RESERVED_TOKENS
    >>> vocab = list(RESERVED_TOKENS) + ["good", "bad", "film", "a"]
    >>> model = lstm_classifier(len(vocab), embedding_dim=8, units=4)
    >>> classifier = ReviewClassifier(model, vocab, max_length=16)
    >>> classifier.encode(tf.constant(["A good film", ""])).numpy().tolist()
    [[7, 4, 6], [0, 0, 0]]
    >>> classifier.classify_texts(["A bad film"]).shape
    (1, 2)
    """

    def __init__(self, model, vocabulary, max_length, name=None):
        super().__init__(name=name)
        self.model = model
        self.tokenizer = TextTokenizer(vocabulary)
        self.max_length = v.positive_int("max_length", max_length)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def encode(self, strings):
        ids = truncate_head_tail(self.tokenizer.tokenize(
            tf.strings.lower(strings, encoding="utf-8")), self.max_length)
        width = tf.maximum(tf.reduce_max(tf.concat(
            [ids.row_lengths(), tf.zeros([1], tf.int64)], 0)), 1)
        return ids.to_tensor(default_value=0, shape=tf.stack(
            [tf.shape(strings, out_type=tf.int64)[0], width]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="reviews")])
    def classify(self, reviews):
        probabilities = self.model(self.encode(reviews), training=False)
        return {"probabilities": tf.cast(probabilities, tf.float32)}

    def classify_texts(self, texts):
        """Python convenience: list of str -> ``np.float32 (N, classes)``.
        TypeError for a single str or a non-str item (naming ``texts[i]``)."""
        if isinstance(texts, (str, bytes)):
            raise TypeError("`texts` must be a list of str, got one str; "
                            "wrap it in a list")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"`texts[{i}]` must be a str, got "
                                f"{type(text).__name__}")
        return self.classify(tf.constant(texts, dtype=tf.string))["probabilities"].numpy()


class DigitClassifier(tf.Module):
    """uint8 images -> digit probabilities, the exported ``serving_default``.

    ``classify(images)``: uint8 ``(batch, 28, 28)`` -> ``{"probabilities":
    float32 (batch, 10)}``. Other shapes or dtypes are refused by the
    signature (TensorFlow names the ``images`` argument).

    Example:

    >>> import numpy as np
    >>> from keras_trm.models import lenet_cnn
    >>> classifier = DigitClassifier(lenet_cnn("layer"))
    >>> classifier.predict(np.zeros((2, 28, 28), np.uint8)).shape
    (2, 10)
    """

    def __init__(self, model, name=None):
        super().__init__(name=name)
        self.model = model

    @tf.function(input_signature=[
        tf.TensorSpec([None, 28, 28], tf.uint8, name="images")])
    def classify(self, images):
        probabilities = self.model(tf.cast(images, tf.float32), training=False)
        return {"probabilities": tf.cast(probabilities, tf.float32)}

    def predict(self, images):
        """NumPy convenience: checked like ``check_images``."""
        return self.classify(tf.constant(check_images(images)))["probabilities"].numpy()
