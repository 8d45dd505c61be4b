"""The model server on a toy export: TF Serving's REST API through real
HTTP (``requests``) and its gRPC API through the ``tensorflow-serving-api``
stubs, the JSON errors for malformed requests, config files, batching,
version policy and polling, and graceful shutdown of ``keras-trm serve``.
Everything listens on 127.0.0.1 only and stops by itself."""

import base64
import concurrent.futures
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc, predict_pb2,
    prediction_service_pb2_grpc)

from keras_trm.export import export_module
from keras_trm.serving import (
    BatchingOptions, BatchScheduler, InvalidArgument, ModelManager, ModelServer,
    Unavailable, batching_options, create_app, model_server_config)
from keras_trm.serving.rest import to_array

TIMEOUT = 30  # seconds, for every client call


class _Toy(tf.Module):
    """Two signatures: strings -> strings, and two float inputs -> two outputs."""

    def __init__(self, bias=0.0):
        super().__init__()
        self.w = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
        self.bias = tf.Variable(bias)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def shout(self, text):
        return {"loud": tf.strings.upper(text) + "!"}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x"),
                                  tf.TensorSpec([None], tf.float32, name="scale")])
    def affine(self, x, scale):
        y = tf.matmul(x, self.w) * scale[:, None] + self.bias
        return {"y": y, "total": tf.reduce_sum(y, axis=1)}


def _export(root, name="toy", bias=0.0, version=None):
    toy = _Toy(bias)
    return export_module(toy, root, name,
                         {"serving_default": toy.shout, "affine": toy.affine},
                         version=version)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    _export(root)
    _export(root, bias=10.0)  # versions 1 and 2; the latest (2) is served
    manager = ModelManager(model_server_config([], [root / "toy"]),
                           BatchingOptions(max_batch_size=8, num_batch_threads=1),
                           file_system_poll_wait_seconds=-1)
    server = ModelServer(manager, rest_api_port=0, grpc_port=0,
                         max_request_bytes=64 * 1024).start()
    loaded = tf.saved_model.load(str(root / "toy" / "2"))
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    yield server, f"http://127.0.0.1:{server.rest_api_port}", channel, loaded
    channel.close()
    server.stop(grace=5)


# -- REST -----------------------------------------------------------------------------
def test_rest_status_and_metadata_in_tf_serving_form(server):
    _, url, _, _ = server
    status = requests.get(f"{url}/v1/models/toy", timeout=TIMEOUT).json()
    assert status == {"model_version_status": [
        {"version": "2", "state": "AVAILABLE",
         "status": {"error_code": "OK", "error_message": ""}}]}
    meta = requests.get(f"{url}/v1/models/toy/versions/2/metadata", timeout=TIMEOUT).json()
    assert meta["model_spec"] == {"name": "toy", "signature_name": "", "version": "2"}
    sigs = meta["metadata"]["signature_def"]["signature_def"]
    x = sigs["affine"]["inputs"]["x"]
    assert x["dtype"] == "DT_FLOAT"
    assert x["tensor_shape"] == {"dim": [{"size": "-1", "name": ""},
                                         {"size": "2", "name": ""}],
                                 "unknown_rank": False}
    assert sigs["serving_default"]["outputs"]["loud"]["dtype"] == "DT_STRING"
    assert sigs["serving_default"]["method_name"] == "tensorflow/serving/predict"
    assert requests.get(f"{url}/healthz", timeout=TIMEOUT).status_code == 200
    ready = requests.get(f"{url}/readyz", timeout=TIMEOUT).json()
    assert ready["models"] == ["toy"] and ready["requests_in_flight"] == 0


def test_rest_row_columnar_and_b64(server):
    _, url, _, loaded = server
    texts = ["hallo welt", "", "ünïcode"]
    want = [t.decode() for t in loaded.signatures["serving_default"](
        text=tf.constant(texts))["loud"].numpy()]
    row = requests.post(f"{url}/v1/models/toy:predict", json={"instances": texts},
                        timeout=TIMEOUT)
    assert row.status_code == 200 and row.json() == {"predictions": want}
    col = requests.post(f"{url}/v1/models/toy/versions/2:predict",
                        json={"inputs": {"text": texts}}, timeout=TIMEOUT)
    assert col.json() == {"outputs": want}
    b64 = requests.post(f"{url}/v1/models/toy:predict", json={"instances": [
        {"b64": base64.b64encode("hallo welt".encode()).decode()}]}, timeout=TIMEOUT)
    assert b64.json() == {"predictions": [want[0]]}
    # A non-UTF-8 output comes back as {"b64": ...}.
    raw = requests.post(f"{url}/v1/models/toy:predict", json={"instances": [
        {"b64": base64.b64encode(b"\xff").decode()}]}, timeout=TIMEOUT).json()
    assert base64.b64decode(raw["predictions"][0]["b64"]) == b"\xff!"


def test_rest_several_inputs_and_outputs(server):
    _, url, _, loaded = server
    x, scale = [[1.0, 0.5], [-2.0, 3.0]], [1.0, 0.5]
    want = loaded.signatures["affine"](x=tf.constant(x), scale=tf.constant(scale))
    rows = requests.post(f"{url}/v1/models/toy:predict", json={
        "signature_name": "affine",
        "instances": [{"x": x[i], "scale": scale[i]} for i in range(2)],
    }, timeout=TIMEOUT).json()["predictions"]
    np.testing.assert_allclose([r["y"] for r in rows], want["y"].numpy(), rtol=1e-6)
    np.testing.assert_allclose([r["total"] for r in rows], want["total"].numpy(),
                               rtol=1e-6)
    cols = requests.post(f"{url}/v1/models/toy:predict", json={
        "signature_name": "affine", "inputs": {"x": x, "scale": scale}},
        timeout=TIMEOUT).json()
    np.testing.assert_allclose(cols["outputs"]["y"], want["y"].numpy(), rtol=1e-6)


BAD_BODIES = [
    # (body bytes or JSON, path suffix, status, words in the error)
    (b"this is not JSON", ":predict", 400, "JSON Parse error"),
    (b'{"instances": ["a"', ":predict", 400, "JSON Parse error"),
    (b"\xff\xfe\x00{}", ":predict", 400, "not UTF-8"),
    ([1, 2], ":predict", 400, "JSON object"),
    ({}, ":predict", 400, "exactly one"),
    ({"instances": ["a"], "inputs": ["a"]}, ":predict", 400, "exactly one"),
    ({"instances": "a"}, ":predict", 400, "must be a list"),
    ({"instances": []}, ":predict", 400, "empty"),
    ({"inputs": {"text": []}}, ":predict", 400, "empty"),
    ({"inputs": {}}, ":predict", 400, "empty"),
    ({"instances": [1, 2]}, ":predict", 400, "expects strings"),
    ({"instances": [{"b64": "%%%"}]}, ":predict", 400, "base64"),
    ({"signature_name": 3, "instances": ["a"]}, ":predict", 400, "signature_name"),
    ({"signature_name": "affine", "instances": [{"x": [1.0, 2.0]}]}, ":predict",
     400, "scale"),
    ({"signature_name": "affine", "instances": [{"x": [1.0, 2.0], "scale": 1.0},
                                                {"x": [1.0, 2.0]}]},
     ":predict", 400, "same inputs"),
    ({"signature_name": "affine", "inputs": {"x": [[1.0, 2.0], [3.0]],
                                             "scale": [1.0, 1.0]}},
     ":predict", 400, "ragged"),
    ({"signature_name": "affine", "inputs": {"x": [[1.0, 2.0, 3.0]], "scale": [1.0]}},
     ":predict", 400, "shape"),
    ({"signature_name": "affine", "inputs": {"x": [["a", "b"]], "scale": [1.0]}},
     ":predict", 400, "float32"),
    ({"signature_name": "affine", "inputs": {"x": [[1.0, 2.0]], "scale": [1.0],
                                             "z": [1]}}, ":predict", 400, "unknown"),
    ({"signature_name": "affine", "inputs": {"x": [[1.0, 2.0], [3.0, 4.0]],
                                             "scale": [1.0, 2.0, 3.0]}},
     ":predict", 400, "InvalidArgumentError"),
    ({"signature_name": "nope", "instances": ["a"]}, ":predict", 404, "nope"),
    ({"instances": ["a"]}, "/versions/7:predict", 404, "7"),
    ({"instances": ["a"]}, "/labels/stable:predict", 404, "stable"),
    ({"instances": ["a"]}, ":classify", 501, "classify"),
    (b'{"instances": ["' + b"a" * 70_000 + b'"]}', ":predict", 413, "limit"),
    # Nested deeper than Python's recursion limit, under the size limit.
    (b'{"instances": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", ":predict", 400,
     "nested too deeply"),
    # A scalar in columnar form: the signature takes a list of rows.
    ({"inputs": "A dog."}, ":predict", 400, "shape []"),
    # Numbers a float32 cannot hold, and a boolean, as TF Serving refuses
    # them (they became inf, 16777216 and 1.0).
    ({"signature_name": "affine", "inputs": {"x": [[1e39, 2.0]], "scale": [1.0]}},
     ":predict", 400, "1e+39 is out of the range of float32"),
    ({"signature_name": "affine", "inputs": {"x": [[16777217, 2.0]], "scale": [1.0]}},
     ":predict", 400, "16777217 cannot be a float32 without loss"),
    ({"signature_name": "affine", "instances": [{"x": [1.0, 2.0], "scale": True}]},
     ":predict", 400, "true is a boolean"),
    # Numbers past float64, which TF Serving's parser (rapidjson) refuses:
    # Python's json read the first as inf and passed it on, and the second
    # (5,000 digits) made the error message itself fail.
    (b'{"signature_name": "affine", "inputs": {"x": [[1e400, 2.0]], "scale": [1.0]}}',
     ":predict", 400, "Number too big to be stored in double: 1e400"),
    (b'{"signature_name": "affine", "inputs": {"x": [[' + b"9" * 5000
     + b', 2.0]], "scale": [1.0]}}', ":predict", 400, "(5000 characters)"),
]


@pytest.mark.parametrize("body, suffix, status, words", BAD_BODIES)
def test_malformed_requests_get_json_errors(server, body, suffix, status, words):
    _, url, _, _ = server
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = requests.post(f"{url}/v1/models/toy{suffix}", data=data, timeout=TIMEOUT,
                          headers={"Content-Type": "application/json"})
    assert reply.status_code == status, reply.text
    assert reply.headers["Content-Type"].startswith("application/json")
    assert words in reply.json()["error"]


@pytest.mark.parametrize("value, dtype, words", [
    (2**40, tf.int32, "out of the range of int32"),  # was 0
    (300, tf.uint8, "out of the range of uint8 [0, 255]"),  # was 44
    (-1, tf.uint8, "out of the range of uint8"),  # was 255
    (2**63, tf.int64, "out of the range of int64"),
    (1.5, tf.int32, "1.5 is not an integer"),
    (True, tf.int64, "true is a boolean"),  # was 1
    (1, tf.bool, "1 is not a boolean"),
    (70000.0, tf.float16, "out of the range of float16"),  # was inf
])
def test_numbers_the_dtype_cannot_hold_are_refused(value, dtype, words):
    """JSON numbers become tensor elements only where the dtype holds them
    (TF Serving's rules); tf.constant alone wrapped or rounded them."""
    with pytest.raises(InvalidArgument, match=re.escape(words)):
        to_array([value], tf.TensorSpec([None], dtype), "x")
    for ok, dtype_ok in ((2**31 - 1, tf.int32), (255, tf.uint8), (False, tf.bool),
                         (float("nan"), tf.float32), (2**53 - 1, tf.float64),
                         (65504.0, tf.float16)):
        np.testing.assert_array_equal(
            to_array([ok], tf.TensorSpec([None], dtype_ok), "x"),
            np.array([ok], dtype_ok.as_numpy_dtype))


def test_unknown_routes_models_and_methods_get_json_errors(server):
    _, url, _, _ = server
    for method, path, status in [("get", "/v1/models/nope", 404),
                                 ("get", "/v1/models/toy/versions/7", 404),
                                 ("get", "/v1/models/nope/metadata", 404),
                                 ("post", "/v1/models/nope:predict", 404),
                                 ("get", "/no/such/route", 404),
                                 ("get", "/v1/models/toy:predict", 405),
                                 ("delete", "/v1/models/toy/versions/2", 405)]:
        reply = getattr(requests, method)(url + path, timeout=TIMEOUT)
        assert reply.status_code == status, (path, reply.text)
        assert "error" in reply.json()
    # A request line waitress refuses is answered in JSON as well.
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])),
                                  timeout=TIMEOUT) as sock:
        sock.sendall(b"POST /v1/models/toy:predict HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 999999999\r\n\r\n")
        # The server closes the connection after its answer; headers and
        # body may arrive in separate segments, so read until it does.
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
        answer = b"".join(chunks).decode()
    assert answer.startswith("HTTP/1.1 413") and '{"error":' in answer


def test_server_still_answers_after_bad_requests(server):
    _, url, _, _ = server
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        bad = list(pool.map(lambda b: requests.post(
            f"{url}/v1/models/toy:predict", data=json.dumps(b[0]).encode()
            if not isinstance(b[0], bytes) else b[0], timeout=TIMEOUT).status_code,
            BAD_BODIES[:20] * 3))
    assert all(400 <= s < 500 for s in bad)
    reply = requests.post(f"{url}/v1/models/toy:predict", json={"instances": ["ok"]},
                          timeout=TIMEOUT)
    assert reply.json() == {"predictions": ["OK!"]}


# -- gRPC -----------------------------------------------------------------------------
def test_grpc_predict_metadata_and_status(server):
    _, _, channel, loaded = server
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "toy"
    request.model_spec.signature_name = "affine"
    x = np.array([[1.0, 0.5], [-2.0, 3.0]], np.float32)
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    request.inputs["scale"].CopyFrom(tf.make_tensor_proto(np.array([1.0, 0.5], np.float32)))
    request.output_filter.append("total")
    response = stub.Predict(request, timeout=TIMEOUT)
    want = loaded.signatures["affine"](x=tf.constant(x), scale=tf.constant([1.0, 0.5]))
    assert list(response.outputs) == ["total"]
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["total"]),
                               want["total"].numpy(), rtol=1e-6)
    assert response.model_spec.version.value == 2

    meta_request = get_model_metadata_pb2.GetModelMetadataRequest()
    meta_request.model_spec.name = "toy"
    meta_request.metadata_field.append("signature_def")
    meta = stub.GetModelMetadata(meta_request, timeout=TIMEOUT)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    meta.metadata["signature_def"].Unpack(signature_map)
    assert signature_map.signature_def["affine"].inputs["x"].dtype == tf.float32.as_datatype_enum

    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "toy"
    status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
        status_request, timeout=TIMEOUT)
    assert [(s.version, s.state) for s in status.model_version_status] == [
        (2, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]


def _declared(values, shape):
    """A string TensorProto of ``values`` declaring ``shape``."""
    proto = tf.make_tensor_proto(values)
    del proto.tensor_shape.dim[:]
    for size in shape:
        proto.tensor_shape.dim.add(size=size)
    return proto


def test_grpc_shape_bomb_and_rest_rows_are_refused_by_the_row_limit(server):
    """More rows than max_request_rows (4096 by default) get
    INVALID_ARGUMENT / 400 naming the limit, fast; one value filling a small
    shape is still TensorFlow's splat."""
    _, url, channel, _ = server
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "toy"
    request.inputs["text"].CopyFrom(_declared(["a"], [200_000]))
    assert request.ByteSize() < 100
    start = time.perf_counter()
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(request, timeout=TIMEOUT)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "200000 rows" in err.value.details()
    assert "max_request_rows" in err.value.details()
    assert time.perf_counter() - start < TIMEOUT
    request.inputs["text"].CopyFrom(_declared(["a"], [3]))
    out = stub.Predict(request, timeout=TIMEOUT).outputs["loud"]
    assert tf.make_ndarray(out).tolist() == [b"A!"] * 3
    body = json.dumps({"instances": ["a"] * 5000}).encode()
    reply = requests.post(f"{url}/v1/models/toy:predict", data=body, timeout=TIMEOUT)
    assert reply.status_code == 400 and "max_request_rows" in reply.json()["error"]
    reply = requests.post(f"{url}/v1/models/toy:predict", timeout=TIMEOUT,
                          data=json.dumps({"inputs": ["a"] * 5000}).encode())
    assert reply.status_code == 400 and "5000 rows" in reply.json()["error"]


def _variant():
    proto = tf.make_tensor_proto(["a"])
    proto.dtype = tf.variant.as_datatype_enum
    return proto


@pytest.mark.parametrize("change, code", [
    (lambda r: setattr(r.model_spec, "name", "nope"), grpc.StatusCode.NOT_FOUND),
    (lambda r: r.model_spec.version.CopyFrom(type(r.model_spec.version)(value=7)),
     grpc.StatusCode.NOT_FOUND),
    (lambda r: setattr(r.model_spec, "signature_name", "nope"), grpc.StatusCode.NOT_FOUND),
    (lambda r: r.inputs["text"].CopyFrom(tf.make_tensor_proto([1.0])),
     grpc.StatusCode.INVALID_ARGUMENT),
    (lambda r: r.inputs["extra"].CopyFrom(tf.make_tensor_proto([1.0])),
     grpc.StatusCode.INVALID_ARGUMENT),
    (lambda r: r.inputs["text"].CopyFrom(tf.make_tensor_proto([["a"]])),
     grpc.StatusCode.INVALID_ARGUMENT),
    (lambda r: r.output_filter.append("nope"), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda r: r.inputs["text"].CopyFrom(tf.make_tensor_proto(["a" * 70_000])),
     grpc.StatusCode.RESOURCE_EXHAUSTED),
    # A 47-byte shape bomb: one value declared as 200,000 rows (TensorFlow
    # would repeat it), refused before it is expanded.
    (lambda r: r.inputs["text"].CopyFrom(_declared(["a"], [200_000])),
     grpc.StatusCode.INVALID_ARGUMENT),
    (lambda r: r.inputs["text"].CopyFrom(_declared(["a", "b"], [3])),
     grpc.StatusCode.INVALID_ARGUMENT),
    # A dtype no request can carry; TensorFlow's own message is just "21".
    (lambda r: r.inputs["text"].CopyFrom(_variant()), grpc.StatusCode.INVALID_ARGUMENT),
])
def test_grpc_errors_carry_tf_serving_codes(server, change, code):
    _, _, channel, _ = server
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "toy"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(["a"]))
    change(request)
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(request, timeout=TIMEOUT)
    assert err.value.code() == code, err.value.details()
    if request.inputs["text"].dtype == tf.variant.as_datatype_enum:
        assert "dtype DT_VARIANT" in err.value.details()
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "toy"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(["still fine"]))
    out = stub.Predict(request, timeout=TIMEOUT).outputs["loud"]
    assert tf.make_ndarray(out).tolist() == [b"STILL FINE!"]


# -- batching -------------------------------------------------------------------------
def _wait_for(predicate, what):
    """Polls ``predicate`` until it holds; fails after TIMEOUT seconds. The
    wait only bounds the test: what it waits for is certain to happen."""
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_concurrent_requests_are_merged_and_split_back(server):
    """While the only batch thread is busy, concurrent requests queue up and
    are merged into batches; each gets its own rows back."""
    srv, url, _, _ = server
    with srv.manager.acquire("toy") as servable:
        batcher = servable._batcher
        before = servable.batch_stats
        run, entered, gate = batcher._run, threading.Event(), threading.Event()

        def held_run(signature, inputs):  # the first batch waits for the gate
            entered.set()
            gate.wait(TIMEOUT)
            return run(signature, inputs)

        def one(i):
            reply = requests.post(f"{url}/v1/models/toy:predict",
                                  json={"instances": [f"s{i}"] * (1 + i % 3)},
                                  timeout=TIMEOUT)
            return reply.json()["predictions"]

        batcher._run = held_run
        try:
            with concurrent.futures.ThreadPoolExecutor(12) as pool:
                futures = [pool.submit(one, i) for i in range(48)]
                _wait_for(entered.is_set, "the first batch")
                # every client's request is now in the held batch or queued
                _wait_for(lambda: batcher.queued_tasks() + batcher.stats["tasks"]
                          - before.get("tasks", 0) == 12, "12 requests in")
                gate.set()
                answers = [f.result(TIMEOUT) for f in futures]
        finally:
            batcher._run = run
            gate.set()
        after = servable.batch_stats
    assert answers == [[f"S{i}!"] * (1 + i % 3) for i in range(48)]
    tasks = after["tasks"] - before.get("tasks", 0)
    batches = after["batches"] - before.get("batches", 0)
    assert tasks == 48
    assert after["rows"] - before.get("rows", 0) == sum(1 + i % 3 for i in range(48))
    # A batch closed because the next task did not fit holds >= 6 of its 8
    # rows, so >= 2 tasks of 1-3 rows: the 11-12 requests queued or held
    # while the gate was shut took at most 7 batches.
    assert batches <= 48 - 5, (tasks, batches)


def test_batch_scheduler_semantics():
    calls = []
    entered, gate = threading.Event(), threading.Event()

    def run(signature, inputs):
        entered.set()
        gate.wait(TIMEOUT)
        calls.append(len(inputs["x"]))
        return {"y": inputs["x"] * 2}

    options = BatchingOptions(max_batch_size=4, num_batch_threads=1,
                              max_enqueued_batches=2, allowed_batch_sizes=(2, 4))
    scheduler = BatchScheduler(run, options, name="unit")
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            first = pool.submit(scheduler.schedule, "s", {"x": np.array([0.0])})
            _wait_for(entered.is_set, "the batch thread to take the first task")
            more = [pool.submit(scheduler.schedule, "s", {"x": np.array([i, i], float)})
                    for i in range(1, 5)]
            _wait_for(lambda: scheduler.queued_tasks("s") == 4, "4 queued tasks")
            # 2 batches of 2 tasks wait: the queue is full
            with pytest.raises(Unavailable, match="queue"):
                scheduler.schedule("s", {"x": np.array([9.0])})
            with pytest.raises(InvalidArgument, match="larger than maximum"):
                scheduler.schedule("s", {"x": np.zeros(5)})
            gate.set()
            assert first.result(TIMEOUT)["y"].tolist() == [0.0]
            assert [m.result(TIMEOUT)["y"].tolist() for m in more] == [
                [2 * i, 2 * i] for i in range(1, 5)]
        assert calls == [2, 4, 4]  # 1 row padded to 2; then two full batches
        assert scheduler.queued_tasks() == 0
    finally:
        gate.set()
        scheduler.stop()


def test_batching_parameters_and_model_config_files(tmp_path):
    path = tmp_path / "batching.txt"
    path.write_text("max_batch_size { value: 32 }\nbatch_timeout_micros { value: 500 }\n"
                    "num_batch_threads { value: 2 }\nmax_enqueued_batches { value: 7 }\n"
                    "allowed_batch_sizes: 16\nallowed_batch_sizes: 32\n")
    assert batching_options(path) == BatchingOptions(32, 500, 2, 7, (16, 32))
    path.write_text("max_batch_size { value: 0 }")
    with pytest.raises(ValueError, match="max_batch_size=0"):
        batching_options(path)
    path.write_text("max_batch_sise { value: 8 }")
    with pytest.raises(ValueError, match="max_batch_sise"):
        batching_options(path)
    config = tmp_path / "models.config"
    config.write_text('model_config_list { config { name: "a" base_path: "x/a" '
                      'model_platform: "tensorflow" model_version_policy { all {} } } '
                      'config { base_path: "/srv/b" } }')
    parsed = model_server_config(model_config_file=config)
    assert [(m.name, m.base_path) for m in parsed.model_config_list.config] == [
        ("a", str(tmp_path / "x" / "a")), ("b", "/srv/b")]
    with pytest.raises(ValueError, match="not both"):
        model_server_config(["a"], ["x"], config)
    config.write_text("model_config_list { config { name: 3 } }")
    with pytest.raises(ValueError, match="models.config"):
        model_server_config(model_config_file=config)


# -- versions -------------------------------------------------------------------------
def _states(manager, name):
    return {v: state for v, state, _ in manager.status(name)}


def test_version_policies_labels_and_several_models(tmp_path):
    for _ in range(3):
        _export(tmp_path, "a")
    _export(tmp_path, "b")
    config = tmp_path / "models.config"
    config.write_text(
        'model_config_list {\n'
        f' config {{ name: "a" base_path: "{tmp_path / "a"}" '
        ' model_version_policy { specific { versions: 1 versions: 3 } }'
        ' version_labels { key: "stable" value: 1 } }\n'
        f' config {{ name: "all_a" base_path: "{tmp_path / "a"}" '
        ' model_version_policy { all {} } }\n'
        f' config {{ name: "b" base_path: "{tmp_path / "b"}" }}\n}}\n')
    manager = ModelManager(model_server_config(model_config_file=config),
                           file_system_poll_wait_seconds=-1)
    manager.start()
    try:
        assert _states(manager, "a") == {1: "AVAILABLE", 3: "AVAILABLE"}
        assert _states(manager, "all_a") == {1: "AVAILABLE", 2: "AVAILABLE",
                                             3: "AVAILABLE"}
        assert _states(manager, "b") == {1: "AVAILABLE"}
        app = create_app(manager).test_client()
        assert app.get("/v1/models/a/labels/stable").get_json()[
            "model_version_status"][0]["version"] == "1"
        reply = app.post("/v1/models/a/labels/stable:predict", json={"instances": ["x"]})
        assert reply.get_json() == {"predictions": ["X!"]}
        assert app.post("/v1/models/a/versions/2:predict",
                        json={"instances": ["x"]}).status_code == 404
    finally:
        manager.stop()


def test_new_version_loads_before_the_old_one_unloads(tmp_path):
    _export(tmp_path, "toy")
    manager = ModelManager(model_server_config([], [tmp_path / "toy"]),
                           BatchingOptions(max_batch_size=4),
                           file_system_poll_wait_seconds=0.2)
    server = ModelServer(manager, rest_api_port=0, grpc_port=None).start()
    url = f"http://127.0.0.1:{server.rest_api_port}/v1/models/toy"
    stop = threading.Event()
    results = []

    def client():
        while not stop.is_set():
            reply = requests.post(url + ":predict", timeout=TIMEOUT, json={
                "signature_name": "affine", "instances": [{"x": [0.0, 0.0], "scale": 1}]})
            results.append((reply.status_code, reply.json()))

    threads = [threading.Thread(target=client) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        _wait_for(lambda: len(results) >= 4, "answers from version 1")
        _export(tmp_path, "toy", bias=1.0)  # version 2, renamed into place
        deadline = time.monotonic() + 60
        while _states(manager, "toy") != {2: "AVAILABLE", 1: "END"}:
            assert time.monotonic() < deadline, _states(manager, "toy")
            time.sleep(0.1)
        swapped = len(results)
        _wait_for(lambda: len(results) >= swapped + 8, "answers after the swap")
    finally:
        stop.set()
        for thread in threads:
            thread.join(TIMEOUT)
        server.stop(grace=5)
    assert results and all(status == 200 for status, _ in results), results[-3:]
    biases = [body["predictions"][0]["total"] for _, body in results]
    assert biases[0] == 0.0 and biases[-1] == 2.0  # bias 1 on both outputs of y


def test_stop_closes_the_rest_port_even_when_waitress_wake_up_pipe_is_gone(
        tmp_path, monkeypatch):
    """CI once saw EBADF from the pipe ``stop()`` uses to wake waitress' loop;
    ``stop()`` must still close the port and end the loop thread."""
    import errno

    _export(tmp_path, "toy")
    manager = ModelManager(model_server_config([], [tmp_path / "toy"]),
                           BatchingOptions(max_batch_size=4),
                           file_system_poll_wait_seconds=-1)
    server = ModelServer(manager, rest_api_port=0, grpc_port=None).start()
    url = f"http://127.0.0.1:{server.rest_api_port}/v1/models/toy"
    assert requests.get(url, timeout=TIMEOUT).status_code == 200

    def broken_pipe():
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(server._rest.trigger, "_physical_pull", broken_pipe)
    server.stop(grace=5)
    assert not server._rest_thread.is_alive()
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=TIMEOUT)


def test_a_port_in_use_is_named_and_nothing_is_left_running(tmp_path):
    """A port another process holds: ``start()`` raises ``OSError`` naming
    the port's argument and address, unloads the models and closes the port
    it had already bound (the models stay loaded if the caller had started
    the manager); ``keras-trm serve`` says why in one line and exits
    1 (no traceback), as it does for a base path that is not a folder."""
    _export(tmp_path, "toy")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for rest_api_port, grpc_port, name in ((port, 0, "rest_api_port"),
                                               (0, port, "grpc_port")):
            manager = ModelManager(model_server_config([], [tmp_path / "toy"]), None,
                                   file_system_poll_wait_seconds=-1)
            server = ModelServer(manager, rest_api_port=rest_api_port,
                                 grpc_port=grpc_port)
            with pytest.raises(OSError, match=f"{name} {port}: cannot listen on "
                                              f"127.0.0.1:{port}"):
                server.start()
            assert _states(manager, "toy") == {1: "END"}
            if name == "rest_api_port":  # gRPC had started on a free port
                _wait_for(lambda: _can_bind(server.grpc_port),
                          "the gRPC port to be closed again")
        # A manager the caller started stays theirs: its models stay loaded.
        manager = ModelManager(model_server_config([], [tmp_path / "toy"]), None,
                               file_system_poll_wait_seconds=-1)
        manager.start()
        try:
            with pytest.raises(OSError, match=f"rest_api_port {port}"):
                ModelServer(manager, rest_api_port=port, grpc_port=None).start()
            assert _states(manager, "toy") == {1: "AVAILABLE"}
        finally:
            manager.stop()
        assert _states(manager, "toy") == {1: "END"}
    proc = subprocess.run(
        [sys.executable, "-m", "keras_trm.cli", "serve",
         "--model_base_path", str(tmp_path / "nothing")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"keras-trm serve: `model_base_path` '{tmp_path / 'nothing'}'" in proc.stderr
    assert "Traceback" not in proc.stderr


def _can_bind(port):
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_missing_export_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="model_base_path"):
        create_app(tmp_path / "nothing")


# -- warm-up requests (assets.extra/tf_serving_warmup_requests) ---------------------
class _Counter(tf.Module):
    """Answers each request with the number of calls so far."""

    def __init__(self):
        super().__init__()
        self.calls = tf.Variable(0, dtype=tf.int64)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def count(self, text):
        return {"calls": tf.fill(tf.shape(text), self.calls.assign_add(1))}


def test_warmup_requests_are_replayed_at_load_as_tf_serving_does(tmp_path):
    from tensorflow_serving.apis import prediction_log_pb2

    from keras_trm.export.warmup import warmup_path
    from keras_trm.serving.manager import ServableVersion

    counter = _Counter()
    warmup = [("serving_default", {"text": ["a"]}),
              ("serving_default", {"text": ["b", "c"]})]
    path = export_module(counter, tmp_path, "counter",
                         {"serving_default": counter.count},
                         warmup_requests=warmup)
    # TF Serving's format: a TFRecord file of PredictionLog protos.
    logs = [prediction_log_pb2.PredictionLog.FromString(r.numpy())
            for r in tf.data.TFRecordDataset(str(warmup_path(path)))]
    assert [log.predict_log.request.model_spec.signature_name for log in logs] == [
        "serving_default"] * 2
    assert [list(log.predict_log.request.inputs["text"].string_val)
            for log in logs] == [[b"a"], [b"b", b"c"]]
    version = ServableVersion("counter", 1, path)
    version.load()
    assert version.state == "AVAILABLE" and version.warmup_requests == 2
    # Both requests ran through the loaded model before the first client's.
    out = version.predict("serving_default", {"text": np.array([b"x"], object)})
    assert out["calls"].tolist() == [3]
    version.unload()


def test_bad_warmup_requests_fail_the_export_or_the_load(tmp_path):
    from keras_trm.export.warmup import warmup_path, write_warmup_requests
    from keras_trm.serving.manager import ServableVersion

    counter = _Counter()
    with pytest.raises(ValueError, match=r"warmup_requests\[0\].*'predict'"):
        export_module(counter, tmp_path, "counter",
                      {"serving_default": counter.count},
                      warmup_requests=[("predict", {"text": ["a"]})])
    assert not (tmp_path / "counter").exists()  # nothing written, checked first
    path = export_module(counter, tmp_path, "counter",
                         {"serving_default": counter.count})
    # A request the model refuses (wrong input name): the load fails, as in
    # TF Serving, and says which record.
    warmup_path(path).parent.mkdir()
    write_warmup_requests(warmup_path(path), [
        ("serving_default", {"text": ["a"]}), ("serving_default", {"words": ["b"]})])
    version = ServableVersion("counter", 1, path)
    with pytest.raises(ValueError, match="warm-up request 1 of .* failed"):
        version.load()
    assert version.state == "END" and "warm-up request 1" in version.error
    warmup_path(path).write_bytes(b"not a TFRecord")
    with pytest.raises(ValueError, match="tf_serving_warmup_requests' is not a "
                                         "TFRecord file"):
        ServableVersion("counter", 1, path).load()
    with pytest.raises(ValueError, match="1 to 1000"):
        write_warmup_requests(warmup_path(path), [])


# -- keras-trm serve ------------------------------------------------------------------
def test_cli_takes_tf_serving_flags_and_drains_on_sigterm(tmp_path, free_ports):
    """A slow request in flight when SIGTERM arrives still gets its answer;
    the process then exits 0."""

    toy = _Toy()
    export_module(toy, tmp_path, "toy", {"serving_default": toy.shout})
    batching = tmp_path / "batching.txt"
    batching.write_text("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 1500000 }\n")
    monitoring = tmp_path / "monitoring.txt"
    monitoring.write_text('prometheus_config { enable: true path: "/metrics" }\n')
    for attempt in range(3):
        rest, grpc_port = free_ports(2)
        log = open(tmp_path / "server.log", "w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "keras_trm.cli", "serve", f"--rest_api_port={rest}",
             "--port", str(grpc_port), "--model_name", "shout", "--model-base-path",
             str(tmp_path / "toy"), "--enable_batching", "--batching_parameters_file",
             str(batching), "--file_system_poll_wait_seconds", "0",
             "--tensorflow_intra_op_parallelism=1",
             "--tensorflow-inter-op-parallelism", "2",
             "--monitoring_config_file", str(monitoring)],
            stdout=subprocess.PIPE, stderr=log, text=True)
        line = proc.stdout.readline()  # printed once listening
        if line or proc.wait(TIMEOUT) != 1 or "cannot listen" not in (
                tmp_path / "server.log").read_text():
            break
        # A port was taken between free_ports() and the bind: new ports.
        proc.stdout.close()
        log.close()
    try:
        assert line, (tmp_path / "server.log").read_text()[-3000:]
        started = json.loads(line)
        assert started["rest_api_port"] == rest
        # The thread flags reached TensorFlow in the server process.
        assert started["tensorflow_threads"] == {"intra_op": 1, "inter_op": 2}
        url = f"http://127.0.0.1:{rest}"
        assert requests.get(f"{url}/readyz", timeout=TIMEOUT).status_code == 200
        # --monitoring_config_file: TF Serving's metrics at the file's path.
        assert requests.post(f"{url}/v1/models/shout/versions/7:predict",
                             json={"instances": ["x"]}, timeout=TIMEOUT).status_code == 404
        metrics = requests.get(f"{url}/metrics", timeout=TIMEOUT)
        assert metrics.headers["Content-Type"].startswith("text/plain")
        assert (':tensorflow:serving:request_count_total{model_name="shout",'
                'status="NOT_FOUND"} 1.0') in metrics.text
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            # batch_timeout_micros 1.5 s keeps this request in flight.
            pending = pool.submit(requests.post, f"{url}/v1/models/shout:predict",
                                  json={"instances": ["bye"]}, timeout=TIMEOUT)
            _wait_for(lambda: requests.get(f"{url}/readyz", timeout=TIMEOUT).json()[
                "requests_in_flight"] == 1, "the request to reach the server")
            assert not pending.done()
            proc.send_signal(signal.SIGTERM)
            reply = pending.result(TIMEOUT)
        assert reply.status_code == 200 and reply.json() == {"predictions": ["BYE!"]}
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
        proc.stdout.close()
        log.close()
    # Unloading logs what batching did: the one request ran in one batch.
    assert "batching: 1 requests in 1 batches (1.00 rows per batch)" in (
        tmp_path / "server.log").read_text()


class _Spin(tf.Module):
    """A model that computes for as long as it is asked (``steps`` loop
    iterations): a server busy in a request."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="steps")])
    def spin(self, steps):
        n = tf.cast(steps[0], tf.int64)
        _, total = tf.while_loop(lambda i, t: i < n,
                                 lambda i, t: (i + 1, t + tf.sin(t + 1.0)),
                                 (tf.constant(0, tf.int64), tf.constant(0.0)))
        return {"total": tf.fill(tf.shape(steps), total)}


def test_sigterm_ends_a_busy_server_within_its_grace(tmp_path, free_ports):
    """A request that would compute for minutes is in a model when SIGTERM
    arrives: the process exits (status 0) within the grace period plus a
    margin, not when the computation ends."""
    spin = _Spin()
    export_module(spin, tmp_path, "spin", {"serving_default": spin.spin})
    rest, grpc_port = free_ports(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "keras_trm.cli", "serve", f"--rest_api_port={rest}",
         "--port", str(grpc_port), "--model_name", "spin", "--model_base_path",
         str(tmp_path / "spin"), "--file_system_poll_wait_seconds", "0",
         "--shutdown_grace_seconds", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert line, "the server did not start"
        import psutil

        server = psutil.Process(proc.pid)
        busy_from = sum(server.cpu_times()[:2])
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "spin"
        # About 10^9 loop iterations: minutes of work. gRPC's worker threads
        # are joined when the interpreter exits, so this kept the process
        # alive after "server stopped".
        request.inputs["steps"].CopyFrom(tf.make_tensor_proto([1e9], tf.float32))
        pending = prediction_service_pb2_grpc.PredictionServiceStub(
            channel).Predict.future(request, timeout=TIMEOUT)
        _wait_for(lambda: sum(server.cpu_times()[:2]) > busy_from + 2.0,
                  "the server to compute the request")
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0
        assert time.monotonic() - start < 1 + 15
        assert not pending.done() or pending.exception() is not None
        channel.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
        proc.stdout.close()


def test_cli_refuses_bad_thread_flags_before_touching_tensorflow(tmp_path, capsys):
    from keras_trm import cli

    code = cli.main(["serve", "--model_base_path", str(tmp_path),
                     "--tensorflow_intra_op_parallelism", "-1"])
    assert code == 2
    assert ("--tensorflow_intra_op_parallelism must be an int >= 0, got -1"
            in capsys.readouterr().err)


@pytest.mark.parametrize("flag, value, words", [
    # --port -1 and 70000 started a server; 0 bytes or rows was a traceback;
    # NaN seconds and a negative grace were taken.
    ("--port", "70000", "in [0, 65535], got '70000'"),
    ("--port", "-1", "in [0, 65535], got '-1'"),
    ("--rest_api_port", "x", "in [0, 65535], got 'x'"),
    ("--max_request_bytes", "0", ">= 1, got '0'"),
    ("--max_request_rows", "-3", ">= 1, got '-3'"),
    ("--rest_api_num_threads", "0", ">= 1, got '0'"),
    ("--file_system_poll_wait_seconds", "nan", "finite number, got 'nan'"),
    ("--shutdown_grace_seconds", "-5", "finite number >= 0.0, got '-5'"),
])
def test_cli_refuses_out_of_range_flags_as_usage_errors(tmp_path, capsys, flag, value,
                                                         words):
    from keras_trm import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", "--model_base_path", str(tmp_path), flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and words in err, err


# -- Prometheus metrics (--monitoring_config_file) -----------------------------------
def test_prometheus_metrics_count_rest_and_grpc_requests_as_tf_serving(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    _export(tmp_path)
    manager = ModelManager(model_server_config([], [tmp_path / "toy"]),
                           file_system_poll_wait_seconds=-1)
    server = ModelServer(manager, rest_api_port=0, grpc_port=0,
                         monitoring_path="/monitoring/prometheus/metrics").start()
    url = f"http://127.0.0.1:{server.rest_api_port}"
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        for body, code in (({"instances": ["a"]}, 200), ({"instances": ["b"]}, 200),
                           ({"instances": [1.5]}, 400)):
            reply = requests.post(f"{url}/v1/models/toy:predict", json=body,
                                  timeout=TIMEOUT)
            assert reply.status_code == code
        assert requests.get(f"{url}/v1/models/nope", timeout=TIMEOUT).status_code == 404
        assert requests.get(f"{url}/v1/models/toy/metadata", timeout=TIMEOUT).ok
        assert requests.get(f"{url}/healthz", timeout=TIMEOUT).ok  # names no model
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "toy"
        request.inputs["text"].CopyFrom(tf.make_tensor_proto(["c"]))
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert stub.Predict(request, timeout=TIMEOUT).outputs["loud"].string_val == [b"C!"]
        request.model_spec.signature_name = "nope"
        with pytest.raises(grpc.RpcError):
            stub.Predict(request, timeout=TIMEOUT)
        status_request = get_model_status_pb2.GetModelStatusRequest()
        status_request.model_spec.name = "toy"
        model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            status_request, timeout=TIMEOUT)
        reply = requests.get(f"{url}/monitoring/prometheus/metrics", timeout=TIMEOUT)
        assert reply.status_code == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(reply.text)}
    finally:
        channel.close()
        server.stop(grace=5)

    counts = {(s.labels["model_name"], s.labels["status"]): s.value
              for s in families[":tensorflow:serving:request_count"].samples
              if s.name.endswith("_total")}
    assert counts == {("toy", "OK"): 5.0, ("toy", "INVALID_ARGUMENT"): 1.0,
                      ("nope", "NOT_FOUND"): 1.0, ("toy", "NOT_FOUND"): 1.0}
    latency = families[":tensorflow:serving:request_latency"].samples
    calls = {(s.labels["model_name"], s.labels["API"], s.labels["entrypoint"]): s.value
             for s in latency if s.name.endswith("_count")}
    assert calls == {("toy", "Predict", "REST"): 3.0, ("nope", "GetModelStatus", "REST"): 1.0,
                     ("toy", "GetModelMetadata", "REST"): 1.0,
                     ("toy", "Predict", "GRPC"): 2.0, ("toy", "GetModelStatus", "GRPC"): 1.0}
    # Microseconds, as TF Serving: 3 REST predictions took between 1 µs and 1 min.
    total = [s.value for s in latency if s.name.endswith("_sum")
             and s.labels["API"] == "Predict" and s.labels["entrypoint"] == "REST"]
    assert 3 <= total[0] <= 3 * 60e6


def test_monitoring_config_file_as_tf_serving_reads_it(tmp_path):
    from keras_trm.serving import monitoring_path

    def config(text):
        path = tmp_path / "monitoring.txt"
        path.write_text(text)
        return str(path)

    assert monitoring_path(None) is None
    assert monitoring_path(config("prometheus_config { enable: true }")) == (
        "/monitoring/prometheus/metrics")
    assert monitoring_path(config('prometheus_config { enable: true path: "/m" }')) == "/m"
    assert monitoring_path(config('prometheus_config { path: "/m" }')) is None
    with pytest.raises(ValueError, match="monitoring_config_file.*must start with '/'"):
        monitoring_path(config('prometheus_config { enable: true path: "m" }'))
    with pytest.raises(ValueError, match="monitoring_config_file.*MonitoringConfig"):
        monitoring_path(config("prometheus_config { enabled: true }"))
    with pytest.raises(ValueError, match="monitoring_config_file"):
        monitoring_path(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="rest_api_port=None"):
        ModelServer(None, rest_api_port=None, monitoring_path="/m")


def test_odd_or_broken_version_folders_never_stop_the_scan(tmp_path):
    """A folder named by a non-ASCII digit made int() fail and stopped every
    model's scan (and the start-up); a "0010" folder was loaded from
    "10"; a deleted base path unloaded every version it served (TF Serving
    logs a failed poll and keeps them); a version that failed three loads
    was never tried again, even once its folder was replaced."""
    import shutil

    _export(tmp_path, "a")
    _export(tmp_path, "b")
    shutil.copytree(tmp_path / "a" / "1", tmp_path / "a" / "\u00b2")
    shutil.copytree(tmp_path / "a" / "1", tmp_path / "a" / "0010")
    manager = ModelManager(model_server_config([], [tmp_path / "a", tmp_path / "b"]),
                           file_system_poll_wait_seconds=-1)
    manager.start()
    try:
        assert _states(manager, "a") == {10: "AVAILABLE"}
        _export(tmp_path, "b")
        manager.refresh()
        assert _states(manager, "b") == {1: "END", 2: "AVAILABLE"}
        shutil.rmtree(tmp_path / "b")
        manager.refresh()
        assert _states(manager, "b")[2] == "AVAILABLE"
        bad = tmp_path / "a" / "11"
        shutil.copytree(tmp_path / "a" / "1", bad)
        (bad / "saved_model.pb").write_bytes(b"not a SavedModel")
        for _ in range(4):
            manager.refresh()
        assert _states(manager, "a") == {10: "AVAILABLE", 11: "END"}
        shutil.rmtree(bad)
        shutil.copytree(tmp_path / "a" / "1", bad)
        manager.refresh()
        assert _states(manager, "a") == {10: "END", 11: "AVAILABLE"}
    finally:
        manager.stop()


@pytest.mark.parametrize("files, flags, words", [
    # A missing file or a folder was a traceback (exit 1); a non-UTF-8 file
    # named neither the flag nor the file; a batching file without
    # --enable_batching was ignored (TF Serving refuses it).
    ({}, ["--model_config_file", "nope.cfg"],
     "`model_config_file` 'nope.cfg' cannot be read: No such file"),
    ({}, ["--model_config_file", "."], "`model_config_file` '.' cannot be read"),
    ({"m.cfg": b"model_config_list { } # caf\xe9"}, ["--model_config_file", "m.cfg"],
     "`model_config_file` 'm.cfg' is not UTF-8 text"),
    ({}, ["--model_base_path", ".", "--enable_batching", "--batching_parameters_file",
          "nope.cfg"], "`batching_parameters_file` 'nope.cfg' cannot be read"),
    ({"b.cfg": b"max_batch_size { value: 4 }"},
     ["--model_base_path", ".", "--batching_parameters_file", "b.cfg"],
     "--batching_parameters_file is set without --enable_batching"),
    # A wait past a day killed the batch threads (their requests hung).
    ({"b.cfg": b"batch_timeout_micros { value: 9223372036854775807 }"},
     ["--model_base_path", ".", "--enable_batching", "--batching_parameters_file", "b.cfg"],
     "batch_timeout_micros` must be an int in [0, 86400000000]"),
    ({"b.cfg": b"num_batch_threads { value: 100000000 }"},
     ["--model_base_path", ".", "--enable_batching", "--batching_parameters_file", "b.cfg"],
     "num_batch_threads` must be an int in [1, 1024]"),
    # Names the REST paths cannot reach (GET /v1/models/a:b was a 405).
    ({"m.cfg": b'model_config_list { config { name: "a:b" base_path: "/m" } }'},
     ["--model_config_file", "m.cfg"], "model name 'a:b'"),
    ({"m.cfg": b'model_config_list { config { name: "a/b" base_path: "/m" } }'},
     ["--model_config_file", "m.cfg"], "model name 'a/b'"),
    # A metrics path that would answer in place of an API route.
    ({"mon.cfg": b'prometheus_config { enable: true path: "/healthz" }'},
     ["--model_base_path", ".", "--monitoring_config_file", "mon.cfg"],
     "is a route of the REST API"),
    ({"mon.cfg": b"prometheus_config { enable: true } # caf\xe9"},
     ["--model_base_path", ".", "--monitoring_config_file", "mon.cfg"],
     "`monitoring_config_file` 'mon.cfg' is not UTF-8 text"),
])
def test_cli_refuses_bad_config_files_in_one_line(tmp_path, monkeypatch, capsys, files,
                                                  flags, words):
    from keras_trm import cli

    monkeypatch.chdir(tmp_path)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    assert cli.main(["serve", *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err
