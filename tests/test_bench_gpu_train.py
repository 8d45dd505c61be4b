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

from bench import gpu_train  # numpy only at import
from bench import step_parts  # the standard library only

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
@pytest.mark.slow
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
    if backend == "jax":  # the step's time by part, through the dumped HLO
        parts = result["ours"]["tiny"]["profile"]["by_part"]
        assert parts["attributed_fraction"] > 0.95
        for part in ("attention", "feed_forward", "layer_norm", "dropout", "embedding", "logits",
                     "loss", "optimizer"):
            assert parts["parts"][part]["ms_per_step"] > 0, part
        assert parts["parts"]["feed_forward"]["matmul"] > 0
        assert parts["parts"]["feed_forward"]["backward"] > 0
        assert parts["parts"]["optimizer"]["update"] > 0
    ratio = result["ratio_tokens_per_s"]["tiny"]
    assert math.isfinite(ratio) and ratio > 0


@pytest.mark.parametrize("kind", ["rbg", "bits16"])
def test_dropout_mask_levers_drop_at_the_rate_and_rescale(kind):
    """``--dropout-mask``'s JAX dropouts: about ``rate`` of the entries
    zeroed, the rest scaled by 1/(1 - rate), a new mask per call."""
    pytest.importorskip("jax")
    code = f"""
import numpy as np, keras
from bench import gpu_train
gpu_train.patch_jax_dropout({kind!r})
layer = keras.layers.Dropout(0.1, seed=1)
x = np.ones((500, 400), "float32")
a, b = (np.asarray(layer(x, training=True)) for _ in range(2))
print((a == 0).mean(), np.unique(a).tolist(), (a != b).mean())
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
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


HLO = """HloModule jit_train_step, is_scheduled=true

%fused_select (param_0: bf16[8,4]) -> bf16[8,4] {
  %param_0 = bf16[8,4]{1,0} parameter(0)
  ROOT %select.1 = bf16[8,4]{1,0} select(%param_0, %param_0, %param_0)
}

%gemm_fusion_dot.101_computation (p0: bf16[8,4], p1: bf16[4,4]) -> bf16[8,4] {
  %p0 = bf16[8,4]{1,0} parameter(0)
  %p1 = bf16[4,4]{1,0} parameter(1)
  ROOT %dot.5 = bf16[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main.9 (Arg_0.1: bf16[8,4], Arg_1.2: bf16[4,4]) -> bf16[8,4] {
  %Arg_0.1 = bf16[8,4]{1,0} parameter(0)
  %Arg_1.2 = bf16[4,4]{1,0} parameter(1)
  %loop_compare_select_fusion = bf16[8,4]{1,0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_select, metadata={op_name="jit(train_step)/transpose(jvp(decoder_layer_3))/self_attention/dropout_7/select_n"}
  %gemm_fusion_dot.101 = bf16[8,4]{1,0} fusion(%Arg_0.1, %Arg_1.2), kind=kCustom, calls=%gemm_fusion_dot.101_computation, metadata={op_name="jit(train_step)/jvp(embedding)/dot_general"}
  %custom-call.7 = (bf16[8,4]{1,0}, s8[0]{0}) custom-call(%Arg_0.1, %Arg_1.2), custom_call_target="__cublas$gemm", metadata={op_name="jit(train_step)/jvp(encoder_layer_0)/ffn_inner/dot_general"}
  %custom-call.9 = (bf16[8,4]{1,0}, u8[0]{0}) custom-call(%Arg_0.1, %Arg_0.1), custom_call_target="__cudnn$fmhaSoftmax", metadata={op_name="jit(train_step)/jvp(encoder_layer_0)/self_attention/dot_product_attention"}
  %input_reduce_fusion.3 = bf16[8,4]{1,0} fusion(%Arg_0.1), kind=kInput, calls=%fused_select, metadata={op_name="jit(train_step)/fused_adam/add"}
  ROOT %add.4 = bf16[8,4]{1,0} add(%Arg_0.1, %Arg_0.1), metadata={op_name="jit(train_step)/transpose(jvp(decoder_layer_3))/ffn_norm/add"}
}
"""


def test_step_parts_charges_each_kernel_to_its_instructions_scope():
    """A GPU-like trace: kernels tied to the HLO by their name (fusions) or
    their ``hlo_op`` argument (cuBLAS, cuDNN), charged to the part named by
    the instruction's op_name, split by kind and direction; the derived
    "XLA Ops" line and host events are not counted, an unknown kernel is
    counted but unattributed."""
    hlo = step_parts.read_hlo(HLO)
    assert {k: hlo[k]["kind"] for k in ("loop_compare_select_fusion", "gemm_fusion_dot.101",
                                        "custom-call.7", "custom-call.9", "add.4")} == {
        "loop_compare_select_fusion": "non_matmul", "gemm_fusion_dot.101": "matmul",
        "custom-call.7": "matmul", "custom-call.9": "fused_attention", "add.4": "non_matmul"}
    meta = [dict(ph="M", name="process_name", pid=1, args=dict(name="/device:GPU:0")),
            dict(ph="M", name="process_name", pid=2, args=dict(name="/host:CPU")),
            dict(ph="M", name="thread_name", pid=1, tid=5, args=dict(name="Stream #13(Compute)")),
            dict(ph="M", name="thread_name", pid=1, tid=6, args=dict(name="XLA Ops"))]
    kernels = [("loop_compare_select_fusion", 4000, None), ("gemm_fusion_dot_101", 3000, None),
               ("nvjet_sm90_tst_256x128", 2000, "custom-call.7"),
               ("cudnn_generated_fort_native_sdpa", 1500, "custom-call.9"),
               ("input_reduce_fusion_3", 500, None), ("add_4", 600, None), ("mystery", 400, None)]
    events = meta + [dict(ph="X", pid=1, tid=5, name=n, dur=d, args={"hlo_op": op} if op else {})
                     for n, d, op in kernels]
    events += [dict(ph="X", pid=1, tid=6, name="fusion.1", dur=9999),
               dict(ph="X", pid=2, tid=7, name="ExecuteHelper", dur=9999, args={"hlo_op": "x"})]
    names, ops, lines, where = step_parts.device_times(events)
    assert where == "device streams" and lines == {"XLA Ops": 9999}
    assert sum(names.values()) == sum(ops.values()) == 12000 and names["nvjet_sm90_tst_256x128"] == 2000
    out = step_parts.by_part(ops, hlo, steps=2)
    assert out["kernel_ms_per_step"] == 6.0
    assert out["attributed_fraction"] == pytest.approx(1 - 400 / 12000, abs=1e-4)
    assert out["parts"] == {
        "dropout": {"ms_per_step": 2.0, "non_matmul": 2.0, "backward": 2.0},
        "logits": {"ms_per_step": 1.5, "matmul": 1.5, "forward": 1.5},
        "feed_forward": {"ms_per_step": 1.0, "matmul": 1.0, "forward": 1.0},
        "attention": {"ms_per_step": 0.75, "fused_attention": 0.75, "forward": 0.75},
        "layer_norm": {"ms_per_step": 0.3, "non_matmul": 0.3, "backward": 0.3},
        "optimizer": {"ms_per_step": 0.25, "non_matmul": 0.25, "update": 0.25}}
    assert out["top_ops"][0][:4] == ["loop_compare_select_fusion", 2.0, "non_matmul", "dropout"]
    assert out["top_unattributed"] == [["mystery", 0.2]]


@pytest.mark.parametrize("op_name, part", [
    ("jit(train_step)/jvp(decoder_layer_0)/cross_attention_norm/jit(_var)/mul", "layer_norm"),
    ("jit(train_step)/transpose(jvp(encoder_layer_1))/ffn_norm/mul", "layer_norm"),
    ("jit(train_step)/jvp(encoder_layer_1)/ffn_outer/dot_general", "feed_forward"),
    ("jit(train_step)/jvp(decoder_layer_0)/dropout_6/jit(_bernoulli)/lt", "dropout"),
    ("jit(train_step)/jvp(embedding)/jit(_take)/gather", "embedding"),
    ("jit(train_step)/transpose(jvp(embedding))/dot_general", "logits"),
    ("jit(train_step)/transpose(jvp(compile_loss))/label_smoothed_ce/scatter", "loss"),
    ("jit(train_step)/fused_adam/sqrt", "optimizer"),
    ("", "other"),
])
def test_step_parts_names_the_part_of_an_op_name(op_name, part):
    assert step_parts.part_of(op_name) == part
