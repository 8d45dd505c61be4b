"""The Multi30k job end to end on a few hundred real pairs (smoke run):
validation BLEU after every epoch, checkpoint averaging chosen on val, the
test set decoded once at the end, an export."""

import json

import pytest

from keras_trm.decoding import translator as translator_module
from keras_trm.jobs import translation
from keras_trm.data import load_multi30k


def test_translation_job_uses_val_for_choices_and_test_once(
        data_dir, tmp_path, monkeypatch):
    decoded = []
    real = translator_module.Translator.translate_texts

    def spy(self, sentences, *args, **kwargs):
        decoded.append((self.beam_size, len(sentences), sentences[0]))
        return real(self, sentences, *args, **kwargs)

    monkeypatch.setattr(translator_module.Translator, "translate_texts", spy)
    config = translation.TranslationConfig(
        vocabulary_size=400, num_layers=1, d_model=32, num_heads=2, d_ff=64,
        max_length=48, warmup_steps=10, tokens_per_batch=1024, epochs=3,
        average_last=3, limit=240, model_name="tiny_multi30k")
    result = translation.run(config, data_dir, tmp_path / "work",
                             tmp_path / "export")
    val_src, _ = load_multi30k("val", data_dir)
    test_src, _ = load_multi30k("test_2016_flickr", data_dir)
    greedy = [d for d in decoded if d[0] == 1]
    beam = [d for d in decoded if d[0] != 1]
    # Every greedy decode (3 epochs + averages of k = 1..3) is on val ...
    assert len(greedy) == 3 + 3
    assert all(first == val_src[0] for _, _, first in greedy)
    # ... and the test set is decoded exactly once, with beam search.
    assert len(beam) == 1 and beam[0][2] == test_src[0] and beam[0][0] == 4
    epochs = json.loads((tmp_path / "work" / "epochs.json").read_text())
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    assert all("val_greedy_bleu" in e for e in epochs)
    scores = result["val_greedy_bleu_by_average"]
    assert sorted(scores) == [1, 2, 3]
    assert scores[result["averaged_checkpoints"]] == max(scores.values())
    assert scores[1] == pytest.approx(epochs[-1]["val_greedy_bleu"], abs=0.01)
    assert result["test_split"] == "test_2016_flickr"
    assert (tmp_path / "export" / "tiny_multi30k").is_dir()
