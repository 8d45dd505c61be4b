"""The REST server answers TF Serving's REST API requests with the export's
outputs (checked against calling the SavedModel signature directly)."""

import base64

import numpy as np
import pytest
import tensorflow as tf

from keras_trm.export import export_module
from keras_trm.serving import create_app


class _Toy(tf.Module):
    """Two signatures: strings -> strings, and two float inputs -> two outputs."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable([[1.0, 2.0], [3.0, 4.0]])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def shout(self, text):
        return {"loud": tf.strings.upper(text) + "!"}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x"),
                                  tf.TensorSpec([None], tf.float32, name="scale")])
    def affine(self, x, scale):
        y = tf.matmul(x, self.w) * scale[:, None]
        return {"y": y, "total": tf.reduce_sum(y, axis=1)}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    toy = _Toy()
    for _ in range(2):  # versions 1 and 2
        export_module(toy, root, "toy",
                      {"serving_default": toy.shout, "affine": toy.affine})
    loaded = tf.saved_model.load(str(root / "toy" / "2"))
    return create_app(root / "toy").test_client(), loaded


def test_status_and_metadata(served):
    client, _ = served
    status = client.get("/v1/models/toy").get_json()
    assert [s["version"] for s in status["model_version_status"]] == ["2", "1"]
    assert all(s["state"] == "AVAILABLE" for s in status["model_version_status"])
    meta = client.get("/v1/models/toy/versions/1/metadata").get_json()
    sigs = meta["metadata"]["signature_def"]["signature_def"]
    assert sigs["affine"]["inputs"]["x"] == {
        "dtype": "float32", "tensor_shape": [-1, 2], "name": "x"}
    assert sigs["serving_default"]["outputs"]["loud"]["dtype"] == "string"
    assert client.get("/v1/models/nope").status_code == 404
    assert client.get("/v1/models/toy/versions/7").status_code == 404


def test_row_and_columnar_strings(served):
    client, loaded = served
    texts = ["hallo welt", "", "ünïcode"]
    want = [t.decode() for t in loaded.signatures["serving_default"](
        text=tf.constant(texts))["loud"].numpy()]
    row = client.post("/v1/models/toy:predict", json={"instances": texts})
    assert row.status_code == 200 and row.get_json() == {"predictions": want}
    col = client.post("/v1/models/toy/versions/2:predict",
                      json={"inputs": {"text": texts}})
    assert col.get_json() == {"outputs": want}
    b64 = client.post("/v1/models/toy:predict", json={"instances": [
        {"b64": base64.b64encode("hallo welt".encode()).decode()}]})
    assert b64.get_json() == {"predictions": [want[0]]}


def test_several_inputs_and_outputs(served):
    client, loaded = served
    x = [[1.0, 0.5], [-2.0, 3.0]]
    scale = [1.0, 0.5]
    want = loaded.signatures["affine"](x=tf.constant(x), scale=tf.constant(scale))
    rows = client.post("/v1/models/toy:predict", json={
        "signature_name": "affine",
        "instances": [{"x": x[i], "scale": scale[i]} for i in range(2)],
    }).get_json()["predictions"]
    np.testing.assert_allclose([r["y"] for r in rows], want["y"].numpy(), rtol=1e-6)
    np.testing.assert_allclose([r["total"] for r in rows], want["total"].numpy(), rtol=1e-6)
    cols = client.post("/v1/models/toy:predict", json={
        "signature_name": "affine", "inputs": {"x": x, "scale": scale}}).get_json()
    np.testing.assert_allclose(cols["outputs"]["y"], want["y"].numpy(), rtol=1e-6)


@pytest.mark.parametrize("body, status, words", [
    ({"instances": ["a"], "inputs": ["a"]}, 400, "exactly one"),
    ({}, 400, "exactly one"),
    ({"signature_name": "nope", "instances": ["a"]}, 404, "nope"),
    ({"signature_name": "affine", "instances": [{"x": [1.0, 2.0]}]}, 400, "scale"),
    ({"signature_name": "affine", "inputs": {"x": [[1.0, 2.0, 3.0]], "scale": [1.0]}},
     400, "shape"),
    ({"signature_name": "affine", "inputs": {"x": [["a", "b"]], "scale": [1.0]}},
     400, "float32"),
])
def test_bad_requests_name_the_problem(served, body, status, words):
    client, _ = served
    response = client.post("/v1/models/toy:predict", json=body)
    assert response.status_code == status
    assert words in response.get_json()["error"]


def test_missing_export_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="model_base_path"):
        create_app(tmp_path / "nothing")
