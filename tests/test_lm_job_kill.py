"""``keras-trm train-lm`` killed with SIGKILL in training and started again
goes on from its last validation and ends as a run never stopped (#63)."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
FLAGS = [
    "--data.corpus", "tinyshakespeare", "--data.train_tokens", "3000",
    "--data.eval_tokens", "300", "--model.num_layers", "1",
    "--model.d_model", "16", "--model.num_heads", "2", "--model.d_ff", "32",
    "--model.seg_len", "8", "--model.mem_len", "8",
    "--model.dropout_rate", "0.1", "--training.batch_size", "4",
    "--training.steps", "400", "--training.warmup_steps", "10",
    "--training.eval_every", "20", "--training.baseline", "false",
    "--evaluation.eval_batch_size", "2", "--export.model_name", "tiny_xl",
    "--seed", "3",
]


def _command(folder):
    return [sys.executable, "-m", "keras_trm.cli", "train-lm", *FLAGS,
            "--workdir", str(folder / "work"),
            "--export_dir", str(folder / "export")]


def _finish(folder):
    proc = subprocess.run(_command(folder), capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(
        (folder / "work" / "results" / "result.json").read_text())
    return proc.stdout + proc.stderr, result


def test_a_killed_job_resumes_and_ends_as_one_never_stopped(tmp_path):
    _, whole = _finish(tmp_path / "whole")

    folder = tmp_path / "killed"
    checkpoint = (folder / "work" / "checkpoints" / "transformer_xl"
                  / "checkpoint.npz")
    proc = subprocess.Popen(_command(folder), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.monotonic() + 300
    try:
        # Polled, not slept on: killed as soon as a validation has saved.
        while not checkpoint.exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint in 300 s"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before the kill"
    assert not (folder / "work" / "results" / "result.json").exists()

    log, resumed = _finish(folder)
    step = int(re.search(r"resumed at step (\d+) of 400", log).group(1))
    assert 0 < step < 400 and step % 20 == 0
    assert not checkpoint.exists()  # removed once the report is written
    ours, theirs = resumed["transformer_xl"], whole["transformer_xl"]
    for key in ("step", "train_loss", "valid_nll"):  # every validation's
        assert ours["history"][key] == theirs["history"][key], key
    assert ours["test"] == theirs["test"]
