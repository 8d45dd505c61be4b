"""MultiHeadAttention: Eq. (1) numerics, Keras parity, masks, cache."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_allclose, assert_array_equal, to_np
from keras_trm.layers import MultiHeadAttention

pytestmark = pytest.mark.portable  # CI runs it under each backend


def numpy_mha(layer, q_in, kv_in, mask=None):
    """Eq. (1) and the multi-head projection of §3.2.2, in NumPy."""
    wq, bq, wk, bk, wv, bv, wo, bo = [to_np(w) for w in layer.get_weights()]
    q = np.einsum("btd,dnh->btnh", q_in, wq) + bq
    k = np.einsum("btd,dnh->btnh", kv_in, wk) + bk
    v = np.einsum("btd,dnh->btnh", kv_in, wv) + bv
    scores = np.einsum("bqnh,bknh->bnqk", q, k) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask[:, None], scores, -1e9)
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    heads = np.einsum("bnqk,bknh->bqnh", p, v)
    return np.einsum("bqnh,nhd->bqd", heads, wo) + bo, p


@pytest.fixture
def layer_and_inputs(rng):
    layer = MultiHeadAttention(num_heads=4, key_dim=6)
    q = rng.normal(size=(2, 5, 12)).astype("float32")
    kv = rng.normal(size=(2, 7, 12)).astype("float32")
    layer(q, kv)
    # Non-zero biases so that they are checked too.
    layer.set_weights([w + rng.normal(size=w.shape).astype("float32") * 0.1
                       for w in layer.get_weights()])
    return layer, q, kv


def test_matches_numpy_eq1(layer_and_inputs, rng):
    layer, q, kv = layer_and_inputs
    mask = rng.random((2, 5, 7)) > 0.3
    mask[:, :, 0] = True
    out, probs = layer(q, kv, attention_mask=mask, return_attention_scores=True)
    ref_out, ref_p = numpy_mha(layer, q, kv, mask)
    assert_allclose(out, ref_out, atol=1e-5)
    assert_allclose(probs, ref_p, atol=1e-6)
    # Masked keys get exactly zero probability.
    assert np.all(to_np(probs)[np.broadcast_to(~mask[:, None], probs.shape)] == 0)


def test_matches_keras_multi_head_attention(layer_and_inputs, rng):
    layer, q, kv = layer_and_inputs
    ref = keras.layers.MultiHeadAttention(num_heads=4, key_dim=6)
    ref(q, kv)
    ref.set_weights(layer.get_weights())
    mask = rng.random((2, 5, 7)) > 0.2
    mask[:, :, 0] = True
    for kwargs in ({}, {"attention_mask": mask}):
        assert_allclose(layer(q, kv, **kwargs), ref(q, kv, **kwargs),
                                   atol=1e-5)
    x = q
    assert_allclose(layer(x, x, use_causal_mask=True),
                               ref(x, x, use_causal_mask=True), atol=1e-5)


def test_causal_mask_hides_the_future(rng):
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = rng.normal(size=(1, 6, 8)).astype("float32")
    out = to_np(layer(x, x, use_causal_mask=True))
    x2 = x.copy()
    x2[:, 4:] = rng.normal(size=(1, 2, 8))  # change positions 4 and 5
    out2 = to_np(layer(x2, x2, use_causal_mask=True))
    assert_allclose(out[:, :4], out2[:, :4], atol=1e-6)
    assert not np.allclose(out[:, 4:], out2[:, 4:])


def test_padding_mask_from_keras_masking(rng):
    """Values at padded key positions cannot change the output."""
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    q = rng.normal(size=(2, 3, 8)).astype("float32")
    kv = rng.normal(size=(2, 5, 8)).astype("float32")
    value_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], bool)
    out = layer(q, kv, value_mask=value_mask)
    kv2 = kv.copy()
    kv2[0, 3:] = 100.0
    kv2[1, 4:] = -100.0
    assert_allclose(out, layer(q, kv2, value_mask=value_mask), atol=1e-5)
    # Keras masking (a `_keras_mask` on the tensor) is honoured the same way.
    masked = keras.layers.Masking(mask_value=0.0)
    kv3 = kv.copy()
    kv3[~value_mask] = 0.0
    kv3_masked = masked(tf.constant(kv3))
    assert_allclose(layer(q, kv3_masked), out, atol=1e-5)


def test_head_major_cache_matches_numpy_and_masks(layer_and_inputs, rng):
    """``call_with_cache``: self-attention one position at a time equals
    Eq. (1) with a causal mask in NumPy; cross-attention over the
    pre-projected keys/values equals Eq. (1) with the padding mask, and a
    padded key gets no weight (changing it changes nothing)."""
    layer, q, kv = layer_and_inputs
    causal = np.tril(np.ones((5, 5), bool))[None].repeat(2, 0)
    expected, _ = numpy_mha(layer, q, q, causal)
    cache = layer.key_value_heads(q[:, :0])
    for t in range(5):
        out, cache = layer.call_with_cache(q[:, t:t + 1], cache,
                                           new_key_value=q[:, t:t + 1])
        assert_allclose(out[:, 0], expected[:, t], atol=1e-5)
    assert tuple(cache[0].shape) == tuple(cache[1].shape) == (2, 4, 5, 6)

    padding = np.ones((2, 7), bool)
    padding[1, 4:] = False
    expected, _ = numpy_mha(layer, q, kv, padding[:, None, :].repeat(5, 1))
    mask = padding[:, None, None, :]
    out, _ = layer.call_with_cache(q, layer.key_value_heads(kv),
                                   attention_mask=mask)
    assert_allclose(out, expected, atol=1e-5)
    changed = kv.copy()
    changed[1, 4:] = rng.normal(size=changed[1, 4:].shape)
    out2, _ = layer.call_with_cache(q, layer.key_value_heads(changed),
                                    attention_mask=mask)
    assert_allclose(out2, out, atol=1e-6)


def test_fixed_size_head_major_cache_matches_numpy(layer_and_inputs, rng):
    """``call_with_cache(..., cache_update_index=i)`` over a fixed-size
    cache: a chunk of two positions, then one at a time, equals Eq. (1)
    with a causal mask; positions not yet written get no weight (filling
    them with noise changes nothing) and stay as they were."""
    layer, q, _ = layer_and_inputs
    causal = np.tril(np.ones((5, 5), bool))[None].repeat(2, 0)
    expected, _ = numpy_mha(layer, q, q, causal)
    noise = rng.normal(size=(2, 4, 5, 6)).astype("float32")
    cache = (noise, noise + 1.0)  # unwritten positions: anything
    out, cache = layer.call_with_cache(q[:, :2], cache, new_key_value=q[:, :2],
                                       cache_update_index=0)
    assert_allclose(out, expected[:, :2], atol=1e-5)
    assert_array_equal(cache[0][:, :, 2:], noise[:, :, 2:])
    for t in range(2, 5):
        out, cache = layer.call_with_cache(q[:, t:t + 1], cache,
                                           new_key_value=q[:, t:t + 1],
                                           cache_update_index=t)
        assert_allclose(out[:, 0], expected[:, t], atol=1e-5)
    grown = layer.key_value_heads(q)
    assert_allclose(cache[0], grown[0], atol=1e-6)
    assert_allclose(cache[1], grown[1], atol=1e-6)
    with pytest.raises(ValueError, match="cache_update_index=3 with new_key_value=None"):
        layer.call_with_cache(q[:, :1], cache, cache_update_index=3)


@pytest.mark.tensorflow  # oneDNN's kernels in a TensorFlow graph
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cached_step_avoids_onednn_attention_kernels(dtype, rng):
    """In float32 the cached step's graph holds BatchMatMulV3 (Eigen's
    kernel) and no BatchMatMulV2 / Softmax, which TensorFlow rewrites to
    oneDNN kernels that are slower at one query per row
    (bench/bench_attention_kernels.py at 32da1ca); bfloat16 keeps oneDNN's matmul (native
    bfloat16). Both compute Eq. (1)."""
    layer = MultiHeadAttention(num_heads=2, key_dim=4, dtype=dtype)
    x = rng.normal(size=(3, 4, 8)).astype("float32")
    layer(x, x)
    xs = tf.cast(x, dtype)
    cache = layer.key_value_heads(xs[:, :3])
    step = tf.function(lambda q, k, v: layer.call_with_cache(
        q, (k, v), new_key_value=q))
    graph = step.get_concrete_function(xs[:, 3:], *cache).graph
    kinds = {op.type for op in graph.get_operations()}
    assert "Softmax" not in kinds
    if dtype == "float32":
        assert "BatchMatMulV3" in kinds
        assert not kinds & {"BatchMatMul", "BatchMatMulV2"}, kinds
    else:
        assert "BatchMatMulV3" not in kinds
    out, _ = step(xs[:, 3:], *cache)
    expected, _ = numpy_mha(layer, x, x, np.tril(np.ones((4, 4), bool))[None])
    assert_allclose(tf.cast(out[:, 0], "float32"), expected[:, 3],
                               atol=1e-5 if dtype == "float32" else 0.1)


@pytest.mark.tensorflow  # AutoGraph
@pytest.mark.parametrize("fuse", [False, True])
def test_autograph_converts_every_path(fuse, rng, caplog, monkeypatch):
    """Inside a tf.function (the exports, Keras' train step) AutoGraph
    converts the layer's methods. A construct it cannot convert (a for/else
    in _projections did) makes it run the method as is, log a warning and
    keep the error, whose traceback held the translation job's fit() frame
    and its training dataset after training (the job's memory)."""
    monkeypatch.setattr(MultiHeadAttention, "fuse_projections", fuse)
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = tf.constant(rng.normal(size=(2, 3, 8)).astype("float32"))
    layer(x, x)

    @tf.function
    def paths(x):
        cache = layer.key_value_heads(x[:, :1])
        step, _ = layer.call_with_cache(x[:, 1:2], cache, new_key_value=x[:, 1:2])
        cross, _ = layer.call_with_cache(x[:, 1:2], cache)
        fixed = (tf.zeros((2, 2, 3, 4)),) * 2
        written, _ = layer.call_with_cache(x[:, :1], fixed,
                                           new_key_value=x[:, :1],
                                           cache_update_index=0)
        return step, cross, written, layer(x, x), layer(x, x[:, :2])

    with caplog.at_level("WARNING", logger="tensorflow"):
        paths(x)
    assert not [r for r in caplog.records if "AutoGraph" in r.getMessage()]


def test_head_major_cache_needs_equal_head_sizes():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, value_dim=3)
    x = tf.zeros((1, 2, 8))
    layer(x, x)
    with pytest.raises(ValueError, match="value_dim=3"):
        layer.call_with_cache(x, (tf.zeros((1, 2, 0, 4)),) * 2, new_key_value=x)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_heads=0, key_dim=4), "num_heads"),
    (dict(num_heads=2, key_dim=-1), "key_dim"),
    (dict(num_heads=2, key_dim=4, value_dim=0), "value_dim"),
    (dict(num_heads=2, key_dim=4, dropout=1.0), "dropout"),
    (dict(num_heads=2.0, key_dim=4), "num_heads"),
    (dict(num_heads=2, key_dim="4"), "key_dim"),
])
def test_bad_arguments(kwargs, match):
    # ValueError for wrong types too, as keras.layers.MultiHeadAttention.
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


def test_round_trip(tmp_path, rng):
    q = keras.Input((None, 8))
    kv = keras.Input((None, 8))
    out = MultiHeadAttention(num_heads=2, key_dim=4, value_dim=3,
                             output_shape=5)(q, kv)
    model = keras.Model([q, kv], out)
    x = [rng.normal(size=(2, 3, 8)).astype("float32"),
         rng.normal(size=(2, 4, 8)).astype("float32")]
    model.save(tmp_path / "mha.keras")
    loaded = keras.models.load_model(tmp_path / "mha.keras")
    assert_array_equal(model(x), loaded(x))
    assert loaded.output_shape == (None, None, 5)


# -- every weight its own initializer ----------------------------------------

def _built(**kwargs):
    layer = MultiHeadAttention(num_heads=4, key_dim=16, **kwargs)
    x = np.zeros((1, 3, 64), "float32")
    layer(x, x)
    return layer


def _kernels(layer):
    return [to_np(d.kernel) for d in (layer.query_dense, layer.key_dense,
                                           layer.value_dense,
                                           layer.output_dense)]


def test_every_kernel_has_its_own_initial_values():
    kernels = _kernels(_built())
    pairs = [(a, b) for i, a in enumerate(kernels) for b in kernels[i + 1:]
             if a.shape == b.shape]
    assert len(pairs) == 3  # W_Q, W_K, W_V are all (64, 4, 16)
    for a, b in pairs:
        assert not np.array_equal(a, b)


def test_seeded_initializer_is_reproducible_unseeded_is_not():
    def seeded():
        return _built(
            kernel_initializer=keras.initializers.GlorotUniform(seed=3),
            bias_initializer=keras.initializers.RandomNormal(seed=3))

    a, b = seeded(), seeded()
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        assert_array_equal(wa, wb)
    # Distinct offsets: the seeded kernels and biases differ from each other.
    qk, kk, vk, _ = _kernels(a)
    assert not np.array_equal(qk, kk) and not np.array_equal(kk, vk)
    assert not np.array_equal(to_np(a.query_dense.bias),
                              to_np(a.key_dense.bias))
    init = keras.initializers.GlorotUniform()  # one unseeded instance, shared
    c = _built(kernel_initializer=init)
    d = _built(kernel_initializer=init)
    for kc, kd in zip(_kernels(c), _kernels(d)):
        assert not np.array_equal(kc, kd)


# -- drop-in for keras.layers.MultiHeadAttention ------------------------------

def _pair(rng, query, value, key=None, **kwargs):
    """This layer and Keras' with the same arguments and (random) weights."""
    ours = MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)
    ref = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)
    ours(query, value, key=key)
    ref(query, value, key=key)
    assert [w.shape for w in ours.weights] == [w.shape for w in ref.weights]
    ref.set_weights([rng.normal(size=w.shape).astype("float32") * 0.5
                     for w in ref.get_weights()])
    ours.set_weights(ref.get_weights())
    return ours, ref


def _inputs(rng, d_query=8, d_value=6, d_key=None, t_q=3, t_k=4):
    q = rng.normal(size=(2, t_q, d_query)).astype("float32")
    v = rng.normal(size=(2, t_k, d_value)).astype("float32")
    k = None if d_key is None else rng.normal(size=(2, t_k, d_key)).astype(
        "float32")
    return q, v, k


def test_return_attention_scores_in_functional_model(rng):
    q, v, _ = _inputs(rng)
    ours, ref = _pair(rng, q, v)
    qi, vi = keras.Input((3, 8)), keras.Input((4, 6))
    out, scores = ours(qi, vi, return_attention_scores=True)
    assert out.shape == (None, 3, 8)
    assert scores.shape == (None, 2, 3, 4)  # (batch, h, T_q, T_k)
    model = keras.Model([qi, vi], [out, scores])
    got_out, got_scores = model([q, v])
    ref_out, ref_scores = ref(q, v, return_attention_scores=True)
    assert_allclose(got_out, ref_out, atol=1e-5)
    assert_allclose(got_scores, ref_scores, atol=1e-5)
    # Keras' symbolic scores are (batch, h, T_q, T_q) whatever T_k is; they
    # agree with ours where T_q == T_k.
    xi = keras.Input((3, 8))
    _, ours_s = ours(xi, xi, return_attention_scores=True)
    ref2 = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    _, ref_s = ref2(xi, xi, return_attention_scores=True)
    assert ours_s.shape == ref_s.shape and ours_s.dtype == ref_s.dtype


@pytest.mark.parametrize("output_shape", [5, (5,), (2, 3), [2, 3]])
def test_output_shape_int_or_tuple_matches_keras(rng, output_shape):
    q, v, _ = _inputs(rng)
    ours, ref = _pair(rng, q, v, output_shape=output_shape)
    assert_allclose(ours(q, v), ref(q, v), atol=1e-5)
    assert ours.compute_output_shape(q.shape, v.shape) == \
        ref.compute_output_shape(q.shape, v.shape)
    qi, vi = keras.Input((3, 8)), keras.Input((4, 6))
    assert ours(qi, vi).shape == ref(qi, vi).shape


def test_query_value_key_of_different_last_dims_match_keras(rng):
    q, v, k = _inputs(rng, d_query=8, d_value=6, d_key=5)
    ours, ref = _pair(rng, q, v, key=k)
    assert_allclose(ours(q, v, key=k), ref(q, v, key=k), atol=1e-5)
    qi, vi, ki = keras.Input((3, 8)), keras.Input((4, 6)), keras.Input((4, 5))
    model = keras.Model([qi, vi, ki], ours(qi, vi, key=ki))
    assert model.output_shape == (None, 3, 8)
    assert_allclose(model([q, v, k]), ref(q, v, key=k), atol=1e-5)


def test_key_shape_not_matching_value_raises_like_keras(rng):
    q, v, _ = _inputs(rng)
    k = rng.normal(size=(2, 5, 6)).astype("float32")  # T_k 5 != 4
    for layer_cls in (MultiHeadAttention, keras.layers.MultiHeadAttention):
        with pytest.raises(ValueError, match="`value` and `key`"):
            layer_cls(num_heads=2, key_dim=4)(q, v, key=k)  # at build
        with pytest.raises(ValueError, match="`value` and `key`"):
            layer_cls(num_heads=2, key_dim=4)(keras.Input((3, 8)),
                                              keras.Input((4, 6)),
                                              key=keras.Input((5, 6)))
        with pytest.raises(ValueError, match="`value` and `key`"):
            layer_cls(num_heads=2, key_dim=4).compute_output_shape(
                q.shape, v.shape, k.shape)
    # Also on a built layer (Keras fails inside the einsum there).
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    layer(q, v, key=v)
    with pytest.raises(ValueError, match="`value` and `key`"):
        layer(q, v, key=k)


@pytest.mark.tensorflow  # the step's gradients through tf.GradientTape
def test_regularizers_and_constraints_match_keras(rng):
    q, v, _ = _inputs(rng)
    ours, ref = _pair(
        rng, q, v,
        kernel_regularizer=keras.regularizers.L2(0.01),
        bias_regularizer=keras.regularizers.L1(0.02),
        activity_regularizer=keras.regularizers.L2(0.03),
        kernel_constraint=keras.constraints.NonNeg(),
        bias_constraint=keras.constraints.MaxNorm(0.5, axis=None),
    )
    for layer in (ours, ref):
        layer(q, v)
    # 4 kernel + 4 bias penalties, and activity penalties on the outputs of
    # the 4 projections.
    assert len(ours.losses) == len(ref.losses) == 12
    assert_allclose(float(sum(ours.losses)), float(sum(ref.losses)),
                               rtol=1e-5)

    def sgd_step(layer):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(layer(q, v) ** 2) + sum(layer.losses)
        variables = layer.trainable_variables
        keras.optimizers.SGD(0.5).apply(tape.gradient(loss, variables),
                                        variables)

    sgd_step(ours)
    sgd_step(ref)
    for a, b in zip(ours.get_weights(), ref.get_weights()):
        assert_allclose(a, b, atol=1e-5)
    for kernel in _kernels(ours):
        assert kernel.min() >= 0.0  # NonNeg applied by the optimizer
    assert np.linalg.norm(to_np(ours.output_dense.bias)) <= 0.5 + 1e-6


def test_non_integer_output_shape_raises_value_error_like_keras():
    with pytest.raises(ValueError):
        keras.layers.MultiHeadAttention(num_heads=2, key_dim=4,
                                        output_shape=2.5)
    for bad in (2.5, "8", (2, 1.5), (0,), -1, (), True):
        with pytest.raises(ValueError, match="output_shape"):
            MultiHeadAttention(num_heads=2, key_dim=4, output_shape=bad)


@pytest.mark.parametrize("attention_axes", [None, 1, -2, (1,), [-2]])
def test_attention_over_the_sequence_axis_matches_keras(rng, attention_axes):
    q, v, _ = _inputs(rng)
    ours, ref = _pair(rng, q, v, attention_axes=attention_axes)
    mask = rng.random((2, 3, 4)) > 0.3
    mask[..., 0] = True
    for got, want in zip(
        ours(q, v, attention_mask=mask, return_attention_scores=True),
        ref(q, v, attention_mask=mask, return_attention_scores=True),
    ):
        assert_allclose(got, want, atol=1e-5)


def test_rank4_inputs_attend_over_the_sequence_axis_like_keras(rng):
    q = rng.normal(size=(2, 3, 4, 8)).astype("float32")
    v = rng.normal(size=(2, 3, 5, 8)).astype("float32")
    ours = MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=-2)
    ref = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4,
                                          attention_axes=(2,))
    ours(q, v)
    ref(q, v)
    ours.set_weights(ref.get_weights())
    mask = rng.random((2, 3, 4, 5)) > 0.3
    mask[..., 0] = True
    got = ours(q, v, attention_mask=mask, return_attention_scores=True)
    want = ref(q, v, attention_mask=mask, return_attention_scores=True)
    assert got[1].shape == want[1].shape == (2, 3, 2, 4, 5)
    for a, b in zip(got, want):
        assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("kwargs, rank", [
    (dict(attention_axes=(1, 2)), 4),
    (dict(attention_axes=2), 4),
    (dict(), 4),
    (dict(use_gate=True), 3),
    (dict(sliding_window=2), 3),
])
def test_keras_options_beyond_one_sequence_axis_match_keras(rng, kwargs,
                                                            rank):
    """Attention over several or other axes, gates and sliding windows run
    Keras' attention: same outputs and scores as Keras' layer."""
    q = rng.normal(size=(2,) + (3,) * (rank - 2) + (8,)).astype("float32")
    v = rng.normal(size=(2,) + (3,) * (rank - 2) + (6,)).astype("float32")
    ours, ref = _pair(rng, q, v, **kwargs)
    for got, want in zip(ours(q, v, return_attention_scores=True),
                         ref(q, v, return_attention_scores=True)):
        assert_allclose(got, want, atol=1e-5)


def test_dropout_seed_matches_keras(rng):
    q, v, _ = _inputs(rng)
    ours, ref = _pair(rng, q, v, dropout=0.5, seed=7)
    dropped = ours(q, v, training=True)
    assert not np.allclose(to_np(dropped), to_np(ours(q, v)))
    assert_allclose(dropped, ref(q, v, training=True), atol=1e-5)
    again, _ = _pair(rng, q, v, dropout=0.5, seed=7)
    again.set_weights(ours.get_weights())
    assert_allclose(again(q, v, training=True), dropped, atol=1e-6)


def test_keras_masks_match_keras(rng):
    q, v, _ = _inputs(rng, d_value=8)
    ours, ref = _pair(rng, q, v)
    q[1, 2:] = 0.0
    v[0, 3:] = 0.0
    masking = keras.layers.Masking(0.0)
    mq, mv = masking(tf.constant(q)), masking(tf.constant(v))
    query_mask = to_np(mq._keras_mask)
    got = ours(mq, mv)
    want = ref(masking(tf.constant(q)), masking(tf.constant(v)))
    assert_allclose(got, want, atol=1e-5)
    # The output carries the query's mask, as Keras' output does.
    assert_array_equal(got._keras_mask, query_mask)
    assert_array_equal(want._keras_mask, query_mask)


@pytest.mark.parametrize("fuse", [False, True])
def test_inputs_keep_their_keras_masks(rng, monkeypatch, fuse):
    """The layer leaves the Keras masks of the tensors it is given in place,
    with or without ``fuse_projections``. Keras' own call deletes them
    (its sub-layers must not see them); a block that reads its input's
    mask after attending (``TransformerDecoderBlock.compute_mask``) or the
    encoder output's mask in a later layer lost it only on the unfused path,
    so the next decoder layer's padded queries were masked on one path and
    not on the other."""
    monkeypatch.setattr(MultiHeadAttention, "fuse_projections", fuse)
    q, v, _ = _inputs(rng, d_value=8)
    q[1, 2:] = 0.0
    v[0, 3:] = 0.0
    masking = keras.layers.Masking(0.0)
    mq, mv = masking(tf.constant(q)), masking(tf.constant(v))
    query_mask, value_mask = to_np(mq._keras_mask), to_np(mv._keras_mask)
    assert not query_mask.all() and not value_mask.all()
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    for value in (mv, mq):  # cross-attention, then self-attention
        out = layer(mq, value)
        assert_array_equal(out._keras_mask, query_mask)
        assert_array_equal(mq._keras_mask, query_mask)
        assert_array_equal(mv._keras_mask, value_mask)


def test_config_round_trip_with_all_arguments(rng):
    layer = MultiHeadAttention(
        num_heads=2, key_dim=4, value_dim=3, dropout=0.1, use_bias=True,
        output_shape=(2, 3), attention_axes=-2, flash_attention=False,
        kernel_initializer=keras.initializers.GlorotUniform(seed=1),
        bias_initializer="ones",
        kernel_regularizer=keras.regularizers.L2(0.01),
        bias_regularizer=keras.regularizers.L1(0.02),
        activity_regularizer=keras.regularizers.L2(0.03),
        kernel_constraint=keras.constraints.NonNeg(),
        bias_constraint=keras.constraints.MaxNorm(2.0),
        use_gate=False, seed=5,
    )
    config = layer.get_config()
    assert MultiHeadAttention.from_config(config).get_config() == config
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer))
    assert isinstance(restored, MultiHeadAttention)
    assert restored.get_config() == config
    q, v, _ = _inputs(rng)
    layer(q, v)
    restored(q, v)
    restored.set_weights(layer.get_weights())
    assert_array_equal(restored(q, v), layer(q, v))
    # A config written by keras.layers.MultiHeadAttention loads as well.
    ref = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, seed=3)
    ref(q, v)
    ported = MultiHeadAttention.from_config(ref.get_config())
    ported(q, v)
    ported.set_weights(ref.get_weights())
    assert_allclose(ported(q, v), ref(q, v), atol=1e-5)
