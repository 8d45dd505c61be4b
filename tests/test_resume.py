"""Resume after preemption: a run killed with SIGKILL in the middle of an
epoch and started again with the same command ends with the same weights as
the same run uninterrupted, and repeats at most ``save_freq`` steps.

The script below trains with the pieces the translation job uses
(a prepared folder, ``TokenBatches(repeat=True, position=...)`` through
the job's ``tf_dataset``, its ``batches_per_epoch`` as the epoch length,
``TrainingBackup`` first in the
callback list, ``EpochCheckpoints``, ``TimeBudget``, ``BleuLog``, Noam +
Adam, dropout 0.1) on a tiny Transformer and seeded random sentences of a
46-word vocabulary, so that three runs fit in well under a minute; the
real job wires the same callbacks the same way.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

SCRIPT = textwrap.dedent("""
    import json, pathlib, sys, time
    import numpy as np, keras
    from keras_trm.data import TokenBatches, prepare_translation_data, read_prepared
    from keras_trm.jobs.translation import tf_dataset, token_encoder, vocabulary_sha256
    from keras_trm.models import transformer
    from keras_trm.text import RESERVED_TOKENS, TextTokenizer
    from keras_trm.training import (
        BleuLog, DataPosition, EpochCheckpoints, LabelSmoothedCrossEntropy,
        NoamSchedule, TimeBudget, TrainingBackup, paper_adam)

    work = pathlib.Path(sys.argv[1]); save_freq = int(sys.argv[2])
    pause_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(4, 50)]  # ids 4..49
    tokenizer = TextTokenizer(list(RESERVED_TOKENS) + words)
    sentence = lambda: " ".join(rng.choice(words, rng.integers(3, 15)))
    src = [sentence() for _ in range(100)]
    tgt = [sentence() for _ in range(100)]
    # The same folder in every run of one work dir: the resumed run reuses it.
    work.mkdir(parents=True, exist_ok=True)
    corpus = [("train", work / "train.src", work / "train.tgt")]
    for path, lines in zip(corpus[0][1:], (src, tgt)):
        if not path.exists():
            path.write_text("".join(l + "\\n" for l in lines))
    shards = prepare_translation_data(
        work / "prepared", corpus, token_encoder(tokenizer),
        len(tokenizer.vocabulary), vocabulary_sha256(tokenizer), max_train_length=16)
    split = read_prepared(work / "prepared").splits["train"]
    boundaries = (8, 16)
    position = DataPosition()
    stream = TokenBatches(split, 128, boundaries, seed=0, repeat=True,
                          position=position)
    data = tf_dataset(stream)
    batches = stream.batches_per_epoch
    model = transformer(50, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                        dropout_rate=0.1, max_sequence_length=16)
    model.compile(optimizer=paper_adam(NoamSchedule(16, 10)),
                  loss=LabelSmoothedCrossEntropy(0.1), jit_compile=False)

    class StepLog(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            with open(work / "steps.log", "a") as f:
                f.write(f"{step}\\n")
            if step == pause_at:  # waits here for the test's SIGKILL
                time.sleep(600)

    budget = TimeBudget(3600)
    checkpoints = EpochCheckpoints(work / "checkpoints", keep=2)
    score = BleuLog(lambda m: float(np.sum(m.get_weights()[0])),
                    work / "epochs.json", clock=budget.elapsed)
    backup = TrainingBackup(work / "backup", save_freq=save_freq,
                            position=position, steps_per_epoch=batches,
                            stateful={"budget": budget, "log": score,
                                      "checkpoints": checkpoints})
    model.fit(data, epochs=3, steps_per_epoch=batches, verbose=0,
              callbacks=[backup, checkpoints, score, budget, StepLog()])
    np.savez(work / "final.npz", *model.get_weights())
    (work / "done.json").write_text(json.dumps(
        {"batches_per_epoch": batches, "pairs": shards["splits"]["train"]["pairs"],
         "shards_reused": shards["reused"],
         "checkpoints": [p.name for p in checkpoints.paths],
         "log_epochs": [e["epoch"] for e in score.history],
         "train_seconds": budget.elapsed(),
         "restored": backup.restored}))
""")

SAVE_FREQ = 3


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")


def _steps(work):
    path = work / "steps.log"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


@pytest.mark.slow
def test_sigkill_mid_epoch_then_same_command_matches_uninterrupted(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, str(script)]

    clean = tmp_path / "clean"
    clean.mkdir()
    proc = subprocess.run(cmd + [str(clean), str(SAVE_FREQ)], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((clean / "done.json").read_text())
    per_epoch = info["batches_per_epoch"]
    assert per_epoch >= 8 and info["restored"] is None
    assert info["pairs"] == 100 and not info["shards_reused"]

    killed = tmp_path / "killed"
    killed.mkdir()
    # Kill inside the second epoch, between two backups.
    target = per_epoch + SAVE_FREQ + 2
    child = subprocess.Popen(cmd + [str(killed), str(SAVE_FREQ), str(target)],
                             env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while len(_steps(killed)) < target:
            assert child.poll() is None, child.stderr.read()[-3000:]
            assert time.time() < deadline, "the run never reached the kill point"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()
    before = len(_steps(killed))
    assert before == target and per_epoch < before < 2 * per_epoch
    assert not (killed / "final.npz").exists()

    proc = subprocess.run(cmd + [str(killed), str(SAVE_FREQ)], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = json.loads((killed / "done.json").read_text())
    restored = resumed["restored"]
    assert restored is not None and restored["epoch"] == 1
    assert resumed["shards_reused"]  # the killed run's shards, unchanged
    assert 0 < restored["batch"] < per_epoch       # restored mid-epoch

    steps = _steps(killed)
    total = 3 * per_epoch
    repeated = len(steps) - total
    print(f"killed after {before} steps, resumed at step {restored['step']}, "
          f"{repeated} steps repeated (save_freq={SAVE_FREQ})")
    assert 0 <= repeated <= SAVE_FREQ
    # The resumed part continues the step counter where the backup left it.
    assert steps[before] == restored["step"] + 1 and steps[-1] == total

    a = np.load(clean / "final.npz")
    b = np.load(killed / "final.npz")
    diffs = [float(np.max(np.abs(a[k] - b[k]))) for k in a.files]
    print(f"max |w_resumed - w_uninterrupted| = {max(diffs):.3g}")
    assert len(a.files) == len(b.files)
    assert max(diffs) < 1e-5
    # What the callbacks carry came back: the log has every epoch once,
    # the checkpoint list the same newest files, training time > 0.
    assert resumed["log_epochs"] == info["log_epochs"] == [1, 2, 3]
    assert resumed["checkpoints"] == info["checkpoints"]
    assert resumed["train_seconds"] > 0
    # Running the finished command again trains no further step.
    proc = subprocess.run(cmd + [str(killed), str(SAVE_FREQ)], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(_steps(killed)) == len(steps)
    c = np.load(killed / "final.npz")
    assert all(np.array_equal(b[k], c[k]) for k in b.files)
