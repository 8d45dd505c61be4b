"""bench/gpu_train.py: its batches and FLOP count, and a ``--tiny`` run per
Keras backend, which writes the figures it promises without importing
TensorFlow."""

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_train  # noqa: E402  (numpy only at import)


def test_batches_hold_real_lengths_at_the_token_budget():
    src, tgt = np.array([3, 5, 9, 2, 6, 4]), np.array([4, 4, 12, 1, 5, 3])
    plan, dropped = gpu_train.plan_batches(src, tgt, 32, (8, 16), seed=0)
    assert dropped == 0
    # Widths max(src, tgt) + 1: five pairs fit 8 (one full batch of 32 // 8
    # = 4, the fifth left over), one needs 16 (no full batch of 2).
    assert [(L, len(idx)) for L, idx in plan] == [(8, 4)]
    L, idx = plan[0]
    b = gpu_train.make_batch(np.random.default_rng(0), L, src[idx], tgt[idx], 50)
    for i, (s, t) in enumerate(zip(src[idx], tgt[idx])):
        assert b["src"][i, s] == gpu_train.END and not b["src"][i, s + 1:].any()
        assert (b["src"][i, :s] >= gpu_train.FIRST_WORD).all()
        assert b["lab"][i, t] == gpu_train.END and not b["lab"][i, t + 1:].any()
        assert b["dec"][i, 0] == gpu_train.START
        np.testing.assert_array_equal(b["dec"][i, 1:t + 1], b["lab"][i, :t])
        assert not b["dec"][i, t + 1:].any()
    np.testing.assert_array_equal(b["tgt_len"], (b["lab"] != 0).sum(1))


def test_train_flops_is_three_forward_passes_of_the_matmuls():
    cfg = dict(num_layers=1, d_model=2, d_ff=3)
    # One pair, S = T = 1: encoder 8*4 + 4*2*3 + 4*2 = 64; decoder
    # (8*4 + 4*2) + 4*4*2 + 4*2 + 4*2*3 = 104; output 2*2*5 = 20.
    assert gpu_train.train_flops([1], [1], cfg, vocab=5) == 3 * (64 + 104 + 20)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_tiny_run_reports_sane_figures_without_tensorflow(backend, tmp_path):
    pytest.importorskip(backend)
    pytest.importorskip("torch")
    out = tmp_path / "gpu_train.json"
    env = {**os.environ, "KERAS_BACKEND": backend}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_train.py"), "--tiny", "--backend", backend,
         "--profile-steps", "2", "--out", str(out)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["tensorflow_imported"] is False
    assert result["device"]["versions"]["keras"] and result["torch"]["device"]["versions"]["torch"]
    for label in ("ours", "torch"):
        run = result[label]["tiny"]
        assert run["steps"] == 3 and run["ms_per_step_mean"] > 0
        assert run["synced_steps"] == 3 and run["ms_per_step_median_synced"] > 0
        assert run["target_tokens_per_s"] > 0 and run["target_padding_tokens_per_s"] >= 0
        assert run["useful_tflops_per_s"] > 0 and run["fraction_of_matmul"] > 0
        assert run["compile_seconds"] >= 0 and run["loss_finite"]
        profile = run["profile"]
        assert profile["steps"] == 2 and profile["kernels"] > 0 and profile["top"]
        assert profile["wall_ms_per_step"] > 0 and profile["counted"]
        losses = run["losses"]
        assert all(math.isfinite(x) for x in losses) and min(losses[1:]) < losses[0]
        if result["device"]["gpu"] is None:
            assert run["peak_memory_gib"] is None and run["fraction_of_peak"] is None
    assert result["ours"]["tiny"]["params"] == result["torch"]["tiny"]["params"]
    ratio = result["ratio_tokens_per_s"]["tiny"]
    assert math.isfinite(ratio) and ratio > 0


@pytest.mark.parametrize("kind", ["rbg", "bits16"])
def test_dropout_mask_levers_drop_at_the_rate_and_rescale(kind):
    """``--dropout-mask``'s JAX dropouts: about ``rate`` of the entries
    zeroed, the rest scaled by 1/(1 - rate), a new mask per call."""
    pytest.importorskip("jax")
    code = f"""
import numpy as np, keras, gpu_train
gpu_train.patch_jax_dropout({kind!r})
layer = keras.layers.Dropout(0.1, seed=1)
x = np.ones((500, 400), "float32")
a, b = (np.asarray(layer(x, training=True)) for _ in range(2))
print((a == 0).mean(), np.unique(a).tolist(), (a != b).mean())
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "bench", capture_output=True,
                          text=True, timeout=120, env={**os.environ, "KERAS_BACKEND": "jax"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    dropped, rest = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    values, changed = rest.rsplit(" ", 1)
    assert abs(float(dropped) - 0.1) < 0.005  # 200,000 draws: sd 0.0007
    assert json.loads(values) == pytest.approx([0.0, 1 / 0.9])
    assert abs(float(changed) - 2 * 0.1 * 0.9) < 0.01  # independent masks


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_attention_length_bench_times_both_paths_and_they_agree(backend, tmp_path):
    """bench/gpu_attention_lengths.py --tiny: the fused op and the einsums
    are each timed at every length, causal and not, and give the same
    output on the rows that are not padding."""
    pytest.importorskip(backend)
    out = tmp_path / "attention.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_attention_lengths.py"), "--tiny",
         "--backend", backend, "--out", str(out)],
        env={**os.environ, "KERAS_BACKEND": backend}, cwd=ROOT, capture_output=True,
        text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["backend"] == backend and result["precision"] == "float32"
    rows = result["rows"]
    assert [(r["key_length"], r["causal"]) for r in rows] == [
        (t, c) for t in (8, 16, 32) for c in (False, True)]
    for r in rows:
        assert r["fused_ms"] > 0 and r["einsum_ms"] > 0
        assert r["max_abs_diff_kept_rows"] < 1e-4, r
