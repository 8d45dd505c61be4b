"""Data parallel across processes under JAX (issue #61): two local CPU
processes, joined by ``jax.distributed`` (``keras.distribution.
initialize``) on loopback, each feeding its share of every global batch
(``TokenBatches(process_index=k, num_processes=2)``) to a
``keras.distribution.DataParallel`` fit, train exactly as one process
does on the same global batches: the same loss at every step.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytest.importorskip("jax")

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = pathlib.Path(os.environ.get("KERAS_TRM_DATA_DIR", ROOT.parent / "shared" / "data"))

WORKER = textwrap.dedent("""
    import json, os, pathlib, sys
    os.environ["KERAS_BACKEND"] = "jax"
    process, processes, port, folder, out = sys.argv[1:]
    process, processes = int(process), int(processes)
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import keras
    if processes > 1:
        keras.distribution.initialize(f"127.0.0.1:{port}", num_processes=processes,
                                      process_id=process)
        parallel = keras.distribution.DataParallel(devices=jax.devices())
        parallel.auto_shard_dataset = False  # each process reads its own rows
        keras.distribution.set_distribution(parallel)
    from keras_trm.data import TokenBatches, read_prepared
    from keras_trm.models import transformer
    from keras_trm.training import LabelSmoothedCrossEntropy, NoamSchedule, paper_adam
    split = read_prepared(folder).splits["train"]
    # The global batch of a step: 2 x 256 // L rows in both runs.
    batches = TokenBatches(split, 512 // processes, (8, 16, 32, 64), seed=3,
                           process_index=process, num_processes=processes)
    keras.utils.set_random_seed(0)
    model = transformer(200, num_layers=1, d_model=32, num_heads=2, d_ff=64,
                        dropout_rate=0.0, max_sequence_length=64)
    model.compile(optimizer=paper_adam(NoamSchedule(32, warmup_steps=4)),
                  loss=LabelSmoothedCrossEntropy(0.1), jit_compile=True)
    history = model.fit(batches, epochs=6, steps_per_epoch=1, verbose=0, shuffle=False)
    json.dump({"loss": history.history["loss"], "devices": len(jax.devices())},
              open(out, "w"))
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from keras_trm.data import prepare_translation_data

    folder = tmp_path_factory.mktemp("jax_processes")

    def encode(lines):  # word ids, hashed into 196 content ids
        return [[4 + hash(w) % 196 for w in line.lower().split()] for line in lines]

    prepare_translation_data(folder / "prepared", [(
        "train", DATA / "multi30k" / "train.en.gz", DATA / "multi30k" / "train.de.gz")],
        encode, 200, "word-hash", max_train_length=64, limit=600)
    return folder / "prepared"


@pytest.mark.slow
def test_two_processes_train_as_one_on_the_same_global_batches(prepared, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONHASHSEED="0")
    port = str(_free_port())
    children = [subprocess.Popen(
        [sys.executable, str(script), str(k), "2", port, str(prepared),
         str(tmp_path / f"process{k}.json")], env=env, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in (0, 1)]
    try:
        logs = [c.communicate(timeout=600)[0] for c in children]
    finally:
        for c in children:
            c.kill()
    assert all(c.returncode == 0 for c in children), "\n".join(x[-3000:] for x in logs)
    one = subprocess.run([sys.executable, str(script), "0", "1", "0", str(prepared),
                          str(tmp_path / "one.json")], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    runs = [json.loads((tmp_path / f"{name}.json").read_text())
            for name in ("process0", "process1", "one")]
    assert [r["devices"] for r in runs] == [2, 2, 1]
    single = runs[2]["loss"]
    assert single[-1] < single[0]  # it learns
    for run in runs[:2]:
        assert run["loss"] == pytest.approx(single, rel=1e-4, abs=1e-5)


def _translation_job(folder, data_dir, port, epochs, kill_after_step=None):
    """``keras-trm train-translation --strategy multi_worker`` as processes
    0 and 1 of a JAX cluster on 127.0.0.1, in ``folder/w0`` and ``folder/w1``;
    returns their ``(output, exit code)``, each within 300 s. Two bucket
    widths: two step shapes to compile; mixed precision, as on a GPU (val
    BLEU then decodes a float32 copy). With ``kill_after_step``, process 1
    is killed with SIGKILL once its backup holds a later step (a preempted
    machine)."""
    children = []
    try:
        for k in (0, 1):
            env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2",
                       KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                       KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                       KERAS_DISTRIBUTION_PROCESS_ID=str(k), PYTHONPATH=str(ROOT))
            children.append(subprocess.Popen(
                [sys.executable, "-m", "keras_trm.cli", "train-translation",
                 "--strategy", "multi_worker", "--preset", "tiny", "--limit", "400",
                 "--epochs", str(epochs), "--average-last", "1", "--training.save_freq", "4",
                 "--data.boundaries", "32,64", "--training.precision", "mixed_bfloat16",
                 "--validation-limit", "20", "--data-dir", str(data_dir),
                 "--workdir", str(folder / f"w{k}"),
                 "--export-dir", str(folder / f"export{k}")],
                env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
        if kill_after_step is not None:
            state = folder / "w1" / "backup_worker1" / "state.json"
            deadline = time.time() + 300
            while _backup_step(state) <= kill_after_step:
                assert children[1].poll() is None, "process 1 ended before the kill"
                assert time.time() < deadline, "process 1 never reached the kill point"
                time.sleep(0.05)
            children[1].send_signal(signal.SIGKILL)
        return [(c.communicate(timeout=300)[0], c.returncode) for c in children]
    finally:
        for c in children:
            c.kill()
            c.wait()


def _backup_step(state):
    try:
        return json.loads(state.read_text())["step"]
    except (OSError, ValueError, KeyError):
        return -1


def _epoch_losses(log):
    return [float(x) for x in re.findall(r"/step - .*?loss: ([0-9.]+)", log)]


def _weights(path):
    import h5py

    out = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, x: out.__setitem__(name, x[()])
                     if isinstance(x, h5py.Dataset) else None)
    return out


@pytest.mark.slow
def test_translation_job_on_two_processes_survives_a_killed_process(
        tmp_path, data_dir, free_ports):
    """The translation job under JAX with ``--strategy multi_worker``: two
    processes step together (the same loss every epoch) and only process 0
    decodes and writes. Process 1 killed with SIGKILL in the second epoch:
    process 0 stops by itself, and the same commands again resume both
    from their backups and end with the weights of the run never killed.
    With one backup gone, both refuse to start, naming the steps."""
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    runs = _translation_job(clean, data_dir, free_ports(1)[0], epochs=2)
    for log, code in runs:
        assert code == 0, log[-3000:]
    losses = [_epoch_losses(log) for log, _ in runs]
    assert len(losses[0]) == 2 and losses[0] == losses[1]
    steps = int(re.search(r"(\d+) batches per epoch", runs[0][0]).group(1))
    chief = json.loads((clean / "w0" / "result.json").read_text())
    assert chief["epochs"] == 2 and chief["test_bleu"] is not None
    assert (clean / "w1" / "prepared_worker1" / "manifest.json").is_file()
    assert not (clean / "w1" / "result.json").exists()
    assert not (clean / "w1" / "checkpoints").exists()
    assert '"test_bleu": null' in runs[1][0]

    # A backup every 4 steps and at each epoch's end: killed in epoch 2.
    runs = _translation_job(killed, data_dir, free_ports(1)[0], epochs=2,
                            kill_after_step=steps)
    assert runs[1][1] == -signal.SIGKILL
    assert runs[0][1] != 0  # process 0 stopped by itself
    assert not (killed / "w0" / "result.json").exists()
    runs = _translation_job(killed, data_dir, free_ports(1)[0], epochs=2)
    for log, code in runs:
        assert code == 0, log[-3000:]
        resumed = re.search(r"resumed from .*: epoch 2, (\d+) of its steps", log)
        assert resumed and 0 < int(resumed.group(1)) < steps, log[-3000:]
    a, b = (_weights(f / "w0" / "checkpoints" / "epoch_002.weights.h5")
            for f in (clean, killed))
    assert a.keys() == b.keys() and len(a) > 20
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-6, err_msg=name)

    shutil.rmtree(killed / "w1" / "backup_worker1")
    runs = _translation_job(killed, data_dir, free_ports(1)[0], epochs=3)
    for log, code in runs:
        assert code != 0 and "would resume from different steps" in log, log[-3000:]
        assert f"[{2 * steps}, -1]" in log  # process 0 after 2 epochs; 1 none


@pytest.mark.parametrize("env, message", [
    ({}, "not set: KERAS_DISTRIBUTION_JOB_ADDRESSES, KERAS_DISTRIBUTION_NUM_PROCESSES, "
         "KERAS_DISTRIBUTION_PROCESS_ID"),
    ({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:1", "KERAS_DISTRIBUTION_NUM_PROCESSES": "two",
      "KERAS_DISTRIBUTION_PROCESS_ID": "0"}, "KERAS_DISTRIBUTION_NUM_PROCESSES='two'"),
    ({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:1", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
      "KERAS_DISTRIBUTION_PROCESS_ID": "2"}, r"must be in \[0, 2\).*got 2"),
])
def test_a_bad_cluster_is_refused_before_joining(monkeypatch, env, message):
    from keras_trm.training.processes import CLUSTER_VARIABLES, JaxProcesses

    for name in CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        JaxProcesses()


def test_a_worker_that_does_not_decode_logs_its_losses_only(tmp_path):
    from keras_trm.training import BleuLog

    log = BleuLog(None, tmp_path / "epochs.json", write=False)
    log.on_train_begin()
    log.on_epoch_end(0, {"loss": 2.5})
    assert log.history == [{"epoch": 1, "train_seconds": log.history[0]["train_seconds"],
                            "loss": 2.5}]
    assert not (tmp_path / "epochs.json").exists()


def test_a_process_with_several_devices_is_refused(tmp_path, free_ports):
    """One device per process: a process that sees two (forced CPU devices)
    is refused after joining, naming them."""
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{free_ports(1)[0]}",
               KERAS_DISTRIBUTION_NUM_PROCESSES="1", KERAS_DISTRIBUTION_PROCESS_ID="0",
               PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-c", "from keras_trm.training.processes import JaxProcesses; "
                               "JaxProcesses()"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "one device per process; process 0 sees 2 (cpu:0, cpu:1)" in run.stderr, \
        run.stderr[-2000:]
