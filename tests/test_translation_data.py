"""Translation beyond Multi30k: parallel-file and WMT14 readers in either
direction, their errors, SentencePiece (learned, round trip, in-graph
export), presets vs the paper, the compound-split BLEU, and the job on the
user's own files in DE->EN."""

import gzip
import json
import os
import subprocess
import sys
import textwrap

import pytest
import sacrebleu
import tensorflow as tf

from keras_trm.data import load_parallel, load_translation_splits, load_wmt14
from keras_trm.decoding.bleu import compound_split_bleu
from keras_trm.text import (
    END_ID,
    PAD_ID,
    START_ID,
    UNK_ID,
    SentencePieceTokenizer,
    learn_sentencepiece,
)
from keras_trm.training import apply_preset, preset

pytestmark = pytest.mark.portable  # CI runs it under each backend


def _write(path, lines):
    text = "".join(line + "\n" for line in lines)
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# --- readers -----------------------------------------------------------------

def test_load_parallel_plain_and_gzip(tmp_path):
    src = _write(tmp_path / "a.de.gz", ["Ein Hund.", "Zwei Katzen, größer."])
    tgt = _write(tmp_path / "a.en", ["A dog.", "Two cats, bigger."])
    assert load_parallel(src, tgt) == (["Ein Hund.", "Zwei Katzen, größer."],
                                       ["A dog.", "Two cats, bigger."])


def test_load_parallel_errors_name_files_and_counts(tmp_path):
    src = _write(tmp_path / "x.en", ["a", "b", "c"])
    tgt = _write(tmp_path / "x.de.gz", ["a", "b"])
    with pytest.raises(ValueError) as err:
        load_parallel(src, tgt)
    message = str(err.value)
    assert "x.en" in message and "3 lines" in message
    assert "x.de.gz" in message and "2 lines" in message
    with pytest.raises(FileNotFoundError, match="nope.de"):
        load_parallel(src, tmp_path / "nope.de")
    empty_src, empty_tgt = _write(tmp_path / "e.en", []), _write(tmp_path / "e.de", [])
    with pytest.raises(ValueError, match=r"empty.*e\.en.*0 lines.*e\.de.*0 lines"):
        load_parallel(empty_src, empty_tgt)
    blank_src = _write(tmp_path / "b.en", ["", " "])
    blank_tgt = _write(tmp_path / "b.de", ["x", ""])
    with pytest.raises(ValueError, match="empty"):
        load_parallel(blank_src, blank_tgt)


def test_files_dataset_splits_and_missing_paths(tmp_path):
    files = {}
    for role in ("train", "validation"):
        files[f"{role}_source"] = _write(tmp_path / f"{role}.de", [f"{role} de"])
        files[f"{role}_target"] = _write(tmp_path / f"{role}.en.gz", [f"{role} en"])
    splits = load_translation_splits("files", None, "de", "en", files=files)
    assert splits.train == (["train de"], ["train en"])
    assert splits.validation == (["validation de"], ["validation en"])
    assert splits.test == ([], []) and splits.names["validation"] == "validation"
    del files["validation_target"]
    with pytest.raises(ValueError, match="validation_target=''"):
        load_translation_splits("files", None, "de", "en", files=files)
    with pytest.raises(ValueError, match="dataset='nope'"):
        load_translation_splits("nope")
    with pytest.raises(ValueError, match="must differ"):
        load_translation_splits("files", None, "en", "en", files=files)


def test_wmt14_local_splits_and_direction(data_dir):
    if not (data_dir / "wmt14_en_de").is_dir():
        pytest.skip("no wmt14_en_de in the data directory")
    splits = load_translation_splits("wmt14", data_dir, "en", "de")
    counts = [len(getattr(splits, r)[0]) for r in ("train", "validation", "test")]
    assert counts == [20000, 3000, 3003]
    assert all(len(s) == len(t) for s, t in (splits.train, splits.validation,
                                             splits.test))
    assert splits.train[0][0] == "Resumption of the session"
    assert splits.train[1][0] == "Wiederaufnahme der Sitzungsperiode"
    reverse = load_wmt14("test", data_dir, source="de", target="en")
    assert reverse == (splits.test[1], splits.test[0])
    assert load_wmt14("newstest2014", data_dir) == splits.test
    with pytest.raises(ValueError, match="'fr'"):
        load_wmt14("test", data_dir, source="en", target="fr")


# --- SentencePiece --------------------------------------------------------------

@pytest.fixture(scope="module")
def sp_model(multi30k_small, tmp_path_factory):
    src, tgt = multi30k_small
    path = tmp_path_factory.mktemp("sp") / "bpe.model"
    return learn_sentencepiece(src + tgt, 1000, path, model_type="bpe")


def test_sentencepiece_special_ids_and_round_trip(sp_model, multi30k_small):
    import sentencepiece as spm

    tok = SentencePieceTokenizer(sp_model)
    assert tok.vocabulary_size == 1000
    assert tok.vocabulary[PAD_ID] == "[PAD]" and tok.vocabulary[UNK_ID] == "[UNK]"
    assert tok.vocabulary[START_ID] == "[START]" and tok.vocabulary[END_ID] == "[END]"
    sentences = multi30k_small[0][:50] + multi30k_small[1][:50] + ["Ein Ärger: 3½ €!"]
    ids = tok.tokenize(tf.constant(sentences))
    # The in-graph ids equal the sentencepiece package's own encoding.
    reference = spm.SentencePieceProcessor(model_file=str(sp_model))
    assert ids.to_list() == reference.encode(sentences)
    assert min(min(row) for row in ids.to_list()) > END_ID  # no UNK, no specials
    decoded = [s.decode() for s in tok.detokenize(ids).numpy()]
    assert decoded[:-1] == sentences[:-1]  # plain text: exact round trip
    # SentencePiece's default NFKC normalization: "½" comes back as "1⁄2",
    # as the package itself decodes it.
    assert decoded[-1] == reference.decode(reference.encode(sentences[-1]))
    assert decoded[-1] == "Ein Ärger: 31⁄2 €!"
    # Padded rows: decoding stops at the first END, START/PAD are dropped.
    row = ids.to_list()[0]
    dense = tf.constant([[START_ID] + row + [END_ID] + row[:2] + [PAD_ID] * 3])
    assert tok.detokenize(dense).numpy()[0].decode() == sentences[0]


def test_sentencepiece_unigram_and_errors(multi30k_small, tmp_path):
    src, tgt = multi30k_small
    path = learn_sentencepiece(src[:500] + tgt[:500], 600, tmp_path / "u.model",
                               model_type="unigram", sample_size=400)
    tok = SentencePieceTokenizer(path)
    text = [src[0], tgt[0]]
    assert [s.decode() for s in tok.detokenize(tok.tokenize(tf.constant(text))).numpy()] == text
    with pytest.raises(ValueError, match="model_type"):
        learn_sentencepiece(src, 600, tmp_path / "x.model", model_type="char")
    with pytest.raises(ValueError, match="non-blank"):
        learn_sentencepiece(["", " "], 600, tmp_path / "x.model")
    with pytest.raises(FileNotFoundError, match="missing.model"):
        SentencePieceTokenizer(tmp_path / "missing.model")


# --- presets and BLEU ------------------------------------------------------------

def test_presets_match_the_paper():
    base, big = preset("transformer_base"), preset("transformer_big")
    assert (base["num_layers"], base["d_model"], base["num_heads"], base["d_ff"],
            base["dropout_rate"]) == (6, 512, 8, 2048, 0.1)
    assert (big["num_layers"], big["d_model"], big["num_heads"], big["d_ff"],
            big["dropout_rate"]) == (6, 1024, 16, 4096, 0.3)
    for p in (base, big):
        assert p["warmup_steps"] == 4000 and p["label_smoothing"] == 0.1
        assert p["beam_size"] == 4 and p["length_penalty"] == 0.6
        assert p["tokens_per_batch"] == 25000 and p["vocabulary_size"] == 37000
    from keras_trm.jobs.translation import TranslationConfig

    defaults = TranslationConfig()
    cpu = preset("cpu_small")
    assert all(getattr(defaults, k) == v for k, v in cpu.items())
    config = apply_preset(TranslationConfig(preset="transformer_big", dropout_rate=0.2))
    assert (config.d_model, config.num_heads, config.dropout_rate) == (1024, 16, 0.2)
    assert apply_preset(defaults) == defaults
    with pytest.raises(ValueError, match="preset='huge'"):
        apply_preset(defaults, "huge")


def test_compound_split_bleu_matches_the_t2t_procedure():
    hyps = ["Das ist ein Eis-Café in Berlin.", "Er kam, sah und siegte."]
    refs = ["Das ist das Eis-Café in Berlin.", "Er kam , sah und siegte !"]
    # Independently: Moses-tokenized by hand, hyphens split as get_ende_bleu.sh.
    tok_hyps = ["Das ist ein Eis ##AT##-##AT## Café in Berlin .",
                "Er kam , sah und siegte ."]
    tok_refs = ["Das ist das Eis ##AT##-##AT## Café in Berlin .",
                "Er kam , sah und siegte !"]
    expected = sacrebleu.corpus_bleu(tok_hyps, [tok_refs], tokenize="none").score
    assert compound_split_bleu(hyps, refs)[0] == pytest.approx(expected)
    with pytest.raises(ValueError, match="1 sentences"):
        compound_split_bleu(hyps[:1], refs)


# --- the job on the user's own files, DE->EN, and its export ---------------------

@pytest.mark.slow
def test_job_on_user_files_de_en_and_export_without_keras_trm(data_dir, tmp_path):
    from keras_trm.jobs import translation

    src, tgt = load_wmt14("train", data_dir, source="de", target="en")
    pairs = [(s, t) for s, t in zip(src, tgt) if 0 < len(s) < 60 and 0 < len(t) < 60][:70]
    files = {}
    for role, part in (("train", pairs[:50]), ("validation", pairs[50:60]),
                       ("test", pairs[60:])):
        files[f"{role}_source"] = str(_write(tmp_path / f"{role}.de.gz", [p[0] for p in part]))
        files[f"{role}_target"] = str(_write(tmp_path / f"{role}.en", [p[1] for p in part]))
    config = translation.TranslationConfig(
        dataset="files", source_language="de", target_language="en",
        preset="tiny", vocabulary_size=1000, max_sequence_length=48, epochs=1,
        average_last=1, export_jit_compile_max_batch_size=1, **files)
    result = translation.run(config, None, tmp_path / "work", tmp_path / "export")
    assert result["direction"] == "de-en" and result["test_split"] == "test"
    assert result["vocabulary"] == "sentencepiece_bpe"
    assert result["config"]["d_model"] == 32  # the tiny preset
    saved = json.loads((tmp_path / "work" / "result.json").read_text())
    assert saved["test_bleu"] == result["test_bleu"] is not None
    hyps = (tmp_path / "work" / "test.hyp.en").read_text().split("\n")[:-1]
    assert len(hyps) == 10
    export = tmp_path / "export" / "transformer_files_de_en" / "1"
    # The XLA search is in the export (a graph-only one has no such function).
    assert b"_XlaMustCompile" in (export / "saved_model.pb").read_bytes()
    # Its warm-up requests: single validation sentences, one per 8-token
    # source bucket (what XLA compiles), every bucket the validation reaches.
    from keras_trm.export import read_warmup_requests, warmup_path

    warmup = [inputs["sentences"].numpy().tolist()
              for _, inputs in read_warmup_requests(warmup_path(export))]
    val_src = [p[0] for p in pairs[50:60]]
    assert warmup and all(len(w) == 1 and w[0].decode() in val_src for w in warmup)
    tokenizer = SentencePieceTokenizer(tmp_path / "work" / "spm_bpe_1000.model")

    def buckets(sentences):  # source ids + END, at most max_sequence_length, per 8
        ids = tokenizer.tokenize(tf.constant(sentences))
        return [min(-(-(min(int(n), 47) + 1) // 8) * 8, 48)
                for n in ids.row_lengths().numpy()]

    assert buckets([w[0].decode() for w in warmup]) == sorted(set(buckets(val_src)))
    assert len(warmup) >= 2  # the 10 validation sentences span several buckets
    script = textwrap.dedent(f"""
        import sys, tensorflow as tf, tensorflow_text
        serve = tf.saved_model.load({str(export)!r}).signatures["serving_default"]
        (out,) = serve(tf.constant({[p[0] for p in pairs[60:62]]!r})).values()
        # One sentence: the export's XLA search (export_jit_compile_max_batch_size=1).
        (one,) = serve(tf.constant({[pairs[61][0]]!r})).values()
        assert not any(m.startswith("keras_trm") for m in sys.modules)
        print("\\n".join(s.decode() for s in [*out.numpy(), *one.numpy()]))
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == hyps[:2] + hyps[1:2]


def test_sample_lines_is_seeded_uniform_and_bounded(tmp_path):
    from keras_trm.data import sample_lines

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("".join(f"a{i}\n" for i in range(600)) + "\n")
    b.write_text("".join(f"b{i}\n" for i in range(400)))
    everything = sample_lines([a, b], 0)
    assert everything == [f"a{i}" for i in range(600)] + [f"b{i}" for i in range(400)]
    assert sample_lines([a, b], 5000) == everything  # blank line skipped
    drawn = sample_lines([a, b], 200, seed=1)
    assert len(drawn) == 200 == len(set(drawn))
    assert drawn == sample_lines([a, b], 200, seed=1) != sample_lines([a, b], 200, seed=2)
    assert drawn == sorted(drawn, key=everything.index)  # file order
    share_b = sum(x.startswith("b") for x in drawn) / 200
    assert 0.25 < share_b < 0.55  # 40% of the lines
    with pytest.raises(ValueError, match="sample_size"):
        sample_lines([a], -1)


def test_wmt14_training_files_are_the_europarl_slice_and_the_news_pool(data_dir):
    from keras_trm.data import translation_train_files

    corpora = translation_train_files("wmt14", data_dir, "de", "en")
    assert [name for name, _, _ in corpora] == [
        "europarl_v7_first20000", "newstest2008-2022-pool"]
    assert all(s.name.endswith(".de.gz") and t.name.endswith(".en.gz")
               for _, s, t in corpora)
    with pytest.raises(ValueError, match="train_source"):
        translation_train_files("files", files={"train_source": "a,b",
                                                "train_target": "c"})
