"""Where the quickstart's CPU training step goes: the Multi30k default model
(3 layers, d_model 256, d_ff 1024, 4 heads, dropout 0.3, 8,000 tied ids;
Adam with Noam, label smoothing 0.1) timed as it is and with one thing
changed at a time (batch, dropout, optimizer, vocabulary, d_ff), each
variant in a child process of its own, the variants taking turns; and,
with ``--profile``, the base step's op time by TensorFlow op type.

    python bench/bench_train_step_variants.py \\
        --out bench/results/train_step_variants_cpu.json [--runs 2] [--profile]

A step is ``train_on_batch`` on ``--batch`` synthetic pairs of ``--length``
tokens a side (4,096 target tokens by default, the job's
``tokens_per_batch``); the figure is the median of ``--steps`` timed steps
after 5 warm-up steps, then the median over runs. Ratios are to the base
variant of the same run: compare those across hosts, not the milliseconds.
"""

import argparse
import collections
import datetime
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_litert import _cpu_model

VARIANTS = {
    "base": {},
    "batch_half": {"batch_fraction": 0.5},
    "batch_quarter": {"batch_fraction": 0.25},
    "no_dropout": {"dropout_rate": 0.0},
    "sgd_not_adam": {"optimizer": "sgd"},
    "vocabulary_6000": {"vocabulary_size": 6000},
    "vocabulary_4000": {"vocabulary_size": 4000},
    "d_ff_512": {"d_ff": 512},
}

CHILD = r"""
import json, os, sys, time
import numpy as np, keras
from keras_trm.models import transformer
from keras_trm.training import LabelSmoothedCrossEntropy, NoamSchedule, paper_adam
change, batch, length, steps, precision, profile = json.loads(sys.argv[1])
keras.mixed_precision.set_global_policy(precision)
keras.utils.set_random_seed(0)
change = dict(change)
vocabulary_size = change.pop("vocabulary_size", 8000)
batch = int(batch * change.pop("batch_fraction", 1.0))
optimizer = change.pop("optimizer", "adam")
config = dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4,
              dropout_rate=0.3, max_sequence_length=128)
config.update(change)
rng = np.random.default_rng(0)
src = rng.integers(4, vocabulary_size, (batch, length)).astype("int32")
tgt = rng.integers(4, vocabulary_size, (batch, length + 1)).astype("int32")
model = transformer(vocabulary_size, **config)
model.compile(
    optimizer=(paper_adam(NoamSchedule(d_model=256, warmup_steps=400))
               if optimizer == "adam" else keras.optimizers.SGD(0.01)),
    loss=LabelSmoothedCrossEntropy(0.1))
x = {"encoder_tokens": src, "decoder_tokens": tgt[:, :-1]}
y = tgt[:, 1:]
for _ in range(5):
    model.train_on_batch(x, y)
times = []
for _ in range(steps):
    start = time.perf_counter()
    model.train_on_batch(x, y)
    times.append(time.perf_counter() - start)
result = {"ms": 1000 * sorted(times)[len(times) // 2],
          "target_tokens": batch * length}
if profile:
    import tensorflow as tf
    tf.profiler.experimental.start(profile)
    for _ in range(steps):
        model.train_on_batch(x, y)
    tf.profiler.experimental.stop()
print(json.dumps(result))
"""


def run_once(change, args, profile=""):
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, "-c", CHILD,
         json.dumps([change, args.batch, args.length, args.steps,
                     args.precision, profile])],
        env=env, check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def op_time_by_type(logdir, steps):
    """ms per step of each TF op type on the executor threads (summed over
    threads, so more than the step's wall time), from the profiler's
    XSpace."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0]
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    total, count = collections.Counter(), collections.Counter()
    for plane in space.planes:
        names = {k: m.name for k, m in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "")
                if ":" not in name or "::" in name:  # not an op (executor frames)
                    continue
                op_type = name.rsplit(":", 1)[1]
                total[op_type] += event.duration_ps
                count[op_type] += 1
    all_ps = sum(total.values())
    return {op_type: {"ms_per_step": round(ps / 1e9 / steps, 2),
                      "share": round(ps / all_ps, 4),
                      "ops_per_step": count[op_type] // steps}
            for op_type, ps in total.most_common()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--precision", default="mixed_bfloat16")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated, from: " + ", ".join(VARIANTS))
    parser.add_argument("--profile", action="store_true",
                        help="also profile the base step: op time by type")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or "base" not in names:
        parser.error(f"--variants must name base and only {sorted(VARIANTS)}, "
                     f"got {args.variants!r}")
    runs = {n: [] for n in names}
    for i in range(args.runs):
        for name in names if i % 2 == 0 else names[::-1]:
            runs[name].append(run_once(VARIANTS[name], args))
            print(name, round(runs[name][-1]["ms"], 1), flush=True)
    ms = {n: statistics.median(r["ms"] for r in v) for n, v in runs.items()}
    tokens = {n: v[0]["target_tokens"] for n, v in runs.items()}
    per_token = {n: ms[n] / tokens[n] for n in names}
    result = {
        "what": "the Multi30k default model's training step (train_on_batch, "
                "TensorFlow) with one change at a time; ms per step, medians",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": _cpu_model(), "precision": args.precision,
        "batch": args.batch, "length": args.length, "steps": args.steps,
        "variants": {n: VARIANTS[n] for n in names},
        "runs": runs, "median_ms": ms, "target_tokens": tokens,
        "ms_per_1000_tokens_over_base": {
            n: round(per_token[n] / per_token["base"], 3) for n in names},
        "command": "python bench/bench_train_step_variants.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
    }
    if args.profile:
        with tempfile.TemporaryDirectory() as logdir:
            run_once({}, args, profile=logdir)
            result["base_op_time_by_type"] = op_time_by_type(logdir, args.steps)
    from keras_trm.utils.files import write_json

    write_json(args.out, result)
    print(json.dumps(result["ms_per_1000_tokens_over_base"]))


if __name__ == "__main__":
    main()
