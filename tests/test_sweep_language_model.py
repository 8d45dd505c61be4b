"""recipes/sweep_language_model.py (issue #63): an Optuna study of the
language-model recipe that reads the valid split only, records every trial,
goes on where it stopped, and prints flags that ``keras-trm train-lm``
takes."""

import importlib.util
import json
import math
import pathlib

import keras_trm  # noqa: F401  (checks the TensorFlow backend first)

import pytest  # noqa: E402

from keras_trm import cli  # noqa: E402
from keras_trm.data import language_modeling as lm  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
pytest.importorskip("optuna")


def _sweep():
    spec = importlib.util.spec_from_file_location(
        "sweep_language_model", REPO / "recipes" / "sweep_language_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_two_trials_on_valid_only(tmp_path, monkeypatch, capsys):
    load = lm.load_lm_corpus

    def no_test_split(corpus, split, *args, **kwargs):
        assert split != "test", "a trial read the test split"
        return load(corpus, split, *args, **kwargs)

    monkeypatch.setattr(lm, "load_lm_corpus", no_test_split)
    sweep = _sweep()
    out = tmp_path / "search.json"
    argv = ["--corpus", "ptb", "--trials", "2", "--minutes", "0.02",
            "--precision", "float32", "--root", str(tmp_path / "study"),
            "--out", str(out), "--train_tokens", "20000", "--eval_tokens", "3000"]
    assert sweep.main(argv) == 0
    report = json.loads(out.read_text())
    assert [t["number"] for t in report["trials"]] == [0, 1]
    for trial in report["trials"]:
        by_memory = trial["valid_perplexity_by_eval_mem_len"]
        assert len(by_memory) == 3
        assert trial["valid_perplexity"] == min(by_memory.values())
        assert 1 < trial["valid_perplexity"] < 1e6 and math.isfinite(
            trial["valid_perplexity"])
        assert trial["config"]["eval_mem_len"] in {int(m) for m in by_memory}
        assert trial["steps"] >= 1 and trial["config"]["corpus"] == "ptb"
    assert report["best"]["valid_perplexity"] == min(
        t["valid_perplexity"] for t in report["trials"])
    # The printed command is the recipe with flags train-lm takes.
    command = capsys.readouterr().out.strip().splitlines()[-1]
    flags = command.split("python recipes/language_model.py ", 1)[1].split()
    parser = cli.config_parser("train-lm", "", sweep.LanguageModelConfig, "runs/x")
    config, _ = cli.parse_config(parser, sweep.LanguageModelConfig, flags)
    assert config.d_model == report["best"]["config"]["d_model"]
    assert config.eval_mem_len == report["best"]["config"]["eval_mem_len"]
    # The study goes on where it stopped: two trials done, none run again.
    assert sweep.main(argv) == 0
    assert len(json.loads(out.read_text())["trials"]) == 2
