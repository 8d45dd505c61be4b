"""Small classifiers: LSTM / LN-LSTM, BERT-style encoder, LeNet CNN.

Functional builders used by the classification recipes (IMDB sentiment with
``lstm_classifier`` / ``encoder_classifier``, MNIST digits with
``lenet_cnn``). Each returns a ``keras.Model`` whose output is float32 class
*probabilities* (a softmax), so compile them with
``SparseCategoricalCrossentropy()`` (``from_logits=False``).

The models are instances of ``ClassifierModel``, an
``IntegerInputsModel``: a functional ``keras.Model`` that also checks the
dtype of its integer inputs (a plain functional model silently casts float
token ids to int32, 1.7 -> 1; this one raises a ``TypeError`` instead).
"""

import keras
from keras import ops

from keras_trm.utils import checks as v
from keras_trm.models.functional import IntegerInputsModel
from keras_trm.layers.lstm_ln import LSTM_LN
from keras_trm.layers.positional_embedding import PositionalEmbedding
from keras_trm.layers.transformer_encoder_block import TransformerEncoderBlock

POOLING_MODES = {"mean", "cls"}
NORM_MODES = {"none", "batch", "layer"}


@keras.saving.register_keras_serializable(package="keras_trm")
class ClassifierModel(IntegerInputsModel):
    """The classifiers' model: an ``IntegerInputsModel`` (a functional
    ``keras.Model`` that refuses non-integer ids), a class of its own so
    that files saved with it load.

    Raises (when called):
        TypeError: a float/bool value for an integer input; the message
            names the input and the dtype received.

    Example:

    >>> import numpy as np
    >>> model = lstm_classifier(vocabulary_size=50, embedding_dim=8, units=8)
    >>> isinstance(model, ClassifierModel)
    True
    >>> model(np.array([[1.0, 2.0]], "float32"))
    Traceback (most recent call last):
    ...
    TypeError: ...token_ids...
    """


def _num_classes(num_classes):
    v.positive_int("num_classes", num_classes)
    if num_classes < 2:
        raise ValueError(
            f"`num_classes` must be >= 2 for a softmax classifier, got "
            f"num_classes={num_classes}"
        )
    return num_classes


def _probabilities(x, num_classes):
    return keras.layers.Dense(
        num_classes, activation="softmax", dtype="float32", name="classifier"
    )(x)


def lstm_classifier(
    vocabulary_size,
    embedding_dim=128,
    units=128,
    num_classes=2,
    layer_norm=False,
    bidirectional=False,
    dropout_rate=0.2,
    name="lstm_classifier",
):
    """Builds an (LN-)LSTM sequence classifier.

    Architecture: ``Embedding(mask_zero=True)`` -> one LSTM layer returning
    its last (masked) state -> ``Dropout`` -> ``Dense(num_classes,
    softmax)``. The LSTM is ``keras.layers.LSTM``, or with
    ``layer_norm=True`` the layer-normalized LSTM of Ba, Kiros and Hinton
    (2016, "Layer Normalization", §3.1), ``keras_trm.layers.LSTM_LN``; with
    ``bidirectional=True`` it is wrapped in ``keras.layers.Bidirectional``
    (forward and backward final states concatenated, ``2 * units``).
    Padding (id 0) is masked: a padded step keeps the previous state, so
    padding does not change the prediction (for the forward direction
    wherever it is; the usual layout is right padding).

    Args:
        vocabulary_size: int > 0; ids are in ``[0, vocabulary_size)`` and
            id 0 is padding.
        embedding_dim: int > 0, size of the token embeddings.
        units: int > 0, LSTM state size.
        num_classes: int >= 2.
        layer_norm: bool, use ``LSTM_LN`` instead of ``keras.layers.LSTM``.
        bidirectional: bool, wrap the LSTM in ``Bidirectional``.
        dropout_rate: float in [0, 1), dropout on the final state.
        name: model name.

    Returns:
        ``ClassifierModel`` with input ``"token_ids"``: int32 ``(batch, T)``
        (any T), and output float32 probabilities ``(batch, num_classes)``
        (rows sum to 1).

    Raises:
        TypeError/ValueError: a bad argument (non-positive sizes,
            ``num_classes < 2``, ``dropout_rate`` outside [0, 1)); the
            message names the argument and value. When called: TypeError
            for non-integer ids (names ``token_ids`` and the dtype).

    Example:

    >>> import numpy as np
    >>> model = lstm_classifier(vocabulary_size=50, embedding_dim=8, units=8,
    ...                         layer_norm=True)
    >>> probs = np.asarray(model(np.array([[4, 5, 6, 0, 0]], "int32")))
    >>> tuple(probs.shape), bool(np.isclose(float(np.sum(probs)), 1.0))
    ((1, 2), True)
    >>> bool(np.allclose(model(np.array([[4, 5, 6]], "int32")), probs, atol=1e-6))
    True
    """
    v.positive_int("vocabulary_size", vocabulary_size)
    v.positive_int("embedding_dim", embedding_dim)
    v.positive_int("units", units)
    _num_classes(num_classes)
    v.rate("dropout_rate", dropout_rate)

    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(
        vocabulary_size, embedding_dim, mask_zero=True, name="embedding"
    )(token_ids)
    if layer_norm:
        rnn = LSTM_LN(units, name="lstm_ln")
    else:
        rnn = keras.layers.LSTM(units, name="lstm")
    if bidirectional:
        rnn = keras.layers.Bidirectional(rnn, name="bidirectional")
    x = rnn(x)
    x = keras.layers.Dropout(dropout_rate, name="dropout")(x)
    outputs = _probabilities(x, num_classes)
    return ClassifierModel(token_ids, outputs, name=name)


def encoder_classifier(
    vocabulary_size, num_layers=2, d_model=128, num_heads=4, d_ff=256,
    max_sequence_length=512, dropout_rate=0.1, pooling="mean", num_classes=2,
    position="learned", name="encoder_classifier", max_length=None,
):
    """Builds a BERT-style Transformer-encoder sequence classifier.

    Architecture (encoder of Vaswani et al. 2017, §3.1; classification as in
    BERT, Devlin et al. 2019): token embedding x sqrt(d_model) + position
    embedding (``PositionalEmbedding``; learned by default as in BERT, or
    the paper's sinusoids) -> dropout -> ``num_layers`` post-LN
    ``TransformerEncoderBlock`` s, attending only to non-padding keys
    (padding mask ``token_ids != 0``) -> pooling -> dropout ->
    ``Dense(num_classes, softmax)``. Pooling:

    * ``"cls"``: the output at position 0. The caller puts a classification
      token (e.g. a ``[CLS]`` id) first in every sequence, as BERT does.
    * ``"mean"``: the mean of the outputs at non-padding positions only,
      ``sum_t m_t h_t / max(sum_t m_t, 1)`` with ``m_t = [id_t != 0]``.
      Padded positions are excluded from both sums and no real position
      attends to them, so appending padding leaves the output unchanged
      (an all-padding row pools to zeros).

    Args:
        vocabulary_size: int > 0; id 0 is padding.
        num_layers: int > 0, encoder blocks.
        d_model, num_heads, d_ff: width, heads (must divide ``d_model``), FFN
            inner width.
        max_sequence_length: int > 0, the positions of the embedding's
            table: the longest sequence accepted. ``max_length``: its old
            name, deprecated.
        dropout_rate: float in [0, 1), on the embeddings, every residual
            sub-layer and the pooled vector.
        pooling: ``"mean"`` or ``"cls"``.
        num_classes: int >= 2.
        position: ``"learned"`` or ``"sinusoidal"``.
        name: model name.

    Returns:
        ``ClassifierModel`` with input ``"token_ids"``: int32 ``(batch, T)``,
        ``T <= max_sequence_length``, and output float32 probabilities ``(batch,
        num_classes)``.

    Raises:
        TypeError/ValueError: bad arguments (non-positive sizes, ``d_model``
            not divisible by ``num_heads``, unknown ``pooling`` or
            ``position``, rates outside [0, 1)); the message names the
            argument. When called: TypeError for non-integer ids (names the
            dtype), ValueError for ``T > max_sequence_length``.

    Example:

    >>> import numpy as np
    >>> model = encoder_classifier(vocabulary_size=50, num_layers=1, d_model=16,
    ...                            num_heads=2, d_ff=32, max_sequence_length=16)
    >>> probs = np.asarray(model(np.array([[4, 5, 6, 0], [7, 8, 0, 0]], "int32")))
    >>> tuple(probs.shape), bool(np.allclose(np.sum(probs, axis=-1), 1.0))
    ((2, 2), True)
    """
    max_sequence_length = v.renamed("max_length", max_length,
                                    "max_sequence_length", max_sequence_length)
    v.positive_int("vocabulary_size", vocabulary_size)
    v.positive_int("num_layers", num_layers)
    v.positive_int("d_model", d_model)
    v.positive_int("num_heads", num_heads)
    v.positive_int("d_ff", d_ff)
    v.divisible("d_model", d_model, "num_heads", num_heads)
    v.positive_int("max_sequence_length", max_sequence_length)
    v.rate("dropout_rate", dropout_rate)
    v.one_of("pooling", pooling, POOLING_MODES)
    v.one_of("position", position, {"learned", "sinusoidal"})
    _num_classes(num_classes)

    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    padding_mask = ops.not_equal(token_ids, 0)
    x = PositionalEmbedding(
        vocabulary_size, d_model, max_sequence_length, position=position,
        name="embedding",
    )(token_ids)
    x = keras.layers.Dropout(dropout_rate, name="embedding_dropout")(x)
    for i in range(num_layers):
        x = TransformerEncoderBlock(
            num_heads=num_heads, d_ff=d_ff, dropout_rate=dropout_rate,
            name=f"encoder_layer_{i}",
        )(x, padding_mask=padding_mask)
    if pooling == "cls":
        pooled = x[:, 0, :]
    else:
        weights = ops.expand_dims(ops.cast(padding_mask, x.dtype), -1)
        total = ops.sum(x * weights, axis=1)
        count = ops.maximum(ops.sum(weights, axis=1), 1.0)
        pooled = total / count
    pooled = keras.layers.Dropout(dropout_rate, name="pooled_dropout")(pooled)
    outputs = _probabilities(pooled, num_classes)
    return ClassifierModel(token_ids, outputs, name=name)


MNIST_IMAGE_SHAPE = (28, 28)


TEXT_CLASSIFIER_KINDS = ("encoder", "lstm_ln", "lstm")


def text_classifier(kind, vocabulary_size, max_sequence_length=512,
                    num_layers=1, d_model=128, num_heads=4, d_ff=256,
                    embedding_dim=64, units=128, dropout_rate=0.2,
                    num_classes=2, name=None, max_length=None):
    """One of three token-id text classifiers, by name, so that a recipe
    can train them on the same data and compare them.

    * ``"encoder"``: ``encoder_classifier`` (``num_layers``, ``d_model``,
      ``num_heads``, ``d_ff``, ``max_sequence_length``; mean pooling);
    * ``"lstm_ln"``: ``lstm_classifier`` with ``LSTM_LN`` (Ba et al. 2016,
      §3.1; ``embedding_dim``, ``units``);
    * ``"lstm"``: the same with ``keras.layers.LSTM``.

    The arguments of the other kinds are ignored.

    Args:
        kind: ``"encoder"``, ``"lstm_ln"`` or ``"lstm"``.
        vocabulary_size: int > 0; id 0 is padding.
        max_sequence_length: int > 0, the encoder's longest input (tokens);
            the LSTMs take any length. ``max_length``: its old name,
            deprecated.
        dropout_rate: float in [0, 1), the kind's dropout.
        num_classes: int >= 2.
        name: the model's name (default ``"<kind>_classifier"``).

    Returns:
        a ``keras.Model``: int32 token ids ``(batch, T)`` (0 = padding) ->
        float probabilities ``(batch, num_classes)``.

    Raises:
        ValueError: ``kind`` not one of ``TEXT_CLASSIFIER_KINDS``; the
            builders' own errors for bad sizes.

    Example:

    >>> import numpy as np
    >>> model = text_classifier("lstm_ln", 50, embedding_dim=8, units=4)
    >>> model.name, tuple(model(np.ones((3, 7), "int32")).shape)
    ('lstm_ln_classifier', (3, 2))
    """
    max_sequence_length = v.renamed("max_length", max_length,
                                    "max_sequence_length", max_sequence_length)
    v.one_of("kind", kind, set(TEXT_CLASSIFIER_KINDS))
    name = name or f"{kind}_classifier"
    if kind == "encoder":
        return encoder_classifier(
            vocabulary_size, num_layers=num_layers, d_model=d_model,
            num_heads=num_heads, d_ff=d_ff,
            max_sequence_length=max_sequence_length,
            dropout_rate=dropout_rate, pooling="mean", num_classes=num_classes,
            name=name)
    return lstm_classifier(
        vocabulary_size, embedding_dim=embedding_dim, units=units,
        num_classes=num_classes, layer_norm=kind == "lstm_ln",
        dropout_rate=dropout_rate, name=name)


def check_images(images, name="images"):
    """Validates MNIST images, the input ``lenet_cnn`` is built for;
    returns them as ``np.uint8 (N, 28, 28)``.

    Raises:
        TypeError: a dtype other than uint8 (the message names the argument
            and the dtype; convert with ``np.uint8`` only if values are
            0-255 pixel intensities).
        ValueError: a shape other than ``(N, 28, 28)``.

    Example:

    >>> import numpy as np
    >>> check_images(np.zeros((2, 28, 28), np.uint8)).shape
    (2, 28, 28)
    """
    import numpy as np

    array = np.asarray(images)
    if array.dtype != np.uint8:
        raise TypeError(
            f"`{name}` must be uint8 pixel values 0-255, got dtype "
            f"{array.dtype}"
        )
    if array.ndim != 3 or array.shape[1:] != MNIST_IMAGE_SHAPE:
        raise ValueError(
            f"`{name}` must have shape (N, 28, 28), got {name}.shape="
            f"{array.shape}"
        )
    return array


def lenet_cnn(norm=None, num_classes=10, name="lenet_cnn"):
    """Builds a LeNet-5-style CNN for 28x28 grey images (MNIST).

    Architecture (after LeCun et al. 1998, with max pooling and tanh):
    ``Rescaling(1/255)`` -> ``Reshape((28, 28, 1))`` ->
    ``Conv2D(6, 5, padding="same", tanh)`` -> ``MaxPool2D(2)`` (14x14x6) ->
    ``Conv2D(16, 5, tanh)`` -> ``MaxPool2D(2)`` (5x5x16) -> ``Flatten`` (400)
    -> ``Dense(120)`` -> [norm] -> tanh -> ``Dense(84)`` -> [norm] -> tanh ->
    ``Dense(num_classes, softmax)``.

    The optional normalization of the two hidden fully connected layers sits
    between the affine map and the non-linearity, ``tanh(N(W x))``, as
    layer normalization is applied to the summed inputs in Ba, Kiros and
    Hinton (2016, "Layer Normalization", §3) and batch normalization in
    Ioffe and Szegedy (2015, §3.2). ``"layer"`` normalizes over the units of
    one example (``keras.layers.LayerNormalization``); ``"batch"`` over the
    batch (``keras.layers.BatchNormalization``, moving statistics at
    inference). With a norm, those two Dense layers have no bias (the
    norm's beta replaces it).

    Args:
        norm: ``None`` (or ``"none"``), ``"batch"`` or ``"layer"``.
        num_classes: int >= 2.
        name: model name.

    Returns:
        ``ClassifierModel`` with input ``"images"``: ``(batch, 28, 28)`` raw
        pixel values 0-255, uint8 or float (converted to float32), and
        output float32 probabilities ``(batch, num_classes)``.

    Raises:
        ValueError: unknown ``norm`` (the message names ``norm`` and the
            value), ``num_classes < 2``. When called: ValueError from the
            model for images of another shape (e.g. ``(batch, 32, 32)``).

    Example:

    >>> import numpy as np
    >>> model = lenet_cnn(norm="layer")
    >>> images = np.zeros((2, 28, 28), "uint8")
    >>> tuple(model(images).shape)
    (2, 10)
    """
    norm_mode = v.one_of("norm", "none" if norm is None else norm, NORM_MODES)
    _num_classes(num_classes)

    images = keras.Input((28, 28), dtype="float32", name="images")
    x = keras.layers.Rescaling(1.0 / 255.0, name="rescaling")(images)
    x = keras.layers.Reshape((28, 28, 1), name="reshape")(x)
    x = keras.layers.Conv2D(
        6, 5, padding="same", activation="tanh", name="conv_1"
    )(x)
    x = keras.layers.MaxPool2D(2, name="pool_1")(x)
    x = keras.layers.Conv2D(16, 5, activation="tanh", name="conv_2")(x)
    x = keras.layers.MaxPool2D(2, name="pool_2")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    for i, size in enumerate((120, 84), start=1):
        x = keras.layers.Dense(
            size, use_bias=norm_mode == "none", name=f"dense_{i}"
        )(x)
        if norm_mode == "layer":
            x = keras.layers.LayerNormalization(name=f"layer_norm_{i}")(x)
        elif norm_mode == "batch":
            x = keras.layers.BatchNormalization(name=f"batch_norm_{i}")(x)
        x = keras.layers.Activation("tanh", name=f"tanh_{i}")(x)
    outputs = _probabilities(x, num_classes)
    return ClassifierModel(images, outputs, name=name)
