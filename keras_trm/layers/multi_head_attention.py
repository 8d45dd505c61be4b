"""Multi-head scaled dot-product attention (Vaswani et al. 2017, §3.2)."""

import itertools
import math
import numbers

import keras
from keras import ops

from keras_trm.utils import checks as v
from keras_trm.layers._initializers import clone_initializer

# Offsets given to ``clone_initializer``: every weight its own initializer, so
# W_Q, W_K, W_V differ even when one unseeded instance is passed in, and a
# seeded one still gives reproducible, distinct weights.
_KERNEL_OFFSETS = {"query": 0, "key": 1, "value": 2, "output": 3}
_BIAS_OFFSETS = {"query": 4, "key": 5, "value": 6, "output": 7}
# Letters for the leading (batch-like) axes of the attention einsums; they
# avoid q, k, h and d, the query, key, head and channel axes.
_BATCH_LETTERS = "abcefgijlm"
# The shortest keys that go through the fused op, by backend (others: 0).
# On one H200 (bench/results/gpu_attention_lengths_NVIDIA_H200.json, both
# backends in one call) JAX's einsums trained transformer_base 1.10x faster
# than cuDNN at the paper's 32-token batches, and one attention layer's step
# through cuDNN was no faster below 512 keys; PyTorch's SDPA beat the
# einsums at every length from 16 to 1024 (1.2x-1.9x).
FUSED_MIN_KEY_LENGTH = {"jax": 512}


# -- the cached step's kernels ---------------------------------------------
# The cached step (``call_with_cache``) attends one query per row over a
# cache whose length changes every step. On CPU, TensorFlow rewrites
# ``BatchMatMulV2`` and ``Softmax`` to oneDNN kernels that cost more than
# Eigen's at these shapes: the query x transposed-keys matmul 1.5-3x, and a
# softmax whose shape is new at every step re-creates its oneDNN primitive.
# ``BatchMatMulV3`` is not rewritten, so float32 uses it (other dtypes keep
# oneDNN, which has native bfloat16), and the softmax is written out; same
# ids, greedy 1.3x and beam 4 1.12x faster on Multi30k val
# (``bench/bench_attention_kernels.py`` at 32da1ca,
# ``bench/results/attention_kernels.json``).


def _cached_matmul(x, y, transpose_y=False):
    """``x @ y`` (``yᵀ`` with ``transpose_y``) over the last two axes, as
    TensorFlow's ``BatchMatMulV3`` for float32 (see above), ``ops.matmul``
    otherwise."""
    if (keras.backend.backend() == "tensorflow"
            and keras.backend.standardize_dtype(x.dtype) == "float32"):
        import tensorflow as tf

        return tf.raw_ops.BatchMatMulV3(x=x, y=y, Tout=x.dtype,
                                        adj_y=transpose_y)
    return ops.matmul(x, ops.swapaxes(y, -1, -2) if transpose_y else y)


def _cached_softmax(scores):
    """Softmax over the last axis, written out: exp(s - max s) / Σ exp(...)
    (the same function as ``ops.softmax``; see above)."""
    e = ops.exp(scores - ops.max(scores, axis=-1, keepdims=True))
    return e / ops.sum(e, axis=-1, keepdims=True)


def _value_error(check, name, value, *args):
    """Runs a ``_validation`` check, raising ``ValueError`` for any bad value.

    ``keras.layers.MultiHeadAttention`` raises ``ValueError`` for wrong types
    as well as wrong values; this layer does the same, to be a drop-in.
    """
    try:
        return check(name, value, *args)
    except TypeError as err:
        raise ValueError(str(err)) from None


def _normalize_output_shape(output_shape):
    """``None``, an int or a sequence of ints -> ``None`` or an int tuple."""
    if output_shape is None:
        return None
    if isinstance(output_shape, numbers.Integral) and not isinstance(
        output_shape, bool
    ):
        output_shape = (output_shape,)
    if not isinstance(output_shape, (tuple, list)) or not output_shape:
        raise ValueError(
            "`output_shape` must be a positive int or a non-empty tuple/list "
            f"of positive ints, got output_shape={output_shape!r}"
        )
    for dim in output_shape:
        if (
            isinstance(dim, bool)
            or not isinstance(dim, numbers.Integral)
            or dim <= 0
        ):
            raise ValueError(
                "`output_shape` must be a positive int or a non-empty "
                "tuple/list of positive ints, got "
                f"output_shape={output_shape!r}"
            )
    return tuple(int(dim) for dim in output_shape)


def _normalize_attention_axes(attention_axes):
    """``None`` or one axis (int or 1-sequence) -> ``None`` or a 1-tuple."""
    if attention_axes is None:
        return None
    if isinstance(attention_axes, numbers.Integral) and not isinstance(
        attention_axes, bool
    ):
        attention_axes = (attention_axes,)
    if not isinstance(attention_axes, (tuple, list)) or not all(
        isinstance(a, numbers.Integral) and not isinstance(a, bool)
        for a in attention_axes
    ):
        raise ValueError(
            "`attention_axes` must be an int, list, or tuple, got "
            f"attention_axes={attention_axes!r}"
        )
    if len(attention_axes) != 1:
        raise ValueError(
            "Attention over several axes is not supported: `attention_axes` "
            "must be None or the sequence axis (the query's second-to-last "
            f"axis, -2), got attention_axes={attention_axes!r}"
        )
    return (int(attention_axes[0]),)


def _shapes_compatible(a, b):
    """Static shapes equal where both dimensions are known."""
    return len(a) == len(b) and all(
        x is None or y is None or x == y for x, y in zip(a, b)
    )


@keras.saving.register_keras_serializable(package="keras_trm")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention with padding/causal masks and a key/value cache.

    Implements Eq. (1) and the multi-head projection of Vaswani et al. (2017),
    §3.2.1-3.2.2:

        Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V
        MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

    The constructor, the call signature, the exceptions and the weight layout
    (query, key, value, output kernels of shapes ``(d_query, h, key_dim)``,
    ``(d_key, h, key_dim)``, ``(d_value, h, value_dim)``,
    ``(h, value_dim, *output_shape)``, each followed by its bias) match
    ``keras.layers.MultiHeadAttention``, so weights transfer with
    ``set_weights(other.get_weights())`` and the layer is a drop-in
    replacement. Under JAX and PyTorch, as in Keras' layer, Eq. (1) goes
    through ``keras.ops.dot_product_attention`` (cuDNN / flash attention,
    SDPA on GPUs) when no scores are returned and no attention dropout
    applies, except under JAX for keys shorter than 512, where XLA's
    einsums trained 1.10x faster on an H200 (``fused_min_key_length``);
    TensorFlow, which has no fused kernel behind that op, keeps the
    einsums. Each weight gets its own clone of its initializer (a seeded
    initializer gets ``seed + i`` for the i-th weight), so no two projections
    start equal.

    Not supported (each raises ``ValueError`` naming the argument):
    attention over several axes or over an axis other than the sequence axis
    (``attention_axes`` other than ``None``/the query's second-to-last axis,
    and ``attention_axes=None`` on inputs of rank > 3, which Keras reads as
    attention over all inner axes), ``use_gate=True``,
    ``sliding_window``, ``flash_attention=True``, and ``dropout=1``.

    Args:
        num_heads: int > 0, the number of heads h.
        key_dim: int > 0, size of each query/key head d_k.
        value_dim: int > 0, size of each value head d_v (default ``key_dim``).
        dropout: float in [0, 1), dropout on the attention probabilities.
        use_bias: bool, whether the projections have biases.
        output_shape: positive int or tuple/list of positive ints, the
            output's shape after the batch and sequence axes (default: the
            query's last dimension). A tuple gives an output kernel
            ``(h, value_dim, *output_shape)``.
        attention_axes: ``None`` or the sequence axis (``-2``, or the query's
            rank minus 2; an int or a 1-tuple/list); declined otherwise.
        sliding_window: must be ``None`` (declined).
        flash_attention: ``None`` or ``False`` (``True`` is declined).
        kernel_initializer, bias_initializer: initializers of the projections.
        kernel_regularizer, bias_regularizer: regularizers of the projection
            kernels/biases; their penalties are in ``layer.losses``.
        activity_regularizer: regularizer applied, as in Keras, to the
            outputs of the four projections (each penalty divided by the
            batch size); the penalties are in ``layer.losses``.
        kernel_constraint, bias_constraint: constraints the optimizer
            applies to the kernels/biases after each update.
        use_gate: must be ``False`` (declined).
        seed: optional int, seed of the attention dropout.

    Call arguments:
        query: float tensor ``(batch, T_q, d_query)`` (or ``(batch, ...,
            T_q, d_query)``: the inner axes are batch axes).
        value: float tensor ``(batch, T_k, d_value)``.
        key: optional float tensor ``(batch, T_k, d_key)``; default ``value``.
            All dimensions but the last must match ``value``'s.
        query_mask, value_mask, key_mask: optional bool ``(batch, T_q)`` /
            ``(batch, T_k)`` padding masks; default: the Keras masks
            (``_keras_mask``) of ``query``/``value``/``key``.
        attention_mask: optional bool/int tensor ``(batch, T_q, T_k)``
            (or broadcastable to it); 1/True = may attend, 0/False = masked.
            Combined (AND) with the padding masks, as in Keras.
        use_causal_mask: bool, forbid attending to later positions
            (query i sees keys j <= i; with a cache, j <= index + i).
        training: bool, enables attention dropout.
        return_attention_scores: bool, also return the probabilities
            ``(batch, num_heads, T_q, T_k)`` (before dropout). Works on
            symbolic inputs, e.g. in a functional model.
        cache: optional float tensor ``(batch, 2, S, num_heads, key_dim)``
            holding projected keys ([:, 0]) and values ([:, 1]) of S
            positions, for incremental decoding (rank-3 inputs only). Its
            shape never changes, so the decoding loop compiles with XLA.
        cache_update_index: int scalar (may be a tensor). If given, the keys
            and values projected from this call's ``key``/``value`` are
            written into ``cache`` at ``[cache_update_index,
            cache_update_index + T_q)`` and queries attend to cache positions
            ``<= cache_update_index + i``. If ``None`` while ``cache`` is
            given, the cache is used as is (cross-attention over a
            pre-computed encoder memory) and ``key``/``value`` are ignored.

    Returns:
        ``(batch, T_q, *output_shape)`` in the layer's compute dtype, carrying
        the query's Keras mask; with ``return_attention_scores`` a tuple
        ``(output, scores)``; with a ``cache`` a tuple ``(output, cache)``
        (scores, if asked, come third).

    Raises:
        ValueError: ``num_heads``/``key_dim``/``value_dim`` not positive
            integers, ``dropout`` outside [0, 1), an ``output_shape`` that is
            not a positive int or tuple of them, a declined argument (above),
            a ``key`` whose shape differs from ``value``'s except in the last
            dimension, inputs of rank < 3, batch sizes that differ between
            ``query``, ``value``, ``key`` and ``cache``, a cache whose shape
            does not match ``(batch, 2, S, num_heads, key_dim)``, or a host
            ``cache_update_index`` outside ``[0, S - T_q]``.
        TypeError: a float or bool ``cache_update_index``.

    Example:

    >>> import numpy as np
    >>> mha = MultiHeadAttention(num_heads=2, key_dim=4, output_shape=(3,))
    >>> q = np.zeros((1, 5, 8), "float32")
    >>> v = np.zeros((1, 7, 6), "float32")
    >>> out, scores = mha(q, v, return_attention_scores=True)
    >>> tuple(out.shape), tuple(scores.shape)
    ((1, 5, 3), (1, 2, 5, 7))
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
        sliding_window=None,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        use_gate=False,
        seed=None,
        **kwargs,
    ):
        self.num_heads = _value_error(v.positive_int, "num_heads", num_heads)
        self.key_dim = _value_error(v.positive_int, "key_dim", key_dim)
        self.value_dim = _value_error(
            v.positive_int, "value_dim", key_dim if value_dim is None
            else value_dim,
        )
        self.dropout = _value_error(v.rate, "dropout", dropout)
        self._output_shape = _normalize_output_shape(output_shape)
        self.attention_axes = _normalize_attention_axes(attention_axes)
        if sliding_window is not None:
            raise ValueError(
                "`sliding_window` is not supported by "
                "keras_trm.layers.MultiHeadAttention, got "
                f"sliding_window={sliding_window!r}"
            )
        if flash_attention:
            raise ValueError(
                "`flash_attention=True` is not supported by "
                "keras_trm.layers.MultiHeadAttention, got "
                f"flash_attention={flash_attention!r}"
            )
        if use_gate:
            raise ValueError(
                "`use_gate=True` (gated attention) is not supported by "
                "keras_trm.layers.MultiHeadAttention, got "
                f"use_gate={use_gate!r}"
            )
        if seed is not None:
            seed = _value_error(v.non_negative_int, "seed", seed)
        super().__init__(**kwargs)
        self.supports_masking = True
        self.use_bias = bool(use_bias)
        self.flash_attention = flash_attention
        self.seed = seed
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        # Not the base Layer's `activity_regularizer`: that one would also
        # penalise the scores and the cache. Keras applies it to the outputs
        # of the four projections (its EinsumDense sub-layers), as done here.
        self._activity_regularizer = keras.regularizers.get(
            activity_regularizer
        )
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self._dropout_layer = keras.layers.Dropout(
            self.dropout, seed=seed, dtype=self.dtype_policy
        )

    # -- shapes ------------------------------------------------------------
    @staticmethod
    def _check_key_value_shapes(value_shape, key_shape):
        """Keras' check: key and value equal except in the last dimension."""
        value_shape, key_shape = tuple(value_shape), tuple(key_shape)
        if not _shapes_compatible(value_shape[1:-1], key_shape[1:-1]):
            raise ValueError(
                "All dimensions of `value` and `key`, except the last one, "
                f"must be equal. Received: value_shape={value_shape} and "
                f"key_shape={key_shape}"
            )

    def _check_ranks(self, query_shape, value_shape):
        rank = len(query_shape)
        if rank < 3 or len(value_shape) != rank:
            raise ValueError(
                "`query` and `value` must have the same rank, at least 3 "
                "(batch, sequence, features), got "
                f"query_shape={tuple(query_shape)} and "
                f"value_shape={tuple(value_shape)}"
            )
        if self.attention_axes is None:
            if rank > 3:
                raise ValueError(
                    "`attention_axes=None` on inputs of rank > 3 means "
                    "attention over all inner axes, which is not supported; "
                    "pass attention_axes=-2 to attend over the sequence axis "
                    "only. Got attention_axes=None and "
                    f"query_shape={tuple(query_shape)}"
                )
            return
        axis = self.attention_axes[0]
        # Keras resolves a negative axis a to rank + a.
        if (axis + rank if axis < 0 else axis) != rank - 2:
            raise ValueError(
                "Only attention over the sequence axis (the query's "
                f"second-to-last axis, {rank - 2} or -2) is supported, got "
                f"attention_axes={self.attention_axes} for "
                f"query_shape={tuple(query_shape)}"
            )

    def build(
        self, query_shape, value_shape=None, key_shape=None, **unused_kwargs
    ):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        self._check_key_value_shapes(value_shape, key_shape)
        self._check_ranks(query_shape, value_shape)
        d_query = query_shape[-1]
        out_shape = self._output_shape or (d_query,)
        h = self.num_heads

        def weights(name, kernel_shape, bias_shape):
            kernel = self.add_weight(
                name=f"{name}_kernel",
                shape=kernel_shape,
                initializer=clone_initializer(
                    self.kernel_initializer, _KERNEL_OFFSETS[name]
                ),
                regularizer=self.kernel_regularizer,
                constraint=self.kernel_constraint,
            )
            bias = None
            if self.use_bias:
                bias = self.add_weight(
                    name=f"{name}_bias",
                    shape=bias_shape,
                    initializer=clone_initializer(
                        self.bias_initializer, _BIAS_OFFSETS[name]
                    ),
                    regularizer=self.bias_regularizer,
                    constraint=self.bias_constraint,
                )
            return kernel, bias

        dk, dv = self.key_dim, self.value_dim
        self.query_kernel, self.query_bias = weights(
            "query", (d_query, h, dk), (h, dk)
        )
        self.key_kernel, self.key_bias = weights(
            "key", (key_shape[-1], h, dk), (h, dk)
        )
        self.value_kernel, self.value_bias = weights(
            "value", (value_shape[-1], h, dv), (h, dv)
        )
        self.output_kernel, self.output_bias = weights(
            "output", (h, dv) + tuple(out_shape), tuple(out_shape)
        )
        self.built = True

    # -- projections -------------------------------------------------------
    @staticmethod
    def _project(x, kernel, bias):
        """(B, ..., T, d) x (d, h, k) -> (B, ..., T, h, k) as one matmul."""
        d, h, k = kernel.shape
        y = ops.matmul(x, ops.reshape(kernel, (d, h * k)))
        y = ops.reshape(y, tuple(ops.shape(x)[:-1]) + (h, k))
        if bias is not None:
            y = y + bias
        return y

    # True: query, key and value that are one tensor (self-attention; the
    # keys and values of cross-attention) go through one matmul against
    # their kernels side by side (the input read once; in training its
    # gradient one matmul, not a sum of two or three). Off by default: the
    # transformer_small training step measured 0.94x (TensorFlow) and 0.92x
    # (JAX) on CPU in mixed bfloat16, same run
    # (``bench/results/train_step_fused_projections_ab_*.json``); a lever
    # for GPUs (``bench/gpu_train.py --fuse-projections``), where XLA may
    # leave dots this large unmerged. Same function either way.
    fuse_projections = False

    def _projections(self, dtype=None, **inputs):
        """``query=``, ``key=``, ``value=`` tensors -> their projections
        ``(B, ..., T, h, k)``, in the order given; inputs that are the same
        tensor share one matmul. ``dtype``: cast the weights to it (the
        methods that run outside ``__call__``)."""
        # No for/else here: AutoGraph (the exports' tf.functions) cannot
        # convert it, runs the method as is and keeps the error, whose
        # traceback held the training job's fit() frame and its dataset.
        groups = []  # (tensor, names), in the order first seen
        for name, x in inputs.items():
            same = [names for group_x, names in groups if group_x is x]
            if same:
                same[0].append(name)
            else:
                groups.append((x, [name]))
        out = {}
        for x, names in groups:
            kernels = [getattr(self, f"{n}_kernel") for n in names]
            biases = [getattr(self, f"{n}_bias") for n in names]
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

    @staticmethod
    def _project_output(heads, kernel, bias):
        """W^O: (B, ..., T, h, d_v) x (h, d_v, *output_shape) as one matmul."""
        h, dv = kernel.shape[:2]
        out_shape = tuple(kernel.shape[2:])
        lead = tuple(ops.shape(heads)[:-2])
        out = ops.matmul(ops.reshape(heads, lead + (h * dv,)),
                         ops.reshape(kernel, (h * dv, math.prod(out_shape))))
        if len(out_shape) > 1:
            out = ops.reshape(out, lead + out_shape)
        if bias is not None:
            out = out + bias
        return out

    def project_key_value(self, key, value):
        """Projects an attended sequence once, for a cross-attention cache.

        Args:
            key, value: ``(batch, S, d)`` float tensors.

        Returns:
            ``(batch, 2, S, num_heads, key_dim)``: keys and values stacked.

        Raises:
            ValueError: ``value_dim != key_dim``.
        """
        self._check_cacheable()
        k, val = self._projections(key=key, value=value)
        return ops.stack([k, val], axis=1)

    # -- incremental decoding on head-major caches -------------------------
    # The layer's cached step for autoregressive decoding (what the searches
    # and the exports use). Keys and values are kept head-major, each
    # ``(batch, num_heads, S, key_dim)``, so one step's attention is two
    # batched matmuls with no transpose or slice of the cache, and a
    # self-attention cache grows by one position per step (nothing unwritten
    # to copy, reorder or mask). These methods run outside ``__call__``, so
    # they cast the float32 variables of a mixed policy to the inputs' dtype
    # themselves. Eq. (1) and the weights are those of ``call``.

    def key_value_heads(self, key, value=None):
        """Projects an attended sequence into a head-major cache.

        Args:
            key: float ``(batch, S, d_key)``.
            value: float ``(batch, S, d_value)``; default ``key``.

        Returns:
            ``(keys, values)``, each ``(batch, num_heads, S, key_dim)`` in
            ``key``'s dtype: a cross-attention cache (computed once per
            source sentence), or one step's entries of a self-attention
            cache.

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

        Eq. (1) of Vaswani et al. (2017) for incremental decoding: the
        cached keys/values were projected once (``key_value_heads``).
        Dropout is off (inference).

        Args:
            query: float ``(batch, T_q, d_query)``, the new positions.
            cache: ``(keys, values)``, each float ``(batch, num_heads, S,
                key_dim)``.
            new_key_value: optional float ``(batch, T_q, d)``: the sequence
                whose keys/values are appended to ``cache`` before attending
                (self-attention over the positions decoded so far plus these;
                the caller decodes left to right, so no causal mask is
                needed for ``T_q == 1``). ``None``: ``cache`` is used as is
                (cross-attention over the encoder output).
            attention_mask: optional bool, broadcastable to ``(batch,
                num_heads, T_q, S')`` with ``S'`` the keys attended; True =
                may attend (e.g. the source padding mask as ``(batch, 1, 1,
                S)``).
            cache_update_index: optional int (scalar tensor): ``cache`` has
                a fixed size S (static shapes, for XLA) and holds positions
                ``0 .. cache_update_index - 1``; ``new_key_value``'s
                keys/values are written at ``cache_update_index`` instead of
                appended, and query i attends to positions
                ``<= cache_update_index + i`` only (the rest is unwritten).

        Returns:
            ``(output, cache)``: float ``(batch, T_q, *output_shape)`` in
            ``query``'s dtype, and the cache attended (with ``T_q`` more
            positions when ``new_key_value`` is given; of the same size S,
            written at ``cache_update_index``, when that is given).

        Raises:
            ValueError: ``value_dim != key_dim`` (a cache holds both with
                one head size), ``cache_update_index`` without
                ``new_key_value``, or a host ``cache_update_index`` outside
                ``[0, S - T_q]``.
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
        self._check_cacheable()
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
            new_keys = ops.transpose(new_keys, (0, 2, 1, 3))
            new_values = ops.transpose(new_values, (0, 2, 1, 3))
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
        q = ops.transpose(q * ops.cast(1.0 / math.sqrt(self.key_dim), q.dtype),
                          (0, 2, 1, 3))  # (batch, h, T_q, d_k)
        scores = ops.cast(_cached_matmul(q, keys, transpose_y=True),
                          "float32")
        if attention_mask is not None:
            scores = ops.where(ops.cast(attention_mask, "bool"), scores,
                               ops.cast(-1e9, "float32"))
        probs = ops.cast(_cached_softmax(scores), query.dtype)
        out = ops.transpose(_cached_matmul(probs, values), (0, 2, 1, 3))
        bias = self.output_bias
        out = self._project_output(
            out, ops.cast(self.output_kernel, out.dtype),
            None if bias is None else ops.cast(bias, out.dtype))
        return out, (keys, values)

    def _add_activity_losses(self, *tensors):
        if self._activity_regularizer is None:
            return
        for x in tensors:
            loss = self._activity_regularizer(x)
            batch = ops.cast(ops.shape(x)[0], loss.dtype)
            self.add_loss(ops.divide_no_nan(loss, batch))

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

        # (..., T_q) -> (..., T_q, 1); (..., T_k) -> (..., 1, T_k).
        def _bool(x, axis):
            return ops.expand_dims(ops.cast(x, "bool"), axis)

        v.mask_shape("query_mask", query_mask, query.shape[:-1])
        v.mask_shape("value_mask", value_mask, value.shape[:-1])
        v.mask_shape("key_mask", key_mask, key.shape[:-1])
        if use_kv_masks:
            v.attention_mask_shape(attention_mask, query.shape[-2], key.shape[-2])
        if query_mask is not None:
            mask = _and(mask, _bool(query_mask, -1))
        if value_mask is not None:
            mask = _and(mask, _bool(value_mask, -2))
        if key_mask is not None:
            mask = _and(mask, _bool(key_mask, -2))
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
    # Keys at least this long (static length; unknown counts as long) go
    # through the fused op, shorter ones through the einsums; None: the
    # backend's FUSED_MIN_KEY_LENGTH. Benches set it on an instance.
    fused_min_key_length = None

    def _fused_applies(self, q, k, training, return_scores):
        """Whether Eq. (1) goes through ``keras.ops.dot_product_attention``
        (cuDNN / flash attention under JAX on a GPU, PyTorch's SDPA): one
        batch axis, no probabilities returned, no attention dropout to
        apply (rate 0, the paper's setting, or not training), keys at
        least ``fused_min_key_length`` long (under JAX 512: below that
        XLA's einsums were as fast or faster on an H200, see
        ``FUSED_MIN_KEY_LENGTH``), and not TensorFlow. TensorFlow has no
        fused kernel behind that op (Keras builds the same einsums, plus a
        mask the size of the scores): the
        transformer_small training step measured 0.92x in float32 on CPU
        (same losses; ``bench/results/train_step_fused_attention_ab_*.json``),
        and this path keeps the exports' graphs as they were."""
        shortest = self.fused_min_key_length
        if shortest is None:
            shortest = FUSED_MIN_KEY_LENGTH.get(keras.backend.backend(), 0)
        key_length = k.shape[-3]  # None or symbolic while tracing: long
        return (len(q.shape) == 4 and not return_scores
                and (self.dropout == 0 or not training)
                and (not isinstance(key_length, int) or key_length >= shortest)
                and keras.backend.backend() != "tensorflow")

    def _attend(self, q, k, val, mask, training, is_causal=False,
                return_scores=False):
        """Eq. (1) on (B, ..., T, h, d) tensors; returns ``(output,
        probabilities or None)``.

        The mask is broadcast to the scores ``(B, ..., h, T_q, T_k)`` by
        inserting axes before its last two (the head axis first), as Keras.
        ``is_causal`` adds the causal mask. Where ``_fused_applies``, the
        backend's fused attention computes it (same function: float32
        scores and softmax, a fully masked row uniform) and no
        probabilities are returned. The causal mask goes in as part of the
        mask, not as the fused op's ``is_causal``: TensorFlow's builds it
        with a bool strided slice, which LiteRT has no builtin kernel for.
        """
        if mask is not None:
            mask = ops.cast(mask, "bool")
        if is_causal:
            causal = self.causal_mask(ops.shape(q)[-3], ops.shape(k)[-3])
            mask = causal if mask is None else ops.logical_and(mask, causal)
        if mask is not None:
            # expand_dims, not [:, None]: a bool strided slice has no
            # builtin LiteRT kernel (it would need the Flex delegate).
            while len(mask.shape) < len(q.shape):
                mask = ops.expand_dims(mask, -3)
        if self._fused_applies(q, k, training, return_scores):
            if mask is not None:
                # The mask's query axis at full length: cuDNN's fused
                # attention (JAX on a GPU) takes the mask as a bias of
                # shape (B or 1, h or 1, T_q, T_k) and rejects a key-only
                # (..., 1, T_k) mask, so Keras fell back to XLA's
                # attention for every cross-attention.
                mask = ops.broadcast_to(mask, tuple(mask.shape[:-2]) + (
                    ops.shape(q)[-3], ops.shape(k)[-3]))
            out = ops.dot_product_attention(
                q, k, val, mask=mask, scale=1.0 / math.sqrt(self.key_dim))
            return out, None
        batch = _BATCH_LETTERS[: len(q.shape) - 3]
        scale = 1.0 / math.sqrt(self.key_dim)
        scores = ops.einsum(
            f"{batch}qhd,{batch}khd->{batch}hqk",
            q * ops.cast(scale, q.dtype), k,
        )
        scores = ops.cast(scores, "float32")
        if mask is not None:
            # A large finite negative keeps fully masked rows finite (uniform)
            # instead of NaN; such rows only occur at padded queries.
            scores = ops.where(mask, scores, ops.cast(-1e9, "float32"))
        probs = ops.softmax(scores, axis=-1)
        probs = ops.cast(probs, self.compute_dtype)
        dropped = self._dropout_layer(probs, training=training)
        out = ops.einsum(f"{batch}hqk,{batch}khd->{batch}qhd", dropped, val)
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
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
    ):
        self._check_ranks(query.shape, value.shape)
        if key is None:
            key = value
        elif cache is None or cache_update_index is not None:
            self._check_key_value_shapes(value.shape, key.shape)
        v.same_batch(query=query, value=value, key=key, cache=cache)
        # With a cache the keys are the S cached positions, not T_k: masks of
        # the new key/value rows do not apply (pass `attention_mask` instead).
        mask = self._merge_masks(
            query, value, key, attention_mask, query_mask, value_mask,
            key_mask, use_kv_masks=cache is None,
        )
        q_len = ops.shape(query)[-2]
        if cache is not None:
            self._check_cacheable()
            self._check_cache(cache, query)
            v.host_index("cache_update_index", cache_update_index,
                         query.shape[-2], cache.shape[2], "the cache")
        if cache is not None and cache_update_index is None:
            # Cross-attention over pre-projected keys/values.
            q, = self._projections(query=query)
            self._add_activity_losses(q)
        else:
            q, k, val = self._projections(query=query, key=key, value=value)
            self._add_activity_losses(q, k, val)

        if cache is not None:
            if cache_update_index is None:
                k, val = cache[:, 0], cache[:, 1]
            else:
                new_kv = ops.stack([k, val], axis=1)
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

        out, probs = self._attend(q, k, val, mask, training,
                                  is_causal=use_causal_mask,
                                  return_scores=return_attention_scores)
        out = self._project_output(out, self.output_kernel, self.output_bias)
        self._add_activity_losses(out)

        result = (out,)
        if cache is not None:
            result += (cache,)
        if return_attention_scores:
            result += (probs,)
        return result[0] if len(result) == 1 else result

    def _check_cacheable(self):
        if self.value_dim != self.key_dim:
            raise ValueError(
                "A key/value cache needs value_dim == key_dim, got "
                f"key_dim={self.key_dim}, value_dim={self.value_dim}"
            )

    def _check_cache(self, cache, query):
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
        if len(query.shape) != 3:
            raise ValueError(
                "A `cache` needs rank-3 inputs (batch, T, d), got "
                f"query.shape={tuple(query.shape)}"
            )

    def compute_mask(self, query, value, key=None, **kwargs):
        return getattr(query, "_keras_mask", None)

    def compute_output_shape(self, query_shape, value_shape=None,
                             key_shape=None):
        query_shape = tuple(query_shape)
        if value_shape is not None:
            value_shape = tuple(value_shape)
        else:
            value_shape = query_shape
        if key_shape is not None:
            self._check_key_value_shapes(value_shape, key_shape)
        return query_shape[:-1] + (self._output_shape or query_shape[-1:])

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
    ):
        """Symbolic outputs: ``output`` [, ``cache``] [, ``scores``]."""
        key_shape = None
        uses_key = cache is None or cache_update_index is not None
        if key is not None and uses_key:
            key_shape = key.shape
        out = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape, key_shape),
            dtype=self.compute_dtype,
        )
        result = (out,)
        if cache is not None:
            result += (keras.KerasTensor(cache.shape, dtype=cache.dtype),)
            k_len = cache.shape[2]
        else:
            k_len = (value if key is None else key).shape[-2]
        if return_attention_scores:
            q_shape = tuple(query.shape)
            result += (keras.KerasTensor(
                q_shape[:-2] + (self.num_heads, q_shape[-2], k_len),
                dtype=self.compute_dtype,
            ),)
        return result[0] if len(result) == 1 else result

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            dropout=self.dropout,
            use_bias=self.use_bias,
            output_shape=self._output_shape,
            attention_axes=self.attention_axes,
            sliding_window=None,
            flash_attention=self.flash_attention,
            kernel_initializer=keras.initializers.serialize(
                self.kernel_initializer
            ),
            bias_initializer=keras.initializers.serialize(
                self.bias_initializer
            ),
            kernel_regularizer=keras.regularizers.serialize(
                self.kernel_regularizer
            ),
            bias_regularizer=keras.regularizers.serialize(
                self.bias_regularizer
            ),
            activity_regularizer=keras.regularizers.serialize(
                self._activity_regularizer
            ),
            kernel_constraint=keras.constraints.serialize(
                self.kernel_constraint
            ),
            bias_constraint=keras.constraints.serialize(self.bias_constraint),
            use_gate=False,
            seed=self.seed,
        )
        return config
