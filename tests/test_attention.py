"""MultiHeadAttention: Eq. (1) numerics, Keras parity, masks, cache."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_trm.layers import MultiHeadAttention


def numpy_mha(layer, q_in, kv_in, mask=None):
    """Eq. (1) and the multi-head projection of §3.2.2, in NumPy."""
    wq, bq, wk, bk, wv, bv, wo, bo = [np.asarray(w) for w in layer.get_weights()]
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
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    np.testing.assert_allclose(probs, ref_p, atol=1e-6)
    # Masked keys get exactly zero probability.
    assert np.all(np.asarray(probs)[np.broadcast_to(~mask[:, None], probs.shape)] == 0)


def test_matches_keras_multi_head_attention(layer_and_inputs, rng):
    layer, q, kv = layer_and_inputs
    ref = keras.layers.MultiHeadAttention(num_heads=4, key_dim=6)
    ref(q, kv)
    ref.set_weights(layer.get_weights())
    mask = rng.random((2, 5, 7)) > 0.2
    mask[:, :, 0] = True
    for kwargs in ({}, {"attention_mask": mask}):
        np.testing.assert_allclose(layer(q, kv, **kwargs), ref(q, kv, **kwargs),
                                   atol=1e-5)
    x = q
    np.testing.assert_allclose(layer(x, x, use_causal_mask=True),
                               ref(x, x, use_causal_mask=True), atol=1e-5)


def test_causal_mask_hides_the_future(rng):
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = rng.normal(size=(1, 6, 8)).astype("float32")
    out = np.asarray(layer(x, x, use_causal_mask=True))
    x2 = x.copy()
    x2[:, 4:] = rng.normal(size=(1, 2, 8))  # change positions 4 and 5
    out2 = np.asarray(layer(x2, x2, use_causal_mask=True))
    np.testing.assert_allclose(out[:, :4], out2[:, :4], atol=1e-6)
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
    np.testing.assert_allclose(out, layer(q, kv2, value_mask=value_mask), atol=1e-5)
    # Keras masking (a `_keras_mask` on the tensor) is honoured the same way.
    masked = keras.layers.Masking(mask_value=0.0)
    kv3 = kv.copy()
    kv3[~value_mask] = 0.0
    kv3_masked = masked(tf.constant(kv3))
    np.testing.assert_allclose(layer(q, kv3_masked), out, atol=1e-5)


def test_cache_incremental_equals_full(rng):
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    full = np.asarray(layer(x, x, use_causal_mask=True))
    cache = tf.zeros((2, 2, 6, 2, 4))
    steps = []
    for t in range(6):
        out, cache = layer(x[:, t:t + 1], x[:, t:t + 1], use_causal_mask=True,
                           cache=cache, cache_update_index=t)
        steps.append(np.asarray(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)
    # Cross-attention over a pre-projected memory equals plain attention.
    mem = rng.normal(size=(2, 4, 8)).astype("float32")
    kv_cache = layer.project_key_value(mem, mem)
    out, _ = layer(x, x, cache=kv_cache)
    np.testing.assert_allclose(out, layer(x, mem), atol=1e-5)


def test_cache_shape_is_checked():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = tf.zeros((1, 1, 8))
    with pytest.raises(ValueError, match="cache"):
        layer(x, x, cache=tf.zeros((1, 2, 5, 3, 4)), cache_update_index=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_heads=0, key_dim=4), "num_heads"),
    (dict(num_heads=2, key_dim=-1), "key_dim"),
    (dict(num_heads=2, key_dim=4, dropout=1.0), "dropout"),
    (dict(num_heads=2.0, key_dim=4), "num_heads"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
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
    np.testing.assert_array_equal(model(x), loaded(x))
    assert loaded.output_shape == (None, None, 5)
