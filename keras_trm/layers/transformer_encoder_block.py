"""Transformer encoder block (Vaswani et al. 2017, §3.1 and §5.4)."""

import keras
from keras import ops

from keras_trm.utils import checks as v
from keras_trm.layers._initializers import (
    clone_initializer, config_with, known_last_dim)
from keras_trm.layers.multi_head_attention import MultiHeadAttention

# Sub-layers of a block get their kernel initializer cloned at offsets this
# far apart, so that a seeded initializer still gives every weight its own
# seed (an attention layer numbers its own weights below this).
_SUBLAYER_STRIDE = 100


def key_mask(padding_mask):
    """A bool ``(batch, T_k)`` padding mask as ``(batch, 1, T_k)``, or None."""
    if padding_mask is None:
        return None
    return ops.expand_dims(ops.cast(padding_mask, "bool"), 1)


class _BlockBase(keras.layers.Layer):
    """Shared pieces of the encoder and decoder blocks.

    Residual sub-layer wiring (§3.1, §5.4 "Residual Dropout"):
      post-LN (paper):  x <- LayerNorm(x + Dropout(Sublayer(x)))
      pre-LN (option):  x <- x + Dropout(Sublayer(LayerNorm(x)))
    Position-wise FFN (Eq. 2): FFN(x) = max(0, x W1 + b1) W2 + b2.
    Sub-layers are built as they are made (the order fixes unseeded draws).
    """

    def __init__(self, num_heads, d_ff, dropout_rate=0.1,
                 attention_dropout_rate=0.0, activation="relu",
                 norm_first=False, layer_norm_epsilon=1e-6,
                 kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.num_heads = v.positive_int("num_heads", num_heads)
        self.d_ff = v.positive_int("d_ff", d_ff)
        self.dropout_rate = v.rate("dropout_rate", dropout_rate)
        self.attention_dropout_rate = v.rate("attention_dropout_rate",
                                             attention_dropout_rate)
        self.activation = keras.activations.get(activation)
        self.norm_first = bool(norm_first)
        self.layer_norm_epsilon = v.positive_float("layer_norm_epsilon",
                                                   layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True
        self._sublayers_made = 0

    def _initializer(self):
        """A clone of ``kernel_initializer`` for the next sub-layer."""
        self._sublayers_made += 1
        return clone_initializer(self.kernel_initializer,
                                 self._sublayers_made * _SUBLAYER_STRIDE)

    @staticmethod
    def _built(layer, *shapes):
        layer.build(*shapes)
        return layer

    def _attention(self, name, query_shape, value_shape):
        d_model = known_last_dim("inputs", query_shape)
        v.divisible("d_model", d_model, "num_heads", self.num_heads)
        return self._built(MultiHeadAttention(
            num_heads=self.num_heads, key_dim=d_model // self.num_heads,
            dropout=self.attention_dropout_rate,
            kernel_initializer=self._initializer(), dtype=self.dtype_policy,
            name=name), query_shape, value_shape)

    def _norm(self, name, shape):
        return self._built(keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy,
            name=name), shape)

    def _build_ffn(self, input_shape):
        self.ffn_inner = self._built(keras.layers.Dense(
            self.d_ff, activation=self.activation,
            kernel_initializer=self._initializer(), dtype=self.dtype_policy,
            name="ffn_inner"), input_shape)
        self.ffn_outer = self._built(keras.layers.Dense(
            input_shape[-1], kernel_initializer=self._initializer(),
            dtype=self.dtype_policy, name="ffn_outer"),
            tuple(input_shape[:-1]) + (self.d_ff,))
        self.ffn_norm = self._norm("ffn_norm", input_shape)
        self.dropout = keras.layers.Dropout(self.dropout_rate,
                                            dtype=self.dtype_policy)
        self.built = True

    def _residual(self, x, norm, sublayer, training):
        """One residual sub-layer, post-LN or pre-LN."""
        if self.norm_first:
            return x + self.dropout(sublayer(norm(x)), training=training)
        return norm(x + self.dropout(sublayer(x), training=training))

    def _ffn(self, x, training):
        return self._residual(
            x, self.ffn_norm, lambda y: self.ffn_outer(self.ffn_inner(y)),
            training)

    def get_config(self):
        config = config_with(super().get_config(), self, (
            "num_heads", "d_ff", "dropout_rate", "attention_dropout_rate",
            "norm_first", "layer_norm_epsilon"), ("kernel_initializer",))
        config["activation"] = keras.activations.serialize(self.activation)
        return config


@keras.saving.register_keras_serializable(package="keras_trm")
class TransformerEncoderBlock(_BlockBase):
    """One encoder layer: self-attention then position-wise FFN (§3.1).

    Post-LN as in the paper, LayerNorm(x + Dropout(Sublayer(x))), or pre-LN
    with ``norm_first=True`` (then the model adds a final LayerNorm).

    Args:
        num_heads: int > 0; must divide d_model (the input's last dim).
        d_ff: int > 0, inner size of the FFN (Eq. 2).
        dropout_rate: float in [0, 1), on each sub-layer output (§5.4).
        attention_dropout_rate: float in [0, 1), on attention probabilities.
        activation: FFN activation (``"relu"`` in the paper).
        norm_first: bool, pre-LN instead of post-LN.
        layer_norm_epsilon: float.

    Call arguments:
        inputs: float ``(batch, seq_len, d_model)``.
        padding_mask: optional bool ``(batch, seq_len)``, True at real
            tokens; defaults to the Keras mask carried by ``inputs``.
        use_causal_mask: bool, query i attends to positions <= i only
            (the decoder-only / language-model layer, §3.2.3).
        training: bool.

    Returns:
        float ``(batch, seq_len, d_model)``, carrying the same Keras mask.

    Raises:
        ValueError: d_model not divisible by ``num_heads``, bad rates.

    Example:

    >>> import numpy as np
    >>> block = TransformerEncoderBlock(num_heads=2, d_ff=32)
    >>> x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    >>> mask = np.array([[True] * 5, [True] * 3 + [False] * 2])
    >>> y = block(x, padding_mask=mask)
    >>> tuple(y.shape)
    (2, 5, 8)
    >>> x2 = x.copy()
    >>> x2[1, 3:] = 100.0   # padded positions do not reach real ones
    >>> bool(np.allclose(block(x2, padding_mask=mask)[1, :3], y[1, :3], atol=1e-5))
    True
    """

    def build(self, inputs_shape, padding_mask_shape=None):
        self.self_attention = self._attention("self_attention", inputs_shape,
                                              inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm",
                                              inputs_shape)
        self._build_ffn(inputs_shape)

    def call(self, inputs, padding_mask=None, use_causal_mask=False,
             training=None, mask=None):
        if padding_mask is None:
            padding_mask = mask
        v.mask_shape("padding_mask", padding_mask, inputs.shape[:-1],
                     "(batch, seq_len), as `inputs`")
        attention_mask = key_mask(padding_mask)
        x = self._residual(
            inputs, self.self_attention_norm,
            lambda y: self.self_attention(
                y, y, attention_mask=attention_mask,
                use_causal_mask=use_causal_mask, training=training),
            training)
        return self._ffn(x, training)

    def compute_mask(self, inputs, mask=None, padding_mask=None,
                     use_causal_mask=False):
        return mask if mask is not None else padding_mask
