"""Token embedding plus position encoding (Vaswani et al. 2017, §3.4-3.5)."""

import math
import numbers

import keras
import numpy as np
from keras import ops

from keras_trm.utils import checks as v
from keras_trm.layers._initializers import clone_initializer, config_with


def even_d_model(d_model):
    """``d_model`` checked as a positive even int (sinusoids pair channels)."""
    v.positive_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(
            f"`d_model` must be even for sinusoidal positions, got d_model={d_model}")
    return d_model


def sinusoidal_position_encoding(length, d_model, dtype="float32"):
    """The fixed sinusoids of Vaswani et al. (2017), §3.5, as a NumPy array.

        PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
        PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

    Sines and cosines are interleaved (even / odd channels) as the paper
    writes them.

    Args:
        length: int >= 0, number of positions.
        d_model: even int > 0, number of channels.

    Returns:
        ``(length, d_model)`` array of ``dtype``.

    Raises:
        ValueError: ``d_model`` odd or not positive, ``length`` negative.

    Example:

    >>> pe = sinusoidal_position_encoding(50, 16)
    >>> pe.shape, str(pe.dtype)
    ((50, 16), 'float32')
    >>> pe[0, :4].tolist()   # position 0: sin 0 = 0 (even), cos 0 = 1 (odd)
    [0.0, 1.0, 0.0, 1.0]
    """
    v.non_negative_int("length", length)
    even_d_model(d_model)
    pos = np.arange(length, dtype=np.float64)[:, None]
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
    angle = pos / np.power(10000.0, two_i / d_model)
    pe = np.empty((length, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe.astype(dtype)


@keras.saving.register_keras_serializable(package="keras_trm")
class PositionalEmbedding(v.RenamedAttributes, keras.layers.Layer):
    """Token embedding scaled by sqrt(d_model) plus position encoding.

    Vaswani et al. (2017) §3.4: embeddings are multiplied by sqrt(d_model);
    §3.5: position encodings are added, sinusoidal (``position="sinusoidal"``,
    see ``sinusoidal_position_encoding``) or learned (``position="learned"``).

    The token table can be shared with the output projection (§3.4, weight
    tying): call the layer with ``reverse=True`` on hidden states to get
    logits ``h · Eᵀ``. Calling one instance on the source, on the target and
    in reverse ties all three, as the paper does with its shared vocabulary.

    Args:
        vocabulary_size: int > 0.
        d_model: int > 0 (even for sinusoidal positions).
        max_sequence_length: int > 0, the positions of the table: the
            longest sequence accepted (keras-hub's backbones' name).
            ``max_length``: its old name, deprecated (a config saved with
            it still loads).
        position: ``"sinusoidal"`` or ``"learned"``.
        mask_zero: bool; if True id 0 is padding and a Keras mask
            ``ids != 0`` is produced.
        scale_embeddings: bool, multiply token embeddings by sqrt(d_model).
        embeddings_initializer: default ``normal(0, d_model**-0.5)``, so that
            scaled embeddings and tied logits start at unit scale.

    Call arguments:
        inputs: int tensor ``(batch, seq_len)`` of token ids in
            ``[0, vocabulary_size)``; or, with ``reverse=True``, float hidden
            states ``(batch, seq_len, d_model)``.
        start_index: int (may be a tensor), position of ``inputs[:, 0]``
            (incremental decoding feeds one token at ``start_index = t``).
        reverse: bool, return logits ``(batch, seq_len, vocabulary_size)``
            computed with the (shared) token table.

    Returns:
        ``(batch, seq_len, d_model)`` in the compute dtype, or logits in
        float32 when ``reverse=True``.

    Raises:
        TypeError: non-integer token ids (e.g. float tensors), a float or
            bool ``start_index``.
        ValueError: a sequence longer than ``max_sequence_length`` (checked
            at run time for dynamic shapes), a negative host ``start_index``,
            bad arguments.

    Ids outside ``[0, vocabulary_size)`` are not checked (it would copy
    every batch's ids from the device): as with ``keras.layers.Embedding``,
    TensorFlow and PyTorch raise for an id past the table, JAX returns NaN,
    and a negative id reads a row from the end.

    Example:

    >>> import numpy as np
    >>> embed = PositionalEmbedding(vocabulary_size=100, d_model=16,
    ...                             max_sequence_length=32)
    >>> ids = np.array([[5, 7, 9, 0]], "int32")   # 0 = padding
    >>> x = embed(ids)
    >>> tuple(x.shape)
    (1, 4, 16)
    >>> np.asarray(embed.compute_mask(ids)).tolist()
    [[True, True, True, False]]
    >>> tuple(embed(x, reverse=True).shape)   # logits with the shared table
    (1, 4, 100)
    """

    RENAMED_ATTRIBUTES = {"max_length": "max_sequence_length"}

    def __init__(self, vocabulary_size, d_model, max_sequence_length=None,
                 position="sinusoidal", mask_zero=True, scale_embeddings=True,
                 embeddings_initializer=None, max_length=None, **kwargs):
        super().__init__(**kwargs)
        max_sequence_length = v.renamed("max_length", max_length,
                                        "max_sequence_length",
                                        max_sequence_length)
        if max_sequence_length is None:
            raise TypeError("PositionalEmbedding needs `max_sequence_length`")
        self.vocabulary_size = v.positive_int("vocabulary_size", vocabulary_size)
        self.d_model = v.positive_int("d_model", d_model)
        self.max_sequence_length = v.positive_int("max_sequence_length",
                                                  max_sequence_length)
        self.position = v.one_of("position", position, {"sinusoidal", "learned"})
        self.mask_zero = bool(mask_zero)
        self.scale_embeddings = bool(scale_embeddings)
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(
                stddev=self.d_model**-0.5)
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer)
        if self.position == "sinusoidal":
            self._pe = sinusoidal_position_encoding(self.max_sequence_length,
                                                    d_model)
        self.supports_masking = self.mask_zero

    def build(self, inputs_shape=None):
        # autocast=False: the lookup gathers float32 rows and casts them, so
        # its gradient is a float32 scatter-add; a bf16 one summed 1,000
        # gradients of 1 to 256 (tests/test_backends.py) and took 9.4 of
        # transformer_base's 53 ms per step on an H100
        # (bench/results/gpu_train_profile_NVIDIA_H100_80GB_HBM3.json).
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.d_model),
            initializer=clone_initializer(self.embeddings_initializer, 0),
            autocast=False,
        )
        if self.position == "learned":
            self.position_embeddings = self.add_weight(
                name="position_embeddings",
                shape=(self.max_sequence_length, self.d_model),
                initializer=keras.initializers.RandomNormal(
                    stddev=self.d_model**-0.5))
        self.built = True

    def position_encoding(self, length, start_index=0):
        """``(length, d_model)`` encodings of positions start_index + [0, length)."""
        # The variable's tensor: JAX's slice takes no Keras variable.
        table = ops.convert_to_tensor(self._pe if self.position == "sinusoidal"
                                      else self.position_embeddings)
        return ops.cast(
            ops.slice(table, [start_index, 0], [length, self.d_model]),
            self.compute_dtype)

    def _check_ids(self, inputs, start_index):
        v.integer_ids("inputs", inputs)
        v.host_index("start_index", start_index)
        length = inputs.shape[-1]
        if (isinstance(length, int) and isinstance(start_index, numbers.Integral)
                and start_index + length > self.max_sequence_length):
            raise ValueError(
                f"`inputs` has sequence length {length} (start_index="
                f"{start_index}), longer than max_sequence_length="
                f"{self.max_sequence_length} of layer '{self.name}'")

    def call(self, inputs, start_index=0, reverse=False):
        if reverse:
            return ops.cast(ops.matmul(inputs, ops.transpose(
                ops.cast(self.embeddings, inputs.dtype))), "float32")
        self._check_ids(inputs, start_index)
        x = ops.take(self.embeddings, inputs, axis=0)
        x = ops.cast(x, self.compute_dtype)
        if self.scale_embeddings:
            x = x * ops.cast(math.sqrt(self.d_model), x.dtype)
        length = ops.shape(inputs)[-1]
        # A dynamic length in a TensorFlow graph is checked when it runs;
        # concrete ones were checked above.
        with v.at_most_when_run(start_index + length, self.max_sequence_length, (
                f"`inputs` sequence length (plus start_index) exceeds "
                f"max_sequence_length={self.max_sequence_length} of layer '{self.name}'")):
            return x + self.position_encoding(length, start_index)

    def compute_output_spec(self, inputs, start_index=0, reverse=False):
        # Without tracing ``call``: a symbolic length (JAX's shape
        # polymorphism) can neither be checked nor slice the table.
        if reverse:
            return keras.KerasTensor(
                tuple(inputs.shape[:-1]) + (self.vocabulary_size,), "float32")
        return keras.KerasTensor(tuple(inputs.shape) + (self.d_model,),
                                 self.compute_dtype)

    def compute_mask(self, inputs, mask=None, start_index=0, reverse=False):
        if reverse or not self.mask_zero:
            return None
        return ops.not_equal(inputs, 0)

    def get_config(self):
        return config_with(super().get_config(), self, (
            "vocabulary_size", "d_model", "max_sequence_length", "position",
            "mask_zero", "scale_embeddings"), ("embeddings_initializer",))

    @classmethod
    def from_config(cls, config):
        # Configs saved before the rename name the table ``max_length``.
        return super().from_config(
            v.renamed_key(config, "max_length", "max_sequence_length"))
