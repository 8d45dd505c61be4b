"""Evaluation speed: Transformer-XL with memory vs vanilla sliding window.

    taskset -c 1 python bench/bench_transformer_xl.py [--lengths 128 256 512]

Writes ``bench/results/transformer_xl.json``: tokens/s of evaluation (next-
token NLL of every position of ordered streams) at attention lengths L =
128, 256, 512, in one process, for two models of the same size (the
recipe's: 4 layers, d_model 128, 4 heads; Transformer-XL d_ff 512, vanilla
d_ff 575 so that both have the same parameter count; 65 characters, Tiny
Shakespeare's test split as the streams):

* **Transformer-XL** (Dai et al. 2019 §3.2): segments of L tokens, memory
  of ``mem_len = L`` positions per layer carried from segment to segment,
  ``same_length=True``: every prediction attends to exactly L + 1 positions
  (itself and the L before it). One compiled call (``tf.function``, fixed
  shapes) scores a whole ``(batch, L)`` segment and returns the new
  memories; the memory of the first timed segment is zeros of full length,
  so that every call has the same shapes (the speed does not depend on the
  values).
* **vanilla** (Dai et al. §3.1, Al-Rfou et al. 2018): to predict each new
  token the model is run on the window of the L tokens before it (its own
  position included), and only the last position's prediction is kept; the
  window then moves by one token. One compiled call (fixed shapes) scores
  one new token of every stream, i.e. ``batch`` windows of L tokens at
  once. Nothing is cached between windows: that recomputation is the cost
  the memory removes (the model computes logits at all L positions, which
  with 65 output classes is a negligible part of a window's work).

Both use the same batch of streams (``--batch-size``, default 16) and run
dropout-free. Weights are random: speed does not depend on them. Each
configuration is warmed up (traced) before it is timed. The two are timed
interleaved (alternating rounds of ``--round-seconds`` of each until both
have run ``--min-seconds``), so that on a shared machine both see the same
load; the JSON records the 1-minute load average before and after. Speed-up =
Transformer-XL tokens/s / vanilla tokens/s. Run it alone and pinned to one
core (``taskset -c 1``) for stable figures; the JSON records the cores the
process could use.
"""

import argparse
import json
import os
import pathlib
import platform
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import ops  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from keras_trm.data import language_modeling as lm  # noqa: E402
from keras_trm.models.transformer_xl import (  # noqa: E402
    TransformerXLLM,
    vanilla_transformer_lm,
)
from keras_trm.utils import write_json  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
SIZE = dict(num_layers=4, d_model=128, num_heads=4)
XL_D_FF, VANILLA_D_FF = 512, 575


class _Timer:
    """Accumulates the time and tokens of one side's timed calls."""

    def __init__(self):
        self.tokens, self.seconds, self.calls, self.nll = 0, 0.0, 0, 0.0

    def time(self, call, tokens):
        start = time.perf_counter()
        self.nll += float(call())  # one sync per call, as an evaluation loop
        self.seconds += time.perf_counter() - start
        self.tokens += tokens
        self.calls += 1


def txl_runner(streams, vocabulary_size, length, jit_compile):
    """Transformer-XL segment-by-segment evaluation: returns (step, model);
    each ``step()`` scores the next segment of every stream (memories
    carried; back to the first segment and zero memories after the last)."""
    batch = streams.shape[0]
    model = TransformerXLLM(
        vocabulary_size, d_ff=XL_D_FF, mem_len=length, max_segment_len=length,
        same_length=True, dropout_rate=0.0, **SIZE)
    spec_ids = tf.TensorSpec((batch, length), tf.int32)
    spec_mem = [tf.TensorSpec((batch, length, SIZE["d_model"]), tf.float32)
                for _ in range(SIZE["num_layers"])]

    @tf.function(input_signature=[spec_ids, spec_ids, spec_mem],
                 jit_compile=jit_compile)
    def score_segment(inputs, targets, memories):
        logits, new_memories = model(inputs, memories, training=False)
        nll = ops.sum(ops.sparse_categorical_crossentropy(
            targets, logits, from_logits=True))
        return nll, new_memories

    pairs = list(lm.segments(streams, length, drop_remainder=True))
    zeros = [tf.zeros(s.shape) for s in spec_mem]
    score_segment(*pairs[0], zeros)[0].numpy()  # trace + warm up
    state = {"k": 0, "memories": zeros}

    def step():
        inputs, targets = pairs[state["k"]]
        out, state["memories"] = score_segment(inputs, targets,
                                               state["memories"])
        state["k"] += 1
        if state["k"] == len(pairs):
            state["k"], state["memories"] = 0, zeros
        return out

    return step, model, batch * length


def vanilla_runner(streams, vocabulary_size, length, jit_compile):
    """Vanilla sliding-window evaluation: each ``step()`` scores one new
    token of every stream, the whole window of ``length`` recomputed."""
    batch = streams.shape[0]
    model = vanilla_transformer_lm(
        vocabulary_size, d_ff=VANILLA_D_FF, max_sequence_length=length,
        dropout_rate=0.0,
        **SIZE)

    @tf.function(input_signature=[tf.TensorSpec((batch, length), tf.int32),
                                  tf.TensorSpec((batch,), tf.int32)],
                 jit_compile=jit_compile)
    def score_last(window, target):
        logits = model(window, training=False)[:, -1]
        return ops.sum(ops.sparse_categorical_crossentropy(
            target, logits, from_logits=True))

    score_last(streams[:, :length], streams[:, length]).numpy()  # warm up
    state = {"t": length - 1}  # predict t + 1 from t - length + 1 .. t

    def step():
        t = state["t"]
        if t + 1 >= streams.shape[1]:
            t = length - 1
        state["t"] = t + 1
        return score_last(streams[:, t - length + 1:t + 1], streams[:, t + 1])

    return step, model, batch


def measure(streams, vocabulary_size, length, min_seconds, jit_compile,
            round_seconds):
    """Times both evaluations interleaved: rounds of ~``round_seconds`` of
    Transformer-XL, then of vanilla, until each side has run at least
    ``min_seconds`` (and >= 2 XL segments, >= 3 vanilla steps), so that
    both see the same machine load."""
    txl_step, txl_model, txl_tokens = txl_runner(
        streams, vocabulary_size, length, jit_compile)
    van_step, van_model, van_tokens = vanilla_runner(
        streams, vocabulary_size, length, jit_compile)
    txl, van = _Timer(), _Timer()
    rounds = 0
    while (txl.seconds < min_seconds or van.seconds < min_seconds
           or txl.calls < 2 or van.calls < 3):
        for timer, step, tokens in ((txl, txl_step, txl_tokens),
                                    (van, van_step, van_tokens)):
            start = timer.seconds
            while timer.seconds - start < round_seconds:
                timer.time(step, tokens)
        rounds += 1
    return (
        {"tokens_per_second": txl.tokens / txl.seconds, "tokens": txl.tokens,
         "seconds": round(txl.seconds, 3), "segments": txl.calls,
         "ms_per_segment": round(1000 * txl.seconds / txl.calls, 2),
         "parameters": int(txl_model.count_params())},
        {"tokens_per_second": van.tokens / van.seconds, "tokens": van.tokens,
         "seconds": round(van.seconds, 3), "steps": van.calls,
         "ms_per_step": round(1000 * van.seconds / van.calls, 2),
         "parameters": int(van_model.count_params())},
        rounds,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[128, 256, 512])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--min-seconds", type=float, default=8.0,
                        help="time each configuration at least this long")
    parser.add_argument("--round-seconds", type=float, default=2.0,
                        help="length of one round of each side when "
                             "interleaving the two timings")
    parser.add_argument("--jit-compile", choices=["off", "on"], default="off")
    parser.add_argument("--output", default=str(RESULTS / "transformer_xl.json"))
    args = parser.parse_args(argv)
    jit = args.jit_compile == "on"

    ids, vocab = lm.load_lm_corpus("tinyshakespeare", "test")
    streams = lm.batchify(ids, args.batch_size)
    keras.utils.set_random_seed(0)
    rows = []
    for length in tqdm(args.lengths, desc="attention lengths"):
        if streams.shape[1] < 2 * length + 1:
            raise ValueError(
                f"streams of {streams.shape[1]} tokens are too short for "
                f"attention length {length}; lower --batch-size")
        load_before = os.getloadavg()[0]
        txl, van, rounds = measure(streams, len(vocab), length,
                                   args.min_seconds, jit, args.round_seconds)
        row = {
            "attention_length": length,
            "transformer_xl_tokens_per_second": round(txl["tokens_per_second"], 1),
            "vanilla_tokens_per_second": round(van["tokens_per_second"], 2),
            "speedup": round(txl["tokens_per_second"] / van["tokens_per_second"], 1),
            "transformer_xl": txl, "vanilla": van,
            "interleaved_rounds": rounds,
            "load_average_1min": [round(load_before, 2),
                                  round(os.getloadavg()[0], 2)],
        }
        rows.append(row)
        tqdm.write(f"L={length}: Transformer-XL {row['transformer_xl_tokens_per_second']:,} "
                   f"tokens/s, vanilla {row['vanilla_tokens_per_second']:,} tokens/s, "
                   f"speed-up {row['speedup']}x")
    result = {
        "benchmark": "Transformer-XL evaluation with memory vs vanilla "
                     "sliding-window evaluation (tokens/s)",
        "command": "python bench/bench_transformer_xl.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {
            "cpu_cores_usable": len(os.sched_getaffinity(0)),
            "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "gpus": len(tf.config.list_physical_devices("GPU")),
            "tensorflow": tf.__version__, "keras": keras.__version__,
        },
        "setup": {
            "model": {**SIZE, "vocabulary_size": len(vocab),
                      "transformer_xl_d_ff": XL_D_FF,
                      "vanilla_d_ff": VANILLA_D_FF},
            "batch_size": args.batch_size,
            "streams": "Tiny Shakespeare test split (55,770 characters) cut "
                       f"into {args.batch_size} contiguous streams",
            "transformer_xl": "segments of L tokens, mem_len = L, "
                              "same_length=True (each prediction attends to "
                              "L + 1 positions), one call per segment",
            "vanilla": "window of the last L tokens recomputed for each "
                       "new token, one call per new token of every stream",
            "jit_compile": jit,
            "min_seconds_per_configuration": args.min_seconds,
            "timing": "interleaved: alternating rounds of about "
                      f"{args.round_seconds} s of each side until both have "
                      "run min_seconds, so that both see the same load",
        },
        "speedup_curve": {str(r["attention_length"]): r["speedup"] for r in rows},
        "results": rows,
    }
    write_json(args.output, result)
    print(json.dumps(result["speedup_curve"]))
    return result


if __name__ == "__main__":
    main()
