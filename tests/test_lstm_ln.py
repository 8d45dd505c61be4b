import keras
"""LSTM_LN: the LN-LSTM equations of Ba et al. (2016), masks, serialization."""

import keras_trm  # noqa: F401  (checks the TensorFlow backend first)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_trm.layers.lstm_ln import LSTM_LN, LSTMLNCell  # noqa: E402


pytestmark = pytest.mark.portable  # CI runs it under each backend


def to_numpy(x, dtype=None):
    """A tensor of any backend (a PyTorch one that requires grad too) as
    a NumPy array."""
    return np.asarray(keras.ops.convert_to_numpy(x), dtype)

B, T, D, U = 3, 5, 4, 6


def _ln(z, gamma, beta, eps):
    mu = z.mean(-1, keepdims=True)
    var = ((z - mu) ** 2).mean(-1, keepdims=True)
    return gamma * (z - mu) / np.sqrt(var + eps) + beta


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def numpy_lstm_ln(weights, x, eps=1e-5, h0=None, c0=None):
    """Step-by-step reference of the LN-LSTM equations, gate order (f,i,o,g)."""
    wx, wh, b, g1, b1, g2, b2, g3, b3 = [to_numpy(w, "float64") for w in weights]
    units = wh.shape[0]
    h = np.zeros((x.shape[0], units)) if h0 is None else h0.astype("float64")
    c = np.zeros((x.shape[0], units)) if c0 is None else c0.astype("float64")
    hs = []
    for t in range(x.shape[1]):
        z = _ln(h @ wh, g1, b1, eps) + _ln(x[:, t] @ wx, g2, b2, eps) + b
        f, i, o, g = np.split(z, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(_ln(c, g3, b3, eps))
        hs.append(h)
    return np.stack(hs, 1), h, c


def _plain_lstm(weights, x):
    """The same gates without any LN, to show the invariance is LN's."""
    wx, wh, b = [to_numpy(w, "float64") for w in weights[:3]]
    h = c = np.zeros((x.shape[0], wh.shape[0]))
    hs = []
    for t in range(x.shape[1]):
        f, i, o, g = np.split(h @ wh + x[:, t] @ wx + b, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        hs.append(h)
    return np.stack(hs, 1)


def _randomize(layer, rng):
    """Non-trivial gains/biases (and weights) so every parameter is checked."""
    new = []
    for w in layer.get_weights():
        if w.ndim == 1:
            w = w + rng.normal(size=w.shape).astype("float32") * 0.5
        else:
            w = rng.normal(size=w.shape).astype("float32") * 0.7
        new.append(w)
    layer.set_weights(new)
    return new


@pytest.fixture
def x(rng):
    return rng.normal(size=(B, T, D)).astype("float32")


def test_weights_layout_and_init(x):
    layer = LSTM_LN(U)
    layer(x)
    names = [w.path.split("/")[-1] for w in layer.weights]
    assert names == [
        "kernel", "recurrent_kernel", "bias",
        "recurrent_gamma", "recurrent_beta",
        "input_gamma", "input_beta", "cell_gamma", "cell_beta",
    ]
    shapes = [tuple(w.shape) for w in layer.weights]
    assert shapes == [(D, 4 * U), (U, 4 * U), (4 * U,)] + [(4 * U,)] * 4 + [(U,)] * 2
    w = layer.get_weights()
    # unit_forget_bias: forget slice (first, order f,i,o,g) is 1, rest 0.
    np.testing.assert_array_equal(w[2][:U], 1.0)
    np.testing.assert_array_equal(w[2][U:], 0.0)
    for gamma in (w[3], w[5], w[7]):
        np.testing.assert_array_equal(gamma, 1.0)
    for beta in (w[4], w[6], w[8]):
        np.testing.assert_array_equal(beta, 0.0)


@pytest.mark.parametrize("go_backwards", [False, True])
def test_matches_numpy_reference(x, rng, go_backwards):
    layer = LSTM_LN(U, return_sequences=True, return_state=True,
                    go_backwards=go_backwards)
    layer(x)
    weights = _randomize(layer, rng)
    seq, h, c = [to_numpy(a) for a in layer(x)]
    x_ref = x[:, ::-1] if go_backwards else x
    ref_seq, ref_h, ref_c = numpy_lstm_ln(weights, x_ref)
    np.testing.assert_allclose(seq, ref_seq, atol=1e-5)
    np.testing.assert_allclose(h, ref_h, atol=1e-5)
    np.testing.assert_allclose(c, ref_c, atol=1e-5)
    np.testing.assert_allclose(seq[:, -1], h, atol=1e-6)


def test_initial_state_and_cell_step(x, rng):
    layer = LSTM_LN(U, return_state=True, epsilon=1e-3, unroll=True)
    layer(x)
    weights = _randomize(layer, rng)
    h0 = rng.normal(size=(B, U)).astype("float32")
    c0 = rng.normal(size=(B, U)).astype("float32")
    out, h, c = layer(x, initial_state=[h0, c0])
    _, ref_h, ref_c = numpy_lstm_ln(weights, x, eps=1e-3, h0=h0, c0=c0)
    np.testing.assert_allclose(to_numpy(h), ref_h, atol=1e-5)
    np.testing.assert_allclose(to_numpy(c), ref_c, atol=1e-5)
    # The cell alone computes one step.
    cell = LSTMLNCell(U, epsilon=1e-3)
    cell.build((None, D))
    cell.set_weights(weights)
    h1, (h1b, c1) = cell(x[:, 0], [h0, c0])
    _, ref_h1, ref_c1 = numpy_lstm_ln(weights, x[:, :1], eps=1e-3, h0=h0, c0=c0)
    np.testing.assert_allclose(to_numpy(h1), ref_h1, atol=1e-5)
    np.testing.assert_allclose(to_numpy(h1b), ref_h1, atol=1e-5)
    np.testing.assert_allclose(to_numpy(c1), ref_c1, atol=1e-5)


@pytest.mark.parametrize("which", [0, 1])  # 0: kernel (W_x), 1: recurrent
def test_kernel_scale_invariance(x, rng, which):
    layer = LSTM_LN(U, return_sequences=True)
    layer(x)
    weights = _randomize(layer, rng)
    before = to_numpy(layer(x))
    scaled = list(weights)
    scaled[which] = scaled[which] * 3.7
    layer.set_weights(scaled)
    after = to_numpy(layer(x))
    # Only epsilon breaks the invariance, far below this tolerance.
    np.testing.assert_allclose(after, before, atol=1e-4)
    # The rescaled weights are really in use ...
    np.testing.assert_allclose(layer.get_weights()[which], scaled[which])
    # ... and without the LN the same rescaling would change the outputs.
    assert not np.allclose(_plain_lstm(weights, x), _plain_lstm(scaled, x),
                           atol=1e-2)


def test_trailing_padding_is_masked(rng):
    vocab = 20
    ids = keras.Input(shape=(None,), dtype="int32")
    emb = keras.layers.Embedding(vocab, D, mask_zero=True)(ids)
    out, h, c = LSTM_LN(U, return_state=True)(emb)
    model = keras.Model(ids, [out, h, c])
    tokens = rng.integers(1, vocab, size=(2, 4)).astype("int32")
    padded = np.concatenate([tokens, np.zeros((2, 3), "int32")], axis=1)
    short = [to_numpy(a) for a in model(tokens)]
    long = [to_numpy(a) for a in model(padded)]
    for a, b in zip(short, long):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # Different padding per row: row 0 unpadded length 4, row 1 length 2.
    ragged = padded.copy()
    ragged[1, 2:] = 0
    out_r = to_numpy(model(ragged)[1])
    np.testing.assert_allclose(out_r[1], to_numpy(model(tokens[1:, :2])[1])[0],
                               atol=1e-6)


def test_bidirectional(x):
    layer = keras.layers.Bidirectional(LSTM_LN(U))
    y = layer(x)
    assert tuple(y.shape) == (B, 2 * U)
    assert isinstance(layer.backward_layer, LSTM_LN)
    assert layer.backward_layer.go_backwards
    seq = keras.layers.Bidirectional(LSTM_LN(U, return_sequences=True))(x)
    assert tuple(seq.shape) == (B, T, 2 * U)


def test_dropout_train_vs_inference(x):
    layer = LSTM_LN(U, dropout=0.5, recurrent_dropout=0.5, seed=3)
    infer = to_numpy(layer(x, training=False))
    np.testing.assert_array_equal(infer, to_numpy(layer(x)))
    train = to_numpy(layer(x, training=True))
    assert np.all(np.isfinite(train))
    assert not np.allclose(train, infer)


def test_config_and_keras_round_trip(tmp_path, rng):
    ids = keras.Input(shape=(None,), dtype="int32")
    h = keras.layers.Embedding(30, D, mask_zero=True)(ids)
    h = keras.layers.Bidirectional(
        LSTM_LN(U, return_sequences=True, dropout=0.1, recurrent_dropout=0.2,
                epsilon=1e-4)
    )(h)
    h = LSTM_LN(U, unit_forget_bias=False, name="top")(h)
    model = keras.Model(ids, keras.layers.Dense(2)(h))
    tokens = rng.integers(1, 30, size=(2, 6)).astype("int32")
    tokens[0, 4:] = 0
    expected = to_numpy(model(tokens))

    path = tmp_path / "lstm_ln.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(to_numpy(loaded(tokens)), expected, atol=1e-6)
    top = loaded.get_layer("top")
    assert isinstance(top, LSTM_LN) and top.cell.unit_forget_bias is False

    layer = LSTM_LN(7, dropout=0.25, epsilon=1e-3, go_backwards=True)
    clone = LSTM_LN.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    cell = LSTMLNCell(5, recurrent_dropout=0.3)
    assert LSTMLNCell.from_config(cell.get_config()).get_config() == cell.get_config()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(units=0), "units"),
        (dict(units=-3), "units"),
        (dict(units=2.5), "units"),
        (dict(units=4, dropout=1.5), "dropout"),
        (dict(units=4, dropout=1.0), "dropout"),
        (dict(units=4, recurrent_dropout=-0.1), "recurrent_dropout"),
        (dict(units=4, epsilon=0.0), "epsilon"),
    ],
)
@pytest.mark.parametrize("cls", [LSTM_LN, LSTMLNCell])
def test_bad_arguments(cls, kwargs, name):
    with pytest.raises((ValueError, TypeError), match=f"`{name}`.*{name}="):
        cls(**kwargs)
