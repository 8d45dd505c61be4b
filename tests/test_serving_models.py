"""The model server on real exports of the project (tiny, untrained): the
raw-text translator, the IMDB review classifier and the Transformer-XL
language model, served together with batching on. Each answer, through REST
(``requests``) and gRPC (``tensorflow-serving-api``'s stubs), concurrent
or not, equals the SavedModel called directly."""

import keras_trm  # noqa: F401, I001  (checks the TensorFlow backend first)

import concurrent.futures
import re

import grpc
import keras
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from keras_trm.decoding import BeamSearch, Translator
from keras_trm.export import ReviewClassifier, TransformerXLServing, export_module
from keras_trm.models import text_classifier, transformer
from keras_trm.models.transformer_xl import TransformerXLLM
from keras_trm.serving import BatchingOptions, ModelManager, ModelServer, model_server_config
from keras_trm.text import RESERVED_TOKENS, TextTokenizer

TIMEOUT = 60
SENTENCES = [
    "A man in a blue shirt is standing on a ladder.",
    "Two dogs are playing in the snow.",
    "",
    "A little girl climbing into a wooden playhouse.",
    "Ein Mann fährt Fahrrad.",
    "dogs " * 60,  # longer than the model's 32 positions
]
XL = dict(num_layers=2, d_model=16, num_heads=2, d_ff=32, mem_len=8,
          max_segment_len=24, dropout_rate=0.0)


def _vocabulary(texts, words=80):
    tokens = [w for t in texts for w in re.findall(r"\w+|[^\w\s]", t)]
    chars = sorted({c for w in tokens for c in w})
    common = sorted({w for w in tokens if len(w) > 1})[:words]
    return list(RESERVED_TOKENS) + chars + [f"##{c}" for c in chars] + common


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    keras.utils.set_random_seed(0)
    vocab = _vocabulary(SENTENCES + ["the a an of is are on in with"])
    translator = Translator(transformer(len(vocab), num_layers=1, d_model=16,
                                        num_heads=2, d_ff=32,
                    max_sequence_length=32), TextTokenizer(vocab), search=BeamSearch(beam_size=2))
    export_module(translator, root, "translator",
                  {"serving_default": translator.translate})
    classifier = ReviewClassifier(
        text_classifier("encoder", len(vocab), max_sequence_length=32, d_model=16,
                        num_heads=2, d_ff=32, name="imdb_encoder"), vocab, 24)
    export_module(classifier, root, "classifier",
                  {"serving_default": classifier.classify})
    lm = TransformerXLServing(TransformerXLLM(37, **XL))
    export_module(lm, root, "xl", {"serving_default": lm.serve})
    loaded = {name: tf.saved_model.load(str(root / name / "1")).signatures[
        "serving_default"] for name in ("translator", "classifier", "xl")}
    return root, loaded


@pytest.fixture(scope="module")
def server(exports):
    root, _ = exports
    config = model_server_config([], [root / "translator", root / "classifier",
                                      root / "xl"])
    manager = ModelManager(config, BatchingOptions(max_batch_size=16, num_batch_threads=1),
                           file_system_poll_wait_seconds=-1)
    server = ModelServer(manager, rest_api_port=0, grpc_port=0).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    yield (f"http://127.0.0.1:{server.rest_api_port}/v1/models",
           prediction_service_pb2_grpc.PredictionServiceStub(channel), manager)
    channel.close()
    server.stop(grace=5)


def _texts(tensor):
    return [s.decode("utf-8") for s in tensor.numpy()]


def _grpc_predict(stub, name, **inputs):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    response = stub.Predict(request, timeout=TIMEOUT)
    return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


def test_translation_rest_and_grpc_match_the_saved_model(exports, server):
    _, loaded = exports
    url, stub, _ = server
    want = _texts(loaded["translator"](tf.constant(SENTENCES))["output_0"])
    reply = requests.post(f"{url}/translator:predict", json={"instances": SENTENCES},
                          timeout=TIMEOUT)
    assert reply.status_code == 200 and reply.json() == {"predictions": want}
    out = _grpc_predict(stub, "translator", sentences=np.array(SENTENCES, object))
    assert [s.decode() for s in out["output_0"]] == want


def test_concurrent_translations_are_batched_and_equal_single_calls(exports, server):
    _, loaded = exports
    url, stub, _ = server
    want = {s: _texts(loaded["translator"](tf.constant([s]))["output_0"])[0]
            for s in SENTENCES}

    def rest(sentence):
        return requests.post(f"{url}/translator:predict", json={"instances": [sentence]},
                             timeout=TIMEOUT).json()["predictions"][0]

    def rpc(sentence):
        out = _grpc_predict(stub, "translator", sentences=np.array([sentence], object))
        return out["output_0"][0].decode()

    url, stub, manager = server
    work = SENTENCES * 4
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got_rest = list(pool.map(rest, work))
        got_rpc = list(pool.map(rpc, work))
    assert got_rest == [want[s] for s in work]
    assert got_rpc == [want[s] for s in work]
    with manager.acquire("translator") as servable:
        stats = servable.batch_stats
    assert stats["tasks"] >= 2 * len(work) and stats["batches"] < stats["tasks"], stats


def test_classifier_rest_and_grpc_match_the_saved_model(exports, server):
    _, loaded = exports
    url, stub, _ = server
    want = loaded["classifier"](tf.constant(SENTENCES))["probabilities"].numpy()
    rows = requests.post(f"{url}/classifier:predict", json={"instances": SENTENCES},
                         timeout=TIMEOUT).json()["predictions"]
    np.testing.assert_allclose(rows, want, rtol=1e-5, atol=1e-6)
    cols = requests.post(f"{url}/classifier:predict",
                         json={"inputs": {"reviews": SENTENCES}}, timeout=TIMEOUT).json()
    np.testing.assert_allclose(cols["outputs"], want, rtol=1e-5, atol=1e-6)
    out = _grpc_predict(stub, "classifier", reviews=np.array(SENTENCES, object))
    np.testing.assert_allclose(out["probabilities"], want, rtol=1e-5, atol=1e-6)
    meta = requests.get(f"{url}/classifier/metadata", timeout=TIMEOUT).json()
    outputs = meta["metadata"]["signature_def"]["signature_def"]["serving_default"][
        "outputs"]
    assert outputs["probabilities"]["dtype"] == "DT_FLOAT"


def test_transformer_xl_segments_through_grpc_and_rest(exports, server):
    """Two segments, the memories fed back; the signature's batch axis of
    ``memories`` is 1, so the server runs it unbatched (columnar REST)."""
    _, loaded = exports
    url, stub, _ = server
    rng = np.random.default_rng(0)
    seg1, seg2 = (rng.integers(1, 37, (2, 5)).astype(np.int32) for _ in range(2))
    empty = np.zeros((XL["num_layers"], 2, 0, XL["d_model"]), np.float32)
    want1 = loaded["xl"](token_ids=tf.constant(seg1), memories=tf.constant(empty))
    want2 = loaded["xl"](token_ids=tf.constant(seg2), memories=want1["new_memories"])
    out1 = _grpc_predict(stub, "xl", token_ids=seg1, memories=empty)
    np.testing.assert_allclose(out1["log_probs"], want1["log_probs"].numpy(),
                               rtol=1e-5, atol=1e-5)
    # JSON cannot spell an empty axis inside a rank-4 array; the second
    # segment (memories of M = 5) goes through REST.
    reply = requests.post(f"{url}/xl:predict", timeout=TIMEOUT, json={"inputs": {
        "token_ids": seg2.tolist(), "memories": out1["new_memories"].tolist()}})
    assert reply.status_code == 200, reply.text
    out2 = reply.json()["outputs"]
    np.testing.assert_allclose(out2["log_probs"], want2["log_probs"].numpy(),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out2["new_memories"], want2["new_memories"].numpy(),
                               rtol=1e-5, atol=1e-5)
    # The row format cannot split outputs whose axis 0 differs: a JSON 400.
    bad = requests.post(f"{url}/xl:predict", timeout=TIMEOUT, json={"instances": [
        {"token_ids": seg2[0].tolist(), "memories": out1["new_memories"][:, 0].tolist()}]})
    assert bad.status_code == 400 and "error" in bad.json()
    # A segment longer than max_segment_len: the graph's check, as a 400.
    long = requests.post(f"{url}/xl:predict", timeout=TIMEOUT, json={"inputs": {
        "token_ids": [[1] * 30], "memories": [[[[0.0] * 16]]] * 2}})
    assert long.status_code == 400 and "max_segment_len" in long.json()["error"]
