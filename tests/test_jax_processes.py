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
import socket
import subprocess
import sys
import textwrap

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
