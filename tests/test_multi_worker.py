"""MultiWorkerMirroredStrategy on loopback: two worker processes on
127.0.0.1, each pinned to one core, train a tiny Transformer for a few steps
on a seeded stream of token-count batches sharded by batch index
(``shard_batches``); the losses and final weights match one process that
trains on the same global batches (the two workers' batches of a step
concatenated). Bounded in time; the children are killed in any case.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np, keras, tensorflow as tf
    from keras_trm.models import transformer
    from keras_trm.training import (LabelSmoothedCrossEntropy, make_strategy,
                                    paper_adam, shard_batches, worker_info,
                                    build_for_distributed_fit)

    out, mode = sys.argv[1], sys.argv[2]
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    STEPS, W, B, L = 3, 2, 4, 6
    # A stream of 8 batches with no padding (equal token counts per batch,
    # so the mean over workers of per-worker token means is the global mean).
    stream = [(rng.integers(1, 30, (B, L)).astype("int32"),
               rng.integers(1, 30, (B, L)).astype("int32"),
               rng.integers(1, 30, (B, L)).astype("int32"))
              for _ in range(STEPS * W)]

    def gen():
        for e, d, y in stream:
            yield {"encoder_tokens": e, "decoder_tokens": d}, y

    spec = tf.TensorSpec((None, None), tf.int32)
    sig = ({"encoder_tokens": spec, "decoder_tokens": spec}, spec)
    if mode == "multi":
        strategy = make_strategy("multi_worker")
        local = tf.data.Dataset.from_generator(gen, output_signature=sig)
        data = shard_batches(local, strategy)
    else:   # one worker, the same global batches: batches 2k and 2k+1 joined
        strategy = make_strategy("default")
        joined = [tuple(np.concatenate([stream[2 * k][i], stream[2 * k + 1][i]])
                        for i in range(3)) for k in range(STEPS)]
        data = tf.data.Dataset.from_tensor_slices(
            ({"encoder_tokens": np.stack([j[0] for j in joined]),
              "decoder_tokens": np.stack([j[1] for j in joined])},
             np.stack([j[2] for j in joined])))
    num_workers, index, chief = worker_info(strategy)
    with strategy.scope():
        model = transformer(30, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                            dropout_rate=0.0, max_sequence_length=8)
        # SGD: Adam with epsilon 1e-9 turns 1e-9 round-off in near-zero
        # gradients into lr-sized steps; SGD compares the gradients.
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=LabelSmoothedCrossEntropy(0.1), jit_compile=False)
    if mode == "multi":
        build_for_distributed_fit(model, strategy, local)

    class Losses(keras.callbacks.Callback):
        losses = []
        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(float(logs["loss"]))

    model.fit(data, epochs=1, steps_per_epoch=STEPS, verbose=0,
              callbacks=[Losses()])
    if chief:   # only the chief writes
        np.savez(os.path.join(out, "weights.npz"), *model.get_weights())
    with open(os.path.join(out, f"info_{mode}_{index}.json"), "w") as f:
        json.dump({"workers": num_workers, "index": index, "chief": chief,
                   "losses": Losses.losses}, f)
""")


def _env(tf_config=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow",
               CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def test_two_workers_on_loopback_match_one_worker(tmp_path, free_ports):
    script = tmp_path / "mw.py"
    script.write_text(SCRIPT)
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    ref = subprocess.run([sys.executable, str(script), str(one), "single"],
                         env=_env(), capture_output=True, text=True, timeout=120)
    assert ref.returncode == 0, ref.stderr[-3000:]

    pin = shutil.which("taskset")
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else {0}
    cores = sorted(cores)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    children = []
    start = time.time()
    try:
        for i in range(2):
            cmd = [sys.executable, str(script), str(two), "multi"]
            if pin:   # one core each (the same one if the machine has one)
                cmd = [pin, "-c", str(cores[i % len(cores)])] + cmd
            children.append(subprocess.Popen(
                cmd, env=_env({"cluster": cluster,
                               "task": {"type": "worker", "index": i}}),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for child in children:
            _, err = child.communicate(timeout=max(1, 150 - (time.time() - start)))
            assert child.returncode == 0, err[-3000:]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    seconds = time.time() - start

    single = json.loads((one / "info_single_0.json").read_text())
    workers = [json.loads((two / f"info_multi_{i}.json").read_text())
               for i in range(2)]
    assert [w["workers"] for w in workers] == [2, 2]
    assert [w["chief"] for w in workers] == [True, False]
    # Each worker logs the mean of its own loss (Keras' per-replica loss
    # metric); their average is the global batch's loss.
    multi_losses = np.mean([w["losses"] for w in workers], axis=0)
    a = np.load(one / "weights.npz")
    b = np.load(two / "weights.npz")
    diff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files)
    loss_diff = float(np.max(np.abs(multi_losses - np.array(single["losses"]))))
    print(f"two workers: {seconds:.1f} s, max |loss diff| {loss_diff:.3g}, "
          f"max |weight diff| {diff:.3g}")
    assert len(workers[0]["losses"]) == len(single["losses"]) == 3
    assert loss_diff < 1e-4
    assert diff < 1e-4


@pytest.mark.slow
def test_translation_job_with_two_workers_reading_their_own_rows(
        tmp_path, data_dir, free_ports):
    """``keras-trm train-translation --strategy multi_worker`` on loopback:
    each worker prepares its own folder of the 400 Multi30k pairs and reads
    its own block of rows of every global batch, the steps are synchronized
    (one loss per epoch, the same on both workers), only the chief writes
    the model, the epoch log and the export."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    children = []
    start = time.time()
    try:
        for i in range(2):
            cmd = [sys.executable, "-m", "keras_trm.cli", "train-translation",
                   "--strategy", "multi_worker", "--preset", "tiny", "--limit", "400",
                   "--vocabulary", "wordpiece",  # the counts below are WordPiece's
                   "--epochs", "2", "--average-last", "1", "--validation-limit", "20",
                   "--data-dir", str(data_dir), "--workdir", str(tmp_path / f"w{i}"),
                   "--export-dir", str(tmp_path / f"export{i}")]
            children.append(subprocess.Popen(
                cmd, env=_env({"cluster": cluster,
                               "task": {"type": "worker", "index": i}}),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = []
        for child in children:
            out, _ = child.communicate(timeout=max(1, 300 - (time.time() - start)))
            assert child.returncode == 0, out[-3000:]
            logs.append(out)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    for log in logs:
        assert "395 of 400 pairs kept" in log and "batches per epoch" in log, log[-2000:]
    losses = [[line.split("loss: ")[1].split()[0] for line in log.splitlines()
               if "/step - " in line and "loss: " in line] for log in logs]
    assert len(losses[0]) == 2 and losses[0] == losses[1]
    chief = json.loads((tmp_path / "w0" / "result.json").read_text())
    assert chief["epochs"] == 2 and chief["export"]
    assert (tmp_path / "w0" / "prepared" / "manifest.json").is_file()
    assert (tmp_path / "w1" / "prepared_worker1" / "manifest.json").is_file()
    # both workers stepped through the same number of global batches
    steps = [re.search(r"(\d+) batches per epoch", log).group(1) for log in logs]
    assert steps[0] == steps[1]
    assert not (tmp_path / "w1" / "result.json").exists()
    assert not (tmp_path / "export1").exists()
