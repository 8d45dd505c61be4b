"""Precision choice (keras_trm.training.precision), mixed_bfloat16 numerics
and training, and the allocator re-exec of the entry points
(keras_trm._runtime)."""

import os
import pathlib
import platform
import subprocess
import sys

import keras
import numpy as np
import pytest

from conftest import fit_input, to_np, translation_batches
from keras_trm import _runtime
from keras_trm.decoding import BeamSearch, GreedySearch, Translator
from keras_trm.layers import MultiHeadAttention
from keras_trm.models import transformer
from keras_trm.training import (
    LabelSmoothedCrossEntropy,
    NoamSchedule,
    apply_precision,
    float32_copy,
    paper_adam,
    precision,
    resolve_precision,
)

pytestmark = pytest.mark.portable  # CI runs it under each backend
X86_LINUX = (platform.system() == "Linux"
             and platform.machine().lower() in ("x86_64", "amd64"))


@pytest.fixture
def restore_policy():
    before = keras.config.dtype_policy().name
    yield
    keras.mixed_precision.set_global_policy(before)


# -- the choice ---------------------------------------------------------------

def test_explicit_choices_are_kept_and_unknown_ones_rejected():
    for name in precision.POLICIES:
        assert resolve_precision(name, native_bf16=False, has_gpu=True)[0] == name
    with pytest.raises(ValueError, match="precision='bf16'"):
        resolve_precision("bf16")


def test_auto_picks_bfloat16_only_on_a_native_bf16_cpu_when_enabled():
    def auto(**kw):
        return resolve_precision("auto", **{"backend": "tensorflow", **kw})[0]

    assert auto(native_bf16=True, has_gpu=False, auto_bf16=True) == "mixed_bfloat16"
    assert auto(native_bf16=True, has_gpu=False, auto_bf16=False) == "float32"
    assert auto(native_bf16=False, has_gpu=False, auto_bf16=True) == "float32"
    # on a GPU "auto" never picks a 16-bit type (mixed_float16 is explicit)
    assert auto(native_bf16=True, has_gpu=True, auto_bf16=True) == "float32"
    # the default follows the measured switch
    expected = ("mixed_bfloat16" if precision.AUTO_BF16_ON_NATIVE_CPU
                else "float32")
    assert auto(native_bf16=True, has_gpu=False) == expected
    # bfloat16 was measured no faster under JAX on such a CPU
    for backend in ("jax", "torch"):
        assert auto(native_bf16=True, has_gpu=False, auto_bf16=True,
                    backend=backend) == "float32"


@pytest.mark.skipif(not X86_LINUX, reason="cpuinfo flags are read on x86 Linux")
def test_bf16_detection_reads_cpuinfo_flags(tmp_path):
    with_bf16 = tmp_path / "with"
    with_bf16.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f "
                         "avx512_bf16 avx512_vnni\n")
    amx = tmp_path / "amx"
    amx.write_text("flags\t: fpu avx512f amx_bf16 amx_tile\n")
    without = tmp_path / "without"
    without.write_text("flags\t: fpu sse2 avx2 avx512f avx512_vnni\n")
    assert precision.cpu_has_native_bf16(str(with_bf16))
    assert precision.cpu_has_native_bf16(str(amx))
    assert not precision.cpu_has_native_bf16(str(without))
    assert not precision.cpu_has_native_bf16(str(tmp_path / "missing"))


def test_apply_precision_sets_the_policy_and_env_overrides_only_auto(
        restore_policy, monkeypatch):
    lines = []
    assert apply_precision("mixed_bfloat16", log=lines.append) == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert "mixed_bfloat16" in lines[0]
    monkeypatch.setenv("KERAS_TRM_PRECISION", "mixed_bfloat16")
    assert apply_precision("float32", log=None) == "float32"
    assert apply_precision("auto", log=None) == "mixed_bfloat16"
    monkeypatch.setenv("KERAS_TRM_PRECISION", "half")
    with pytest.raises(ValueError, match="half"):
        apply_precision("auto", log=None)


# -- numerics and training under mixed_bfloat16 -------------------------------

def test_bf16_attention_matches_float32_and_keeps_probabilities_float32(
        restore_policy, rng):
    x = rng.normal(size=(2, 7, 32)).astype("float32")
    mask = np.ones((2, 7), bool)
    mask[1, 4:] = False
    ref = MultiHeadAttention(4, 8, dtype="float32")
    want, want_p = ref(x, x, value_mask=mask, return_attention_scores=True)
    bf = MultiHeadAttention(4, 8, dtype="mixed_bfloat16")
    bf(x, x)
    bf.set_weights(ref.get_weights())
    assert all(w.dtype == "float32" for w in bf.weights)
    got, got_p = bf(x, x, value_mask=mask, return_attention_scores=True)
    assert keras.backend.standardize_dtype(got.dtype) == "bfloat16"
    # the softmax is taken in float32: masked keys get exactly 0 and rows
    # sum to 1 within bf16 rounding of the probabilities
    p = to_np(ops_float(got_p))
    assert np.all(p[1, :, :, 4:] == 0)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=2e-2)
    np.testing.assert_allclose(ops_float(got), to_np(want), atol=5e-2,
                               rtol=5e-2)
    np.testing.assert_allclose(p, to_np(want_p), atol=1e-2)


def ops_float(t):
    return to_np(keras.ops.cast(t, "float32"))


def _batches(tokenizer, pairs, folder, tokens_per_batch=600):
    """The jobs' token-count batches of ``pairs`` (pairs over 64 ids
    dropped), endless, seeded."""
    return translation_batches(tokenizer, pairs, folder, tokens_per_batch,
                               (16, 32, 64), max_train_length=64, seed=0)[0]


def test_mixed_bfloat16_transformer_trains_with_float32_logits_and_loss(
        restore_policy, multi30k_small, tokenizer, tmp_path):
    apply_precision("mixed_bfloat16", log=None)
    pairs = (multi30k_small[0][:240], multi30k_small[1][:240])
    train = _batches(tokenizer, pairs, tmp_path)
    model = transformer(tokenizer.vocabulary_size, num_layers=1, d_model=64,
                        num_heads=2, d_ff=128, dropout_rate=0.0, max_sequence_length=64)
    assert all(w.dtype == "float32" for w in model.weights)
    assert {layer.compute_dtype for layer in model.layers
            if layer.weights} == {"bfloat16"}
    inputs, labels = train.batch(0, 0)
    logits = model(inputs)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    loss_fn = LabelSmoothedCrossEntropy(0.1)
    loss = loss_fn(labels, logits)
    assert keras.backend.standardize_dtype(loss.dtype) == "float32"
    start = float(loss)
    model.compile(optimizer=paper_adam(NoamSchedule(64, 20, 1.0)), loss=loss_fn)
    history = model.fit(fit_input(train), epochs=8, verbose=0,
                        steps_per_epoch=train.batches_per_epoch).history["loss"]
    assert np.all(np.isfinite(history))
    assert history[-1] < 0.8 * start, (start, history)
    # decoding (greedy, key/value cache in bfloat16) gives text
    out = Translator(model, tokenizer,
                     search=BeamSearch(beam_size=2)).translate_texts(pairs[0][:3])
    assert len(out) == 3 and all(isinstance(s, str) for s in out)
    assert any(s.strip() for s in out)


def test_float32_copy_of_a_bf16_model_is_the_float32_model():
    """The copy the jobs decode and export: a mixed_bfloat16 model's float32
    copy gives exactly the logits and beam-search ids of the same weights
    in a model built in float32, and leaves the bf16 model as it was."""

    kwargs = dict(num_layers=2, d_model=16, num_heads=2, d_ff=32,
                  max_sequence_length=16, dropout_rate=0.0)
    keras.utils.set_random_seed(4)
    reference = transformer(30, **kwargs)
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        mixed = transformer(30, **kwargs)
    finally:
        keras.config.set_dtype_policy("float32")
    mixed.set_weights(reference.get_weights())
    copy = float32_copy(mixed)
    assert copy is not mixed and float32_copy(reference) is reference
    inputs = {"encoder_tokens": np.array([[5, 6, 7, 3], [8, 3, 0, 0]]),
              "decoder_tokens": np.array([[2, 9, 10], [2, 11, 0]])}
    np.testing.assert_array_equal(to_np(copy(inputs)), to_np(reference(inputs)))
    assert mixed.get_layer("decoder_layer_0").compute_dtype == "bfloat16"
    assert type(copy) is type(reference)  # still decodes
    ids = [to_np(BeamSearch(beam_size=3, max_decoding_length=8)(m,
                                                          inputs["encoder_tokens"]))
           for m in (copy, reference)]
    np.testing.assert_array_equal(ids[0], ids[1])


def test_val_bleu_decodes_a_float32_twin_refreshed_from_the_scored_model(
        restore_policy, multi30k_small, tokenizer):
    """The job's per-epoch greedy val BLEU of a mixed_bfloat16 model decodes
    a float32 twin: the same hypotheses as a float32 model with the same
    weights, refreshed at every call (weights changed after the scorer was
    built are the ones scored), with one translator kept across calls."""
    from keras_trm.decoding import corpus_bleu
    from keras_trm.decoding import GreedyBleu

    kwargs = dict(num_layers=1, d_model=32, num_heads=2, d_ff=64,
                  max_sequence_length=64, dropout_rate=0.0)
    src, tgt = multi30k_small[0][:12], multi30k_small[1][:12]
    keras.utils.set_random_seed(1)
    first = transformer(tokenizer.vocabulary_size, **kwargs)
    second = transformer(tokenizer.vocabulary_size, **kwargs)
    apply_precision("mixed_bfloat16", log=None)
    mixed = transformer(tokenizer.vocabulary_size, **kwargs)
    keras.config.set_dtype_policy("float32")
    score = GreedyBleu(mixed, tokenizer, src, tgt)
    assert score.twin is not mixed
    translator = score.translator
    for reference in (first, second):
        mixed.set_weights(reference.get_weights())
        bleu = score(mixed)
        assert score.translator is translator
        expected = Translator(reference, tokenizer,
                              search=GreedySearch()).translate_texts(src)
        assert translator.translate_texts(src) == expected
        assert bleu == corpus_bleu(expected, tgt)[0]
    assert Translator(first, tokenizer,
                      search=GreedySearch()).translate_texts(src) != expected
    # A float32 model is scored as it is, no twin.
    assert GreedyBleu(first, tokenizer, src, tgt).twin is first


# -- allocator settings --------------------------------------------------------

CHILD = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("_runtime", {path!r})
runtime = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runtime)
applied = runtime.tune_allocator()
print(applied, os.environ.get("GLIBC_TUNABLES"))
"""


def _run_child(tmp_path, env_extra):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(path=str(pathlib.Path(_runtime.__file__))))
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "KERAS_TRM_NO_MALLOC_TUNING")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, str(script)], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


@pytest.mark.skipif(not _runtime._is_glibc_linux(), reason="glibc only")
def test_tune_allocator_passes_its_settings_on_to_child_processes(tmp_path):
    assert _run_child(tmp_path, {}) == "True " + _runtime.ALLOCATOR_TUNABLES
    assert _runtime.ALLOCATOR_TUNABLES == (
        "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0"
        ":glibc.malloc.trim_threshold=2147483647:glibc.malloc.top_pad=268435456")


@pytest.mark.skipif(not _runtime._is_glibc_linux(), reason="glibc only")
def test_tune_allocator_respects_the_users_tunables_and_the_opt_out(tmp_path):
    assert _run_child(tmp_path, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == (
        "False glibc.malloc.arena_max=2")
    assert _run_child(tmp_path, {"KERAS_TRM_NO_MALLOC_TUNING": "1"}) == "False None"


FAULTS_CHILD = """
import ctypes, importlib.util, resource, sys, threading
if sys.argv[1:] == ["mallopt"]:   # what a keras-trm command does
    spec = importlib.util.spec_from_file_location("_runtime", {path!r})
    runtime = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runtime)
    assert runtime.tune_allocator()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 100 * 2 ** 20          # a logits-sized block, above the 32 MiB cap
faults = []

def work():                    # on a worker thread, as TensorFlow's ops run
    for i in range(6):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)   # touch every page
        libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

thread = threading.Thread(target=work)
thread.start()
thread.join()
print(sum(faults[1:]))        # after the first block
"""


@pytest.mark.skipif(not _runtime._is_glibc_linux(), reason="glibc only")
def test_tunables_keep_large_blocks_instead_of_mapping_them_each_time():
    """A 100 MiB block freed and allocated again on a worker thread: glibc
    maps it afresh every time (one fault per 4 KiB page); with
    ALLOCATOR_TUNABLES (read at the start) or with tune_allocator (mallopt
    in the running process, what a keras-trm command does) it is reused
    from the heap."""
    child = FAULTS_CHILD.replace("{path!r}", repr(str(pathlib.Path(_runtime.__file__))))

    def faults(tunables, *args):
        env = {k: v for k, v in os.environ.items()
               if k not in ("GLIBC_TUNABLES", "KERAS_TRM_NO_MALLOC_TUNING")}
        if tunables:
            env["GLIBC_TUNABLES"] = tunables
        out = subprocess.run([sys.executable, "-c", child, *args], env=env,
                             capture_output=True, text=True, timeout=60,
                             check=True)
        return int(out.stdout.split()[-1])

    pages = 5 * 100 * 2 ** 20 // 4096            # 5 blocks of 25,600 pages
    assert faults(None) > 0.9 * pages
    assert faults(_runtime.ALLOCATOR_TUNABLES) < 0.01 * pages
    assert faults(None, "mallopt") < 0.01 * pages
