"""Transformer-XL layers: relative attention (Dai et al. 2019 §3.3), rel_shift,
segment-level recurrence (§3.2), serialization and argument errors."""

import keras
import numpy as np
import pytest

from conftest import assert_allclose, assert_array_equal, to_np
from keras_trm.layers.relative_attention import (
    RelativeMultiHeadAttention,
    rel_shift,
    relative_position_encoding,
)
from keras_trm.layers.transformer_xl_block import TransformerXLBlock

pytestmark = pytest.mark.portable  # CI runs it under each backend
D_MODEL, HEADS = 8, 2


def numpy_sinusoid(distance, dim):
    """R_d in the concatenated [sin, cos] layout of the reference code."""
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, dim, 2) / dim)
    angle = distance * inv_freq
    return np.concatenate([np.sin(angle), np.cos(angle)])


def numpy_logits(layer, h, context, same_length=False, clamp_len=None,
                 mem_len=None):
    """A_ij / sqrt(d_head) term by term, (a) + (b) + (c) + (d), -inf if masked."""
    wq = to_np(layer.query_kernel)
    wk = to_np(layer.key_kernel)
    wr = to_np(layer.position_kernel)
    u = to_np(layer.content_bias)
    v = to_np(layer.position_bias)
    q = np.einsum("btd,dnh->btnh", h, wq)
    k = np.einsum("btd,dnh->btnh", context, wk)
    batch, t_len, _ = h.shape
    k_len = context.shape[1]
    mem = k_len - t_len
    out = np.full((batch, HEADS, t_len, k_len), -np.inf)
    for i in range(t_len):
        for j in range(k_len):
            dist = mem + i - j  # query at absolute position mem + i
            if dist < 0 or (same_length and dist >= mem_len):
                continue
            r = numpy_sinusoid(
                dist if clamp_len is None else min(dist, clamp_len),
                context.shape[-1],
            )
            wkr = np.einsum("d,dnh->nh", r, wr)  # W_{k,R} R_{i-j}
            a = np.einsum("bnh,bnh->bn", q[:, i], k[:, j])
            b = np.einsum("bnh,nh->bn", q[:, i], wkr)
            c = np.einsum("nh,bnh->bn", u, k[:, j])
            d = np.einsum("nh,nh->n", v, wkr)[None]
            out[:, :, i, j] = (a + b + c + d) / np.sqrt(q.shape[-1])
    return out


def reference_same_length_mask(q_len, m_len, mem_len):
    """True = may attend, built as the reference PyTorch code builds its
    mask (kimiyoung/transformer-xl, mem_transformer.py, _forward):
    masked = triu(ones, 1 + mlen) + tril(ones, -mask_shift_len)."""
    k_len = m_len + q_len
    ones = np.ones((q_len, k_len))
    mask_len = k_len - mem_len
    mask_shift_len = q_len - mask_len if mask_len > 0 else q_len
    masked = np.triu(ones, 1 + m_len) + np.tril(ones, -mask_shift_len)
    return masked == 0


@pytest.mark.parametrize("q_len,m_len,mem_len", [
    (4, 0, 4), (4, 0, 2), (4, 0, 6), (4, 4, 4), (4, 2, 4), (4, 2, 2),
    (3, 5, 5), (6, 3, 3), (1, 4, 4), (5, 1, 3),
])
def test_same_length_mask_is_the_reference_codes(q_len, m_len, mem_len):
    layer = RelativeMultiHeadAttention(HEADS, 3, same_length=True,
                                       mem_len=mem_len)
    mask = to_np(layer.attention_mask_for(q_len, m_len + q_len))
    assert_array_equal(
        mask, reference_same_length_mask(q_len, m_len, mem_len))
    # At a stream start (no memory) a query sees up to mem_len keys, not
    # only itself; everywhere at most mem_len.
    assert mask.sum(1).max() == min(mem_len, m_len + q_len)


def test_same_length_needs_mem_len(rng):
    with pytest.raises(ValueError, match="mem_len"):
        RelativeMultiHeadAttention(HEADS, 3, same_length=True, mem_len=0)
    with pytest.raises(ValueError, match="mem_len"):
        TransformerXLBlock(HEADS, 8, mem_len=0, same_length=True)
    # Without a mem_len of its own the window must come with the call.
    layer = RelativeMultiHeadAttention(HEADS, 3, same_length=True)
    h = rng.normal(size=(1, 4, D_MODEL)).astype("float32")
    with pytest.raises(ValueError, match="mem_len=None"):
        layer(h, h)
    with pytest.raises(ValueError, match="mem_len=0"):
        layer(h, h, mem_len=0)
    assert layer(h, h, mem_len=2).shape == (1, 4, D_MODEL)


@pytest.mark.parametrize("t_len,mem", [(4, 3), (32, 24)])
def test_mem_len_call_argument_is_the_window(rng, t_len, mem):
    """The ``mem_len`` call argument sets the window of ``same_length``
    (the mask and the banded path) as the constructor's does, and
    overrides it."""
    h = rng.normal(size=(2, t_len, D_MODEL)).astype("float32")
    m = rng.normal(size=(2, mem, D_MODEL)).astype("float32")
    context = np.concatenate([m, h], axis=1)
    passed = RelativeMultiHeadAttention(HEADS, 3, same_length=True,
                                        mem_len=2)
    built = RelativeMultiHeadAttention(HEADS, 3, same_length=True,
                                       mem_len=5)
    passed(h, context)
    randomize(passed, rng)
    built(h, context)
    built.set_weights(passed.get_weights())
    # (32, 24): chunks of 16 against windows of 5 + 15 < 56 keys (band).
    assert (built._band_chunk(t_len, mem + t_len, 5) is None) == (t_len == 4)
    expected = to_np(built(h, context))
    assert_allclose(passed(h, context, mem_len=5), expected, atol=1e-6)
    assert_allclose(
        passed.attention_logits(h, context, mem_len=5),
        built.attention_logits(h, context), atol=1e-6)
    k_len = mem + t_len
    assert_array_equal(passed.attention_mask_for(t_len, k_len, 5),
                       built.attention_mask_for(t_len, k_len))
    assert not np.allclose(to_np(passed(h, context)), expected, atol=1e-3)
    assert passed.mem_len == 2  # a call's window is not stored


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def randomize(layer, rng, scale=0.3):
    """Non-zero u, v (and all other weights) so that every term is tested."""
    layer.set_weights([
        w + rng.normal(size=w.shape).astype("float32") * scale
        for w in layer.get_weights()
    ])


@pytest.mark.parametrize(
    "mem,same_length,clamp_len,mem_len",
    [(3, False, None, None), (0, False, None, None), (3, True, None, 3),
     (0, True, None, 2), (5, True, None, 3), (5, False, 2, None)],
)
def test_scores_equal_four_terms(rng, mem, same_length, clamp_len, mem_len):
    t_len = 4
    layer = RelativeMultiHeadAttention(
        HEADS, 3, same_length=same_length, clamp_len=clamp_len,
        mem_len=mem_len,
    )
    h = rng.normal(size=(2, t_len, D_MODEL)).astype("float32")
    m = rng.normal(size=(2, mem, D_MODEL)).astype("float32")
    context = np.concatenate([m, h], axis=1)
    layer(h, context)
    randomize(layer, rng)

    ref = numpy_logits(layer, h, context, same_length, clamp_len, mem_len)
    logits = to_np(layer.attention_logits(h, context))
    valid = np.isfinite(ref)
    assert_allclose(logits[valid], ref[valid], atol=1e-5)
    assert np.all(logits[~valid] <= -1e8)

    out, probs = layer(h, context, return_attention_scores=True)
    ref_p = softmax(ref)
    assert_allclose(probs, ref_p, atol=1e-6)
    # The output: probabilities times projected values, then W_o.
    val = np.einsum("btd,dnh->btnh", context, to_np(layer.value_kernel))
    heads = np.einsum("bnqk,bknh->bqnh", ref_p, val)
    ref_out = np.einsum("bqnh,nhd->bqd", heads, to_np(layer.output_kernel))
    assert_allclose(out, ref_out, atol=1e-5)


def test_position_encoding_layout():
    r = to_np(relative_position_encoding(5, 6, clamp_len=3))
    expected = [numpy_sinusoid(min(d, 3), 6) for d in (4, 3, 2, 1, 0)]
    assert_allclose(r, expected, atol=1e-6)


@pytest.mark.parametrize("t_len,k_len", [(5, 9), (4, 4), (1, 3)])
def test_rel_shift_equals_gather(rng, compiled, t_len, k_len):
    x = rng.normal(size=(2, 3, t_len, k_len)).astype("float32")
    if keras.backend.backend() == "tensorflow":  # unknown dimensions too
        import tensorflow as tf
        shifted = tf.function(rel_shift, input_signature=[
            tf.TensorSpec([None, 3, None, None], tf.float32)])
    else:
        shifted = compiled(rel_shift)
    for y in (to_np(rel_shift(x)), to_np(shifted(x))):
        assert y.shape == x.shape
        mem = k_len - t_len
        for i in range(t_len):
            # Query i at absolute position mem + i; column c of x is the
            # distance k_len - 1 - c, i.e. key j = mem + i - distance.
            j = np.arange(mem + i + 1)
            assert_array_equal(
                y[..., i, j], x[..., i, j + t_len - 1 - i]
            )


def test_no_gradient_reaches_memory(rng, gradients):
    block = TransformerXLBlock(HEADS, 16, mem_len=4, dropout_rate=0.0)
    h = rng.normal(size=(2, 3, D_MODEL)).astype("float32")
    m = rng.normal(size=(2, 4, D_MODEL)).astype("float32")
    block(h, memory=m)

    def loss(h, m):
        y = block(h, memory=m, training=True)
        return keras.ops.sum(y * y)

    def memory_sum(h, m):
        return keras.ops.sum(block.compute_new_memory(h, m))

    g_h, g_m = gradients(loss, h, m)
    assert np.all(g_m == 0) and np.any(g_h != 0)
    for g in gradients(memory_sum, h, m):
        assert np.all(g == 0)


def _segments(x, t_len):
    return [x[:, s:s + t_len] for s in range(0, x.shape[1], t_len)]


@pytest.mark.parametrize("clamp_len", [None, 5])
def test_segments_with_memory_equal_one_pass(rng, clamp_len):
    length, t_len = 12, 4
    block = TransformerXLBlock(
        HEADS, 16, mem_len=length - t_len, dropout_rate=0.0,
        clamp_len=clamp_len,
    )
    x = rng.normal(size=(2, length, D_MODEL)).astype("float32")
    block(x)
    randomize(block, rng, scale=0.1)
    full = to_np(block(x))

    memory, outs = None, []
    for seg in _segments(x, t_len):
        outs.append(to_np(block(seg, memory=memory)))
        memory = block.compute_new_memory(seg, memory)
    assert_allclose(np.concatenate(outs, axis=1), full, atol=1e-5)
    assert memory.shape == (2, length - t_len, D_MODEL)

    # Sanity: without memory the later segments differ.
    alone = to_np(block(_segments(x, t_len)[1]))
    assert not np.allclose(alone, full[:, t_len:2 * t_len], atol=1e-3)


def test_two_layer_stack_segments_equal_one_pass(rng):
    length, t_len = 9, 3
    blocks = [
        TransformerXLBlock(HEADS, 16, mem_len=length, dropout_rate=0.0)
        for _ in range(2)
    ]
    x = rng.normal(size=(2, length, D_MODEL)).astype("float32")
    y = x
    for block in blocks:
        block(y)
        randomize(block, rng, scale=0.1)
    for block in blocks:
        y = block(y)
    full = to_np(y)

    memories, outs = [None, None], []
    for seg in _segments(x, t_len):
        h = seg
        for n, block in enumerate(blocks):
            # Each layer's memory is the history of its own inputs.
            new_memory = block.compute_new_memory(h, memories[n])
            h = block(h, memory=memories[n])
            memories[n] = new_memory
        outs.append(to_np(h))
    assert_allclose(np.concatenate(outs, axis=1), full, atol=1e-5)


def test_shared_biases_passed_in(rng):
    shared = RelativeMultiHeadAttention(HEADS, 4, untie_biases=False)
    h = rng.normal(size=(1, 3, D_MODEL)).astype("float32")
    u = rng.normal(size=(HEADS, 4)).astype("float32")
    v = rng.normal(size=(HEADS, 4)).astype("float32")
    out = shared(h, h, content_bias=u, position_bias=v)
    assert out.shape == (1, 3, D_MODEL)
    own = RelativeMultiHeadAttention(HEADS, 4)
    own(h, h)
    own.set_weights(shared.get_weights() + [u, v])
    assert_allclose(own(h, h), out, atol=1e-6)
    with pytest.raises(ValueError, match="content_bias"):
        shared(h, h)
    with pytest.raises(ValueError, match="position_bias"):
        shared(h, h, content_bias=u, position_bias=v[:1])


def test_new_memory_keeps_last_mem_len(rng):
    h = rng.normal(size=(2, 3, D_MODEL)).astype("float32")
    m = rng.normal(size=(2, 4, D_MODEL)).astype("float32")
    block = TransformerXLBlock(HEADS, 16, mem_len=5)
    assert_array_equal(
        block.compute_new_memory(h, m),
        np.concatenate([m, h], axis=1)[:, -5:],
    )
    assert_array_equal(block.compute_new_memory(h), h)
    empty = TransformerXLBlock(HEADS, 16, mem_len=0).compute_new_memory(h, m)
    assert empty.shape == (2, 0, D_MODEL)
    # A zero-length memory is the same as none.
    block(h)
    assert_allclose(block(h, memory=empty), block(h), atol=1e-6)


@pytest.mark.parametrize("t_len,mem", [(4, 6), (16, 8)])
def test_assigning_mem_len_moves_the_same_length_window(rng, compiled, t_len,
                                                        mem):
    """``block.mem_len = n`` after build gives the outputs and memories of
    a block built with ``mem_len=n``: the window of ``same_length`` moves
    too, in the dense path (T=4) and the banded one (T=16, K=24), also in
    a function traced after the assignment. The block stores mem_len; its
    attention holds no copy."""
    h = rng.normal(size=(2, t_len, D_MODEL)).astype("float32")
    m = rng.normal(size=(2, mem, D_MODEL)).astype("float32")
    changed = TransformerXLBlock(HEADS, 16, mem_len=2, same_length=True,
                                 dropout_rate=0.0)
    built = TransformerXLBlock(HEADS, 16, mem_len=5, same_length=True,
                               dropout_rate=0.0)
    changed(h, memory=m)
    randomize(changed, rng)
    old = changed(h, memory=m)
    built(h, memory=m)
    built.set_weights(changed.get_weights())
    changed.mem_len = 5
    expected = to_np(built(h, memory=m))
    assert_allclose(changed(h, memory=m), expected, atol=1e-6)
    traced = compiled(lambda x, y: changed(x, memory=y))
    assert_allclose(traced(h, m), expected, atol=1e-6)
    assert not np.allclose(to_np(old), expected, atol=1e-3)
    assert_array_equal(changed.compute_new_memory(h, m),
                                  built.compute_new_memory(h, m))
    assert changed.get_config()["mem_len"] == 5
    assert changed.self_attention.mem_len is None
    with pytest.raises(ValueError, match="mem_len=0"):
        changed.mem_len = 0
    assert changed.mem_len == 5
    # Which path ran: dense for T=4, windows of 5 + 15 < 24 keys for T=16.
    band = changed.self_attention._band_chunk(t_len, mem + t_len, 5)
    assert (band is None) == (t_len == 4)


def test_keras_round_trip(rng, tmp_path):
    x_in = keras.Input((None, D_MODEL))
    m_in = keras.Input((None, D_MODEL))
    block = TransformerXLBlock(
        HEADS, 16, mem_len=4, clamp_len=6, same_length=True, name="xl"
    )
    model = keras.Model([x_in, m_in], block(x_in, memory=m_in))
    randomize(block, rng, scale=0.1)
    x = rng.normal(size=(2, 3, D_MODEL)).astype("float32")
    m = rng.normal(size=(2, 4, D_MODEL)).astype("float32")
    expected = to_np(model([x, m]))

    path = tmp_path / "xl.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert_array_equal(to_np(loaded([x, m])), expected)
    config = loaded.get_layer("xl").get_config()
    assert config == block.get_config()
    clone = TransformerXLBlock.from_config(config)
    assert clone.mem_len == 4 and clone.same_length and clone.clamp_len == 6


def test_bad_arguments(rng):
    with pytest.raises(ValueError, match="mem_len"):
        TransformerXLBlock(HEADS, 16, mem_len=-1)
    with pytest.raises(ValueError, match="clamp_len"):
        RelativeMultiHeadAttention(HEADS, 4, clamp_len=-1)
    block = TransformerXLBlock(HEADS, 16, mem_len=2)
    h = rng.normal(size=(2, 3, D_MODEL)).astype("float32")
    block(h)
    bad_dim = rng.normal(size=(2, 4, D_MODEL + 2)).astype("float32")
    with pytest.raises(ValueError, match=r"memory.*\(2, 3, 8\).*\(2, 4, 10\)"):
        block(h, memory=bad_dim)
    bad_batch = rng.normal(size=(3, 4, D_MODEL)).astype("float32")
    with pytest.raises(ValueError, match=r"memory.*\(3, 4, 8\)"):
        block(h, memory=bad_batch)
    with pytest.raises(ValueError, match="memory"):
        block.compute_new_memory(h, bad_dim)
    with pytest.raises(ValueError, match="even"):
        RelativeMultiHeadAttention(HEADS, 4)(
            np.zeros((1, 2, 5), "float32"), np.zeros((1, 2, 5), "float32")
        )


def test_mixed_precision_per_layer_policy(rng):
    h = rng.normal(size=(2, 3, D_MODEL)).astype("float32")
    m = rng.normal(size=(2, 4, D_MODEL)).astype("float32")
    for norm_first in (False, True):
        block = TransformerXLBlock(
            HEADS, 16, mem_len=4, norm_first=norm_first, dropout_rate=0.1,
            dtype="mixed_float16",
        )
        y = block(h, memory=m, training=True)
        assert keras.backend.standardize_dtype(y.dtype) == "float16"
        assert tuple(y.shape) == (2, 3, D_MODEL)
        assert block.compute_new_memory(h, m).shape == (2, 4, D_MODEL)


@pytest.mark.parametrize("mem,mem_len,clamp_len", [(40, 24, None), (0, 8, None), (20, 20, 10)])
def test_same_length_band_equals_dense(rng, mem, mem_len, clamp_len):
    """The banded same_length path (query chunks against key windows)
    gives the dense path's output, memory or none, clamped or not."""
    t_len = 48  # chunks of 16: three windows
    layer = RelativeMultiHeadAttention(
        HEADS, 3, same_length=True, mem_len=mem_len, clamp_len=clamp_len)
    h = rng.normal(size=(2, t_len, D_MODEL)).astype("float32")
    m = rng.normal(size=(2, mem, D_MODEL)).astype("float32")
    context = np.concatenate([m, h], axis=1)
    layer(h, context)
    randomize(layer, rng)
    assert layer._band_chunk(t_len, mem + t_len, mem_len) == 16
    band = to_np(layer(h, context))
    layer.use_band = False
    dense = to_np(layer(h, context))
    assert_allclose(band, dense, atol=1e-5)
    # Independent reference: numpy scores -> softmax -> values -> W_o.
    ref_p = softmax(numpy_logits(layer, h, context, True, clamp_len, mem_len))
    val = np.einsum("btd,dnh->btnh", context, to_np(layer.value_kernel))
    heads = np.einsum("bnqk,bknh->bqnh", ref_p, val)
    ref_out = np.einsum("bqnh,nhd->bqd", heads, to_np(layer.output_kernel))
    assert_allclose(band, ref_out, atol=1e-5)
