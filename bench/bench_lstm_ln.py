"""Benchmark: LSTM_LN vs keras.layers.LSTM step time, and IMDB training
examples/s of the three IMDB classifiers (writes JSON).

    python bench/bench_lstm_ln.py [--out bench/results/lstm_ln.json]
        [--steps 10] [--warmup 3]

1. Training step time (forward + backward + Adam update) of
   ``Input(T, d_in) -> RNN(units) -> Dense(2)`` with ``LSTM_LN`` and with
   ``keras.layers.LSTM`` of the same size, in the same run, with and
   without XLA (``jit_compile``); the figure of merit is the ratio
   LSTM_LN / LSTM. Shapes: batch 64, T = 256, d_in 64, units 128 (the IMDB
   recipe's LSTM size).
2. IMDB training examples/s of the recipe's three classifiers
   (``keras_trm.jobs.imdb.ImdbConfig`` defaults, the recipe's XLA choice),
   on batches of 64 random token ids of length 256 (one length bucket of
   the recipe; real epochs mix shorter buckets, see the per-run
   ``train_examples_per_second`` in ``docs/results/imdb/*.json``).

Each figure is the median over ``--steps`` timed steps after ``--warmup``
untimed steps (which include tracing / XLA compilation).
"""

import argparse
import os
import pathlib
import platform
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_trm  # noqa: E402,F401
from keras_trm.utils import write_json  # noqa: E402
from keras_trm.jobs import imdb  # noqa: E402  (the recipe's config)
from keras_trm.layers import LSTM_LN  # noqa: E402
from keras_trm.models import text_classifier  # noqa: E402
from keras_trm.training import compile_classifier  # noqa: E402

BATCH, T, D_IN, UNITS = 64, 256, 64, 128


def median_step_seconds(model, x, y, steps, warmup):
    for _ in range(warmup):
        model.train_on_batch(x, y)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rnn_model(layer_norm):
    inputs = keras.Input((T, D_IN))
    rnn = LSTM_LN(UNITS) if layer_norm else keras.layers.LSTM(UNITS)
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(
        rnn(inputs)))


def bench_rnn(steps, warmup):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, T, D_IN)).astype("float32")
    y = rng.integers(0, 2, BATCH)
    out = {}
    for jit in (False, True):
        row = {}
        for name, layer_norm in (("lstm", False), ("lstm_ln", True)):
            keras.utils.set_random_seed(0)
            model = rnn_model(layer_norm)
            model.compile("adam", "sparse_categorical_crossentropy",
                          jit_compile=jit)
            seconds = median_step_seconds(model, x, y, steps, warmup)
            row[f"{name}_ms_per_step"] = round(1000 * seconds, 1)
            print(f"jit_compile={jit} {name}: {1000 * seconds:.1f} ms/step",
                  flush=True)
        row["ratio_lstm_ln_over_lstm"] = round(
            row["lstm_ln_ms_per_step"] / row["lstm_ms_per_step"], 2)
        out["xla" if jit else "no_xla"] = row
    return out


def bench_imdb(steps, warmup):
    config = imdb.ImdbConfig()
    rng = np.random.default_rng(0)
    x = rng.integers(1, config.vocabulary_size, (config.batch_size, 256)).astype(
        "int32")
    y = rng.integers(0, 2, config.batch_size).astype("int32")
    out = {}
    for kind in imdb.MODEL_KINDS:
        keras.utils.set_random_seed(0)
        model = text_classifier(kind, config.vocabulary_size,
                                **imdb.classifier_options(kind, config))
        compile_classifier(model, **imdb.compile_options(kind, config, 1000))
        seconds = median_step_seconds(model, x, y, steps, warmup)
        out[kind] = {
            "parameters": int(model.count_params()),
            "jit_compile": bool(model.jit_compile),
            "ms_per_step": round(1000 * seconds, 1),
            "train_examples_per_second": round(config.batch_size / seconds, 1),
        }
        print(f"IMDB {kind}: {config.batch_size / seconds:.1f} examples/s "
              f"({1000 * seconds:.0f} ms/step)", flush=True)
    return out


def main(argv):
    parser = argparse.ArgumentParser(prog="bench/bench_lstm_ln.py")
    parser.add_argument("--out", default="bench/results/lstm_ln.json")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    start = time.time()
    result = {
        "machine": {
            "platform": platform.platform(),
            "cpu_cores_available": len(os.sched_getaffinity(0)),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
        },
        "timing": f"median of {args.steps} training steps after "
                  f"{args.warmup} untimed warm-up steps",
        "rnn_step": {
            "shapes": {"batch": BATCH, "time_steps": T, "input_dim": D_IN,
                       "units": UNITS},
            **bench_rnn(args.steps, args.warmup),
        },
        "imdb_training": {
            "shapes": {"batch": imdb.ImdbConfig.batch_size, "time_steps": 256},
            **bench_imdb(args.steps, args.warmup),
        },
    }
    result["bench_seconds"] = round(time.time() - start, 1)
    out = pathlib.Path(args.out)
    write_json(out, result)
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
