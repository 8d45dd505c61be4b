"""Peak resident memory of the whole translation job, two checkouts
alternating: ``keras-trm train-translation`` for a few epochs (training,
checkpoint averaging, test decoding, export) from each checkout, each run
in a fresh work folder, its peak RSS read as ``/usr/bin/time -v`` reads it
(``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a wrapper process whose only
child is the job).

    git worktree add /tmp/keras_trm_old bc1b22c
    KERAS_TRM_DATA_DIR=../shared/data python bench/bench_job_memory.py \\
        --a /tmp/keras_trm_old --a_flags "--vocabulary_size 8000" \\
        --b . --rounds 3 --out /tmp/job_memory.json

Each run takes about 2.5 minutes on a 2-core CPU at one epoch. With
``--epochs 2`` or more, the seconds of each epoch after the first (which
traces the step for every length bucket) compare speed too, and each
checkout's runs are checked to repeat their loss and BLEU. The peak of one
process moves by up to about 90 MiB from run to run (what tf.data and
TensorFlow's allocator happen to hold when a phase peaks), so compare
medians over rounds.
"""

import argparse
import datetime
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile

if __package__ in (None, ""):  # python bench/bench_job_memory.py: import bench/ as a package
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])
from bench.common import cpu_model as _cpu_model  # noqa: E402

WRAPPER = r"""
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL).returncode
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def run_once(checkout, flags, epochs, workdir):
    """One job from ``checkout``: (return code, peak RSS in MiB, its
    ``result.json`` or None)."""
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(checkout).resolve()))
    job = [sys.executable, "-m", "keras_trm.cli", "train-translation",
           "--training.epochs", str(epochs), "--workdir", str(workdir / "run"),
           "--export_dir", str(workdir / "export"), *shlex.split(flags)]
    out = subprocess.run([sys.executable, "-c", WRAPPER, *job], env=env,
                         check=True, capture_output=True, text=True, timeout=3600)
    rc, kib = out.stdout.split()
    result = workdir / "run" / "result.json"
    return int(rc), int(kib) / 1024, (json.loads(result.read_text())
                                      if result.is_file() else None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", required=True, help="checkout B")
    parser.add_argument("--a_flags", default="", help="A's extra job flags")
    parser.add_argument("--b_flags", default="", help="B's extra job flags")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    runs = {"a": [], "b": []}
    epoch_seconds = {"a": [], "b": []}  # each run's seconds per epoch
    same = {"a": set(), "b": set()}  # (loss, val BLEU, test BLEU) of each run
    with tempfile.TemporaryDirectory(prefix="job_memory_") as tmp:
        for i in range(args.rounds):
            for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
                workdir = pathlib.Path(tmp) / f"{name}{i}"
                rc, mib, job = run_once(getattr(args, name),
                                        getattr(args, f"{name}_flags"), args.epochs, workdir)
                if rc != 0 or job is None:
                    sys.exit(f"the job from {getattr(args, name)} failed (exit {rc})")
                runs[name].append(round(mib, 1))
                ends = [0.0] + [e["train_seconds"] for e in job["epochs_log"]]
                epoch_seconds[name].append([round(b - a, 1) for a, b in zip(ends, ends[1:])])
                last = job["epochs_log"][-1]
                same[name].add((last["loss"], last.get("val_greedy_bleu"), job["test_bleu"]))
                print(f"{name} round {i}: {mib:.1f} MiB, epochs {epoch_seconds[name][-1]} s",
                      flush=True)
    median = {k: statistics.median(v) for k, v in runs.items()}
    result = {
        "what": "peak RSS (MiB) of `keras-trm train-translation` (training, "
                "averaging, test decoding, export), two checkouts alternating",
        "date": datetime.date.today().isoformat(),
        "host": _cpu_model(), "a": str(args.a), "b": str(args.b),
        "a_flags": args.a_flags, "b_flags": args.b_flags, "epochs": args.epochs,
        "peak_rss_mib": runs, "median_peak_rss_mib": median,
        "mean_peak_rss_mib": {k: round(statistics.mean(v), 1) for k, v in runs.items()},
        "median_b_over_a": round(median["b"] / median["a"], 3),
        "epoch_seconds": epoch_seconds,
        # The first epoch traces the step for every bucket; later ones do not.
        "median_seconds_of_epochs_after_the_first": {
            k: (statistics.median(s for run in v for s in run[1:])
                if args.epochs > 1 else None) for k, v in epoch_seconds.items()},
        "each_checkout_repeats_its_results": {k: len(v) == 1 for k, v in same.items()},
        "last_epoch_loss_val_bleu_test_bleu": {k: sorted(v) for k, v in same.items()},
    }
    from keras_trm.utils.files import write_json

    write_json(args.out, result)
    print(json.dumps({k: result[k] for k in (
        "median_peak_rss_mib", "median_b_over_a",
        "median_seconds_of_epochs_after_the_first", "each_checkout_repeats_its_results")}))


if __name__ == "__main__":
    main()
