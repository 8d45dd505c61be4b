"""Writes the saved-model fixtures of ``test_legacy_attention_files.py``.

Run once from a checkout of commit 32da1ca, when ``MultiHeadAttention`` kept
its weights as its own variables (``query_kernel`` ... ``output_bias``, one
layer, no sub-layers), under TensorFlow:

    PYTHONPATH=/tmp/old-32da1ca python tests/data/make_legacy_attention_files.py

It writes, into ``tests/data/legacy_32da1ca/``, a tiny ``transformer`` (two
layers: the second decoder layer's padded rows depend on the Keras masks
that the first leaves on its tensors) and a model of two
``MultiHeadAttention`` layers (biases and none, a ``value_dim`` and
``output_shape`` of their own), each as ``.keras`` and ``.weights.h5``,
their inputs and their outputs (``.npy``), so that the layer of today is
tested on files that the layer of that commit wrote.
"""

import os
import pathlib

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_trm  # noqa: E402
from keras_trm.layers import MultiHeadAttention  # noqa: E402
from keras_trm.models import transformer  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent / "legacy_32da1ca"


def attention_model():
    query = keras.Input((None, 6), name="query")
    memory = keras.Input((None, 4), name="memory")
    mask = keras.Input((None,), dtype="bool", name="memory_mask")
    x = MultiHeadAttention(num_heads=2, key_dim=3, name="cross")(
        query, memory, value_mask=mask)
    x = MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5,
                           output_shape=7, use_bias=False, name="self")(
        x, x, use_causal_mask=True)
    return keras.Model([query, memory, mask], x)


def main():
    print("keras_trm from", keras_trm.__file__)
    OUT.mkdir(exist_ok=True)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)

    model = attention_model()
    # Non-zero biases, so that a bias read into the wrong place shows.
    model.set_weights([w + rng.normal(size=w.shape).astype("float32") * 0.1
                       for w in model.get_weights()])
    inputs = {"query": rng.normal(size=(2, 3, 6)).astype("float32"),
              "memory": rng.normal(size=(2, 5, 4)).astype("float32"),
              "memory_mask": np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]],
                                      bool)}
    model.save(OUT / "attention.keras")
    model.save_weights(OUT / "attention.weights.h5")
    np.savez(OUT / "attention_inputs.npz", **inputs)
    np.save(OUT / "attention_outputs.npy", np.asarray(
        model([inputs["query"], inputs["memory"], inputs["memory_mask"]])))

    model = transformer(20, num_layers=2, d_model=8, num_heads=2, d_ff=16,
                        max_sequence_length=8, dropout_rate=0.0)
    model.set_weights([w + rng.normal(size=w.shape).astype("float32") * 0.1
                       for w in model.get_weights()])
    inputs = {"encoder_tokens": np.array([[3, 4, 5, 6, 0], [7, 8, 0, 0, 0]],
                                         "int32"),
              "decoder_tokens": np.array([[1, 9, 10, 11], [1, 12, 13, 0]],
                                         "int32")}
    model.save(OUT / "transformer.keras")
    model.save_weights(OUT / "transformer.weights.h5")
    np.savez(OUT / "transformer_inputs.npz", **inputs)
    np.save(OUT / "transformer_outputs.npy", np.asarray(model(inputs)))
    for path in sorted(OUT.iterdir()):
        print(path.name, path.stat().st_size)


if __name__ == "__main__":
    main()
