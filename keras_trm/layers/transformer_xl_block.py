"""Transformer-XL layer with segment-level recurrence (Dai et al. 2019, §3.2).

For layer n and segment τ + 1 (§3.2-3.3):

    h̃^{n-1}_{τ+1} = [SG(m^{n-1}_{τ+1}) ∘ h^{n-1}_{τ+1}]
    q, k, v       = h^{n-1}_{τ+1} W_q,  h̃^{n-1}_{τ+1} W_{k,E},  h̃^{n-1}_{τ+1} W_v
    A_{i,j}       = (q_i + u)ᵀ k_j + (q_i + v)ᵀ W_{k,R} R_{i-j}
    a             = Masked-Softmax(A) v, then the output projection
    o             = LayerNorm(Linear(a) + h^{n-1}_{τ+1})
    h^n_{τ+1}     = Positionwise-Feed-Forward(o)   (with residual + LayerNorm)

and the memory of the next segment is the layer's input history,
``m^{n-1}_{τ+2} = SG([m^{n-1}_{τ+1} ∘ h^{n-1}_{τ+1}])[-mem_len:]``
(``TransformerXLBlock.compute_new_memory``).
"""

import keras
from keras import ops

from keras_trm.utils import checks as v
from keras_trm.layers._initializers import config_with, known_last_dim
from keras_trm.layers.relative_attention import (
    RelativeMultiHeadAttention, checked_mem_len)
from keras_trm.layers.transformer_encoder_block import _BlockBase


@keras.saving.register_keras_serializable(package="keras_trm")
class TransformerXLBlock(_BlockBase):
    """One Transformer-XL layer: relative attention over memory, then FFN.

    Keys and values come from ``concat([stop_gradient(memory), inputs])``,
    queries from ``inputs`` (``RelativeMultiHeadAttention``, Dai et al.
    2019, §3.3). Sub-layers are post-LN as in the paper's code, or pre-LN
    with ``norm_first=True`` (``pre_lnorm`` of the reference code: the
    memory is normalized with the same LayerNorm before attention; the
    model then adds a final LayerNorm). The FFN is Eq. (2) of Vaswani et
    al. (2017).

    Args:
        num_heads: int > 0.
        d_ff: int > 0, inner size of the FFN.
        mem_len: int >= 0, the number of past positions kept by
            ``compute_new_memory`` (0 = no memory), and the window of
            ``same_length``; its attention receives it with every call, so
            assigning ``block.mem_len`` changes both (as ``reset_length`` of
            the reference code). Read when a call is traced: re-trace
            ``tf.function``s after assigning it.
        key_dim: optional int > 0, d_head (default d_model // num_heads,
            which then must divide d_model).
        dropout_rate: float in [0, 1), on each sub-layer output.
        attention_dropout_rate: float in [0, 1), on attention probabilities.
        same_length: bool, every query attends to the ``mem_len`` most
            recent positions, itself included (needs ``mem_len > 0``).
        clamp_len: optional int >= 0, relative distances are clamped to it
            (0 clamps all; None: no clamping; see
            ``RelativeMultiHeadAttention``).
        untie_biases: bool; False = u and v are not owned by the layer and
            must be passed to ``call`` (one pair shared by all layers).
        use_bias: bool, biases on the attention projections (reference: no).
        activation, norm_first, layer_norm_epsilon, kernel_initializer: as
            in ``TransformerEncoderBlock``.

    Call arguments:
        inputs: float ``(batch, T, d_model)``, the segment h^{n-1}_{τ+1}.
        memory: optional float ``(batch, M, d_model)``, m^{n-1}_{τ+1}: the
            cached inputs of this layer from earlier segments (any M >= 0;
            a gradient never flows into it). None = no memory (M = 0).
        content_bias, position_bias: optional ``(num_heads, key_dim)`` u and
            v (required with ``untie_biases=False``).
        training: bool, enables dropout.

    Returns:
        float ``(batch, T, d_model)`` in the compute dtype. Query i (absolute
        position M + i) depends on memory positions and on ``inputs[:, :i+1]``
        only (causal).

    Raises:
        ValueError: ``mem_len`` < 0, d_model not divisible by ``num_heads``
            (without ``key_dim``), an odd d_model, bad rates, or a
            ``memory`` whose batch size or last dimension differs from
            ``inputs`` (the message names both shapes).
        TypeError: a non-integer ``mem_len``.

    Example:

    >>> import numpy as np
    >>> block = TransformerXLBlock(num_heads=2, d_ff=16, mem_len=4)
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(1, 3, 8)).astype("float32")
    >>> memory = rng.normal(size=(1, 2, 8)).astype("float32")
    >>> tuple(block(x, memory=memory).shape)
    (1, 3, 8)
    >>> tuple(block.compute_new_memory(x, memory).shape)   # the last mem_len
    (1, 4, 8)
    """

    def __init__(self, num_heads, d_ff, mem_len=0, key_dim=None,
                 dropout_rate=0.1, attention_dropout_rate=0.0,
                 same_length=False, clamp_len=None, untie_biases=True,
                 use_bias=False, activation="relu", norm_first=False,
                 layer_norm_epsilon=1e-5, kernel_initializer="glorot_uniform",
                 **kwargs):
        super().__init__(num_heads, d_ff, dropout_rate, attention_dropout_rate,
                         activation, norm_first, layer_norm_epsilon,
                         kernel_initializer, **kwargs)
        self.key_dim = None if key_dim is None else v.positive_int(
            "key_dim", key_dim)
        self.same_length = bool(same_length)
        self.mem_len = mem_len
        if clamp_len is not None:
            clamp_len = v.non_negative_int("clamp_len", clamp_len)
        self.clamp_len = clamp_len
        self.untie_biases = bool(untie_biases)
        self.use_bias = bool(use_bias)

    def build(self, inputs_shape, memory_shape=None):
        d_model = known_last_dim("inputs", inputs_shape)
        if self.key_dim is None:
            v.divisible("d_model", d_model, "num_heads", self.num_heads)
        if memory_shape is not None:
            self._check_memory(inputs_shape, memory_shape)
        self.d_model = d_model
        self.self_attention = self._built(RelativeMultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self.key_dim or d_model // self.num_heads,
            dropout=self.attention_dropout_rate, use_bias=self.use_bias,
            same_length=self.same_length, clamp_len=self.clamp_len,
            untie_biases=self.untie_biases,
            kernel_initializer=self._initializer(), dtype=self.dtype_policy,
            name="self_attention"), inputs_shape, inputs_shape)
        self.self_attention_norm = self._norm("self_attention_norm",
                                              inputs_shape)
        self._build_ffn(inputs_shape)

    @staticmethod
    def _check_memory(inputs_shape, memory_shape):
        inputs_shape, memory_shape = tuple(inputs_shape), tuple(memory_shape)
        b_in, b_mem = inputs_shape[0], memory_shape[0]
        if (len(memory_shape) != 3 or memory_shape[-1] != inputs_shape[-1]
                or None not in (b_in, b_mem) and b_in != b_mem):
            raise ValueError(
                "`memory` must have shape (batch, M, d_model) with the batch "
                f"size and d_model of `inputs` {inputs_shape}, got "
                f"memory.shape={memory_shape}")

    def call(self, inputs, memory=None, content_bias=None,
             position_bias=None, training=None):
        if memory is not None:
            self._check_memory(inputs.shape, memory.shape)
            memory = ops.stop_gradient(ops.cast(memory, inputs.dtype))

        def attend(y):
            mem = memory
            if mem is not None and self.norm_first:
                mem = self.self_attention_norm(mem)
            context = y if mem is None else ops.concatenate([mem, y], axis=1)
            return self.self_attention(
                y, context, content_bias=content_bias,
                position_bias=position_bias, training=training,
                mem_len=self.mem_len)

        x = self._residual(inputs, self.self_attention_norm, attend, training)
        return self._ffn(x, training)

    def compute_new_memory(self, inputs, memory=None):
        """The memory of the next segment for this layer: the last
        ``mem_len`` positions of its input history, without gradient.

        Args:
            inputs: float ``(batch, T, d_model)``, what this block was called
                on for the current segment.
            memory: optional ``(batch, M, d_model)``, the memory it was
                called with.

        Returns:
            float ``(batch, min(mem_len, M + T), d_model)``, without gradient.

        Raises:
            ValueError: ``memory`` not matching ``inputs`` in batch size or
                d_model.
        """
        history = inputs = ops.convert_to_tensor(inputs)
        if memory is not None:
            self._check_memory(inputs.shape, memory.shape)
            history = ops.concatenate(
                [ops.cast(memory, inputs.dtype), inputs], axis=1)
        if self.mem_len == 0:
            return ops.stop_gradient(history[:, :0])
        return ops.stop_gradient(history[:, -self.mem_len:])

    @property
    def mem_len(self):
        """int >= 0: positions of memory kept, and ``same_length``'s window.

        Raises (on assignment):
            ValueError: a negative value, or 0 with ``same_length``.
            TypeError: a non-integer.
        """
        return self._mem_len

    @mem_len.setter
    def mem_len(self, mem_len):
        self._mem_len = checked_mem_len(mem_len, self.same_length)

    def compute_output_shape(self, inputs_shape, memory_shape=None):
        return tuple(inputs_shape)

    def get_config(self):
        return config_with(super().get_config(), self, (
            "mem_len", "key_dim", "same_length", "clamp_len", "untie_biases",
            "use_bias"))
