"""CTranslate2 export: the same weights give the same numbers and tokens."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

ctranslate2 = pytest.importorskip(
    "ctranslate2",
    reason='ctranslate2 is not installed (pip install -e ".[ctranslate2]")',
)

from keras_trm.decoding import GreedySearch, Translator, search_strategy  # noqa: E402
from keras_trm.export.ctranslate2 import (  # noqa: E402
    CTranslate2Translator,
    build_spec,
    cpu_has_int8_dot_product,
    default_compute_type,
    export_ctranslate2,
)
from keras_trm.models import transformer  # noqa: E402
from keras_trm.text import END_ID, RESERVED_TOKENS, START_ID  # noqa: E402
from keras_trm.training import LabelSmoothedCrossEntropy  # noqa: E402


def _log_probs(model, source_ids, target_ids):
    """Our model's log P(target_t | target_<t, source) per target token
    (target = ids + END, decoder input = START + ids)."""
    enc = np.array([source_ids + [END_ID]], "int32")
    dec_in = np.array([[START_ID] + target_ids], "int32")
    logits = model({"encoder_tokens": enc, "decoder_tokens": dec_in},
                   training=False)[0].numpy().astype("float64")
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    gold = target_ids + [END_ID]
    return log_p[np.arange(len(gold)), gold]


@pytest.mark.parametrize("options", [
    dict(),  # the paper's: post-LN, tied, sinusoidal
    dict(norm_first=True, position="learned", tie_embeddings="none"),
    dict(tie_embeddings="decoder"),
])
def test_scores_equal_our_log_probs(tmp_path, rng, options):
    """CT2's score_batch on the exported model equals our forward pass."""
    vocab = list(RESERVED_TOKENS) + [f"t{i}" for i in range(36)]
    model = transformer(len(vocab), num_layers=2, d_model=16, num_heads=2,
                        d_ff=32, max_sequence_length=20, dropout_rate=0.0, **options)
    # Non-trivial norms and biases, so that a mis-mapped one shows.
    for w in model.weights:
        if "gamma" in w.path or "beta" in w.path or "bias" in w.path:
            w.assign(w.numpy() + rng.normal(0, 0.2, w.shape).astype("float32"))
    path = export_ctranslate2(model, tmp_path / "ct2", vocab)
    translator = ctranslate2.Translator(str(path), intra_threads=1)
    sources = [rng.integers(4, len(vocab), n).tolist() for n in (5, 9, 2)]
    targets = [rng.integers(4, len(vocab), n).tolist() for n in (7, 3, 11)]
    results = translator.score_batch(
        [[vocab[i] for i in s] for s in sources],
        [[vocab[i] for i in t] for t in targets])
    for s, t, result in zip(sources, targets, results):
        ours = _log_probs(model, s, t)
        assert result.tokens == [vocab[i] for i in t] + ["[END]"]
        np.testing.assert_allclose(result.log_probs, ours, atol=2e-4)


@pytest.fixture(scope="module")
def trained(multi30k_small, tokenizer, tmp_path_factory):
    """A tiny model trained for a few hundred steps on real Multi30k pairs,
    exported float32 and int8."""
    keras.utils.set_random_seed(7)
    src, tgt = multi30k_small
    vocab = tokenizer.vocabulary
    max_len = 32

    def pad(rows):
        out = np.zeros((len(rows), max_len), "int32")
        for i, r in enumerate(rows):
            r = r[:max_len]
            out[i, :len(r)] = r
        return out

    s_ids = tokenizer.tokenize(tf.constant(src)).to_list()
    t_ids = tokenizer.tokenize(tf.constant(tgt)).to_list()
    enc = pad([r[:max_len - 1] + [END_ID] for r in s_ids])
    dec_in = pad([[START_ID] + r[:max_len - 1] for r in t_ids])
    dec_out = pad([r[:max_len - 1] + [END_ID] for r in t_ids])
    model = transformer(len(vocab), num_layers=2, d_model=64, num_heads=4,
                        d_ff=128, max_sequence_length=64, dropout_rate=0.0)
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss=LabelSmoothedCrossEntropy(label_smoothing=0.0))
    model.fit({"encoder_tokens": enc, "decoder_tokens": dec_in}, dec_out,
              batch_size=50, epochs=4, verbose=0)
    root = tmp_path_factory.mktemp("ct2")
    return {
        "model": model,
        "vocab": vocab,
        "float32": export_ctranslate2(model, root / "f32", vocab),
        "int8": export_ctranslate2(model, root / "int8", vocab,
                                   quantization="int8"),
    }


@pytest.fixture(scope="module")
def val_sentences(data_dir):
    from keras_trm.data import load_multi30k

    return load_multi30k("val", data_dir)[0][:40]


def test_greedy_tokens_equal_ours_on_real_sentences(trained, tokenizer,
                                                   val_sentences):
    translator = Translator(trained["model"], tokenizer, search=GreedySearch())
    ids = tf.function(translator.generate_ids)(
        translator.encode_text(tf.constant(val_sentences))).numpy()
    ours_text = [s.decode() for s in tokenizer.detokenize(ids).numpy()]
    ct2 = CTranslate2Translator(trained["float32"], num_threads=1)
    theirs = ct2.translate_tokens(ct2.tokenize(val_sentences), beam_size=1)
    ours = []
    for row in ids:
        n = int(np.argmax(row == END_ID)) if (row == END_ID).any() else len(row)
        ours.append([trained["vocab"][i] for i in row[:n]])
    # The model learned something: outputs vary and are not empty.
    assert len({tuple(t) for t in ours}) > 10 and all(ours)
    assert theirs == ours  # token for token
    # ... and the runner's raw-text path gives our detokenized text.
    assert ct2.translate_texts(val_sentences, beam_size=1,
                               max_batch_size=16) == ours_text
    # Two CTranslate2 replicas decoding halves of each batch at once
    # (``inter_threads=2``): the same tokens, in the same order.
    pair = CTranslate2Translator(trained["float32"], num_threads=1,
                                 inter_threads=2)
    assert pair.translate_tokens(ct2.tokenize(val_sentences), beam_size=1) == ours
    with pytest.raises(ValueError, match="inter_threads=0"):
        CTranslate2Translator(trained["float32"], inter_threads=0)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_parallel_searches_and_length_groups_keep_each_sentences_ids(
        trained, tokenizer, val_sentences, beam_size):
    """``Translator(parallel_searches=n)`` deals the batch by source length
    into n searches, ``encode_groups=g`` encodes it in g groups padded to
    their own longest: every sentence gets the ids of one search over the
    encoder run on the whole batch, in its own row, for any n, g and batch
    size (fewer sentences than parts or groups, none)."""
    def search(parts, groups):
        """sentences -> ids, traced once."""
        translator = Translator(trained["model"], tokenizer,
                                search=search_strategy(beam_size=beam_size),
                                parallel_searches=parts, encode_groups=groups)
        generate = tf.function(translator.generate_ids, input_signature=[
            tf.TensorSpec([None, None], tf.int32)])
        return lambda sentences: generate(translator.encode_text(
            tf.constant(sentences, tf.string))).numpy()

    one = search(1, 1)
    expected = one(val_sentences)
    assert len({row.tobytes() for row in expected}) > 10  # a mix-up shows
    for parts, groups in ((1, 4), (2, 3)):
        split = search(parts, groups)
        np.testing.assert_array_equal(split(val_sentences), expected)
        np.testing.assert_array_equal(split(val_sentences[:2]),
                                      one(val_sentences[:2]))
        assert split([]).shape[0] == 0
    for name in ("parallel_searches", "encode_groups"):
        for bad, error in ((0, ValueError), (True, TypeError),
                           (2.0, TypeError)):
            with pytest.raises(error, match=f"{name}={bad!r}"):
                Translator(trained["model"], tokenizer, **{name: bad})


# Scores the float32 export's greedy output with the int8 export as
# CTranslate2Translator runs it by default. Run in a fresh process so that
# the environment (e.g. MKL_ENABLE_INSTRUCTIONS=AVX2, which makes MKL and
# our compute-type choice behave as on an AVX2 host) applies from the start.
_INT8_CHECK = """
import json, sys
import numpy as np
from keras_trm.export.ctranslate2 import CTranslate2Translator
f32_dir, int8_dir, sentences = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
f32 = CTranslate2Translator(f32_dir, num_threads=1)
int8 = CTranslate2Translator(int8_dir, num_threads=1)
tokens = f32.tokenize(sentences)
greedy = f32.translate_tokens(tokens, beam_size=1)
same = sum(a == b for a, b in zip(greedy, int8.translate_tokens(tokens, beam_size=1)))
gaps = [np.abs(np.subtract(a.log_probs, b.log_probs)) for a, b in zip(
    f32.translator.score_batch(tokens, greedy),
    int8.translator.score_batch(tokens, greedy))]
import ctranslate2
print(json.dumps({"compute_type": int8.compute_type, "same": same,
                  "mean_gap": float(np.concatenate(gaps).mean()),
                  "supported": sorted(ctranslate2.get_supported_compute_types("cpu"))}))
"""


@pytest.mark.parametrize("isa", ["native", "AVX2"])
def test_int8_stays_within_quantization_error_of_float32(trained, val_sentences,
                                                         isa):
    """On every CPU the int8 export scores float32's output within
    quantization error, and most greedy outputs are unchanged. ``AVX2``
    caps MKL, oneDNN and CTranslate2 at AVX2 (no VNNI), where CTranslate2's
    int8 GEMM saturates (0.15 nats a token measured), so the runner must
    choose int16 there (MKL, Intel CPUs) or float32 (oneDNN, e.g. AMD CPUs,
    which have no int16 GEMM); with VNNI the error is ~0.01 nats."""
    env = dict(os.environ)
    if isa == "AVX2":
        env.update(MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2",
                   CT2_FORCE_CPU_ISA="AVX2")
    out = subprocess.run(
        [sys.executable, "-c", _INT8_CHECK, str(trained["float32"]),
         str(trained["int8"]), json.dumps(val_sentences)],
        env=env, capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["mean_gap"] < 0.05, result
    assert result["same"] >= len(val_sentences) // 2, result
    if isa == "AVX2":
        assert result["compute_type"] == (
            "int16" if "int16" in result["supported"] else "float32"), result


def test_cpu_has_int8_dot_product(tmp_path, monkeypatch):
    for var in ("MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                "DNNL_MAX_CPU_ISA", "CT2_FORCE_CPU_ISA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    avx2 = tmp_path / "avx2"
    avx2.write_text("processor : 0\nflags : fpu sse4_2 avx avx2 fma\n")
    vnni = tmp_path / "vnni"
    vnni.write_text("processor : 0\nflags : avx2 avx512f avx512_vnni\n")
    assert not cpu_has_int8_dot_product(avx2)
    assert cpu_has_int8_dot_product(vnni)
    assert cpu_has_int8_dot_product(tmp_path / "missing")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "avx2")
    assert not cpu_has_int8_dot_product(vnni)
    mkl = {"float32", "int8", "int8_float32", "int16"}  # CTranslate2 on MKL
    onednn = {"float32", "int8", "int8_float32"}  # on oneDNN: no int16 GEMM
    assert default_compute_type("int8", supported=mkl) == "int16"
    assert default_compute_type("int8", supported=onednn) == "float32"
    assert default_compute_type("int8_float32", supported=onednn) == "float32"
    assert default_compute_type("int8") in ("int16", "float32")
    assert default_compute_type("float32") == "default"
    assert default_compute_type("int8", device="cuda") == "default"
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX512_E1")
    assert cpu_has_int8_dot_product(vnni)
    monkeypatch.setenv("CT2_FORCE_CPU_ISA", "avx2")
    assert not cpu_has_int8_dot_product(vnni)
    monkeypatch.delenv("CT2_FORCE_CPU_ISA")
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert cpu_has_int8_dot_product(avx2)


def test_int8_and_beam_give_text(trained, val_sentences):
    """int8 weights and beam search decode to text. The fixture is trained
    for only a few hundred steps: for some sentences its best beam is the
    empty one (END first), in our Keras beam search as in CTranslate2's, so
    most outputs, not all, must be text."""
    f32 = CTranslate2Translator(trained["float32"], num_threads=1)
    int8 = CTranslate2Translator(trained["int8"], num_threads=1)
    quantized = int8.translate_texts(val_sentences + [""], beam_size=4)
    beam = f32.translate_texts(val_sentences, beam_size=4, length_penalty=0.6)
    assert quantized[-1] == ""
    for outputs in (quantized[:-1], beam):
        assert all(isinstance(s, str) for s in outputs)
        assert sum(bool(s) for s in outputs) > len(val_sentences) // 2
        assert len(set(outputs)) > 10  # not one string for every sentence
    # int8 weights are smaller on disk.
    size = {k: (trained[k] / "model.bin").stat().st_size
            for k in ("float32", "int8")}
    assert size["int8"] < 0.5 * size["float32"]


def test_decoding_length_options(trained, val_sentences):
    """``min_decoding_length == max_decoding_length`` decodes exactly that
    many tokens (what bench/bench_step_cost.py at 32da1ca timed); ``max_decoding_length``
    alone cuts longer outputs to it; bad values name the argument."""
    ct2 = CTranslate2Translator(trained["float32"], num_threads=1)
    tokens = ct2.tokenize(val_sentences[:8])
    free = ct2.translate_tokens(tokens, beam_size=4)
    for length in (1, 7, 40):
        forced = ct2.translate_tokens(tokens, beam_size=4, min_decoding_length=length,
                                      max_decoding_length=length)
        assert [len(h) for h in forced] == [length] * 8
        assert "[END]" not in {t for h in forced for t in h}
    cut = ct2.translate_tokens(tokens, beam_size=1, max_decoding_length=3)
    greedy = ct2.translate_tokens(tokens, beam_size=1)
    assert cut == [h[:3] for h in greedy]  # greedy: a prefix, token for token
    assert max(len(h) for h in free) > 3
    with pytest.raises(ValueError, match="max_decoding_length=0"):
        ct2.translate_tokens(tokens, max_decoding_length=0)
    with pytest.raises(ValueError, match="min_decoding_length=9"):
        ct2.translate_tokens(tokens, min_decoding_length=9, max_decoding_length=8)


def test_exported_directory_has_vocabulary_and_special_tokens(trained):
    path = trained["float32"]
    vocab = json.loads((path / "shared_vocabulary.json").read_text())
    assert vocab == list(trained["vocab"])
    config = json.loads((path / "config.json").read_text())
    assert (config["unk_token"], config["bos_token"], config["eos_token"],
            config["decoder_start_token"]) == ("[UNK]", "[START]", "[END]",
                                               "[START]")
    assert config["add_source_eos"] is True and config["add_source_bos"] is False
    assert vocab.index("[UNK]") == 1 and vocab.index("[START]") == START_ID
    assert vocab.index("[END]") == END_ID
    meta = json.loads((path / "keras_trm.json").read_text())
    assert meta["max_sequence_length"] == 64
    assert meta["source_max_sequence_length"] == 64


def test_exports_written_before_the_rename_still_load(trained, tmp_path):
    """Issue #41: a directory whose keras_trm.json says ``max_length`` and
    ``source_max_length`` (before ``max_sequence_length``) loads and
    translates alike; the old attribute names still read, deprecated."""
    import shutil

    old = shutil.copytree(trained["float32"], tmp_path / "old")
    meta = json.loads((old / "keras_trm.json").read_text())
    meta["max_length"] = meta.pop("max_sequence_length")
    meta["source_max_length"] = meta.pop("source_max_sequence_length")
    (old / "keras_trm.json").write_text(json.dumps(meta))
    ct2 = CTranslate2Translator(old, num_threads=1)
    assert (ct2.max_sequence_length, ct2.source_max_sequence_length) == (64, 64)
    with pytest.deprecated_call(match="max_sequence_length"):
        assert ct2.max_length == 64
    new = CTranslate2Translator(trained["float32"], num_threads=1)
    sentences = ["Two dogs are playing in the snow.", "A man is walking."]
    assert ct2.translate_texts(sentences) == new.translate_texts(sentences)


def test_errors_and_no_partial_directory(tmp_path):
    vocab = list(RESERVED_TOKENS) + list("abcdef")
    model = transformer(len(vocab), num_layers=1, d_model=8, num_heads=2,
                        d_ff=16, max_sequence_length=16)
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError, match="exists"):
        export_ctranslate2(model, tmp_path / "exists", vocab)
    with pytest.raises(ValueError, match="quantization"):
        export_ctranslate2(model, tmp_path / "q", vocab, quantization="int3")
    with pytest.raises(ValueError, match="vocabulary"):
        export_ctranslate2(model, tmp_path / "v", vocab[:-1])
    with pytest.raises(ValueError, match="must start with"):
        build_spec(model, vocab[::-1])
    gelu = transformer(len(vocab), num_layers=1, d_model=8, num_heads=2,
                       d_ff=16, max_sequence_length=16)
    for block in ("encoder_layer_0", "decoder_layer_0"):
        gelu.get_layer(block).activation = keras.activations.gelu
    with pytest.raises(ValueError, match="activation"):
        export_ctranslate2(gelu, tmp_path / "g", vocab)
    classifier = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="not built by"):
        export_ctranslate2(classifier, tmp_path / "c", vocab)
    # Nothing half-written is left behind by the failures above.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"]
    with pytest.raises(FileNotFoundError, match="keras_trm.json"):
        CTranslate2Translator(tmp_path / "exists")
