"""bench/gpu_check.py: the CPU smoke configuration runs its whole code path
(child processes, MirroredStrategy, training, beam-4 decoding, BLEU, JSON),
and without a GPU (and without --allow-cpu) it exits 2 with a clear message."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    return env


def _gpu_visible():
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


@pytest.mark.slow
def test_tiny_cpu_run_writes_the_json(tmp_path, data_dir):
    out = tmp_path / "x.json"
    proc = subprocess.run(
        # XLA float32 runs the whole path (plain float32 is the same path
        # without jit_compile: skipped, as it adds a child's minute to the
        # suite); float16 shows a CPU's skip.
        [sys.executable, str(SCRIPT), "--tiny", "--allow-cpu", "--out", str(out),
         "--data-dir", str(data_dir), "--configs", "float32_xla,mixed_float16"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["bleu_split"] == "newstest2014"
    assert "gpu_check.py" in result["command"] and "--tiny" in result["command"]
    assert result["host"]["tensorflow"] and "cpu_count" in result["host"]
    configs = result["configs"]
    assert set(configs) == {"float32_xla", "mixed_float16"}
    ran = [c for c in configs.values() if not c.get("skipped")]
    assert {c["config"] for c in ran} >= {"float32_xla"}
    for c in configs.values():
        if c.get("skipped"):  # only float16 on a CPU is skipped, with a reason
            assert c["config"].startswith("mixed_float16") and c["reason"]
            assert not result["on_gpu"]
            continue
        assert "error" not in c, c
        assert c["steps"] == 3 and c["timed_steps"] == 2
        assert c["steps_per_second"] > 0 and c["target_tokens_per_second"] > 0
        assert math.isfinite(c["final_loss"]) and c["final_loss"] > 0
        assert all(math.isfinite(x) for x in c["interval_losses"])
        # The tokens the model's TokenCount metric saw in training are the
        # real (non-padding) labels of the batches the data pipeline gives,
        # so fit() trained on exactly the counted stream.
        assert c["target_tokens_model"] == c["target_tokens_data"] > 0
        assert sum(c["target_tokens_per_step"]) == c["target_tokens_data"]
        assert c["target_tokens_data"] < c["padded_label_slots"]
        # tokens/s counts only the timed (post-warm-up) steps' real tokens.
        timed = sum(c["target_tokens_per_step"][c["warmup_steps"]:])
        assert c["target_tokens_per_second"] == pytest.approx(
            timed / c["timed_seconds"], rel=0.02, abs=0.2)
        assert isinstance(c["bleu"], float) and 0 <= c["bleu"] <= 100
        assert c["bleu_split"] == "newstest2014" and c["bleu_sentences"] == 4
        assert c["bleu_beam_size"] == 4
        assert c["wall_seconds"] > 0
        if not result["on_gpu"]:
            assert c["peak_gpu_memory_bytes"] is None


def test_without_gpu_exits_2_with_a_clear_message(tmp_path):
    if _gpu_visible():
        pytest.skip("a GPU is visible: the no-GPU refusal does not apply")
    out = tmp_path / "x.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)], cwd=ROOT, env=_env(),
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no GPU is visible" in proc.stderr
    assert "--tiny --allow-cpu" in proc.stderr
    assert not out.exists()
