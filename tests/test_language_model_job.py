"""The language-model job (issue 4): a tiny real-data run writes its result
files and a SavedModel; the SavedModel reloads in a fresh process without
keras_trm, matches the in-process model segment by segment (memories fed
back), and refuses bad input with messages naming the argument and shapes."""

import json
import math
import pathlib
import subprocess
import sys
import textwrap

import keras_trm  # noqa: F401  (checks the TensorFlow backend first)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_trm import cli  # noqa: E402
from keras_trm.export import (  # noqa: E402
    TransformerXLServing,
    export_language_model,
    sample_text,
)
from keras_trm.data.language_modeling import Vocabulary  # noqa: E402
from keras_trm.jobs import language_model as job  # noqa: E402
from keras_trm.models.transformer_xl import (  # noqa: E402
    TransformerXLLM,
    vanilla_transformer_lm,
)

TINY = dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, seg_len=8,
            mem_len=8, batch_size=4, steps=6, warmup_steps=2, eval_every=3,
            eval_batch_size=2, train_tokens=3000, eval_tokens=300,
            learning_rate=3e-3, model_name="tiny_xl")

FRESH = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
    data = np.load(sys.argv[2])
    layers, d_model = int(sys.argv[4]), int(sys.argv[5])
    seg1, seg2 = data["seg1"], data["seg2"]
    empty = tf.zeros((layers, seg1.shape[0], 0, d_model))
    out1 = serve(token_ids=tf.constant(seg1), memories=empty)
    out2 = serve(token_ids=tf.constant(seg2), memories=out1["new_memories"])
    assert "keras_trm" not in sys.modules
    np.savez(sys.argv[3], log_probs1=out1["log_probs"].numpy(),
             memories1=out1["new_memories"].numpy(),
             log_probs2=out2["log_probs"].numpy(),
             memories2=out2["new_memories"].numpy())
""")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_job")
    config = job.LanguageModelConfig(**TINY)
    # results_dir left at its default: <workdir>/results
    result = job.run(config, workdir=root / "work", export_dir=root / "export",
                     verbose=0)
    return root, result


def test_tiny_run_writes_results_and_export(tiny_run):
    root, result = tiny_run
    results = root / "work" / "results"
    assert json.loads((results / "result.json").read_text()) == result
    report = (results / "report.md").read_text()
    assert "Transformer-XL" in report and str(
        result["transformer_xl"]["test"]["bits_per_token"]) in report
    assert (results / "curves.png").stat().st_size > 1000
    # Equal budget: both saw the same steps; validation after steps 3 and 6.
    assert result["train_tokens_seen"] == 6 * 4 * 8
    for key in ("transformer_xl", "vanilla"):
        assert result[key]["history"]["step"] == [3, 6]
        assert result[key]["train_seconds"] > 0
    # Parameters matched through the vanilla FFN width: the closest count
    # (one unit of d_ff is num_layers * (2 d_model + 1) = 33 parameters).
    xl_p, van_p = (result["transformer_xl"]["parameters"],
                   result["vanilla"]["parameters"])
    assert abs(xl_p - van_p) <= 33 // 2 and result["vanilla"]["d_ff"] != 32
    for figures in (result["transformer_xl"]["test"],
                    result["vanilla"]["test_sliding_window"],
                    result["vanilla"]["test_disjoint"]):
        nll = figures["nll_nats"]
        assert 0 < nll < 10
        assert figures["bits_per_token"] == pytest.approx(nll / math.log(2),
                                                          abs=1e-3)
    assert result["test_tokens"] == 2 * (150 - 1)
    export = root / "export" / "tiny_xl" / "1"
    assert result["export"] == str(export)
    assert (export / "saved_model.pb").is_file()
    vocab = json.loads((export / "assets.extra" / "vocab.json").read_text())
    assert len(vocab) == 65 and "\n" in vocab and " " in vocab
    config = json.loads((export / "assets.extra" / "config.json").read_text())
    assert config["max_segment_len"] == 8 and config["mem_len"] == 8
    # The trained model was saved and round-trips.
    model = keras.saving.load_model(root / "work" / "transformer_xl.keras")
    assert isinstance(model, TransformerXLLM) and model.count_params() == xl_p


def test_bfloat16_run_is_scored_and_exported_in_float32(tmp_path):
    """--training.precision mixed_bfloat16 with the regularizers: training
    computes in bfloat16, the test figure comes from a float32 copy with the
    same weights (scored again here), the export is float32, and the global
    dtype policy is left as it was."""
    from keras_trm.decoding import evaluate_with_memory
    from keras_trm.data.language_modeling import batchify, load_lm_corpus

    config = job.LanguageModelConfig(**{
        **TINY, "precision": "mixed_bfloat16", "baseline": False,
        "attention_dropout_rate": 0.1, "weight_decay": 0.1})
    result = job.run(config, workdir=tmp_path / "w", export_dir=tmp_path / "e",
                     verbose=0)
    assert keras.config.dtype_policy().name == "float32"
    assert result["precision"] == "mixed_bfloat16" and result["steps"] == 6
    assert result["vanilla"] is None
    model = keras.saving.load_model(tmp_path / "w" / "transformer_xl.keras")
    assert model.dtype_policy.name == "float32"
    assert model.blocks[0].dtype_policy.name == "float32"
    train_ids, vocab = load_lm_corpus("tinyshakespeare", "train")
    test_ids, _ = load_lm_corpus("tinyshakespeare", "test", vocab)
    nll = evaluate_with_memory(model, batchify(test_ids[:300], 2), 8)
    assert nll == pytest.approx(result["transformer_xl"]["test"]["nll_nats"],
                                abs=1e-4)
    serve = tf.saved_model.load(str(tmp_path / "e" / "tiny_xl" / "1")).signatures[
        "serving_default"]
    assert serve.structured_input_signature[1]["memories"].dtype == tf.float32
    out = serve(token_ids=tf.ones((1, 8), tf.int32), memories=tf.zeros((1, 1, 0, 16)))
    assert out["log_probs"].dtype == tf.float32
    assert out["new_memories"].dtype == tf.float32
    report = (tmp_path / "w" / "results" / "report.md").read_text()
    assert "trained in mixed_bfloat16, tested in float32" in report
    assert "AdamW (weight decay 0.1)" in report


def _segments(vocab, batch=3):
    text = ("First Citizen:\nBefore we proceed any further, hear me speak.\n"
            "All:\nSpeak, speak.")
    ids = np.array([vocab.index(c) for c in text], np.int32)
    rows = np.stack([ids[i:i + 16] for i in range(batch)])
    return rows[:, :8], rows[:, 8:13]  # a full segment, then a shorter one


def test_export_in_fresh_process_matches_in_process(tiny_run, tmp_path):
    root, result = tiny_run
    export = root / "export" / "tiny_xl" / "1"
    vocab = json.loads((export / "assets.extra" / "vocab.json").read_text())
    seg1, seg2 = _segments(vocab)
    model = keras.saving.load_model(root / "work" / "transformer_xl.keras")
    logits1, mems1 = model(seg1)
    logits2, mems2 = model(seg2, mems1)
    np.savez(tmp_path / "in.npz", seg1=seg1, seg2=seg2)
    script = tmp_path / "fresh.py"
    script.write_text(FRESH)
    proc = subprocess.run(
        [sys.executable, str(script), str(export), str(tmp_path / "in.npz"),
         str(tmp_path / "out.npz"), "1", "16"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    assert out["log_probs1"].shape == (3, 8, 65)
    assert out["memories1"].shape == (1, 3, 8, 16)  # min(mem_len, 0 + 8)
    assert out["log_probs2"].shape == (3, 5, 65)
    assert out["memories2"].shape == (1, 3, 8, 16)  # last 8 of 8 + 5
    np.testing.assert_allclose(out["log_probs1"],
                               tf.nn.log_softmax(logits1), atol=1e-5)
    np.testing.assert_allclose(out["log_probs2"],
                               tf.nn.log_softmax(logits2), atol=1e-5)
    np.testing.assert_allclose(out["memories2"], np.stack(mems2), atol=1e-5)
    np.testing.assert_allclose(np.exp(out["log_probs2"]).sum(-1), 1.0,
                               atol=1e-5)
    # The memory matters: segment 2 without it scores differently.
    alone = tf.nn.log_softmax(model(seg2)[0])
    assert np.abs(alone - out["log_probs2"]).max() > 1e-3


def test_export_bad_input_errors(tiny_run):
    root, _ = tiny_run
    serve = tf.saved_model.load(
        str(root / "export" / "tiny_xl" / "1")).signatures["serving_default"]
    ids = np.zeros((2, 4), np.int32)
    empty = tf.zeros((1, 2, 0, 16))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"token_ids.*max_segment_len=8.*\[2 9\]"):
        serve(token_ids=tf.zeros((2, 9), tf.int32), memories=empty)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"token_ids.*\[2 0\]"):
        serve(token_ids=tf.zeros((2, 0), tf.int32), memories=empty)
    bad_memories = {
        "batch": ((1, 3, 5, 16), r"\[1 3 5 16\].*token_ids.shape=\] \[2 4\]"),
        "layers": ((2, 2, 5, 16), r"num_layers=1.*\[2 2 5 16\]"),
        "d_model": ((1, 2, 5, 12), r"d_model=16.*\[1 2 5 12\]"),
    }
    for shape, pattern in bad_memories.values():
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"memories.*" + pattern):
            serve(token_ids=tf.constant(ids), memories=tf.zeros(shape))


def test_bad_config_and_arguments(tmp_path):
    bad = [
        (dict(mem_len=-1), ValueError, "mem_len"),
        (dict(corpus="wikitext103"), ValueError, "corpus"),
        (dict(seg_len=0), ValueError, "seg_len"),
        (dict(warmup_steps=10, steps=10), ValueError, "warmup_steps"),
        (dict(dropout_rate=1.5), ValueError, "dropout_rate"),
        (dict(batch_size=2.5), TypeError, "batch_size"),
    ]
    for kwargs, error, name in bad:
        with pytest.raises(error, match=name):
            job.LanguageModelConfig(**kwargs).validate()
    too_short = job.LanguageModelConfig(**{**TINY, "train_tokens": 32})
    with pytest.raises(ValueError, match=r"seg_len=8"):
        job.run(too_short, workdir=tmp_path / "w", export_dir=tmp_path / "e",
                results_dir=tmp_path / "r", verbose=0)
    vanilla = vanilla_transformer_lm(65, num_layers=1, d_model=16,
                                     num_heads=2, d_ff=32, max_sequence_length=8)
    with pytest.raises(TypeError, match="TransformerXLLM"):
        TransformerXLServing(vanilla)


def test_corpus_recipe_sets_defaults_that_flags_override():
    parser = cli.config_parser("train-lm", "", job.LanguageModelConfig, "runs/x")

    def parse(*argv):
        return cli.parse_config(parser, job.LanguageModelConfig, list(argv))[0]

    ptb = parse("--data.corpus", "ptb")
    assert ptb == job.LanguageModelConfig.recipe("ptb")
    assert (ptb.d_model, ptb.time_budget_minutes) == (256, 60.0)
    assert ptb.dropout_rate == job.CORPUS_RECIPES["ptb"]["dropout_rate"]
    # A flag wins, even one equal to the dataclass default.
    assert parse("--data.corpus", "ptb", "--model.d_model", "128").d_model == 128
    assert parse("--corpus", "ptb", "--dropout_rate", "0.1").dropout_rate == 0.1
    assert parse() == job.LanguageModelConfig()  # Tiny Shakespeare: the defaults
    assert parse("--model.d_model", "64").d_model == 64


# --- sample_text and keras-trm sample-lm (issue #63) ----------------------------

PROMPT = "First Citizen:\nBefore we p"  # 25 characters: segments 8, 8, 8, 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sample_equals_the_keras_model_with_memories(tiny_run, temperature):
    """The export's ids are those of the Keras model fed the same segments
    with its memories, then one token at a time: the argmax at temperature
    0 (greedy), and at temperature 1 the same draws of default_rng(seed)
    from its softmax. Greedy text of a model this small repeats one
    character, whatever the memory holds; the draws at temperature 1 see
    a change of the probabilities (memories dropped while generating: a
    different sample)."""
    root, _ = tiny_run
    export = root / "export" / "tiny_xl" / "1"
    text, ids = sample_text(export, PROMPT, 40, temperature=temperature, seed=5)
    vocab = json.loads((export / "assets.extra" / "vocab.json").read_text())
    model = keras.saving.load_model(root / "work" / "transformer_xl.keras")
    prompt = np.array([[vocab.index(c) for c in PROMPT]], np.int32)
    memories, rng = None, np.random.default_rng(5)
    for start in range(0, prompt.shape[1], 8):
        logits, memories = model(prompt[:, start:start + 8], memories)
    expected = []
    for _ in range(40):
        scores = np.asarray(logits[0, -1], np.float64)
        if temperature:
            probs = np.exp((scores - scores.max()) / temperature)
            expected.append(int(rng.choice(len(probs), p=probs / probs.sum())))
        else:
            expected.append(int(np.argmax(scores)))
        logits, memories = model(np.array([[expected[-1]]], np.int32), memories)
    assert ids.dtype == np.int32 and ids.tolist() == expected
    assert text == "".join(vocab[i] for i in expected)


def test_sample_seed_and_top_k(tiny_run):
    root, _ = tiny_run
    export = str(root / "export" / "tiny_xl" / "1")
    first = sample_text(export, PROMPT, 50, seed=3)
    assert sample_text(export, PROMPT, 50, seed=3)[1].tolist() == first[1].tolist()
    assert sample_text(export, PROMPT, 50, seed=4)[1].tolist() != first[1].tolist()
    greedy = sample_text(export, PROMPT, 20, temperature=0)[1]
    np.testing.assert_array_equal(
        sample_text(export, PROMPT, 20, temperature=1.5, top_k=1, seed=7)[1], greedy)


def test_sample_lm_command(tiny_run, tmp_path, capsys):
    root, _ = tiny_run
    export = root / "export" / "tiny_xl" / "1"
    proc = subprocess.run(
        [sys.executable, "-m", "keras_trm.cli", "sample-lm", str(export),
         "--prompt", PROMPT, "--num_tokens", "12", "--temperature", "0.8",
         "--top_k", "5", "--seed", "2"],
        capture_output=True, text=True, timeout=300,
        cwd=pathlib.Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    text, _ = sample_text(export, PROMPT, 12, temperature=0.8, top_k=5, seed=2)
    assert proc.stdout == PROMPT + text + "\n"
    for path, words in [(tmp_path / "nope", "does not exist"),
                        (root / "work", "has no saved_model.pb")]:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["sample-lm", str(path), "--prompt", "a"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err and words in err, err
    with pytest.raises(SystemExit) as exit_info:  # no character of the vocabulary
        cli.main(["sample-lm", str(export), "--prompt", "é"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'é'" in err, err


def test_sample_bad_arguments(tiny_run):
    root, _ = tiny_run
    export = root / "export" / "tiny_xl" / "1"
    bad = [
        (dict(export_path=3), TypeError, "export_path=3"),
        (dict(prompt=b"First"), TypeError, "prompt=b'First'"),
        (dict(prompt=""), ValueError, "`prompt` must hold at least one token"),
        (dict(prompt="Fé"), ValueError, "'é'.*no '<unk>'"),
        (dict(num_tokens=2.5), TypeError, "num_tokens=2.5"),
        (dict(num_tokens=0), ValueError, "num_tokens=0"),
        (dict(temperature="1"), TypeError, "temperature='1'"),
        (dict(temperature=-0.5), ValueError, "temperature=-0.5"),
        (dict(temperature=float("nan")), ValueError, "temperature=nan"),
        (dict(temperature=float("inf")), ValueError, "temperature=inf"),
        (dict(top_k=1.0), TypeError, "top_k=1.0"),
        (dict(top_k=-1), ValueError, "top_k=-1"),
        (dict(seed=-1), ValueError, "seed=-1"),
    ]
    for kwargs, error, pattern in bad:
        kwargs = {"export_path": export, "prompt": "First", "num_tokens": 3,
                  **kwargs}
        with pytest.raises(error, match=pattern):
            sample_text(**kwargs)


def test_word_level_sample(tmp_path):
    """A word-level export without "level" in config.json: whitespace words,
    a newline as <eos>, unknown words as <unk>; the text is the words, each
    after a space or at the start of a line."""

    words = Vocabulary(["<unk>", "<eos>", "the", "cat", "sat"])
    keras.utils.set_random_seed(1)
    lm = TransformerXLLM(5, num_layers=1, d_model=32, num_heads=2, d_ff=16,
                         mem_len=4, max_segment_len=3)
    export = export_language_model(lm, words, tmp_path, "words")
    _, ids = sample_text(export, "the dog\n  the  dog", 30, seed=2)
    logits, memories = lm(np.array([[2, 0, 1]], np.int32))  # the <unk> <eos>
    logits, memories = lm(np.array([[2, 0]], np.int32), memories)  # the <unk>
    expected, rng = [], np.random.default_rng(2)
    for _ in range(30):
        probs = np.exp(np.asarray(logits[0, -1], np.float64))
        expected.append(int(rng.choice(5, p=probs / probs.sum())))
        logits, memories = lm(np.array([[expected[-1]]], np.int32), memories)
    assert ids.tolist() == expected
    text, ids = sample_text(export, "the cat\n", 40, seed=0)
    pieces, after_eos = [], True  # the prompt ends with <eos>
    for token in words.decode(ids):
        pieces.append("\n" if token == "<eos>" else token if after_eos else " " + token)
        after_eos = token == "<eos>"
    assert text == "".join(pieces) and "<eos>" not in text
    with pytest.raises(ValueError, match=r"at least one token.*prompt=' \\t '"):
        sample_text(export, " \t ", 3)
