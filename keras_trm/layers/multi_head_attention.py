"""Multi-head scaled dot-product attention (Vaswani et al. 2017, §3.2)."""

import math

import keras
from keras import ops

from keras_trm.layers import _validation as v


@keras.saving.register_keras_serializable(package="keras_trm")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention with padding/causal masks and a key/value cache.

    Implements Eq. (1) and the multi-head projection of Vaswani et al. (2017),
    §3.2.1-3.2.2:

        Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V
        MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

    The constructor, the call signature and the weight layout (query, key,
    value, output kernels of shapes ``(d_in, num_heads, key_dim)`` ...
    ``(num_heads, value_dim, d_out)``, each followed by its bias) match
    ``keras.layers.MultiHeadAttention``, so weights transfer with
    ``set_weights(other.get_weights())`` and the layer is a drop-in
    replacement.

    Args:
        num_heads: int > 0, the number of heads h.
        key_dim: int > 0, size of each query/key head d_k.
        value_dim: int > 0, size of each value head d_v (default ``key_dim``).
        dropout: float in [0, 1), dropout on the attention probabilities.
        use_bias: bool, whether the projections have biases.
        output_shape: int, the last dimension of the output (default: the
            query's last dimension).
        kernel_initializer, bias_initializer: initializers of the projections.

    Call arguments:
        query: float tensor ``(batch, T_q, d_query)``.
        value: float tensor ``(batch, T_k, d_value)``.
        key: optional float tensor ``(batch, T_k, d_key)``; default ``value``.
        attention_mask: optional bool/int tensor ``(batch, T_q, T_k)``
            (or broadcastable to it); 1/True = may attend, 0/False = masked.
            Padding masks carried by Keras masking on query/value/key are
            combined with it, as in ``keras.layers.MultiHeadAttention``.
        use_causal_mask: bool, forbid attending to later positions
            (query i sees keys j <= i; with a cache, j <= index + i).
        training: bool, enables attention dropout.
        return_attention_scores: bool, also return the probabilities
            ``(batch, num_heads, T_q, T_k)``.
        cache: optional float tensor ``(batch, 2, S, num_heads, key_dim)``
            holding projected keys ([:, 0]) and values ([:, 1]) of S
            positions, for incremental decoding. Its shape never changes,
            so the decoding loop compiles with XLA.
        cache_update_index: int scalar (may be a tensor). If given, the keys
            and values projected from this call's ``key``/``value`` are
            written into ``cache`` at ``[cache_update_index,
            cache_update_index + T_q)`` and queries attend to cache positions
            ``<= cache_update_index + i``. If ``None`` while ``cache`` is
            given, the cache is used as is (cross-attention over a
            pre-computed encoder memory) and ``key``/``value`` are ignored.

    Returns:
        ``(batch, T_q, output_shape)`` in the layer's compute dtype; with
        ``return_attention_scores`` a tuple ``(output, scores)``; with a
        ``cache`` a tuple ``(output, cache)`` (scores, if asked, come third).

    Raises:
        ValueError: ``num_heads``/``key_dim``/``value_dim`` not positive
            integers, ``dropout`` outside [0, 1), or a cache whose shape does
            not match ``(batch, 2, S, num_heads, key_dim)``.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.supports_masking = True
        self.num_heads = v.positive_int("num_heads", num_heads)
        self.key_dim = v.positive_int("key_dim", key_dim)
        self.value_dim = v.positive_int(
            "value_dim", key_dim if value_dim is None else value_dim
        )
        self.dropout = v.rate("dropout", dropout)
        self.use_bias = bool(use_bias)
        if output_shape is not None:
            if isinstance(output_shape, (tuple, list)):
                if len(output_shape) != 1:
                    raise ValueError(
                        "`output_shape` must be an int or a 1-tuple, got "
                        f"output_shape={output_shape!r}"
                    )
                output_shape = output_shape[0]
            output_shape = v.positive_int("output_shape", output_shape)
        self._output_shape = output_shape
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self._dropout_layer = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy
        )

    def build(
        self, query_shape, value_shape=None, key_shape=None, **unused_kwargs
    ):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        d_query = query_shape[-1]
        out_dim = self._output_shape or d_query
        h = self.num_heads

        def proj(name, d_in, d_head):
            kernel = self.add_weight(
                name=f"{name}_kernel",
                shape=(d_in, h, d_head),
                initializer=self.kernel_initializer,
            )
            bias = None
            if self.use_bias:
                bias = self.add_weight(
                    name=f"{name}_bias",
                    shape=(h, d_head),
                    initializer=self.bias_initializer,
                )
            return kernel, bias

        self.query_kernel, self.query_bias = proj("query", d_query, self.key_dim)
        self.key_kernel, self.key_bias = proj("key", key_shape[-1], self.key_dim)
        self.value_kernel, self.value_bias = proj(
            "value", value_shape[-1], self.value_dim
        )
        self.output_kernel = self.add_weight(
            name="output_kernel",
            shape=(h, self.value_dim, out_dim),
            initializer=self.kernel_initializer,
        )
        self.output_bias = None
        if self.use_bias:
            self.output_bias = self.add_weight(
                name="output_bias",
                shape=(out_dim,),
                initializer=self.bias_initializer,
            )
        self.built = True

    # -- projections -------------------------------------------------------
    @staticmethod
    def _project(x, kernel, bias):
        """(B, T, d) x (d, h, k) -> (B, T, h, k) as one matmul."""
        d, h, k = kernel.shape
        y = ops.matmul(x, ops.reshape(kernel, (d, h * k)))
        y = ops.reshape(y, tuple(ops.shape(x)[:-1]) + (h, k))
        if bias is not None:
            y = y + bias
        return y

    def project_key_value(self, key, value):
        """Projects an attended sequence once, for a cross-attention cache.

        Args:
            key, value: ``(batch, S, d)`` float tensors.

        Returns:
            ``(batch, 2, S, num_heads, key_dim)``: keys and values stacked.
        """
        if self.value_dim != self.key_dim:
            raise ValueError(
                "A key/value cache needs value_dim == key_dim, got "
                f"key_dim={self.key_dim}, value_dim={self.value_dim}"
            )
        k = self._project(key, self.key_kernel, self.key_bias)
        val = self._project(value, self.value_kernel, self.value_bias)
        return ops.stack([k, val], axis=1)

    # -- masks -------------------------------------------------------------
    @staticmethod
    def _merge_masks(query, value, key, attention_mask, query_mask,
                     value_mask, key_mask, use_kv_masks=True):
        if query_mask is None:
            query_mask = getattr(query, "_keras_mask", None)
        if not use_kv_masks:
            value_mask = key_mask = None
        else:
            if value_mask is None:
                value_mask = getattr(value, "_keras_mask", None)
            if key_mask is None and key is not value:
                key_mask = getattr(key, "_keras_mask", None)
        mask = None

        def _and(a, b):
            return b if a is None else ops.logical_and(a, b)

        if query_mask is not None:
            mask = _and(mask, ops.expand_dims(ops.cast(query_mask, "bool"), 2))
        if value_mask is not None:
            mask = _and(mask, ops.expand_dims(ops.cast(value_mask, "bool"), 1))
        if key_mask is not None:
            mask = _and(mask, ops.expand_dims(ops.cast(key_mask, "bool"), 1))
        if attention_mask is not None:
            mask = _and(mask, ops.cast(attention_mask, "bool"))
        return mask

    @staticmethod
    def causal_mask(q_len, k_len, offset=0):
        """Bool ``(q_len, k_len)`` mask with True where key j <= offset + i."""
        i = ops.arange(q_len)[:, None] + offset
        j = ops.arange(k_len)[None, :]
        return ops.greater_equal(i, j)

    # -- attention ---------------------------------------------------------
    def _attend(self, q, k, val, mask, training):
        """Eq. (1) on (B, T, h, d_k) tensors; mask broadcast to (B, h, Tq, Tk)."""
        scale = 1.0 / math.sqrt(self.key_dim)
        scores = ops.einsum("bqhd,bkhd->bhqk", q * ops.cast(scale, q.dtype), k)
        scores = ops.cast(scores, "float32")
        if mask is not None:
            mask = ops.cast(mask, "bool")
            if len(mask.shape) == 3:
                # expand_dims, not [:, None]: a bool strided slice has no
                # builtin LiteRT kernel (it would need the Flex delegate).
                mask = ops.expand_dims(mask, 1)
            # A large finite negative keeps fully masked rows finite (uniform)
            # instead of NaN; such rows only occur at padded queries.
            scores = ops.where(mask, scores, ops.cast(-1e9, "float32"))
        probs = ops.softmax(scores, axis=-1)
        probs = ops.cast(probs, self.compute_dtype)
        dropped = self._dropout_layer(probs, training=training)
        out = ops.einsum("bhqk,bkhd->bqhd", dropped, val)
        return out, probs

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        training=None,
        return_attention_scores=False,
        cache=None,
        cache_update_index=None,
    ):
        if key is None:
            key = value
        # With a cache the keys are the S cached positions, not T_k: masks of
        # the new key/value rows do not apply (pass `attention_mask` instead).
        mask = self._merge_masks(
            query, value, key, attention_mask, query_mask, value_mask,
            key_mask, use_kv_masks=cache is None,
        )
        q = self._project(query, self.query_kernel, self.query_bias)
        q_len = ops.shape(query)[1]

        if cache is not None:
            self._check_cache(cache)
            if cache_update_index is None:
                # Cross-attention over pre-projected keys/values.
                k, val = cache[:, 0], cache[:, 1]
            else:
                new_kv = self.project_key_value(key, value)
                start = [0, 0, cache_update_index, 0, 0]
                cache = ops.slice_update(cache, start, new_kv)
                k, val = cache[:, 0], cache[:, 1]
                # Positions past the written ones hold no data yet.
                written = ops.expand_dims(self.causal_mask(
                    q_len, ops.shape(cache)[2], offset=cache_update_index
                ), 0)
                if not use_causal_mask:
                    # Non-causal chunk: every written position is visible.
                    last = cache_update_index + q_len
                    written = ops.less(
                        ops.arange(ops.shape(cache)[2])[None, None, :], last
                    )
                mask = written if mask is None else ops.logical_and(
                    mask, written
                )
                use_causal_mask = False  # already applied
        else:
            k = self._project(key, self.key_kernel, self.key_bias)
            val = self._project(value, self.value_kernel, self.value_bias)

        if use_causal_mask:
            causal = ops.expand_dims(self.causal_mask(q_len, ops.shape(k)[1]), 0)
            mask = causal if mask is None else ops.logical_and(mask, causal)

        out, probs = self._attend(q, k, val, mask, training)
        # Output projection: (B, T, h, d_v) x (h, d_v, d_out).
        h, dv, d_out = self.output_kernel.shape
        out = ops.reshape(out, tuple(ops.shape(out)[:-2]) + (h * dv,))
        out = ops.matmul(out, ops.reshape(self.output_kernel, (h * dv, d_out)))
        if self.output_bias is not None:
            out = out + self.output_bias

        result = (out,)
        if cache is not None:
            result += (cache,)
        if return_attention_scores:
            result += (probs,)
        return result[0] if len(result) == 1 else result

    def _check_cache(self, cache):
        shape = tuple(cache.shape)
        if (
            len(shape) != 5
            or shape[1] != 2
            or shape[3] != self.num_heads
            or shape[4] != self.key_dim
        ):
            raise ValueError(
                "`cache` must have shape (batch, 2, max_length, num_heads="
                f"{self.num_heads}, key_dim={self.key_dim}), got "
                f"cache.shape={shape}"
            )

    def compute_mask(self, query, value, key=None, **kwargs):
        return getattr(query, "_keras_mask", None)

    def compute_output_shape(self, query_shape, value_shape=None,
                             key_shape=None):
        return tuple(query_shape[:-1]) + (
            self._output_shape or query_shape[-1],
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            dropout=self.dropout,
            use_bias=self.use_bias,
            output_shape=self._output_shape,
            kernel_initializer=keras.initializers.serialize(
                self.kernel_initializer
            ),
            bias_initializer=keras.initializers.serialize(
                self.bias_initializer
            ),
        )
        return config
