"""PositionalEmbedding (§3.4-3.5) and LayerNormalization (Ba et al. Eq. 4)."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.ops import convert_to_numpy as to_numpy

from keras_trm.layers import (
    LayerNormalization,
    PositionalEmbedding,
    sinusoidal_position_encoding,
)


pytestmark = pytest.mark.portable  # CI runs it under each backend


def test_sinusoid_values_follow_the_formula():
    pe = sinusoidal_position_encoding(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("k", [1, 5, 13])
def test_pe_pos_plus_k_is_linear_in_pe_pos(k):
    """§3.5: PE(pos+k) = M_k PE(pos), M_k a fixed block-diagonal rotation."""
    d = 16
    pe = sinusoidal_position_encoding(100, d).astype(np.float64)
    m = np.zeros((d, d))
    for i in range(d // 2):
        w = k / 10000 ** (2 * i / d)
        c, s = math.cos(w), math.sin(w)
        # sin(a+w) = sin a cos w + cos a sin w; cos(a+w) = cos a cos w - sin a sin w
        m[2 * i, 2 * i], m[2 * i, 2 * i + 1] = c, s
        m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = -s, c
    np.testing.assert_allclose(pe[k:] , pe[:-k] @ m.T, atol=1e-5)


def test_embedding_scaled_plus_positions(rng):
    layer = PositionalEmbedding(20, 8, max_sequence_length=10)
    ids = np.array([[3, 4, 5, 0]], "int32")
    out = to_numpy(layer(ids))
    table = to_numpy(layer.embeddings)
    expected = table[ids[0]] * math.sqrt(8) + sinusoidal_position_encoding(4, 8)
    np.testing.assert_allclose(out[0], expected, atol=1e-5)
    # Incremental use: position 2 alone equals the third column of the full call.
    np.testing.assert_allclose(to_numpy(layer(ids[:, 2:3], start_index=2))[0, 0], out[0, 2],
                               atol=1e-6)
    np.testing.assert_array_equal(to_numpy(layer.compute_mask(ids)), ids != 0)


def test_reverse_gives_tied_logits(rng):
    layer = PositionalEmbedding(20, 8, max_sequence_length=10)
    layer(np.ones((1, 1), "int32"))
    h = rng.normal(size=(2, 3, 8)).astype("float32")
    np.testing.assert_allclose(to_numpy(layer(h, reverse=True)),
                               h @ to_numpy(layer.embeddings).T, atol=1e-5)


def test_learned_positions_and_round_trip(tmp_path):
    ids_in = keras.Input((None,), dtype="int32")
    out = PositionalEmbedding(20, 8, max_sequence_length=10, position="learned")(ids_in)
    model = keras.Model(ids_in, out)
    ids = np.array([[1, 2, 3], [4, 5, 0]], "int32")
    model.save(tmp_path / "emb.keras")
    loaded = keras.models.load_model(tmp_path / "emb.keras")
    np.testing.assert_array_equal(to_numpy(model(ids)), to_numpy(loaded(ids)))
    assert len(loaded.weights) == 2


def test_float_ids_are_rejected():
    layer = PositionalEmbedding(20, 8, max_sequence_length=10)
    with pytest.raises(TypeError, match="integer token ids.*float32"):
        layer(np.ones((1, 3), "float32"))


def test_too_long_sequences_are_rejected():
    layer = PositionalEmbedding(20, 8, max_sequence_length=4)
    with pytest.raises(ValueError, match="sequence length 5.*max_sequence_length=4"):
        layer(np.ones((1, 5), "int32"))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="lengths unknown until run time exist in tf.function "
                           "graphs only (jax.jit and torch shapes are static)")
def test_too_long_sequences_are_rejected_at_run_time_in_a_graph():
    layer = PositionalEmbedding(20, 8, max_sequence_length=4)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def dynamic(ids):
        return layer(ids)

    with pytest.raises(tf.errors.InvalidArgumentError, match="max_sequence_length=4"):
        dynamic(tf.ones((1, 6), tf.int32))
    assert dynamic(tf.ones((1, 4), tf.int32)).shape == (1, 4, 8)

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def from_index(start_index):  # a static length, a start known when run
        return layer(tf.ones((1, 3), tf.int32), start_index=start_index)

    assert from_index(tf.constant(1)).shape == (1, 3, 8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="plus start_index"):
        from_index(tf.constant(2))


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocabulary_size=0, d_model=8, max_sequence_length=4), "vocabulary_size"),
    (dict(vocabulary_size=5, d_model=7, max_sequence_length=4), "d_model"),
    (dict(vocabulary_size=5, d_model=8, max_sequence_length=4, position="rope"), "position"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        PositionalEmbedding(**kwargs)


def test_layer_normalization_is_eq4_of_ba_et_al(rng):
    """LN(a) = gamma * (a - mu) / sqrt(var + eps) + beta over the features."""
    x = rng.normal(3.0, 2.0, size=(4, 5, 16)).astype("float32")
    layer = LayerNormalization(epsilon=1e-6)
    layer.build(x.shape)
    gamma = rng.normal(size=16).astype("float32")
    beta = rng.normal(size=16).astype("float32")
    layer.set_weights([gamma, beta])
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    np.testing.assert_allclose(to_numpy(layer(x)), gamma * (x - mu) / np.sqrt(var + 1e-6) + beta,
                               atol=1e-5)
