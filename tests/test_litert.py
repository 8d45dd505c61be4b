"""LiteRT (TFLite) export: the .tflite graph gives the Keras model's outputs
with builtin kernels only (the LiteRT interpreter, no Flex delegate)."""

import numpy as np
import pytest

from keras_trm.export.litert import export_litert, litert_predict
from keras_trm.models import encoder_classifier, lenet_cnn, transformer

from conftest import random_ids


def test_lenet_layer_norm(tmp_path, rng):
    model = lenet_cnn(norm="layer")
    images = rng.integers(0, 256, (3, 28, 28)).astype("uint8")
    path = export_litert(model, tmp_path / "lenet.tflite")
    np.testing.assert_allclose(litert_predict(path, images),
                               model.predict(images, verbose=0), atol=1e-5)


def test_encoder_classifier_with_padding(tmp_path, rng):
    model = encoder_classifier(500, num_layers=1, d_model=16, num_heads=2,
                               d_ff=32, max_length=64)
    ids = random_ids(rng, (3, 24), 500, pad_from=[24, 10, 3])
    path = export_litert(model, tmp_path / "encoder.tflite")
    got = litert_predict(path, ids)
    np.testing.assert_allclose(got, model.predict(ids, verbose=0), atol=1e-5)
    # another batch size and length through the same file
    ids = random_ids(rng, (5, 40), 500, pad_from=[40, 1, 7, 20, 39])
    np.testing.assert_allclose(litert_predict(path, ids),
                               model.predict(ids, verbose=0), atol=1e-5)


def test_transformer_teacher_forced(tmp_path, rng):
    model = transformer(300, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                        max_length=32)
    inputs = {"encoder_tokens": random_ids(rng, (2, 9), 300, pad_from=[9, 4]),
              "decoder_tokens": random_ids(rng, (2, 7), 300, pad_from=[7, 5])}
    path = export_litert(model, tmp_path / "transformer.tflite")
    np.testing.assert_allclose(litert_predict(path, inputs),
                               model.predict(inputs, verbose=0), atol=1e-4)


def test_bad_arguments_and_no_partial_file(tmp_path):
    model = lenet_cnn()
    with pytest.raises(ValueError, match="tflite"):
        export_litert(model, tmp_path / "model.bin")
    (tmp_path / "taken.tflite").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="taken.tflite"):
        export_litert(model, tmp_path / "taken.tflite")
    with pytest.raises(Exception):
        export_litert(model, tmp_path / "bad.tflite", input_signature="nonsense")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.tflite"]
