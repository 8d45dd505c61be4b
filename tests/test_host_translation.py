"""Greedy BLEU and translations without TensorFlow (issue #61): under JAX
and PyTorch, in a child process where ``import tensorflow`` fails,
``GreedyBleu`` and ``Translator.translate_texts`` with the host
SentencePiece tokenizer give what TensorFlow gives on the same weights with
the tensorflow-text tokenizer and the graph ``Translator.translate`` (the
function a SavedModel serves).

A tiny Transformer is trained for a few epochs on 300 real Multi30k pairs
(so that it says more than END), under a SentencePiece vocabulary learned
from them; its weights go to a file that each process loads."""

import gzip
import pathlib
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest


MAX_LENGTH = 20  # the model's max_sequence_length: longer sources are cut
MODEL = dict(num_layers=1, d_model=32, num_heads=2, d_ff=64,
             max_sequence_length=MAX_LENGTH)
BLANK = ["", " \t"]  # translate to "" on every path

# The child starts as on a machine without TensorFlow.
BLOCKER = (pathlib.Path(__file__).parent / "no_tensorflow" / "sitecustomize.py").read_text()
CHILD = BLOCKER + textwrap.dedent("""
    import json
    import keras_trm, keras_trm.training, keras_trm.decoding, keras_trm.text
    import keras
    from keras_trm.decoding import BeamSearch, GreedyBleu, Translator
    from keras_trm.models import transformer
    from keras_trm.text import HostSentencePieceTokenizer
    from keras_trm.training import tensorboard_writer

    request = json.loads(sys.argv[1])
    tokenizer = HostSentencePieceTokenizer(request["model"])
    model = transformer(tokenizer.vocabulary_size, **request["config"])
    model.load_weights(request["weights"])
    sources, references = request["sources"], request["references"]
    result = {"backend": keras.backend.backend()}
    score = GreedyBleu(model, tokenizer, sources, references)
    result["greedy_bleu"] = score(model)
    result["greedy"] = score.translator.translate_texts(sources)
    result["beam"] = Translator(model, tokenizer, search=BeamSearch(beam_size=2)
                                ).translate_texts(sources, batch_size=16)
    errors = {}
    for name, call in (
            ("wordpiece", lambda: keras_trm.text.TextTokenizer),
            ("tensorboard", lambda: tensorboard_writer(request["root"] + "/tb")),
            ("translate", lambda: Translator(model, tokenizer).translate(sources))):
        try:
            call()
        except (ImportError, RuntimeError) as error:
            errors[name] = f"{type(error).__name__}: {error}"
    result["errors"] = errors
    result["tensorflow_modules"] = sorted(
        m for m in sys.modules if m.partition(".")[0] in BLOCKED)
    json.dump(result, open(request["out"], "w"))
""")


def _lines(data_dir, name, n):
    with gzip.open(data_dir / "multi30k" / name, "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


def _padded(tokenizer, lines, start):
    """Training ids: (START) ids END, cut to the model's length, 0-padded."""
    ids = np.zeros((len(lines), MAX_LENGTH + 1), np.int32)
    for i, row in enumerate(tokenizer.encode(lines)):
        row = [2] * start + row[:MAX_LENGTH - 1].tolist() + [3]
        ids[i, :len(row)] = row
    return ids


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """The vocabulary, the trained weights, and what TensorFlow makes of
    them: tf-text tokenizer + graph ``translate`` (and the host tokenizer
    under TensorFlow, which must agree). All TensorFlow work is done here:
    a tf-text tokenizer does not outlive a later ``set_random_seed``."""
    import tensorflow as tf  # noqa: F401  (the reference is TensorFlow's)

    from keras_trm.decoding import BeamSearch, GreedyBleu, Translator
    from keras_trm.models import transformer
    from keras_trm.text import (HostSentencePieceTokenizer, SentencePieceTokenizer,
                                learn_sentencepiece)
    from keras_trm.training import LabelSmoothedCrossEntropy

    assert keras.backend.backend() == "tensorflow"
    root = tmp_path_factory.mktemp("host_translation")
    english = _lines(data_dir, "train.en.gz", 300)
    german = _lines(data_dir, "train.de.gz", 300)
    keras.utils.set_random_seed(0)
    path = learn_sentencepiece(english + german, 500, root / "sp.model")
    host, graph = HostSentencePieceTokenizer(path), SentencePieceTokenizer(path)
    model = transformer(host.vocabulary_size, **MODEL)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=LabelSmoothedCrossEntropy(label_smoothing=0.0))
    target = _padded(host, german, start=True)
    model.fit({"encoder_tokens": _padded(host, english, start=False)[:, :MAX_LENGTH],
               "decoder_tokens": target[:, :-1]}, target[:, 1:],
              batch_size=30, epochs=8, verbose=0)
    model.save_weights(root / "model.weights.h5")

    sources = _lines(data_dir, "val.en.gz", 30) + BLANK
    references = _lines(data_dir, "val.de.gz", 30) + ["", ""]
    expected = {}
    for key, tokenizer in (("", graph), ("host_", host)):
        # TensorFlow with the host tokenizer: generate_ids' graph.
        score = GreedyBleu(model, tokenizer, sources, references)
        expected[key + "greedy_bleu"] = score(model)
        expected[key + "greedy"] = score.translator.translate_texts(sources)
    expected["beam"] = Translator(model, graph,
                                  search=BeamSearch(beam_size=2)).translate_texts(sources)
    request = {"model": str(path), "weights": str(root / "model.weights.h5"),
               "config": MODEL, "sources": sources, "references": references,
               "root": str(root)}
    return request, expected, [len(r) for r in host.encode(sources)]


def test_the_tensorflow_reference_is_not_trivial(reference):
    """Sources longer than the model (cut), translations of several
    tokens, different from each other; the host tokenizer under
    TensorFlow gives the tf-text results."""
    request, expected, lengths = reference
    greedy = expected["greedy"]
    assert max(lengths) > MAX_LENGTH - 1  # some sources are truncated
    assert greedy[-2:] == ["", ""] and expected["beam"][-2:] == ["", ""]
    assert all(len(text.split()) >= 2 for text in greedy[:-2])
    assert len(set(greedy)) >= 10 and greedy != expected["beam"]
    assert expected["greedy_bleu"] > 0.0
    assert expected["host_greedy_bleu"] == expected["greedy_bleu"]
    assert expected["host_greedy"] == greedy


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_greedy_bleu_and_translations_without_tensorflow(reference, backend, tmp_path):
    request, expected, _ = reference
    request = dict(request, out=str(tmp_path / "result.json"))
    env = dict(os.environ, KERAS_BACKEND=backend, JAX_PLATFORMS="cpu")
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(request)],
                           env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["backend"] == backend
    assert result["tensorflow_modules"] == []
    assert result["greedy"] == expected["greedy"]
    assert result["beam"] == expected["beam"]
    assert result["greedy_bleu"] == expected["greedy_bleu"]
    errors = result["errors"]
    assert errors["wordpiece"].startswith("ImportError") and "SentencePiece" in errors["wordpiece"]
    assert errors["tensorboard"].startswith("ImportError") and "TensorFlow" in errors["tensorboard"]
    assert errors["translate"].startswith("RuntimeError") and "translate_texts" in errors["translate"]
