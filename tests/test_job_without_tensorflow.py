"""The translation and language-model jobs where TensorFlow is not
installed (issue #61): one command, ``keras-trm train-translation``, from
the raw corpus to val and test BLEU and weights under JAX and PyTorch;
then, on a machine with TensorFlow, ``keras-trm export-translation
--workdir DIR`` writes the SavedModel, which translates the test sources
exactly as the job's own search did. The same for ``keras-trm train-lm``
and ``keras-trm export-lm``: the SavedModel scores the test split as the
job did.

The child processes start with ``tests/no_tensorflow`` first on
``PYTHONPATH``: its ``sitecustomize`` makes every finder answer "not
found" for TensorFlow, tensorflow-text and tensorflow-datasets.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NO_TENSORFLOW = ROOT / "tests" / "no_tensorflow"
FLAGS = ["--preset", "tiny", "--data.limit", "120", "--training.epochs", "2",
         "--training.validation_limit", "16", "--decoding.beam_size", "2", "--training.tensorboard", "off"]


def _run(args, backend, blocked, timeout=900):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    path = [str(ROOT)] + ([str(NO_TENSORFLOW)] if blocked else [])
    env["PYTHONPATH"] = os.pathsep.join(
        path[::-1] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-m", "keras_trm.cli", *args], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _train(command, flags, backend, workdir):
    """``keras-trm <command>`` under ``backend`` without TensorFlow."""
    child = _run([command, *flags, "--workdir", str(workdir),
                  "--export_dir", str(workdir / "export")], backend, blocked=True)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    return backend, workdir, child.stdout


@pytest.fixture(scope="module", params=["jax", "torch"])
def run_without_tensorflow(request, tmp_path_factory):
    return _train("train-translation", FLAGS, request.param,
                  tmp_path_factory.mktemp(f"no_tf_{request.param}"))


def test_the_job_trains_and_scores_without_tensorflow(run_without_tensorflow):
    backend, workdir, stdout = run_without_tensorflow
    result = json.loads((workdir / "result.json").read_text())
    assert result["backend"] == backend
    assert result["epochs"] == 2 and result["export"] is None
    assert result["test_bleu"] is not None and result["signature"].startswith("nrefs:1")
    assert [e["val_greedy_bleu"] for e in result["epochs_log"]] != []
    assert (workdir / "prepared" / "manifest.json").is_file()
    assert (workdir / "model_float32.keras").is_file()
    command = f"keras-trm export-translation --workdir {workdir}"
    assert result["export_command"] == command and command in stdout
    hyps = (workdir / "test_2016_flickr.hyp.de").read_text().splitlines()
    assert len(hyps) == 120


@pytest.mark.slow
def test_its_savedmodel_translates_as_its_search(run_without_tensorflow, tmp_path):
    """The export on TensorFlow of the weights trained without it: the
    same test translations, so the same test BLEU (asked: within 0.05)."""
    _, workdir, _ = run_without_tensorflow
    child = _run(["export-translation", "--workdir", str(workdir)], "tensorflow",
                 blocked=False)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    export = workdir / "export" / "transformer_multi30k_en_de" / "1"
    assert (export / "saved_model.pb").is_file()
    result = json.loads((workdir / "result.json").read_text())
    sources = json.loads((workdir / "export_request.json").read_text())
    assert sources["model"] == "model_float32.keras"  # relative: the folder moves
    script = (
        "import json, sys, tensorflow as tf, tensorflow_text\n"
        "from keras_trm.data import load_translation_splits\n"
        "from keras_trm.decoding import corpus_bleu\n"
        "model = tf.saved_model.load(sys.argv[1])\n"
        "splits = load_translation_splits('multi30k', None, 'en', 'de', "
        "include_train=False)\n"
        "src, ref = (x[:120] for x in splits.test)\n"
        "(out,) = model.signatures['serving_default'](tf.constant(src)).values()\n"
        "out = [s.decode() for s in out.numpy()]\n"
        "print(json.dumps({'hyps': out, 'bleu': corpus_bleu(out, ref)[0]}))\n")
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    child = subprocess.run([sys.executable, "-c", script, str(export)], env=env,
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    served = json.loads(child.stdout.strip().splitlines()[-1])
    hyps = (workdir / "test_2016_flickr.hyp.de").read_text().splitlines()
    assert served["hyps"] == hyps
    assert abs(served["bleu"] - result["test_bleu"]) <= 0.05


# --- the language-model job (train-lm) -------------------------------------------

LM_FLAGS = [
    "--data.corpus", "tinyshakespeare", "--data.train_tokens", "3000",
    "--data.eval_tokens", "300", "--model.num_layers", "1",
    "--model.d_model", "16", "--model.num_heads", "2", "--model.d_ff", "32",
    "--model.seg_len", "8", "--model.mem_len", "8", "--training.batch_size", "4",
    "--training.steps", "30", "--training.warmup_steps", "5",
    "--training.learning_rate", "0.01",
    "--training.eval_every", "10", "--evaluation.eval_batch_size", "2",
    "--export.model_name", "tiny_xl"]


@pytest.fixture(scope="module", params=["jax", "torch"])
def lm_without_tensorflow(request, tmp_path_factory):
    return _train("train-lm", LM_FLAGS, request.param,
                  tmp_path_factory.mktemp(f"lm_no_tf_{request.param}"))


def test_the_lm_job_trains_and_scores_without_tensorflow(lm_without_tensorflow):
    backend, workdir, stdout = lm_without_tensorflow
    result = json.loads((workdir / "results" / "result.json").read_text())
    assert result["backend"] == backend and result["steps"] == 30
    assert result["export"] is None
    command = f"keras-trm export-lm --workdir {workdir}"
    assert result["export_command"] == command and command in stdout
    history = result["transformer_xl"]["history"]
    assert history["step"] == [10, 20, 30]
    # Learning: 65 characters are ln 65 = 4.17 nats at random.
    assert history["valid_nll"][-1] < min(history["valid_nll"][0] - 0.1, 3.9), history
    assert result["vanilla"]["history"]["step"] == [10, 20, 30]
    assert (workdir / "transformer_xl.keras").is_file()


@pytest.mark.slow
def test_its_lm_savedmodel_scores_as_the_job(lm_without_tensorflow):
    """``keras-trm export-lm`` on TensorFlow from the weights trained
    without it: the SavedModel, memories fed back segment by segment,
    gives the job's test figure."""
    _, workdir, _ = lm_without_tensorflow
    child = _run(["export-lm", "--workdir", str(workdir)], "tensorflow", blocked=False)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    export = workdir / "export" / "tiny_xl" / "1"
    result = json.loads((workdir / "results" / "result.json").read_text())
    script = (
        "import json, sys, numpy as np, tensorflow as tf\n"
        "from keras_trm.data import language_modeling as lm\n"
        "export = sys.argv[1]\n"
        "tokens = json.load(open(export + '/assets.extra/vocab.json'))\n"
        "ids, _ = lm.load_lm_corpus('tinyshakespeare', 'test', lm.Vocabulary(tokens))\n"
        "streams = lm.batchify(ids[:300], 2)\n"
        "serve = tf.saved_model.load(export).signatures['serving_default']\n"
        "memories, total, count = tf.zeros((1, 2, 0, 16)), 0.0, 0\n"
        "for inputs, targets in lm.segments(streams, 8):\n"
        "    out = serve(token_ids=tf.constant(inputs, tf.int32), memories=memories)\n"
        "    memories = out['new_memories']\n"
        "    logp = out['log_probs'].numpy()\n"
        "    total -= np.take_along_axis(logp, targets[..., None], -1).sum()\n"
        "    count += targets.size\n"
        "print(total / count)\n")
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    child = subprocess.run([sys.executable, "-c", script, str(export)], env=env,
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    served = float(child.stdout.strip().splitlines()[-1])
    assert served == pytest.approx(result["transformer_xl"]["test"]["nll_nats"], abs=2e-5)
