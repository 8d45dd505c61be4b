"""A language model on one's own text file (issue #63): ``load_text_file``
cuts it 90/5/5 as the bundled corpora are cut, with the training split's
vocabulary and ``<unk>`` for the rest, and ``keras-trm train-lm --data.corpus
file`` trains on it, with or without the vanilla baseline."""

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_trm.data import language_modeling as lm
from keras_trm.data.translation import CorpusError


def test_char_level_file_is_cut_as_tiny_shakespeare(data_dir):
    path = data_dir / "tinyshakespeare" / "input.txt"
    splits, vocabulary = lm.load_text_file(path, level="char")
    assert vocabulary.tokens[0] == "<unk>"
    for split in ("train", "valid", "test"):
        text = lm.load_tiny_shakespeare(split, data_dir)
        assert "".join(vocabulary.decode(splits[split])) == text
        assert splits[split].dtype == np.int32


def test_word_level_file_gets_the_training_vocabulary(tmp_path):
    lines = [f"the cat {i % 7} sat" for i in range(180)] + ["a dog ran far"] * 20
    path = tmp_path / "words.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    splits, vocabulary = lm.load_text_file(path, level="word")
    tokens = [t for line in lines for t in line.split() + ["<eos>"]]
    train_end, valid_end = int(len(tokens) * 0.9), int(len(tokens) * 0.95)
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [
        train_end, valid_end - train_end, len(tokens) - valid_end]
    # ids follow the training split's counts; "dog" (only at the end) is <unk>
    assert vocabulary.tokens[:3] == ["<unk>", "the", "cat"]
    assert "dog" not in vocabulary
    expected = [vocabulary.token_to_id.get(t, 0) for t in tokens]
    np.testing.assert_array_equal(
        np.concatenate([splits[s] for s in ("train", "valid", "test")]), expected)
    assert (splits["test"] == 0).any()


def test_bad_text_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="level"):
        lm.load_text_file(tmp_path / "x.txt", level="byte")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        lm.load_text_file(tmp_path / "missing.txt")
    short = tmp_path / "short.txt"
    short.write_text("a b\n")
    with pytest.raises(CorpusError, match="short.txt holds 3 word tokens"):
        lm.load_text_file(short, level="word")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1") * 50)
    with pytest.raises(CorpusError, match="latin1.txt"):
        lm.load_text_file(latin)


def test_train_lm_on_a_text_file_without_the_baseline(tmp_path):
    text = tmp_path / "notes.txt"
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "eps"]
    text.write_text("".join(" ".join(rng.choice(words, 6)) + "\n" for _ in range(700)))
    command = [sys.executable, "-m", "keras_trm.cli", "train-lm",
               "--data.corpus", "file", "--data.text_file", str(text),
               "--data.level", "word", "--training.baseline", "false",
               "--model.num_layers", "1", "--model.d_model", "16",
               "--model.num_heads", "2", "--model.d_ff", "32", "--model.seg_len", "8",
               "--model.mem_len", "8", "--training.batch_size", "4",
               "--training.steps", "6", "--training.warmup_steps", "2",
               "--training.eval_every", "3", "--evaluation.eval_batch_size", "2",
               "--workdir", str(tmp_path / "work"), "--export_dir",
               str(tmp_path / "export")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "work" / "results" / "result.json").read_text())
    assert result["vanilla"] is None and result["level"] == "word"
    assert result["vocabulary_size"] == 1 + len(words) + 1  # <unk>, words, <eos>
    assert math_finite(result["transformer_xl"]["test"]["perplexity"])
    report = (tmp_path / "work" / "results" / "report.md").read_text()
    assert "vanilla" not in report and "| **test bits/word** |" in report
    exported = tmp_path / "export" / "transformer_xl_notes" / "1" / "assets.extra"
    assert json.loads((exported / "config.json").read_text())["level"] == "word"
    assert not (tmp_path / "work" / "vanilla.keras").exists()


def test_text_file_goes_with_corpus_file_only():
    from keras_trm.jobs.language_model import LanguageModelConfig

    with pytest.raises(ValueError, match="text_file"):
        LanguageModelConfig(corpus="file").validate()
    with pytest.raises(ValueError, match="text_file"):
        LanguageModelConfig(text_file="x.txt").validate()
    with pytest.raises(TypeError, match="baseline"):
        LanguageModelConfig(baseline="no").validate()


def math_finite(value):
    return bool(np.isfinite(value))
