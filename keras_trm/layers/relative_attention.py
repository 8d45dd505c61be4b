"""Relative multi-head attention of Transformer-XL (Dai et al. 2019, §3.3).

With queries from the current segment h (T positions) and keys/values from
the extended context [SG(memory) ∘ h] (M + T positions), query i (absolute
position M + i) and key j score

    A_ij = q_iᵀ k_j                 (a) content
         + q_iᵀ W_{k,R} R_{i-j}     (b) content-dependent position bias
         + uᵀ k_j                   (c) global content bias
         + vᵀ W_{k,R} R_{i-j}       (d) global position bias
         = (q_i + u)ᵀ k_j + (q_i + v)ᵀ W_{k,R} R_{i-j}

where q = h W_q, k = [SG(m) ∘ h] W_k, R_d is the non-learned sinusoid of
the distance d = M + i - j, W_{k,R} a separate projection of positions and
u, v learned vectors per head (Dai et al. §3.3 and Appendix B), scaled by
1/sqrt(d_head). (b)+(d) is computed against the K = M + T distances in
descending order and aligned with ``rel_shift`` (Appendix B), O(T·K) with
no gather.
"""

import itertools
import math

import keras
import numpy as np
from keras import ops

from keras_trm.utils import checks as v
from keras_trm.layers._initializers import (
    clone_initializer, config_with, known_last_dim)
from keras_trm.layers.multi_head_attention import (
    MultiHeadAttention, mask_scores, masked_softmax)
from keras_trm.layers.positional_embedding import even_d_model


def relative_position_encoding(length, d_model, clamp_len=None,
                               dtype="float32"):
    """Sinusoids R of distances ``length-1, ..., 1, 0`` (descending).

    The Transformer-XL layout: sines and cosines are *concatenated*,

        R_d = [sin(d·ω_0), ..., sin(d·ω_{D/2-1}), cos(d·ω_0), ..., cos(d·ω_{D/2-1})]
        ω_k = 1 / 10000^(2k / D)

    the frequencies of Vaswani et al. (2017) §3.5, not interleaved as in
    ``sinusoidal_position_encoding`` (a fixed permutation of channels;
    W_{k,R} is learned on top of it). Row r holds the distance
    ``length - 1 - r``, clamped to ``clamp_len`` if given.

    Args:
        length: int >= 0 (may be a scalar tensor), number of distances.
        d_model: even int > 0, number of channels D.
        clamp_len: optional int >= 0; larger distances use ``R_{clamp_len}``.
            ``clamp_len=0`` clamps every distance to 0, whereas the
            reference code (kimiyoung/transformer-xl) treats ``clamp_len <=
            0`` as no clamping; pass None for no clamping.
        dtype: dtype of the result.

    Returns:
        ``(length, d_model)`` tensor of ``dtype``.

    Raises:
        ValueError: ``d_model`` odd or not positive, ``clamp_len`` or a
            host ``length`` negative.
        TypeError: a host ``length`` that is not an integer (3.5 gave 4
            rows).

    Example:

    >>> r = relative_position_encoding(5, 8)
    >>> tuple(r.shape)
    (5, 8)
    >>> np.asarray(r)[-1].tolist()   # last row: distance 0 -> sines 0, cosines 1
    [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    """
    even_d_model(d_model)
    if isinstance(length, np.generic) or not hasattr(length, "shape"):
        length = v.non_negative_int("length", length)  # not a tensor
    pos = ops.cast(length - 1 - ops.arange(length), "float32")
    if clamp_len is not None:
        pos = ops.minimum(pos, float(v.non_negative_int("clamp_len", clamp_len)))
    inv_freq = 1.0 / np.power(
        10000.0, np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    angle = pos[:, None] * ops.convert_to_tensor(inv_freq.astype("float32"))[None, :]
    pe = ops.concatenate([ops.sin(angle), ops.cos(angle)], axis=-1)
    return ops.cast(pe, dtype)


def rel_shift(x):
    """Aligns scores against descending distances with query/key positions.

    ``x`` has shape ``(..., T, K)`` (K >= T) where column c holds the score
    of query i against distance ``K - 1 - c`` (as produced against
    ``relative_position_encoding(K, ...)``). The result ``y`` has the same
    shape with

        y[..., i, j] = x[..., i, j + T - 1 - i]   for j <= (K - T) + i,

    the score of query i (absolute position K - T + i) against key j.
    Entries with j > (K - T) + i (future keys, always masked) hold
    unspecified values. The trick of the reference code (Appendix B): pad a
    zero column on the left, view the ``(T, K + 1)`` matrix as ``(K + 1,
    T)``, drop its first row and view the rest as ``(T, K)``; no gather.

    Args:
        x: tensor of rank >= 2, ``(..., T, K)``.

    Returns:
        Tensor of the same shape and dtype.

    Raises:
        ValueError: rank < 2, or K < T where both are static.

    Example:

    >>> import numpy as np
    >>> x = np.arange(6, dtype="float32").reshape(2, 3)   # T=2, K=3
    >>> y = np.asarray(rel_shift(x))
    >>> y[0, :2].tolist(), y[1].tolist()   # y[i, j] = x[i, j + T - 1 - i]
    ([1.0, 2.0], [3.0, 4.0, 5.0])
    """
    rank = len(x.shape)
    if rank < 2:
        raise ValueError(
            f"`x` must have rank >= 2 (..., T, K), got shape {tuple(x.shape)}")
    shape = ops.shape(x)
    lead = tuple(shape[:-2])
    q_len, k_len = shape[-2], shape[-1]
    if isinstance(q_len, int) and isinstance(k_len, int) and k_len < q_len:
        raise ValueError(
            f"`x` must have K >= T (..., T, K), got shape {tuple(x.shape)}")
    x = ops.pad(x, [[0, 0]] * (rank - 1) + [[1, 0]])
    x = ops.reshape(x, lead + (k_len + 1, q_len))[..., 1:, :]
    return ops.reshape(x, lead + (q_len, k_len))


def checked_mem_len(mem_len, same_length):
    """``mem_len`` as an int >= 0, > 0 with ``same_length`` (its window)."""
    mem_len = v.non_negative_int("mem_len", mem_len)
    if same_length and mem_len == 0:
        raise ValueError(
            "`same_length=True` bounds each query's window by `mem_len` "
            "keys, so it needs mem_len > 0, got mem_len=0")
    return mem_len


@keras.saving.register_keras_serializable(package="keras_trm")
class RelativeMultiHeadAttention(keras.layers.Layer):
    """Transformer-XL attention with relative positions and global biases.

    Computes, per head (Dai et al. 2019, §3.3),

        A_ij = (q_i + u)ᵀ k_j + (q_i + v)ᵀ W_{k,R} R_{M+i-j}
        out_i = (Σ_j softmax_j(A_ij / sqrt(d_head)) v_j) W_o

    for queries ``query[:, i]`` at absolute positions ``M + i`` and keys /
    values ``value[:, j]`` of the extended context (``M = K - T``): the
    queries are the last T positions of ``value`` (``concat([
    stop_gradient(memory), query], axis=1)``; see ``TransformerXLBlock``).
    R is ``relative_position_encoding``. Attention is always causal: query
    i sees keys ``j <= M + i``.

    Weights (``get_weights()`` order): ``query_kernel``, ``key_kernel``,
    ``value_kernel`` ``(d_in, num_heads, key_dim)`` (W_q, W_{k,E}, W_v),
    ``position_kernel`` ``(d_model_k, num_heads, key_dim)`` (W_{k,R}, never
    a bias), ``output_kernel`` ``(num_heads, key_dim, d_out)``, each
    projection followed by its bias when ``use_bias``; then ``content_bias``
    (u) and ``position_bias`` (v), both ``(num_heads, key_dim)``, when
    ``untie_biases``. The reference code uses no projection biases (the
    default): u already acts as a query bias.

    Args:
        num_heads: int > 0.
        key_dim: int > 0, d_head (queries, keys and values).
        dropout: float in [0, 1), dropout on the attention probabilities.
        use_bias: bool, biases on the query/key/value/output projections.
        output_shape: int, last dimension of the output (default: the
            query's last dimension).
        same_length: bool; if True every query sees at most ``mem_len``
            keys, itself included (keys j with ``p - mem_len < j <= p``, p
            = M + i), as ``same_length`` of the reference code
            (kimiyoung/transformer-xl, ``MemTransformerLM._forward``): the
            window is the configured ``mem_len``, not the memory length M
            of the call. Computed in key windows where that is smaller.
        mem_len: optional int > 0, the window of ``same_length``, here or
            as the ``mem_len`` call argument (which overrides it; a
            ``TransformerXLBlock`` passes its own to every call).
        clamp_len: optional int >= 0; relative distances above it use
            R_{clamp_len} (0 clamps all, unlike the reference code, which
            treats ``clamp_len <= 0`` as no clamping; None: no clamping).
        untie_biases: bool; if True (default) the layer owns its u and v,
            else they must be passed to ``call`` (e.g. one pair shared by
            all layers, ``untie_r=False`` in the reference code). Passed
            biases override owned ones.
        kernel_initializer, bias_initializer: initializers of projections.
        relative_bias_initializer: initializer of u and v (default zeros).

    Call arguments:
        query: float ``(batch, T, d_model)``, the current segment h.
        value: float ``(batch, K, d_model)`` with ``K = M + T >= T``, the
            extended context whose last T positions are ``query``.
        key: optional float ``(batch, K, d_model)``; default ``value``.
        attention_mask: optional bool ``(batch, T, K)`` (or broadcastable),
            True = may attend; combined with the causal mask.
        content_bias, position_bias: optional float ``(num_heads,
            key_dim)``, u and v (required if ``untie_biases=False``).
        training: bool, enables attention dropout.
        return_attention_scores: bool, also return the probabilities
            ``(batch, num_heads, T, K)`` (float32 before dropout).
        mem_len: optional int > 0, the window of ``same_length`` for this
            call (default: the layer's). A Python int, read when the call
            is traced.

    Returns:
        ``(batch, T, output_shape)`` in the compute dtype, or a tuple
        ``(output, probabilities)``.

    Raises:
        ValueError: bad constructor arguments, an odd key ``d_model``,
            ``key`` shorter than ``query``, missing or mis-shaped u/v,
            ``same_length`` without a ``mem_len`` > 0, inputs not of rank
            3, batch sizes or key and value lengths that differ, an
            ``attention_mask`` not broadcastable to (batch, T, K).
        TypeError: a non-integer ``mem_len`` (with or without
            ``same_length``).

    Example:

    >>> import numpy as np
    >>> attention = RelativeMultiHeadAttention(num_heads=2, key_dim=4)
    >>> rng = np.random.default_rng(0)
    >>> context = rng.normal(size=(1, 5, 8)).astype("float32")  # 2 memory + 3
    >>> segment = context[:, 2:]
    >>> out, probs = attention(segment, context, return_attention_scores=True)
    >>> tuple(out.shape), tuple(probs.shape)
    ((1, 3, 8), (1, 2, 3, 5))
    >>> float(probs[0, 0, 0, 3])   # query 0 (position 2) cannot see position 3
    0.0
    """

    def __init__(self, num_heads, key_dim, dropout=0.0, use_bias=False,
                 output_shape=None, same_length=False, clamp_len=None,
                 untie_biases=True, mem_len=None,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 relative_bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.num_heads = v.positive_int("num_heads", num_heads)
        self.key_dim = v.positive_int("key_dim", key_dim)
        self.dropout = v.rate("dropout", dropout)
        self.use_bias = bool(use_bias)
        if output_shape is not None:
            output_shape = v.positive_int("output_shape", output_shape)
        self._output_shape = output_shape
        self.same_length = bool(same_length)
        self.mem_len = (None if mem_len is None
                        else checked_mem_len(mem_len, self.same_length))
        if clamp_len is not None:
            clamp_len = v.non_negative_int("clamp_len", clamp_len)
        self.clamp_len = clamp_len
        self.untie_biases = bool(untie_biases)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.relative_bias_initializer = keras.initializers.get(
            relative_bias_initializer)
        # Compute same_length attention in key windows (``_band_attention``);
        # False forces the dense (T, K) scores.
        self.use_band = True
        self._dropout_layer = keras.layers.Dropout(self.dropout,
                                                   dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None, key_shape=None,
              **unused_kwargs):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        known_last_dim("query", query_shape)
        known_last_dim("value", value_shape)
        d_pos = known_last_dim("key", key_shape)
        if d_pos % 2:
            raise ValueError(
                "The last dimension of `key` (d_model of the sinusoids R) "
                f"must be even, got key shape {tuple(key_shape)}")
        self._d_pos = d_pos
        h, k = self.num_heads, self.key_dim
        out_dim = self._output_shape or query_shape[-1]
        weights_made = itertools.count()

        def weight(name, shape, initializer):
            # Every weight its own initializer (W_q, W_k, W_v, W_k,R differ).
            return self.add_weight(name=name, shape=shape, initializer=(
                clone_initializer(initializer, next(weights_made))))

        def proj(name, d_in, use_bias):
            kernel = weight(f"{name}_kernel", (d_in, h, k),
                            self.kernel_initializer)
            return kernel, (weight(f"{name}_bias", (h, k),
                                   self.bias_initializer) if use_bias else None)

        self.query_kernel, self.query_bias = proj("query", query_shape[-1],
                                                  self.use_bias)
        self.key_kernel, self.key_bias = proj("key", d_pos, self.use_bias)
        self.value_kernel, self.value_bias = proj("value", value_shape[-1],
                                                  self.use_bias)
        self.position_kernel, _ = proj("position", d_pos, False)
        self.output_kernel = weight("output_kernel", (h, k, out_dim),
                                    self.kernel_initializer)
        self.output_bias = self.content_bias = self.position_bias = None
        if self.use_bias:
            self.output_bias = weight("output_bias", (out_dim,),
                                      self.bias_initializer)
        if self.untie_biases:
            self.content_bias = weight("content_bias", (h, k),
                                       self.relative_bias_initializer)
            self.position_bias = weight("position_bias", (h, k),
                                        self.relative_bias_initializer)
        self.built = True

    # -- pieces ------------------------------------------------------------
    @staticmethod
    def _project(x, kernel, bias):
        """``MultiHeadAttention``'s projection, the weights cast to ``x``'s
        dtype: (B, T, d) x (d, h, k) -> (B, T, h, k)."""
        return MultiHeadAttention._project(
            x, ops.cast(kernel, x.dtype),
            None if bias is None else ops.cast(bias, x.dtype))

    def _bias(self, name, given, own):
        bias = own if given is None else given
        if bias is None:
            raise ValueError(
                f"`{name}` must be passed to layer '{self.name}' (created "
                "with untie_biases=False, so it owns no u/v)")
        if tuple(bias.shape) != (self.num_heads, self.key_dim):
            raise ValueError(
                f"`{name}` must have shape (num_heads={self.num_heads}, "
                f"key_dim={self.key_dim}), got {name}.shape="
                f"{tuple(bias.shape)}")
        return bias

    @staticmethod
    def _check_inputs(query, value, key, attention_mask):
        """Static shapes: rank 3, one batch size, as many keys as values,
        a mask broadcastable to (T, K); each failed deep in the backend."""
        for name, x in (("query", query), ("value", value), ("key", key)):
            if len(x.shape) != 3:
                raise ValueError(f"`{name}` must have rank 3 (batch, length, "
                                 f"features), got {name}.shape={tuple(x.shape)}")
        v.same_batch(query=query, value=value, key=key)
        k_len, v_len = key.shape[1], value.shape[1]
        if k_len is not None and v_len is not None and k_len != v_len:
            raise ValueError(
                "`key` and `value` must hold one key per value, got "
                f"key.shape={tuple(key.shape)} and value.shape={tuple(value.shape)}")
        v.attention_mask_shape(attention_mask, query.shape[1], key.shape[1],
                               ranks=(3, 4))

    def _window(self, mem_len):
        """The ``same_length`` window of a call: ``mem_len`` if given, else
        the layer's; None without ``same_length``."""
        if not self.same_length:
            return None
        mem_len = self.mem_len if mem_len is None else mem_len
        if mem_len is None:
            raise ValueError(
                "`same_length=True` bounds each query's window by `mem_len` "
                f"keys: layer '{self.name}' has mem_len=None, so pass "
                "mem_len > 0 to its constructor or to the call")
        return checked_mem_len(mem_len, True)

    def attention_mask_for(self, q_len, k_len, mem_len=None):
        """Bool ``(T, K)``: True where query i may see key j.

        Causal over memory and segment: ``j <= p`` with ``p = M + i`` and
        ``M = K - T``; with ``same_length`` also ``j > p - mem_len`` (the
        reference code's window of ``mem_len`` keys, itself included;
        ``mem_len`` defaults to the layer's).
        """
        window = self._window(mem_len)
        causal = MultiHeadAttention.causal_mask
        mask = causal(q_len, k_len, offset=k_len - q_len)
        if window is None:
            return mask
        return ops.logical_and(mask, ops.logical_not(
            causal(q_len, k_len, offset=k_len - q_len - window)))

    def _scores(self, q, k, length, content_bias, position_bias, n=""):
        """Scaled A_ij in float32, ``(B, [n,] h, T, length)``, of projected
        queries and keys ``(B, [n,] T or length, h, d_head)``: (a) + (c) as
        ``(q_i + u)ᵀ k_j``, (b) + (d) as ``(q_i + v)ᵀ W_{k,R} R`` against
        distances ``length - 1, ..., 0``, aligned by ``rel_shift``."""
        u = self._bias("content_bias", content_bias, self.content_bias)
        rv = self._bias("position_bias", position_bias, self.position_bias)
        r = relative_position_encoding(length, self._d_pos, self.clamp_len,
                                       dtype=q.dtype)
        d, h, dh = self.position_kernel.shape
        r = ops.reshape(ops.matmul(r, ops.reshape(
            ops.cast(self.position_kernel, r.dtype), (d, h * dh))),
            (length, h, dh))
        content = ops.einsum(f"b{n}qhd,b{n}khd->b{n}hqk",
                             q + ops.cast(u, q.dtype), k)
        position = rel_shift(ops.einsum(f"b{n}qhd,khd->b{n}hqk",
                                        q + ops.cast(rv, q.dtype), r))
        return ops.cast(content + position, "float32") * (
            1.0 / math.sqrt(self.key_dim))

    def _logits(self, query, key, attention_mask, content_bias,
                position_bias, mem_len):
        """Scaled A_ij in float32 ``(B, h, T, K)`` and the bool mask of the
        keys each query may see (broadcastable to them)."""
        q_len, k_len = ops.shape(query)[1], ops.shape(key)[1]
        if isinstance(q_len, int) and isinstance(k_len, int) and k_len < q_len:
            raise ValueError(
                "`key`/`value` must hold the memory followed by the T query "
                f"positions (K >= T), got query.shape={tuple(query.shape)} "
                f"and key.shape={tuple(key.shape)}")
        logits = self._scores(
            self._project(query, self.query_kernel, self.query_bias),
            self._project(key, self.key_kernel, self.key_bias), k_len,
            content_bias, position_bias)
        mask = self.attention_mask_for(q_len, k_len, mem_len)[None, None]
        if attention_mask is not None:
            extra = ops.cast(attention_mask, "bool")
            if len(extra.shape) == 3:
                extra = extra[:, None]
            mask = ops.logical_and(mask, extra)
        return logits, mask

    def attention_logits(self, query, value, key=None, attention_mask=None,
                         content_bias=None, position_bias=None,
                         mem_len=None):
        """The pre-softmax scores A_ij / sqrt(d_head), float32 ``(batch,
        num_heads, T, K)``, -1e9 where masked. Arguments as ``call``."""
        key = value if key is None else key
        if not self.built:
            self.build(tuple(query.shape), tuple(value.shape),
                       tuple(key.shape))
        return mask_scores(*self._logits(query, key, attention_mask,
                                         content_bias, position_bias,
                                         mem_len))

    # -- same_length in bands ----------------------------------------------
    # Query-chunk sizes of the banded path, most preferred first; 128 was
    # fastest at T = mem_len = 512 (bench/bench_transformer_xl.py at 32da1ca).
    _BAND_CHUNKS = (128, 64, 32, 16)

    def _band_chunk(self, q_len, k_len, window):
        """Query-chunk size c of the banded path, or None for the dense one.

        With ``same_length`` a chunk of c queries needs only ``window + c -
        1`` keys: used when the shapes are static, c divides T and the
        windows are shorter than K (40% fewer scores at T = mem_len = M =
        512)."""
        if window is None or not (
                isinstance(q_len, int) and isinstance(k_len, int)):
            return None
        for c in self._BAND_CHUNKS:
            if q_len % c == 0 and window + c - 1 < k_len:
                return c
        return None

    def _band_attention(self, query, key, value, chunk, window,
                        content_bias, position_bias):
        """``softmax(A)`` and the values ``(B, n, h, c, win)``,
        ``(B, n, win, h, d_head)`` of ``same_length`` in key windows.

        Queries are cut into ``n = T / c`` chunks; chunk a attends to the
        ``win = W + c - 1`` keys ending at its last query (W = ``window``;
        keys before position 0 are masked zero padding), a segment of c
        queries with ``W - 1`` memory positions, so (b)+(d) is the same
        ``rel_shift``. The result equals the dense path's.
        """
        q_len, k_len = query.shape[1], key.shape[1]
        n, win = q_len // chunk, window + chunk - 1
        q = self._project(query, self.query_kernel, self.query_bias)
        q = ops.reshape(q, (-1, n, chunk, self.num_heads, self.key_dim))
        # Window a covers padded key positions M + a·c .. M + a·c + win - 1
        # (key j sits at padded position j + W - 1).
        starts = k_len - q_len + chunk * np.arange(n)
        pad = [[0, 0], [window - 1, 0], [0, 0], [0, 0]]

        def windows(x, kernel, bias):
            x = ops.pad(self._project(x, kernel, bias), pad)
            # n static slices (as fast as a gather): (B, n, win, h, d_head).
            return ops.stack([x[:, s:s + win] for s in starts], axis=1)

        logits = self._scores(q, windows(key, self.key_kernel, self.key_bias),
                              win, content_bias, position_bias, n="n")
        # Query i of a window sits at W - 1 + i: distance W - 1 + i - w in
        # [0, W - 1], and the key must be real (padded position >= W - 1).
        i = np.arange(chunk)[:, None]
        w = np.arange(win)[None, :]
        dist = window - 1 + i - w
        mask = ((dist >= 0) & (dist < window))[None] & (
            starts[:, None, None] + w[None] >= window - 1)
        probs = masked_softmax(logits,
                               ops.convert_to_tensor(mask[None, :, None]))
        return probs, windows(value, self.value_kernel, self.value_bias)

    def call(self, query, value, key=None, attention_mask=None,
             content_bias=None, position_bias=None, training=None,
             return_attention_scores=False, mem_len=None):
        key = value if key is None else key
        self._check_inputs(query, value, key, attention_mask)
        if mem_len is not None:
            checked_mem_len(mem_len, self.same_length)
        window = self._window(mem_len)
        chunk = None
        if (attention_mask is None and not return_attention_scores
                and self.use_band and key.shape[1] == value.shape[1]):
            chunk = self._band_chunk(query.shape[1], key.shape[1], window)
        if chunk is not None:
            probs, val = self._band_attention(
                query, key, value, chunk, window, content_bias, position_bias)
            equation = "bnhqk,bnkhd->bnqhd"
        else:
            probs = masked_softmax(*self._logits(
                query, key, attention_mask, content_bias, position_bias,
                window))
            val = self._project(value, self.value_kernel, self.value_bias)
            equation = "bhqk,bkhd->bqhd"
        dropped = self._dropout_layer(ops.cast(probs, self.compute_dtype),
                                      training=training)
        out = ops.einsum(equation, dropped, val)
        h, dh, d_out = self.output_kernel.shape
        out = ops.reshape(out, tuple(ops.shape(query)[:2]) + (h * dh,))
        out = ops.matmul(out, ops.reshape(
            ops.cast(self.output_kernel, out.dtype), (h * dh, d_out)))
        if self.output_bias is not None:
            out = out + ops.cast(self.output_bias, out.dtype)
        if return_attention_scores:
            return out, probs
        return out

    def compute_output_shape(self, query_shape, value_shape=None,
                             key_shape=None):
        return tuple(query_shape[:-1]) + (
            self._output_shape or query_shape[-1],)

    def get_config(self):
        config = config_with(super().get_config(), self, (
            "num_heads", "key_dim", "dropout", "use_bias", "same_length",
            "mem_len", "clamp_len", "untie_biases"), (
            "kernel_initializer", "bias_initializer",
            "relative_bias_initializer"))
        config["output_shape"] = self._output_shape
        return config
