"""The exports load in the stock TensorFlow Serving server (issue #41).

The official ``tensorflow_model_server`` (Docker image ``tensorflow/serving``
or the apt ``tensorflow-model-server``) links TensorFlow's core ops plus
TensorFlow Text's op library (``SUPPORTED_TENSORFLOW_OPS`` in TF Serving's
``tensorflow_serving/model_servers/BUILD``: ``@org_tensorflow_text//
tensorflow_text:ops_lib``, which holds the SentencePiece ops too, and TF
Decision Forests' inference ops, which we do not use). A SavedModel that
holds any other op fails to load there with "Op type not registered".

These tests export small untrained versions of the raw-text translator
(WordPiece and SentencePiece vocabularies), the IMDB review classifier, the
MNIST digit classifier and the Transformer-XL language model, list every op
type in each exported graph (the meta graph's nodes and every function of
its library, where the signatures' bodies are) and check each one against
the ops TensorFlow and tensorflow_text register. Both sets are read from
the op registry of a fresh process (nothing hard-coded); ops registered by
anything else (keras, keras_hub, keras_trm) are in neither set, and this
process must hold none. Only the Python-kernel ops (``tf.py_function``)
are taken out of TensorFlow's set. The pip build's registry also holds a
few definitions the server may not link (TensorFlow's own test ops, TPU
ops), so the core set is slightly generous.
"""

import keras_trm  # noqa: F401, I001  (checks the TensorFlow backend first)

import collections
import json
import inspect
import re
import subprocess
import sys

import keras
import pytest
import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2
from tensorflow.core.protobuf import saved_model_pb2

from keras_trm.decoding import BeamSearch, Translator
from keras_trm.export import (
    DigitClassifier,
    ReviewClassifier,
    TransformerXLServing,
    export_module,
)
from keras_trm.models import lenet_cnn, text_classifier, transformer
from keras_trm.models.transformer_xl import TransformerXLLM
from keras_trm.text import (
    RESERVED_TOKENS,
    SentencePieceTokenizer,
    TextTokenizer,
    learn_sentencepiece,
)

# Op definitions that TensorFlow's C++ core registers but whose kernels live
# in the Python runtime (tensorflow/python/lib/core/py_func.cc: tf.py_function,
# tf.numpy_function): a C++ server has no kernel for them.
PYTHON_KERNEL_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


def registered_ops():
    """The names of all ops registered in this process (TensorFlow's global
    op registry, C++ and loaded op libraries alike)."""
    from tensorflow.core.framework import op_def_pb2
    from tensorflow.python.client import pywrap_tf_session as c_api

    buffer = c_api.TF_GetAllOpList()
    try:
        ops = op_def_pb2.OpList.FromString(c_api.TF_GetBuffer(buffer))
    finally:
        c_api.TF_DeleteBuffer(buffer)
    return {op.name for op in ops.op}


# Run in a fresh process (``registered_ops``'s source first): the ops
# registered by `import tensorflow` alone, then those `import
# tensorflow_text` adds, then those that keras, keras_hub and the keras_trm
# modules the exports use add ("ours", which must be none). Fresh, because
# the suite's own processes also import LiteRT, whose TFLite ops
# (UnidirectionalSequenceLstm, ...) are none of keras_trm's doing.
_REGISTRY_MAIN = """
import json
import tensorflow  # noqa: F401
core = registered_ops()
import tensorflow_text  # noqa: F401
text = registered_ops() - core
import keras, keras_hub  # noqa: F401,E401
import keras_trm.decoding, keras_trm.export, keras_trm.models  # noqa: F401,E401
import keras_trm.jobs.translation, keras_trm.serving, keras_trm.text  # noqa
print(json.dumps({"core": sorted(core), "text": sorted(text),
                  "ours": sorted(registered_ops() - core - text)}))
"""

@pytest.fixture(scope="module")
def registry():
    """``{"core", "text", "ours"}`` -> the sets of op names that TensorFlow
    alone registers, that tensorflow_text adds, and that keras, keras_hub
    and keras_trm then add, read in a fresh process."""
    script = inspect.getsource(registered_ops) + _REGISTRY_MAIN
    proc = subprocess.run([sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {k: set(v) for k, v in
            json.loads(proc.stdout.strip().splitlines()[-1]).items()}


@pytest.fixture(scope="module")
def server_ops(registry):
    """The op names the stock server can run: TensorFlow core's (less the
    Python-kernel ones) plus tensorflow_text's."""
    return (registry["core"] - PYTHON_KERNEL_OPS) | registry["text"]


def ops_outside(graph_def, supported):
    """The ops of ``graph_def`` that are not in ``supported``.

    Every node of the graph and of every function in its library is read
    (the library holds the nested functions too, flat). A node whose type
    names a library function is a call, not an op.

    Args:
        graph_def: a ``GraphDef`` (e.g. a SavedModel meta graph's).
        supported: set of op names.

    Returns:
        dict op type -> sorted names of the functions holding it
        (``"<graph>"`` for the top-level graph); empty when all are
        supported.
    """
    functions = {f.signature.name: f.node_def for f in graph_def.library.function}
    bodies = [("<graph>", graph_def.node)] + sorted(functions.items())
    outside = {}
    for where, nodes in bodies:
        for node in nodes:
            if node.op not in supported and node.op not in functions:
                outside.setdefault(node.op, set()).add(where)
    return {op: sorted(where) for op, where in outside.items()}


def _describe(outside):
    return "; ".join(f"op {op!r} in {', '.join(where)}"
                     for op, where in sorted(outside.items()))


def _meta_graph(version_dir):
    saved_model = saved_model_pb2.SavedModel.FromString(
        (version_dir / "saved_model.pb").read_bytes())
    (meta_graph,) = saved_model.meta_graphs
    return meta_graph


def _wordpiece_vocabulary(texts, words=300):
    """A small WordPiece vocabulary (reserved tokens, characters, their
    ``##`` forms, frequent words) without the learner's cost."""
    tokens = collections.Counter(
        w for t in texts for w in re.findall(r"\w+|[^\w\s]", t))
    chars = sorted({c for w in tokens for c in w})
    common = sorted(w for w, _ in tokens.most_common(words) if len(w) > 1)
    return list(RESERVED_TOKENS) + chars + [f"##{c}" for c in chars] + common


@pytest.fixture(scope="module")
def exports(multi30k_small, tmp_path_factory):
    """name -> the ``MetaGraphDef`` of a small untrained export, written with
    ``export_module`` as the jobs do: the translator with either vocabulary
    kind, the review and digit classifiers, the Transformer-XL LM."""
    root = tmp_path_factory.mktemp("stock_exports")
    src, tgt = multi30k_small
    wordpiece = TextTokenizer(_wordpiece_vocabulary(src[:500] + tgt[:500]))
    sentencepiece = SentencePieceTokenizer(learn_sentencepiece(
        src[:500] + tgt[:500], 600, root / "sp.model", num_threads=1))
    keras.utils.set_random_seed(0)
    modules = {}
    for name, tokenizer in [("translator_wordpiece", wordpiece),
                            ("translator_sentencepiece", sentencepiece)]:
        translator = Translator(transformer(tokenizer.vocabulary_size,
                                            num_layers=1, d_model=16,
                        num_heads=2, d_ff=32, max_sequence_length=32), tokenizer, search=BeamSearch(beam_size=2))
        modules[name] = (translator, translator.translate)
    review = ReviewClassifier(
        text_classifier("encoder", wordpiece.vocabulary_size,
                        max_sequence_length=32, d_model=16, num_heads=2,
                        d_ff=32), wordpiece.vocabulary, 24)
    modules["review_classifier"] = (review, review.classify)
    digits = DigitClassifier(lenet_cnn("layer"))
    modules["digit_classifier"] = (digits, digits.classify)
    lm = TransformerXLServing(TransformerXLLM(
        37, num_layers=1, d_model=16, num_heads=2, d_ff=32, mem_len=8,
        max_segment_len=16, dropout_rate=0.0))
    modules["language_model"] = (lm, lm.serve)
    return {name: _meta_graph(export_module(
                module, root, name, {"serving_default": signature}))
            for name, (module, signature) in modules.items()}


# The tf-text ops each export must hold (its tokenizer's, inside the
# signature's functions); none for the exports that take no text.
TEXT_OPS = {
    "translator_wordpiece": {"RegexSplitWithOffsets",
                             "FastWordpieceTokenizeWithOffsets",
                             "TFText>FastWordpieceDetokenize"},
    "translator_sentencepiece": {"SentencepieceOp", "SentencepieceTokenizeOp",
                                 "SentencepieceDetokenizeOp"},
    "review_classifier": {"RegexSplitWithOffsets",
                          "FastWordpieceTokenizeWithOffsets"},
    "digit_classifier": set(),
    "language_model": set(),
}


@pytest.mark.parametrize("name", sorted(TEXT_OPS))
def test_export_uses_only_ops_the_stock_server_links(name, exports,
                                                     server_ops, registry):
    meta_graph = exports[name]
    assert "serving_default" in meta_graph.signature_def
    graph_def = meta_graph.graph_def
    outside = ops_outside(graph_def, server_ops)
    assert not outside, (f"{name}: ops the stock TF Serving server does not "
                         f"link: {_describe(outside)}")
    # The walk reaches into the functions: every op type is listed, and the
    # tokenizers' tf-text ops, which sit in the signature's functions, are
    # among those outside TensorFlow's core.
    all_ops = ops_outside(graph_def, set())
    assert len(all_ops) > 10 and "StatefulPartitionedCall" in all_ops
    text_ops = ops_outside(graph_def, registry["core"])
    assert set(text_ops) <= registry["text"]
    assert TEXT_OPS[name] <= set(text_ops), sorted(text_ops)
    assert not TEXT_OPS[name] or any(
        where != ["<graph>"] for where in text_ops.values())
    if not TEXT_OPS[name]:
        assert not text_ops, sorted(text_ops)


def test_our_code_registers_no_ops_of_its_own(registry):
    # A fresh process that imported keras, keras_hub and keras_trm holds no
    # op beyond those of `import tensorflow, tensorflow_text`.
    assert registry["ours"] == set()
    assert registry["text"] and not registry["text"] & registry["core"]
    assert PYTHON_KERNEL_OPS <= registry["core"]


def test_check_flags_ops_the_server_lacks(server_ops, registry):
    # A real graph with tf.py_function: EagerPyFunc is registered by
    # TensorFlow's core, but its kernel calls back into Python.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def with_python(x):
        return tf.py_function(lambda v: v * 2.0, [x], tf.float32)

    graph_def = with_python.get_concrete_function().graph.as_graph_def()
    assert ops_outside(graph_def, server_ops) == {"EagerPyFunc": ["<graph>"]}
    # A hand-built graph: an unregistered op inside a function is named
    # with that function; the call of the library function and a tf-text
    # op are not flagged.
    text_op = sorted(registry["text"])[0]
    graph_def = graph_pb2.GraphDef()
    graph_def.node.add(name="x", op="Placeholder")
    graph_def.node.add(name="call", op="inner_fn", input=["x"])
    inner = function_pb2.FunctionDef()
    inner.signature.name = "inner_fn"
    inner.node_def.add(name="fake", op="NotARegisteredOp")
    inner.node_def.add(name="text", op=text_op)
    graph_def.library.function.append(inner)
    outside = ops_outside(graph_def, server_ops)
    assert outside == {"NotARegisteredOp": ["inner_fn"]}
    assert _describe(outside) == "op 'NotARegisteredOp' in inner_fn"
    # Against TensorFlow's core alone, the tf-text op is flagged as well.
    assert ops_outside(graph_def, registry["core"]) == {
        "NotARegisteredOp": ["inner_fn"], text_op: ["inner_fn"]}
