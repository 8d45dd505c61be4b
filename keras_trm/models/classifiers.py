"""Small classifiers: LSTM / LN-LSTM, BERT-style encoder, LeNet CNN.

Functional builders of the IMDB and MNIST recipes. Each returns a
``ClassifierModel`` whose output is float32 class *probabilities* (a
softmax): compile with ``SparseCategoricalCrossentropy()``
(``from_logits=False``).
"""

import keras
import numpy as np
from keras import ops

from keras_trm.utils import checks as v
from keras_trm.models.functional import IntegerInputsModel
from keras_trm.layers.lstm_ln import LSTM_LN
from keras_trm.layers.positional_embedding import PositionalEmbedding
from keras_trm.layers.transformer_encoder_block import TransformerEncoderBlock

@keras.saving.register_keras_serializable(package="keras_trm")
class ClassifierModel(IntegerInputsModel):
    """The classifiers' model: an ``IntegerInputsModel`` (a functional
    ``keras.Model`` that refuses float ids, which a plain one silently
    casts, 1.7 -> 1), a class of its own so that files saved with it load.

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
        raise ValueError(f"`num_classes` must be >= 2 for a softmax classifier, "
                         f"got num_classes={num_classes}")


def _probabilities(x, num_classes):
    return keras.layers.Dense(num_classes, activation="softmax", dtype="float32",
                              name="classifier")(x)


def lstm_classifier(vocabulary_size, embedding_dim=128, units=128, num_classes=2,
                    layer_norm=False, bidirectional=False, dropout_rate=0.2,
                    name="lstm_classifier"):
    """Builds an (LN-)LSTM sequence classifier.

    Architecture: ``Embedding(mask_zero=True)`` -> one LSTM layer returning
    its last (masked) state -> ``Dropout`` -> ``Dense(num_classes,
    softmax)``. Padding (id 0) is masked: a padded step keeps the previous
    state, so padding does not change the prediction (for the forward
    direction wherever it is; the usual layout is right padding).

    Args:
        vocabulary_size: int > 0; ids are in ``[0, vocabulary_size)`` and
            id 0 is padding.
        embedding_dim: int > 0, size of the token embeddings.
        units: int > 0, LSTM state size.
        num_classes: int >= 2.
        layer_norm: bool, ``keras_trm.layers.LSTM_LN`` (Ba, Kiros and
            Hinton 2016, "Layer Normalization", §3.1) instead of
            ``keras.layers.LSTM``.
        bidirectional: bool, wrap the LSTM in ``Bidirectional`` (the final
            states of both directions concatenated, ``2 * units``).
        dropout_rate: float in [0, 1), dropout on the final state.
        name: model name.

    Returns:
        ``ClassifierModel`` with input ``"token_ids"``: int32 ``(batch, T)``
        (any T), and output float32 probabilities ``(batch, num_classes)``.

    Raises:
        TypeError/ValueError: a bad argument (non-positive sizes,
            ``num_classes < 2``, ``dropout_rate`` outside [0, 1)), naming
            it and the value. When called: TypeError for non-integer ids.

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
    for arg, value in (("vocabulary_size", vocabulary_size),
                       ("embedding_dim", embedding_dim), ("units", units)):
        v.positive_int(arg, value)
    _num_classes(num_classes)
    v.rate("dropout_rate", dropout_rate)

    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(vocabulary_size, embedding_dim, mask_zero=True,
                               name="embedding")(token_ids)
    rnn = (LSTM_LN(units, name="lstm_ln") if layer_norm
           else keras.layers.LSTM(units, name="lstm"))
    if bidirectional:
        rnn = keras.layers.Bidirectional(rnn, name="bidirectional")
    x = rnn(x)
    x = keras.layers.Dropout(dropout_rate, name="dropout")(x)
    return ClassifierModel(token_ids, _probabilities(x, num_classes), name=name)


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
    ``Dense(num_classes, softmax)``. Pooling ``"cls"``: the output at
    position 0 (the caller puts a ``[CLS]`` id first, as BERT does);
    ``"mean"``: ``sum_t m_t h_t / max(sum_t m_t, 1)`` with ``m_t = [id_t !=
    0]``, so appending padding leaves the output unchanged (an all-padding
    row pools to zeros).

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
            ``position``, rates outside [0, 1)), naming the argument. When
            called: TypeError for non-integer ids, ValueError for ``T >
            max_sequence_length``.

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
    for arg, value in (("vocabulary_size", vocabulary_size),
                       ("num_layers", num_layers), ("d_model", d_model),
                       ("num_heads", num_heads), ("d_ff", d_ff),
                       ("max_sequence_length", max_sequence_length)):
        v.positive_int(arg, value)
    v.divisible("d_model", d_model, "num_heads", num_heads)
    v.rate("dropout_rate", dropout_rate)
    v.one_of("pooling", pooling, {"mean", "cls"})
    v.one_of("position", position, {"learned", "sinusoidal"})
    _num_classes(num_classes)

    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    padding_mask = ops.not_equal(token_ids, 0)
    x = PositionalEmbedding(vocabulary_size, d_model, max_sequence_length,
                            position=position, name="embedding")(token_ids)
    x = keras.layers.Dropout(dropout_rate, name="embedding_dropout")(x)
    for i in range(num_layers):
        block = TransformerEncoderBlock(num_heads=num_heads, d_ff=d_ff,
                                        dropout_rate=dropout_rate,
                                        name=f"encoder_layer_{i}")
        x = block(x, padding_mask=padding_mask)
    if pooling == "cls":
        pooled = x[:, 0, :]
    else:
        weights = ops.expand_dims(ops.cast(padding_mask, x.dtype), -1)
        pooled = (ops.sum(x * weights, axis=1)
                  / ops.maximum(ops.sum(weights, axis=1), 1.0))
    pooled = keras.layers.Dropout(dropout_rate, name="pooled_dropout")(pooled)
    return ClassifierModel(token_ids, _probabilities(pooled, num_classes), name=name)


TEXT_CLASSIFIER_KINDS = ("encoder", "lstm_ln", "lstm")


def text_classifier(kind, vocabulary_size, max_sequence_length=512,
                    num_layers=1, d_model=128, num_heads=4, d_ff=256,
                    embedding_dim=64, units=128, dropout_rate=0.2,
                    num_classes=2, name=None, max_length=None):
    """One of three token-id text classifiers, by name (for a recipe that
    compares them on the same data): ``"encoder"``, ``encoder_classifier``
    with mean pooling (``num_layers``, ``d_model``, ``num_heads``, ``d_ff``,
    ``max_sequence_length``); ``"lstm_ln"``, ``lstm_classifier`` with
    ``LSTM_LN`` (Ba et al. 2016, §3.1; ``embedding_dim``, ``units``);
    ``"lstm"``, the same with ``keras.layers.LSTM``. The arguments of the
    other kinds are ignored.

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
            vocabulary_size, num_layers=num_layers, d_model=d_model, num_heads=num_heads,
            d_ff=d_ff, max_sequence_length=max_sequence_length, pooling="mean",
            dropout_rate=dropout_rate, num_classes=num_classes, name=name)
    return lstm_classifier(
        vocabulary_size, embedding_dim=embedding_dim, units=units, num_classes=num_classes,
        layer_norm=kind == "lstm_ln", dropout_rate=dropout_rate, name=name)


def check_images(images, name="images"):
    """Validates MNIST images, the input ``lenet_cnn`` is built for;
    returns them as ``np.uint8 (N, 28, 28)``.

    Raises:
        TypeError: a dtype other than uint8, naming the argument and the
            dtype (convert only 0-255 pixel values with ``np.uint8``).
        ValueError: a shape other than ``(N, 28, 28)``.

    Example:

    >>> import numpy as np
    >>> check_images(np.zeros((2, 28, 28), np.uint8)).shape
    (2, 28, 28)
    """
    array = np.asarray(images)
    if array.dtype != np.uint8:
        raise TypeError(f"`{name}` must be uint8 pixel values 0-255, got dtype "
                        f"{array.dtype}")
    if array.ndim != 3 or array.shape[1:] != (28, 28):
        raise ValueError(f"`{name}` must have shape (N, 28, 28), got "
                         f"{name}.shape={array.shape}")
    return array


def lenet_cnn(norm=None, num_classes=10, name="lenet_cnn"):
    """Builds a LeNet-5-style CNN for 28x28 grey images (MNIST).

    Architecture (after LeCun et al. 1998, with max pooling and tanh):
    ``Rescaling(1/255)`` -> ``Reshape((28, 28, 1))`` ->
    ``Conv2D(6, 5, padding="same", tanh)`` -> ``MaxPool2D(2)`` (14x14x6) ->
    ``Conv2D(16, 5, tanh)`` -> ``MaxPool2D(2)`` (5x5x16) -> ``Flatten`` (400)
    -> ``Dense(120)`` -> [norm] -> tanh -> ``Dense(84)`` -> [norm] -> tanh ->
    ``Dense(num_classes, softmax)``.

    The optional norm sits between the affine map and the non-linearity,
    ``tanh(N(W x))``, as in Ba, Kiros and Hinton (2016, "Layer
    Normalization", §3) and Ioffe and Szegedy (2015, §3.2): ``"layer"``
    over the units of one example (``LayerNormalization``), ``"batch"`` over
    the batch (``BatchNormalization``, moving statistics at inference).
    With a norm the two Dense layers have no bias (the norm's beta).

    Args:
        norm: ``None`` (or ``"none"``), ``"batch"`` or ``"layer"``.
        num_classes: int >= 2.
        name: model name.

    Returns:
        ``ClassifierModel`` with input ``"images"``: ``(batch, 28, 28)`` raw
        pixel values 0-255, uint8 or float (converted to float32), and
        output float32 probabilities ``(batch, num_classes)``.

    Raises:
        ValueError: unknown ``norm`` (naming it and the value),
            ``num_classes < 2``; when called, images of another shape.

    Example:

    >>> import numpy as np
    >>> model = lenet_cnn(norm="layer")
    >>> images = np.zeros((2, 28, 28), "uint8")
    >>> tuple(model(images).shape)
    (2, 10)
    """
    norm_mode = v.one_of("norm", "none" if norm is None else norm, {"none", "batch", "layer"})
    _num_classes(num_classes)

    images = keras.Input((28, 28), dtype="float32", name="images")
    x = keras.layers.Rescaling(1.0 / 255.0, name="rescaling")(images)
    x = keras.layers.Reshape((28, 28, 1), name="reshape")(x)
    x = keras.layers.Conv2D(6, 5, padding="same", activation="tanh", name="conv_1")(x)
    x = keras.layers.MaxPool2D(2, name="pool_1")(x)
    x = keras.layers.Conv2D(16, 5, activation="tanh", name="conv_2")(x)
    x = keras.layers.MaxPool2D(2, name="pool_2")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    for i, size in enumerate((120, 84), start=1):
        x = keras.layers.Dense(size, use_bias=norm_mode == "none", name=f"dense_{i}")(x)
        if norm_mode == "layer":
            x = keras.layers.LayerNormalization(name=f"layer_norm_{i}")(x)
        elif norm_mode == "batch":
            x = keras.layers.BatchNormalization(name=f"batch_norm_{i}")(x)
        x = keras.layers.Activation("tanh", name=f"tanh_{i}")(x)
    return ClassifierModel(images, _probabilities(x, num_classes), name=name)
