"""The Multi30k job end to end on a few hundred real pairs (smoke run):
validation BLEU after every epoch, checkpoint averaging chosen on val, the
test set decoded once at the end, an export."""

import dataclasses
import gc
import json
import time
import weakref

import pytest

from keras_trm.decoding import translator as translator_module
from keras_trm.jobs import translation
from keras_trm.data import load_multi30k


@pytest.mark.slow
def test_translation_job_uses_val_for_choices_and_test_once(
        data_dir, tmp_path, monkeypatch, caplog):
    decoded = []
    real = translator_module.Translator.translate_texts

    def spy(self, sentences, *args, **kwargs):
        decoded.append((getattr(self.search, "beam_size", 1), len(sentences),
                        sentences[0]))
        return real(self, sentences, *args, **kwargs)

    monkeypatch.setattr(translator_module.Translator, "translate_texts", spy)
    released = []
    release = translation.TranslationRun.release_training

    def release_spy(self):  # the training stream and step are really freed
        dataset = weakref.ref(self.stream["batches"])
        release(self)
        gc.collect()
        released.append((dataset() is None, self.model.train_function is None))

    monkeypatch.setattr(translation.TranslationRun, "release_training", release_spy)
    config = translation.TranslationConfig(
        vocabulary_size=400, num_layers=1, d_model=32, num_heads=2, d_ff=64,
        max_sequence_length=48, warmup_steps=10, tokens_per_batch=1024, epochs=3,
        average_last=3, limit=240, model_name="tiny_multi30k")
    with caplog.at_level("WARNING", logger="tensorflow"):
        result = translation.run(config, data_dir, tmp_path / "work",
                                 tmp_path / "export")
    # AutoGraph converted every function it traced (train step, searches,
    # export): where it cannot, it runs the code as is and keeps the error,
    # whose traceback kept fit()'s frame and the dataset alive (see below).
    assert not [r.getMessage() for r in caplog.records if "AutoGraph" in r.getMessage()]
    val_src, _ = load_multi30k("val", data_dir)
    test_src, _ = load_multi30k("test_2016_flickr", data_dir)
    greedy = [d for d in decoded if d[0] == 1]
    beam = [d for d in decoded if d[0] != 1]
    # Every greedy decode (3 epochs + averages of k = 1..3) is on val ...
    assert len(greedy) == 3 + 3
    assert all(first == val_src[0] for _, _, first in greedy)
    # ... and the test set is decoded exactly once, with beam search.
    assert len(beam) == 1 and beam[0][2] == test_src[0] and beam[0][0] == config.beam_size
    epochs = json.loads((tmp_path / "work" / "epochs.json").read_text())
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    assert all("val_greedy_bleu" in e for e in epochs)
    scores = result["val_greedy_bleu_by_average"]
    assert sorted(scores) == [1, 2, 3]
    assert scores[result["averaged_checkpoints"]] == max(scores.values())
    assert scores[1] == pytest.approx(epochs[-1]["val_greedy_bleu"], abs=0.01)
    assert result["test_split"] == "test_2016_flickr"
    assert (tmp_path / "export" / "tiny_multi30k").is_dir()
    # The job's stages ran in order; result.json, written by the last one,
    # times those before it and holds what run() returned.
    assert list(result["stage_seconds"]) == list(translation.TranslationRun.STAGES[:-1])
    assert released == [(True, True)]
    written = json.loads((tmp_path / "work" / "result.json").read_text())
    assert written["stage_seconds"] == result["stage_seconds"]
    # The Multi30k papers' metric beside sacreBLEU, on the same outputs.
    assert 0 <= result["test_lowercase_tokenized_bleu"] <= 100
    assert result["test_lowercase_tokenized_bleu_line"].startswith("BLEU = ")


@pytest.mark.slow
def test_several_corpora_with_weights_are_prepared_once(data_dir, tmp_path):
    """``dataset="files"`` with two training corpora and ``train_weights``:
    each is prepared once, a split of ``<workdir>/prepared`` (reused by a
    second run), and the result names both with their pairs and weights."""
    import gzip

    from keras_trm.data import read_lines

    src = read_lines(data_dir / "multi30k" / "train.en.gz")[:300]
    tgt = read_lines(data_dir / "multi30k" / "train.de.gz")[:300]
    files = {}
    for name, lo, hi in (("one", 0, 120), ("two", 120, 300)):
        for lang, lines in (("en", src), ("de", tgt)):
            path = tmp_path / f"{name}.{lang}.gz"
            with gzip.open(path, "wt", encoding="utf-8") as f:
                f.write("\n".join(lines[lo:hi]) + "\n")
            files[(name, lang)] = str(path)
    val = {lang: str(data_dir / "multi30k" / f"val.{lang}.gz") for lang in ("en", "de")}
    config = translation.TranslationConfig(
        dataset="files", train_source=f"{files['one', 'en']},{files['two', 'en']}",
        train_target=f"{files['one', 'de']},{files['two', 'de']}",
        train_weights="1,3", validation_source=val["en"], validation_target=val["de"],
        validation_limit=20, preset="tiny", epochs=1, average_last=1,
        model_name="two_corpora")
    result = translation.run(config, None, tmp_path / "work", tmp_path / "export")
    assert result["train_split"] == "one+two"
    assert result["train_weights"] == [1.0, 3.0]
    assert result["test_bleu"] is None  # no test split given
    manifest = tmp_path / "work" / "prepared" / "manifest.json"
    read = json.loads(manifest.read_text())["splits"]
    assert sorted(read) == ["one", "two"]
    assert [read[n]["lines"] for n in ("one", "two")] == [120, 180]
    assert result["train_pairs"] == {n: read[n]["pairs"] for n in ("one", "two")}
    assert all(m["pairs"] + m["too_long"] + m["blank"] == m["lines"]
               for m in read.values())
    stamp = manifest.stat().st_mtime_ns
    bad = dataclasses.replace(config, train_weights="1")
    with pytest.raises(ValueError, match="train_weights"):
        translation.run(bad, None, tmp_path / "work2", tmp_path / "export")
    import shutil

    shutil.rmtree(tmp_path / "work" / "backup")
    translation.run(config, None, tmp_path / "work", tmp_path / "export")
    assert manifest.stat().st_mtime_ns == stamp  # reused


@pytest.mark.parametrize("bad", [{"parallel_searches": 0},
                                 {"weight_decay": -0.01},
                                 {"export_jit_compile_max_batch_size": -1},
                                 # 63 x 16 buckets > TF Serving's 1000 warm-up
                                 # requests (max_sequence_length 128)
                                 {"export_jit_compile_max_batch_size": 63}])
def test_bad_options_fail_before_training(bad, data_dir, tmp_path):
    config = translation.TranslationConfig(limit=10, **bad)
    (name, value), = bad.items()
    with pytest.raises(ValueError, match=f"{name}={value}"):
        translation.run(config, data_dir, tmp_path / "work", tmp_path / "export")
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("boundaries", ["16,x", "0,32"])
def test_bad_boundaries_fail_before_training(boundaries, data_dir, tmp_path):
    config = translation.TranslationConfig(limit=10, boundaries=boundaries)
    with pytest.raises(ValueError, match=f"boundaries='{boundaries}'"):
        translation.run(config, data_dir, tmp_path / "work", tmp_path / "export")
    assert not (tmp_path / "work").exists()


def test_transformer_small_is_the_model_the_job_builds_by_default():
    """The preset promises the quickstart's model: every model field of the
    job's defaults (and the vocabulary size) is the preset's."""
    from keras_trm.models import transformer_small

    defaults = translation.TranslationConfig()
    config = transformer_small().get_config()
    for name in ("vocabulary_size",) + translation.TranslationConfig.SECTIONS["model"]:
        assert config[name] == getattr(defaults, name), name


@pytest.mark.slow
def test_job_under_jax_exports_what_it_decoded(data_dir, tmp_path):
    """``KERAS_BACKEND=jax keras-trm train-translation``: trains (jax.jit),
    decodes val and test with the keras.ops search, and its SavedModel,
    exported by a TensorFlow child process from the trained weights and
    loaded here without keras_trm, translates the test sentences exactly as
    the JAX search did."""
    import os
    import subprocess
    import sys

    import tensorflow as tf
    import tensorflow_text  # noqa: F401 -- the export's tokenizer ops

    pytest.importorskip("jax")
    work, export = tmp_path / "work", tmp_path / "export"
    env = dict(os.environ, KERAS_BACKEND="jax", KERAS_TRM_DATA_DIR=str(data_dir))
    subprocess.run(
        [sys.executable, "-m", "keras_trm.cli", "train-translation",
         # Under JAX each bucket width is a compilation: two buckets
         # (--boundaries) rather than the default six below 32 tokens; 20
         # cheap epochs (validation every 10) make the model emit words.
         "--preset", "tiny", "--limit", "120", "--max_sequence_length", "32",
         "--boundaries", "16",
         "--epochs", "20", "--eval_every_epochs", "10",
         "--average_last", "1", "--workdir", str(work), "--export_dir",
         str(export)],
        env=env, check=True, timeout=600, capture_output=True)
    result = json.loads((work / "result.json").read_text())
    assert result["backend"] == "jax" and result["export_error"] is None
    assert result["bucket_boundaries"] == [16, 32]
    hyps = (work / "test_2016_flickr.hyp.de").read_text().split("\n")[:-1]
    test_src, _ = load_multi30k("test_2016_flickr", data_dir)
    assert len(hyps) == 120 and all(h.strip() for h in hyps), hyps[:3]
    served = tf.saved_model.load(result["export"]).signatures["serving_default"]
    out = served(sentences=tf.constant(test_src[:120]))
    (texts,) = out.values()
    assert [t.decode() for t in texts.numpy()] == hyps


@pytest.mark.slow
def test_a_budget_that_cuts_the_run_fits_its_schedule(data_dir, tmp_path, monkeypatch):
    """``budget_schedule="fit"`` on a fake clock where each epoch takes 100
    s of a 250-s budget: after the first, one more fits, so the rate decays
    to 0 over the second epoch and the job stops there (of 4 planned)."""
    import types

    from keras_trm.training import progress

    clock = [0.0]
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(
        time=lambda: clock[0], perf_counter=time.perf_counter))
    end_epoch = progress.TimeBudget.on_epoch_end

    def slow_epoch(self, epoch, logs=None):
        clock[0] += 100.0
        return end_epoch(self, epoch, logs)

    monkeypatch.setattr(progress.TimeBudget, "on_epoch_end", slow_epoch)
    config = translation.TranslationConfig(
        vocabulary_size=400, num_layers=1, d_model=32, num_heads=2, d_ff=64,
        max_sequence_length=48, warmup_steps=10, tokens_per_batch=1024, epochs=4,
        average_last=1, limit=240, model_name="tiny", time_budget_minutes=250 / 60,
        budget_schedule="fit", beam_size=1)
    result = translation.run(config, data_dir, tmp_path / "work", tmp_path / "export")
    steps = json.loads((tmp_path / "work" / "result.json").read_text())["budget_decay_steps"]
    assert result["epochs"] == 2
    per_epoch = steps[0]
    assert per_epoch > 0 and steps == [per_epoch, 2 * per_epoch]
