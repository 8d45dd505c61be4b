"""Files written before ``MultiHeadAttention`` subclassed Keras' layer.

``tests/data/legacy_32da1ca/`` holds a tiny ``transformer`` (two layers,
so that the second decoder layer's padded rows are compared too: they
depend on the Keras masks the first layer leaves on its tensors) and a
model of two attention layers, each saved as ``.keras`` and
``.weights.h5`` by commit 32da1ca
(``tests/data/make_legacy_attention_files.py``), when the layer's eight
weights were its own variables. Today's layer keeps them in Keras'
``EinsumDense`` sub-layers and converts such files on load: the outputs
are the ones recorded then, on every backend.
"""

import pathlib

import keras
import numpy as np
import pytest


DATA = pathlib.Path(__file__).parent / "data" / "legacy_32da1ca"


pytestmark = pytest.mark.portable  # CI runs it under each backend


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def _inputs(name):
    inputs = dict(np.load(DATA / f"{name}_inputs.npz"))
    if name == "attention":
        return [inputs["query"], inputs["memory"], inputs["memory_mask"]]
    return inputs


@pytest.mark.parametrize("name", ["attention", "transformer"])
def test_old_keras_file_loads_with_its_outputs(name):
    model = keras.models.load_model(DATA / f"{name}.keras")
    np.testing.assert_allclose(to_numpy(model(_inputs(name))),
                               np.load(DATA / f"{name}_outputs.npy"),
                               atol=1e-5)


@pytest.mark.parametrize("name", ["attention", "transformer"])
def test_old_weights_file_loads_with_its_outputs(name, tmp_path):
    model = keras.models.load_model(DATA / f"{name}.keras")
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    model.load_weights(DATA / f"{name}.weights.h5")
    expected = np.load(DATA / f"{name}_outputs.npy")
    np.testing.assert_allclose(to_numpy(model(_inputs(name))), expected,
                               atol=1e-5)
    # Saved again, in today's layout (Keras' sub-layers), and read back.
    model.save_weights(tmp_path / "again.weights.h5")
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    model.load_weights(tmp_path / "again.weights.h5")
    np.testing.assert_allclose(to_numpy(model(_inputs(name))), expected,
                               atol=1e-5)


def test_old_file_with_other_weights_is_refused(tmp_path):
    """A file whose attention holds a different number of variables is
    refused with the layer named, not read into the wrong weights."""
    from keras_trm.layers import MultiHeadAttention

    q = keras.Input((None, 6))
    kv = keras.Input((None, 4))
    # use_bias=False: 4 variables, the file's first layer has 8.
    model = keras.Model([q, kv], MultiHeadAttention(2, 3, use_bias=False)(
        q, kv))
    with pytest.raises(ValueError, match="expected 4 variables"):
        model.load_weights(DATA / "attention.weights.h5",
                           skip_mismatch=False)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="the files were written under TensorFlow, whose "
                           "random draws differ from the other backends'")
def test_a_seeded_build_gives_the_weights_of_32da1ca():
    """Under ``set_random_seed(0)`` today's layers start from the weights
    that commit 32da1ca's did (the files hold them plus the generator's
    seeded noise): the same Glorot fans (Keras 3.15 counts them otherwise)
    and the same seeds, drawn in the same order, so that the recipes'
    figures measured then still describe the code of today."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_legacy", DATA.parent / "make_legacy_attention_files.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    built = [w + rng.normal(size=w.shape).astype("float32") * 0.1
             for w in make.attention_model().get_weights()]
    saved = keras.models.load_model(DATA / "attention.keras").get_weights()
    assert len(built) == len(saved) == 12
    for b, s in zip(built, saved):
        np.testing.assert_array_equal(b, s)
