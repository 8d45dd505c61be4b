"""Every weight starts from its own random draw.

Keras 3 initializers fix their seed when constructed: one unseeded instance
used for several weights gives them identical values (W_Q = W_K = W_V). These
tests build every public layer and model builder and check that no two
random weights of equal shape are equal, that the same seeded initializer
gives equal layers and that unseeded layers differ.
"""

import itertools

import keras
import numpy as np
import pytest

from keras_trm import layers as L
from keras_trm import models as M


pytestmark = pytest.mark.portable  # CI runs it under each backend


def to_numpy(x, dtype=None):
    """A tensor of any backend (a PyTorch one that requires grad too) as
    a NumPy array."""
    return np.asarray(keras.ops.convert_to_numpy(x), dtype)


def _random_weights(obj):
    """(path, value) of every weight that is not constant at initialization."""
    out = []
    for w in obj.weights:
        value = to_numpy(keras.ops.convert_to_numpy(w))
        if value.size > 1 and np.ptp(value) > 0:
            out.append((w.path, value))
    return out


def assert_no_equal_pairs(obj, min_weights=2):
    weights = _random_weights(obj)
    assert len(weights) >= min_weights, [p for p, _ in weights]
    equal = [
        (a, b)
        for (a, x), (b, y) in itertools.combinations(weights, 2)
        if x.shape == y.shape and np.array_equal(x, y)
    ]
    assert not equal, f"{len(equal)} pairs of identical weights: {equal[:5]}"
    # Equal prefixes would also betray a shared seed across shapes.
    flat = [(p, v.ravel()[:32]) for p, v in weights if v.size >= 32]
    same_prefix = [
        (a, b) for (a, x), (b, y) in itertools.combinations(flat, 2)
        if np.array_equal(x, y)
    ]
    assert not same_prefix, same_prefix[:5]


def _mha(init="glorot_uniform"):
    layer = L.MultiHeadAttention(num_heads=4, key_dim=16, kernel_initializer=init)
    layer.build((1, 3, 64), (1, 3, 64))
    return layer


def _relative(init="glorot_uniform"):
    layer = L.RelativeMultiHeadAttention(
        num_heads=2, key_dim=16, kernel_initializer=init,
        relative_bias_initializer=init,  # u and v random here, to test them
    )
    layer.build((1, 4, 32), (1, 6, 32))
    return layer


def _encoder_block(init="glorot_uniform"):
    layer = L.TransformerEncoderBlock(num_heads=2, d_ff=32, kernel_initializer=init)
    layer.build((1, 5, 32))
    return layer


def _decoder_block(init="glorot_uniform"):
    layer = L.TransformerDecoderBlock(num_heads=2, d_ff=32, kernel_initializer=init)
    layer.build((1, 5, 32), (1, 7, 32))
    return layer


def _xl_block(init="glorot_uniform"):
    layer = L.TransformerXLBlock(num_heads=2, d_ff=32, mem_len=4,
                                 kernel_initializer=init)
    layer.build((1, 5, 32))
    return layer


def _lstm_ln(init="glorot_uniform"):
    layer = L.LSTM_LN(16, kernel_initializer=init,
                      recurrent_initializer=init)
    layer.build((1, 5, 16))
    return layer


def _embedding(init=None):
    layer = L.PositionalEmbedding(50, 16, max_sequence_length=16, position="learned",
                                  embeddings_initializer=init)
    layer.build((1, 5))
    return layer


LAYERS = {
    "MultiHeadAttention": _mha,
    "RelativeMultiHeadAttention": _relative,
    "TransformerEncoderBlock": _encoder_block,
    "TransformerDecoderBlock": _decoder_block,
    "TransformerXLBlock": _xl_block,
    "LSTM_LN": _lstm_ln,
}


@pytest.mark.parametrize("name", sorted(LAYERS) + ["PositionalEmbedding"])
def test_layer_weights_are_distinct(name):
    layer = LAYERS.get(name, _embedding)()
    assert_no_equal_pairs(layer, min_weights=2)


def test_attention_q_k_v_kernels_differ():
    # The case reported on main: W_Q = W_K = W_V bit for bit.
    layer = _mha()
    q, k, val = (to_numpy(w) for w in (
        layer.query_dense.kernel, layer.key_dense.kernel,
        layer.value_dense.kernel))
    assert not np.array_equal(q, k) and not np.array_equal(k, val)
    assert not np.array_equal(q, val)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_same_seeded_initializer_gives_equal_layers(name):
    make = LAYERS[name]
    a = make(keras.initializers.GlorotUniform(seed=7))
    b = make(keras.initializers.GlorotUniform(seed=7))
    for wa, wb in zip(a.weights, b.weights):
        np.testing.assert_array_equal(to_numpy(wa), to_numpy(wb),
                                      err_msg=wa.path)
    # ... and still no two weights of a seeded layer are equal.
    assert_no_equal_pairs(a)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_unseeded_layers_differ(name):
    a, b = LAYERS[name](), LAYERS[name]()
    ka = _random_weights(a)[0][1]
    kb = _random_weights(b)[0][1]
    assert not np.array_equal(ka, kb)


def test_lstm_ln_cell_weights_are_distinct():
    cell = L.LSTMLNCell(12)
    cell.build((1, 12))  # input dim = units: W_x and W_h have equal shapes
    assert_no_equal_pairs(cell)


MODELS = {
    "transformer": lambda: M.transformer(
        100, num_layers=2, d_model=32, num_heads=2, d_ff=64, max_sequence_length=16),
    "transformer_untied": lambda: M.transformer(
        100, num_layers=2, d_model=32, num_heads=2, d_ff=32, max_sequence_length=16,
        tie_embeddings="none", position="learned"),
    "transformer_small": lambda: M.transformer_small(
        vocabulary_size=64, max_sequence_length=16),
    "encoder_classifier": lambda: M.encoder_classifier(
        100, num_layers=2, d_model=32, num_heads=2, d_ff=32, max_sequence_length=16),
    "lstm_classifier": lambda: M.lstm_classifier(100, 16, 16),
    "lstm_ln_classifier": lambda: M.lstm_classifier(100, 16, 16, layer_norm=True),
    "lenet_none": lambda: M.lenet_cnn(None),
    "lenet_batch": lambda: M.lenet_cnn("batch"),
    "lenet_layer": lambda: M.lenet_cnn("layer"),
    "transformer_xl_lm": lambda: M.TransformerXLLM(
        60, num_layers=2, d_model=32, num_heads=2, d_ff=32, mem_len=4,
        untie_biases=False),
    "vanilla_transformer_lm": lambda: M.vanilla_transformer_lm(
        60, num_layers=2, d_model=32, num_heads=2, d_ff=32, max_sequence_length=16),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_weights_are_distinct(name):
    assert_no_equal_pairs(MODELS[name](), min_weights=3)


def test_transformer_attention_kernels_all_differ():
    # On main, 36 pairs of attention kernels of this model were identical.
    model = MODELS["transformer"]()
    kernels = [(w.path, to_numpy(w)) for w in model.weights
               if "attention" in w.path and w.path.endswith("kernel")]
    assert len(kernels) == 2 * 4 + 2 * 4 + 2 * 4  # enc self, dec self, cross
    for (a, x), (b, y) in itertools.combinations(kernels, 2):
        assert not np.array_equal(x, y), (a, b)


@pytest.mark.parametrize("name", ["transformer", "encoder_classifier",
                                  "transformer_xl_lm"])
def test_models_follow_the_global_seed(name):
    keras.utils.set_random_seed(123)
    a = MODELS[name]()
    keras.utils.set_random_seed(123)
    b = MODELS[name]()
    c = MODELS[name]()  # same process, no re-seed: a new draw
    for wa, wb in zip(a.weights, b.weights):
        np.testing.assert_array_equal(to_numpy(wa), to_numpy(wb))
    ka, kc = _random_weights(a)[0][1], _random_weights(c)[0][1]
    assert not np.array_equal(ka, kc)
