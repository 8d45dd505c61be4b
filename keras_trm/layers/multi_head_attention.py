"""Multi-head scaled dot-product attention (Vaswani et al. 2017, §3.2)."""

import itertools
import math
import numbers

import keras
from keras import ops
# What Keras' MultiHeadAttention.call uses to delete its inputs' masks.
from keras.src.backend.common.masking import get_keras_mask, set_keras_mask

from keras_trm.utils import checks as v
from keras_trm.layers._initializers import clone_initializer

# Letters for the leading (batch-like) axes of the attention einsums; they
# avoid q, k, h and d, the query, key, head and channel axes.
_BATCH_LETTERS = "abcefgijlm"
# The shortest keys that go through the fused op, by backend (others: 0).
# On one H200 (bench/results/gpu_attention_lengths_NVIDIA_H200.json) JAX's
# einsums trained transformer_base 1.10x faster than cuDNN at 32-token
# batches, and cuDNN was no faster below 512 keys; PyTorch's SDPA beat the
# einsums at every length from 16 to 1024 (1.2x-1.9x).
FUSED_MIN_KEY_LENGTH = {"jax": 512}

# The cached step's kernels: on CPU TensorFlow rewrites ``BatchMatMulV2``
# and ``Softmax`` to oneDNN kernels that cost more than Eigen's at its
# shapes (one query over a cache whose length changes every step: the
# matmul 1.5-3x, and a softmax re-creates its primitive at every new
# shape). ``BatchMatMulV3`` is not rewritten, so float32 uses it (bfloat16
# keeps oneDNN), and the softmax is written out: greedy 1.3x, beam 4 1.12x
# faster on Multi30k val (``bench/results/attention_kernels.json``).


def _cached_matmul(x, y, transpose_y=False):
    """``x @ y`` (``yᵀ`` with ``transpose_y``) over the last two axes, as
    ``BatchMatMulV3`` for float32 on TensorFlow (see above)."""
    if (keras.backend.backend() == "tensorflow"
            and keras.backend.standardize_dtype(x.dtype) == "float32"):
        import tensorflow as tf

        return tf.raw_ops.BatchMatMulV3(x=x, y=y, Tout=x.dtype,
                                        adj_y=transpose_y)
    return ops.matmul(x, ops.swapaxes(y, -1, -2) if transpose_y else y)


def mask_scores(scores, mask):
    """float32 ``scores`` with -1e9 where the bool ``mask`` (broadcast to
    them) is False. A large finite negative, not -inf: a fully masked row
    (only at padded queries) stays finite and its softmax uniform."""
    scores = ops.cast(scores, "float32")
    if mask is None:
        return scores
    return ops.where(ops.cast(mask, "bool"), scores, ops.cast(-1e9, "float32"))


def masked_softmax(scores, mask=None, written_out=False):
    """The softmax of Eq. (1) over the last axis, masked, in float32.

    Args:
        scores: float ``(..., T_q, T_k)`` attention logits.
        mask: optional bool broadcastable to ``scores``; True = may attend.
        written_out: compute exp(s - max s) / Σ exp(...) with elementary ops
            (the cached step's kernel on TensorFlow, see above) instead of
            ``ops.softmax``.

    Returns:
        float32 probabilities of ``scores``' shape; masked entries are 0.

    Example:

    >>> import numpy as np
    >>> p = masked_softmax(np.zeros((1, 3), "float32"), np.array([[1, 1, 0]], bool))
    >>> np.round(np.asarray(p), 3).tolist()
    [[0.5, 0.5, 0.0]]
    """
    scores = mask_scores(scores, mask)
    if not written_out:
        return ops.softmax(scores, axis=-1)
    e = ops.exp(scores - ops.max(scores, axis=-1, keepdims=True))
    return e / ops.sum(e, axis=-1, keepdims=True)


def _output_shape(output_shape):
    """``None``, a positive int or a sequence of them, else ValueError (as
    Keras' type errors; Keras lets 2.5 or (0,) through)."""
    if output_shape is None:
        return None
    shape = (output_shape if isinstance(output_shape, (tuple, list))
             else (output_shape,))
    if not shape or any(isinstance(d, bool) or not isinstance(
            d, numbers.Integral) or d <= 0 for d in shape):
        raise ValueError(
            "`output_shape` must be a positive int or a non-empty tuple/list "
            f"of positive ints, got output_shape={output_shape!r}")
    return tuple(int(d) for d in shape)


class _ClassicFans(keras.initializers.Initializer):
    """A ``VarianceScaling`` initializer with the fans of a 3-D kernel as
    Keras computed them before 3.15: fan_in = the product of all axes but
    the last, fan_out = of all but the one before it (d_model·h and
    d_model·d_k for ``(d_model, h, d_k)``). Keras 3.15's ``EinsumDense``
    counts d_model and h·d_k, a 5.8x larger scale for transformer_small's
    W_Q, which would change every recipe's training with the Keras version.
    An initializer given with ``input_axes`` and ``output_axes`` is kept."""

    def __init__(self, initializer):
        self.initializer = initializer

    @classmethod
    def wrap(cls, initializer):
        if (isinstance(initializer, keras.initializers.VarianceScaling)
                and getattr(initializer, "input_axes", 0) is None
                and getattr(initializer, "output_axes", 0) is None):
            return cls(initializer)
        return initializer

    def __call__(self, shape, dtype=None):
        rank = len(shape)
        config = self.initializer.get_config()
        config["seed"] = self.initializer.seed  # the drawn one, if unseeded
        config["input_axes"] = list(range(rank - 1))
        config["output_axes"] = list(range(rank - 2)) + [rank - 1]
        return type(self.initializer).from_config(config)(shape, dtype=dtype)

    def get_config(self):
        return {"initializer": keras.initializers.serialize(self.initializer)}

    @classmethod
    def from_config(cls, config):
        return cls(keras.initializers.deserialize(config["initializer"]))


@keras.saving.register_keras_serializable(package="keras_trm")
class MultiHeadAttention(keras.layers.MultiHeadAttention):
    """Multi-head attention with a key/value cache for decoding.

    Implements Eq. (1) and the multi-head projection of Vaswani et al. (2017),
    §3.2.1-3.2.2:

        Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V
        MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

    A ``keras.layers.MultiHeadAttention`` (its constructor, call
    arguments, masks, ``EinsumDense`` projections ``query_dense``,
    ``key_dense``, ``value_dense``, ``output_dense`` with kernels
    ``(d_query, h, key_dim)``, ``(d_key, h, key_dim)``, ``(d_value, h,
    value_dim)``, ``(h, value_dim, *output_shape)``, config and weights
    files are Keras'). This subclass adds:

    - the cached step of decoding (``key_value_heads``,
      ``call_with_cache``);
    - the rule for the fused op (``_fused_applies``): with one attention
      axis, Eq. (1) goes through ``keras.ops.dot_product_attention`` only
      when no scores are returned, no attention dropout applies, the
      backend is not TensorFlow (no fused kernel there: 0.92x,
      ``bench/results/train_step_fused_attention_ab_*.json``) and, under
      JAX, from ``FUSED_MIN_KEY_LENGTH`` keys; otherwise einsums with a
      float32 softmax (``masked_softmax``);
    - ``fuse_projections``, a lever for GPUs;
    - every projection its own initializer (seeded: ``seed + i``) with the
      fans of Keras before 3.15 (``_ClassicFans``);
    - loading of files of the layer before it subclassed Keras';
    - the Keras masks of ``query``, ``value`` and ``key`` stay on them.

    Several attention axes, ``use_gate``, ``sliding_window`` and
    ``flash_attention=True`` run Keras' own attention.

    Args:
        num_heads: int, h.
        key_dim: int, d_k, the size of each head's queries and keys.
        value_dim: int, d_v (default ``key_dim``).
        dropout: float in [0, 1), the rate on the attention probabilities.
        output_shape: int or tuple of ints (default: the query's last
            dimension).
        **kwargs: the other arguments of ``keras.layers.MultiHeadAttention``
            and of ``keras.layers.Layer``.

    Call arguments: those of ``keras.layers.MultiHeadAttention``: ``query``
        float ``(batch, T_q, d_query)``, ``value`` ``(batch, T_k, d_value)``,
        optional ``key`` ``(batch, T_k, d_key)``, ``query_mask``,
        ``value_mask``, ``key_mask``, ``attention_mask`` bool ``(batch, T_q,
        T_k)`` (True = may attend), ``return_attention_scores``,
        ``training``, ``use_causal_mask``.

    Returns:
        ``(batch, T_q, *output_shape)`` in the compute dtype, carrying the
        query's Keras mask; with ``return_attention_scores`` a tuple
        ``(output, scores)``, scores ``(batch, num_heads, T_q, T_k)``.

    Raises:
        ValueError: ``num_heads``/``key_dim``/``value_dim`` not positive
            ints, ``dropout`` outside [0, 1), a bad ``output_shape``, inputs
            of rank < 3 or of different ranks, a ``key`` shape that differs
            from ``value``'s but in the last axis, batch sizes that differ,
            masks whose shapes do not fit the inputs.

    Example:

    >>> import numpy as np
    >>> mha = MultiHeadAttention(num_heads=2, key_dim=4, output_shape=(3,))
    >>> q = np.zeros((1, 5, 8), "float32")
    >>> v = np.zeros((1, 7, 6), "float32")
    >>> out, scores = mha(q, v, return_attention_scores=True)
    >>> tuple(out.shape), tuple(scores.shape)
    ((1, 5, 3), (1, 2, 5, 7))
    """

    def __init__(self, num_heads, key_dim, value_dim=None, dropout=0.0,
                 output_shape=None, **kwargs):
        try:
            dropout = v.rate("dropout", dropout)
        except TypeError as err:  # ValueError for types too, as Keras
            raise ValueError(str(err)) from None
        super().__init__(num_heads, key_dim, value_dim=value_dim,
                         dropout=dropout,
                         output_shape=_output_shape(output_shape), **kwargs)

    def build(self, query_shape, value_shape=None, key_shape=None):
        self._sublayers_made = itertools.count()
        super().build(query_shape,
                      query_shape if value_shape is None else value_shape,
                      key_shape)

    def _get_common_kwargs_for_sublayer(self):
        # Keras' own clones each initializer from its config (a seeded one
        # then gives W_Q = W_K = W_V). Here the i-th projection gets seed + i
        # (kernels) and seed + 8 + i (biases), and an unseeded one draws as
        # before this layer was a subclass (same weights from a seed).
        i = next(self._sublayers_made)
        return dict(
            kernel_initializer=_ClassicFans.wrap(
                clone_initializer(self._kernel_initializer, i)),
            bias_initializer=clone_initializer(self._bias_initializer, 8 + i),
            kernel_regularizer=self._kernel_regularizer,
            bias_regularizer=self._bias_regularizer,
            activity_regularizer=self._activity_regularizer,
            kernel_constraint=self._kernel_constraint,
            bias_constraint=self._bias_constraint,
            dtype=self.dtype_policy,
        )

    def _compute_causal_mask(self, query, value=None):
        # (1, T_q, T_k) from aranges (Keras' cumsums of ones cost more), of
        # the sequence axis also for rank-4 inputs.
        k_len = ops.shape(query if value is None else value)[-2]
        return ops.expand_dims(
            self.causal_mask(ops.shape(query)[-2], k_len), 0)

    @staticmethod
    def causal_mask(q_len, k_len, offset=0):
        """Bool ``(q_len, k_len)`` mask with True where key j <= offset + i."""
        i = ops.arange(q_len)[:, None] + offset
        j = ops.arange(k_len)[None, :]
        return ops.greater_equal(i, j)

    # -- projections -------------------------------------------------------
    # True: query, key and value that are one tensor go through one matmul
    # against their kernels side by side (the input and its gradient read
    # once). Off by default: 0.94x (TensorFlow) and 0.92x (JAX) on CPU
    # (``bench/results/train_step_fused_projections_ab_*.json``); a lever
    # for GPUs (``bench/gpu_train.py --fuse-projections``). Same function.
    fuse_projections = False

    @staticmethod
    def _project(x, kernel, bias):
        """(B, ..., T, d) x (d, h, k) -> (B, ..., T, h, k) as one matmul."""
        d, h, k = kernel.shape
        y = ops.matmul(x, ops.reshape(kernel, (d, h * k)))
        y = ops.reshape(y, tuple(ops.shape(x)[:-1]) + (h, k))
        return y if bias is None else y + bias

    def _projections(self, dtype=None, **inputs):
        """``query=``, ``key=``, ``value=`` tensors -> their projections
        ``(B, ..., T, h, k)``, in the order given; with ``fuse_projections``
        inputs that are the same tensor share one matmul. ``dtype``: cast
        the weights to it (the methods that run outside ``__call__``)."""
        # No for/else here: AutoGraph (the exports' tf.functions) cannot
        # convert it, runs the method as is and keeps the error, whose
        # traceback held the training job's fit() frame and its dataset.
        groups = {}  # id(tensor) -> (tensor, names), in the order first seen
        for name, x in inputs.items():
            groups.setdefault(id(x), (x, []))[1].append(name)
        out = {}
        for x, names in groups.values():
            dense = [getattr(self, f"_{n}_dense") for n in names]
            kernels = [d.kernel for d in dense]
            biases = [d.bias for d in dense]
            if dtype is not None:
                kernels = [ops.cast(w, dtype) for w in kernels]
                biases = [None if b is None else ops.cast(b, dtype)
                          for b in biases]
            if len(names) == 1 or not self.fuse_projections:
                for n, w, b in zip(names, kernels, biases):
                    out[n] = self._project(x, w, b)
                continue
            d = kernels[0].shape[0]
            widths = [w.shape[1] * w.shape[2] for w in kernels]
            y = ops.matmul(x, ops.concatenate(
                [ops.reshape(w, (d, n)) for w, n in zip(kernels, widths)],
                axis=-1))
            if self.use_bias:
                y = y + ops.concatenate(
                    [ops.reshape(b, (n,)) for b, n in zip(biases, widths)])
            lead = tuple(ops.shape(x)[:-1])
            parts = ops.split(y, list(itertools.accumulate(widths))[:-1],
                              axis=-1)
            for n, part, w in zip(names, parts, kernels):
                out[n] = ops.reshape(part, lead + tuple(w.shape[1:]))
        return [out[name] for name in inputs]

    def _project_output(self, heads, dtype):
        """W^O: (B, ..., T, h, d_v) x (h, d_v, *output_shape) as one matmul,
        the weights cast to ``dtype``."""
        kernel = ops.cast(self._output_dense.kernel, dtype)
        bias = self._output_dense.bias
        h, dv = kernel.shape[:2]
        out_shape = tuple(kernel.shape[2:])
        lead = tuple(ops.shape(heads)[:-2])
        out = ops.matmul(ops.reshape(heads, lead + (h * dv,)),
                         ops.reshape(kernel, (h * dv, math.prod(out_shape))))
        if len(out_shape) > 1:
            out = ops.reshape(out, lead + out_shape)
        return out if bias is None else out + ops.cast(bias, dtype)

    def call(self, query, value, key=None, query_mask=None, value_mask=None,
             key_mask=None, attention_mask=None,
             return_attention_scores=False, training=None,
             use_causal_mask=False):
        # Keras' call deletes the Keras masks of query, value and key (its
        # sub-layers must not see them); they are put back, so the caller's
        # tensors keep them (deleted, a stack of decoder blocks lost the
        # encoder output's mask after the first layer).
        masks = [(x, get_keras_mask(x)) for x in (query, value, key)
                 if x is not None]
        try:
            self._check_inputs(query, value, key, query_mask, value_mask,
                               key_mask, attention_mask)
            if query_mask is not None and get_keras_mask(query) is None:
                # Keras' call reads the query's Keras mask only.
                rows = ops.expand_dims(ops.cast(query_mask, "bool"), -1)
                attention_mask = rows if attention_mask is None else \
                    ops.logical_and(ops.cast(attention_mask, "bool"), rows)
            if self._use_gate or self._activity_regularizer is not None:
                return super().call(
                    query, value, key=key, query_mask=query_mask,
                    value_mask=value_mask, key_mask=key_mask,
                    attention_mask=attention_mask,
                    return_attention_scores=return_attention_scores,
                    training=training, use_causal_mask=use_causal_mask)
            # Keras' call with one matmul per projection: through Keras'
            # EinsumDense calls the training step ran 0.934x-0.973x, this
            # 0.998x (bench/results/train_step_mha_subclass_ab_*.json).
            key = value if key is None else key
            mask = self._compute_attention_mask(
                query, value, query_mask=get_keras_mask(query),
                value_mask=value_mask, key_mask=key_mask,
                attention_mask=attention_mask, use_causal_mask=use_causal_mask)
            q, k, val = self._projections(query=query, key=key, value=value)
            out, scores = self._compute_attention(q, k, val, mask, training,
                                                  return_attention_scores)
            out = self._project_output(out, out.dtype)
            return (out, scores) if return_attention_scores else out
        finally:
            for x, mask in masks:
                if mask is not None:
                    set_keras_mask(x, mask)

    def _check_inputs(self, query, value, key, query_mask, value_mask,
                      key_mask, attention_mask):
        """Static shapes that Keras' layer lets through to the backend (or,
        under JAX and PyTorch, broadcasts silently)."""
        if len(query.shape) < 3 or len(value.shape) != len(query.shape):
            raise ValueError(
                "`query` and `value` must have the same rank, at least 3 "
                f"(batch, sequence, features), got query.shape="
                f"{tuple(query.shape)} and value.shape={tuple(value.shape)}")
        # Keras fails inside the einsum on a built layer.
        self.compute_output_shape(query.shape, value.shape,
                                  None if key is None else key.shape)
        key = value if key is None else key
        v.same_batch(query=query, value=value, key=key)
        v.mask_shape("query_mask", query_mask, query.shape[:-1])
        v.mask_shape("value_mask", value_mask, value.shape[:-1])
        v.mask_shape("key_mask", key_mask, key.shape[:-1])
        v.attention_mask_shape(attention_mask, query.shape[-2],
                               key.shape[-2])

    # -- attention ---------------------------------------------------------
    # Keys at least this long (static length; unknown counts as long) go
    # through the fused op, shorter ones through the einsums; None: the
    # backend's FUSED_MIN_KEY_LENGTH. Benches set it on an instance.
    fused_min_key_length = None

    def _fused_applies(self, q, k, training, return_scores):
        """Whether Eq. (1) goes through ``keras.ops.dot_product_attention``
        (see the class docstring; not on TensorFlow, which also keeps the
        exports' graphs as they were)."""
        shortest = self.fused_min_key_length
        if shortest is None:
            shortest = FUSED_MIN_KEY_LENGTH.get(keras.backend.backend(), 0)
        key_length = k.shape[-3]  # None or symbolic while tracing: long
        return (len(q.shape) == 4 and not return_scores
                and (self.dropout == 0 or not training)
                and (not isinstance(key_length, int) or key_length >= shortest)
                and keras.backend.backend() != "tensorflow")

    def _compute_attention(self, query, key, value, attention_mask=None,
                           training=None, return_attention_scores=False,
                           use_causal_mask=False):
        """Eq. (1) on projected ``(B, ..., T, h, d)`` tensors; returns
        ``(output, probabilities or None)``. The mask ``(B, ..., T_q, T_k)``
        (causal mask included) is broadcast to the scores ``(B, ..., h,
        T_q, T_k)``; the fused op computes the same function."""
        if (self._attention_axes != (len(query.shape) - 3,)
                or self._flash_attention):
            return super()._compute_attention(
                query, key, value, attention_mask, training,
                return_attention_scores, use_causal_mask)
        mask = attention_mask
        if mask is not None:
            # expand_dims, not [:, None]: a bool strided slice has no
            # builtin LiteRT kernel (it would need the Flex delegate).
            mask = ops.cast(mask, "bool")
            while len(mask.shape) < len(query.shape):
                mask = ops.expand_dims(mask, -3)
        if self._fused_applies(query, key, training, return_attention_scores):
            if mask is not None:
                # The query axis at full length: cuDNN (JAX on a GPU)
                # rejects a key-only (..., 1, T_k) mask, and Keras fell
                # back to XLA's attention for every cross-attention.
                mask = ops.broadcast_to(mask, tuple(mask.shape[:-2]) + (
                    ops.shape(query)[-3], ops.shape(key)[-3]))
            out = ops.dot_product_attention(
                query, key, value, mask=mask, scale=self._inverse_sqrt_key_dim)
            return out, None
        batch = _BATCH_LETTERS[: len(query.shape) - 3]
        scores = ops.einsum(
            f"{batch}qhd,{batch}khd->{batch}hqk",
            query * ops.cast(self._inverse_sqrt_key_dim, query.dtype), key)
        probs = ops.cast(masked_softmax(scores, mask), self.compute_dtype)
        dropped = self._dropout_layer(probs, training=training)
        out = ops.einsum(f"{batch}hqk,{batch}khd->{batch}qhd", dropped, value)
        return out, probs

    def compute_output_spec(self, query, value, key=None, *args,
                            return_attention_scores=False, **kwargs):
        """Keras' spec, with scores ``(batch, h, T_q, T_k)`` (Keras gives
        ``T_q`` twice)."""
        out = super().compute_output_spec(query, value, key, *args, **kwargs)
        if not return_attention_scores:
            return out
        q_shape = tuple(query.shape)
        return out, keras.KerasTensor(
            q_shape[:-2] + (self.num_heads, q_shape[-2],
                            (value if key is None else key).shape[-2]),
            dtype=self.compute_dtype)

    # -- incremental decoding on head-major caches -------------------------
    # Keys and values are kept head-major, each ``(batch, num_heads, S,
    # key_dim)``, so one step's attention is two batched matmuls with no
    # transpose or slice of the cache. These methods run outside
    # ``__call__``, so they cast a mixed policy's float32 variables to the
    # inputs' dtype themselves.

    def key_value_heads(self, key, value=None):
        """Projects an attended sequence into a head-major cache.

        Args:
            key: float ``(batch, S, d_key)``.
            value: float ``(batch, S, d_value)``; default ``key``.

        Returns:
            ``(keys, values)``, each ``(batch, num_heads, S, key_dim)`` in
            ``key``'s dtype: a cross-attention cache, or the entries of a
            self-attention cache.

        Example:

        >>> import numpy as np
        >>> mha = MultiHeadAttention(num_heads=2, key_dim=4)
        >>> x = np.zeros((3, 5, 8), "float32")
        >>> _ = mha(x, x)   # builds the weights
        >>> keys, values = mha.key_value_heads(x)
        >>> tuple(keys.shape), tuple(values.shape)
        ((3, 2, 5, 4), (3, 2, 5, 4))
        """
        value = key if value is None else value
        k, v = self._projections(key.dtype, key=key, value=value)
        return ops.transpose(k, (0, 2, 1, 3)), ops.transpose(v, (0, 2, 1, 3))

    def call_with_cache(self, query, cache, new_key_value=None,
                        attention_mask=None, cache_update_index=None):
        """Attention of ``query`` over a head-major key/value cache.

        Eq. (1) for incremental decoding (inference: no dropout) over
        keys/values projected once (``key_value_heads``).

        Args:
            query: float ``(batch, T_q, d_query)``, the new positions.
            cache: ``(keys, values)``, each float ``(batch, num_heads, S,
                key_dim)``.
            new_key_value: optional float ``(batch, T_q, d)`` whose
                keys/values are appended to ``cache`` before attending
                (self-attention; no causal mask for ``T_q == 1``). ``None``:
                ``cache`` is used as is (cross-attention).
            attention_mask: optional bool, broadcastable to ``(batch,
                num_heads, T_q, S')`` with ``S'`` the keys attended; True =
                may attend (e.g. a source padding mask ``(batch, 1, 1, S)``).
            cache_update_index: optional int (scalar tensor): ``cache`` has
                a fixed size S (static shapes, for XLA) holding positions
                ``0 .. cache_update_index - 1``; ``new_key_value``'s
                keys/values are written there instead of appended, and query
                i attends to positions ``<= cache_update_index + i`` only.

        Returns:
            ``(output, cache)``: float ``(batch, T_q, *output_shape)`` in
            ``query``'s dtype, and the cache attended (``T_q`` positions
            longer with ``new_key_value``; written in place with
            ``cache_update_index``).

        Raises:
            ValueError: ``value_dim != key_dim``, ``cache_update_index``
                without ``new_key_value``, or a host ``cache_update_index``
                outside ``[0, S - T_q]``.
            TypeError: a float or bool ``cache_update_index``.

        Example:

        >>> import numpy as np
        >>> mha = MultiHeadAttention(num_heads=2, key_dim=4)
        >>> x = np.random.default_rng(0).normal(size=(1, 3, 8)).astype("float32")
        >>> full = mha(x, x, use_causal_mask=True)
        >>> cache = mha.key_value_heads(x[:, :0])   # 0 positions
        >>> for t in range(3):   # one position at a time, same outputs
        ...     out, cache = mha.call_with_cache(x[:, t:t + 1], cache,
        ...                                      new_key_value=x[:, t:t + 1])
        ...     assert np.allclose(out[0, 0], full[0, t], atol=1e-5)
        >>> tuple(cache[0].shape)
        (1, 2, 3, 4)
        """
        if self.value_dim != self.key_dim:
            raise ValueError(
                "A key/value cache needs value_dim == key_dim, got "
                f"key_dim={self.key_dim}, value_dim={self.value_dim}")
        keys, values = cache
        if cache_update_index is not None and new_key_value is None:
            raise ValueError(
                "`cache_update_index` writes `new_key_value` into the cache, "
                f"got cache_update_index={cache_update_index} with "
                "new_key_value=None")
        v.host_index("cache_update_index", cache_update_index,
                     query.shape[-2], keys.shape[2], "the cache")
        if new_key_value is not None:
            q, new_keys, new_values = self._projections(
                query.dtype, query=query, key=new_key_value,
                value=new_key_value)
            new_keys, new_values = (ops.transpose(x, (0, 2, 1, 3))
                                    for x in (new_keys, new_values))
            if cache_update_index is None:
                keys = ops.concatenate([keys, new_keys], axis=2)
                values = ops.concatenate([values, new_values], axis=2)
            else:
                start = [0, 0, cache_update_index, 0]
                keys = ops.slice_update(keys, start, new_keys)
                values = ops.slice_update(values, start, new_values)
                written = self.causal_mask(ops.shape(query)[1],
                                           ops.shape(keys)[2],
                                           offset=cache_update_index)
                attention_mask = written if attention_mask is None else \
                    ops.logical_and(ops.cast(attention_mask, "bool"), written)
        else:
            q, = self._projections(query.dtype, query=query)
        q = ops.transpose(
            q * ops.cast(self._inverse_sqrt_key_dim, q.dtype),
            (0, 2, 1, 3))  # (batch, h, T_q, d_k)
        scores = _cached_matmul(q, keys, transpose_y=True)
        probs = ops.cast(masked_softmax(scores, attention_mask,
                                        written_out=True), query.dtype)
        out = ops.transpose(_cached_matmul(probs, values), (0, 2, 1, 3))
        return self._project_output(out, out.dtype), (keys, values)

    # -- files written before this layer was a subclass ---------------------
    def load_own_variables(self, store):
        """Reads a file of either layout.

        Up to commit 32da1ca this layer saved its weights as its own
        variables ``0 .. 7`` (query, key, value, output kernel, each followed
        by its bias when ``use_bias``); Keras' keeps them in its
        ``EinsumDense`` sub-layers. An old file's variables are read into
        the sub-layers, which then skip their own (empty) load once.
        """
        if not len(store.keys()):
            return super().load_own_variables(store)
        dense = [self._query_dense, self._key_dense, self._value_dense,
                 self._output_dense]
        variables = [w for d in dense for w in (d.kernel, d.bias)
                     if w is not None]
        if len(store.keys()) != len(variables):
            raise ValueError(
                f"Layer '{self.name}' expected {len(variables)} variables "
                f"in a file written before it was a subclass of Keras' "
                f"MultiHeadAttention, but received {len(store.keys())}")
        for i, w in enumerate(variables):
            w.assign(store[str(i)])
        for d in dense:
            d.load_own_variables = _skip_load_once(d)


def _skip_load_once(layer):
    """An instance ``load_own_variables`` that does nothing, once."""
    def load_own_variables(store):
        del layer.load_own_variables  # back to the class's method
    return load_own_variables
