"""Benchmark: single-sentence beam-4 latency split into steps x cost per step,
ours against CTranslate2, and the step's matmuls alone.

    python bench/bench_step_cost.py --model <run>/model.keras \\
        --vocab <run>/vocab_8000.txt [--split val] [--num-sentences 12]

One sentence at a time (beam 4, alpha 0.6, 2 threads), three calls per
runtime and sentence, taking turns, each after an untimed 20 ms pause:

- ``real``: the search as served (ours: the exact stop, compiled by XLA as
  the SavedModel runs batches of one; CTranslate2: its own stop);
- ``full``: every step to the sentence's limit L = n + 50 (n source
  tokens with END; ours ``early_stopping="never"``, CTranslate2
  ``min_decoding_length = max_decoding_length = L``), four live rows all
  the way;
- ``one``: a single step (``max_decoding_length=1``; CTranslate2 min = max = 1).

A step costs (full - one) / (L - 1): four rows through the decoder, the
output projection, log-softmax, top-k and the cache reorder. The steps a
real search ran are then about 1 + (real - one) / step. Ours runs in
process and also as the graph search (no XLA), CTranslate2 float32 in a
worker process of its own (as ``bench_decoding.py``). The floor is the
decoder's dense matmuls alone, for one row and for four, with the model's
kernels, in an XLA loop and in a graph loop: no attention, no search.

Writes ``--out`` (default ``bench/results/step_cost.json``): per sentence
and the medians over sentences.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_decoding import (  # noqa: E402
    SubprocessCTranslate2, add_model_args, host_info, set_tf_threads)

CALLS = ("real", "full", "one")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--split", default="val")
    p.add_argument("--num-sentences", type=int, default=12)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--settle-ms", type=float, default=20.0)
    p.add_argument("--floor-steps", type=int, default=50)
    p.add_argument("--out", default="bench/results/step_cost.json")
    return p.parse_args(argv)


def step_limit(model, tokens):
    """The sentence's token limit, as ``beam_search`` sets it: n + 50
    (n source tokens with END), at most the model's max_sequence_length - 1."""
    n = int((tokens != 0).sum())
    return min(n + 50, model.max_sequence_length - 1)


def matmul_floor(model, steps, rows=4):
    """Seconds per step of the decoder's dense matmuls alone for ``rows``
    rows (the model's kernels, chained so none overlaps the next), in an
    XLA loop and in a graph loop of ``steps`` steps; medians of 9."""
    import numpy as np
    import tensorflow as tf

    kernels = []
    for w in model.weights:
        name = w.path
        if not name.startswith("decoder_layer_") or not name.endswith("kernel"):
            continue
        if "cross_attention/key" in name or "cross_attention/value" in name:
            continue  # computed once per sentence, not per step
        if name.endswith("attention_output/kernel"):  # W^O
            kernels.append(tf.reshape(w.value, (-1, w.shape[-1])))
        else:
            kernels.append(tf.reshape(w.value, (w.shape[0], -1)))
    embedding = model.get_layer("embedding").embeddings
    d_model = int(embedding.shape[1])

    def step(h):
        for kernel in kernels:  # q, k, v, W^O, cross q, W^O, FFN in, out
            h = tf.matmul(h[:, :kernel.shape[0]], kernel)
        return tf.matmul(h[:, :d_model], embedding, transpose_b=True)

    def loop(x):
        def body(i, x, total):
            logits = step(x)
            return i + 1, x + 1e-6 * tf.reduce_max(logits, -1, keepdims=True), \
                total + tf.reduce_sum(logits)
        return tf.while_loop(lambda i, x, t: i < steps, body, (0, x, 0.0))[2]

    x = tf.constant(np.random.default_rng(0).standard_normal((rows, d_model)),
                    tf.float32)
    out = {}
    for name, jit in (("xla", True), ("graph", False)):
        f = tf.function(loop, jit_compile=jit)
        f(x).numpy()
        times = []
        for _ in range(9):
            start = time.perf_counter()
            f(x).numpy()
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times) / steps
    macs = sum(int(k.shape[0]) * int(k.shape[1]) for k in kernels) + \
        int(embedding.shape[0]) * d_model
    return out, macs


def main(argv=None):
    args = parse_args(argv)
    load_at_start = os.getloadavg()
    import tensorflow as tf

    set_tf_threads(args.threads, 1, args.threads)
    tf.get_logger().setLevel("ERROR")  # one tf.function per sentence and call
    import keras

    import keras_trm  # noqa: F401
    from keras_trm.data import load_multi30k
    from keras_trm.decoding import Translator, beam_search
    from keras_trm.export.ctranslate2 import export_ctranslate2
    from keras_trm.text import TextTokenizer, load_vocabulary
    from keras_trm.training.precision import float32_copy
    from keras_trm.utils import write_json

    sources, _ = load_multi30k(args.split, args.data_dir)
    sentences = [s for s in sources if s.strip()][:args.num_sentences]
    vocab = load_vocabulary(args.vocab)
    model = float32_copy(keras.saving.load_model(args.model))
    translator = Translator(model, TextTokenizer(vocab), jit_compile=True)

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="bench_step_cost_"))
    ct2_dir = export_ctranslate2(model, workdir / "ct2", vocab)
    ct2 = SubprocessCTranslate2(ct2_dir, num_threads=args.threads)

    def ours(jit, rule, max_decoding_length):
        def search(tokens):
            return beam_search(model, tokens, beam_size=4, length_penalty=0.6,
                               max_decoding_length=max_decoding_length,
                               early_stopping=rule,
                               static_cache=jit)
        return tf.function(search, jit_compile=jit)

    rows = []
    for index, sentence in enumerate(sentences):
        tokens = translator.encode_text(tf.constant([sentence]))
        limit = step_limit(model, tokens.numpy())
        width = int(tokens.shape[1])
        padded = tf.pad(tokens, [[0, 0], [0, int(translator.compiled_width(width))
                                        - width]])
        systems = {}
        for name, jit, source in (("ours_xla", True, padded),
                                  ("ours_graph", False, tokens)):
            calls = {"real": ours(jit, "bound", None), "full": ours(jit, "never", None),
                     "one": ours(jit, "never", 1)}
            systems[name] = {call: (lambda f=f, s=source: f(s).numpy())
                             for call, f in calls.items()}
        ct2_tokens = ct2.call("tokenize", [sentence])[0]
        ct2_lengths = {"real": {}, "full": {"min_decoding_length": limit,
                                            "max_decoding_length": limit},
                       "one": {"min_decoding_length": 1, "max_decoding_length": 1}}

        def ct2_call(call):
            hyps, seconds = ct2.call("translate_tokens", ct2_tokens, beam_size=4,
                                     length_penalty=0.6, **ct2_lengths[call])
            return len(hyps[0]), seconds

        systems["ct2_float32"] = {call: (lambda c=call: ct2_call(c)) for call in CALLS}
        # Untimed first calls (XLA compiles here), checking the step counts.
        widths = {}
        for name, calls in systems.items():
            for call, fn in calls.items():
                out = fn()
                widths[(name, call)] = out[0] if name == "ct2_float32" else out.shape[-1]
        assert widths[("ct2_float32", "full")] == limit, widths
        assert widths[("ours_graph", "full")] == limit, widths
        times = {(name, call): [] for name in systems for call in CALLS}
        for _ in range(args.repeats):
            for name, calls in systems.items():
                for call, fn in calls.items():
                    time.sleep(args.settle_ms / 1000)
                    if name == "ct2_float32":
                        times[(name, call)].append(fn()[1])
                    else:
                        start = time.perf_counter()
                        fn()
                        times[(name, call)].append(time.perf_counter() - start)
        row = {"sentence": index, "limit": limit}
        for name in systems:
            med = {call: statistics.median(times[(name, call)]) for call in CALLS}
            step = (med["full"] - med["one"]) / (limit - 1)
            row[name] = {"ms": {c: round(1000 * med[c], 3) for c in CALLS},
                         "ms_per_step": round(1000 * step, 4),
                         "steps_of_real": round(1 + (med["real"] - med["one"]) / step, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    ct2.close()

    floor = {}
    for rows_per_step in (1, 4):
        times, macs = matmul_floor(model, args.floor_steps, rows=rows_per_step)
        floor.update({f"{k}_{rows_per_step}_rows": v for k, v in times.items()})
    names = ("ours_xla", "ours_graph", "ct2_float32")

    def med(name, key, sub=None):
        values = [r[name][key][sub] if sub else r[name][key] for r in rows]
        return round(statistics.median(values), 3)

    summary = {name: {"real_ms_p50": med(name, "ms", "real"),
                      "ms_per_step_p50": med(name, "ms_per_step"),
                      "steps_of_real_p50": med(name, "steps_of_real")}
               for name in names}
    ct2 = summary["ct2_float32"]
    summary["ratios_over_ct2_float32"] = {
        f"{name}_{key}": round(summary[name][key] / ct2[key], 3)
        for name in ("ours_xla", "ours_graph")
        for key in ("real_ms_p50", "ms_per_step_p50", "steps_of_real_p50")}
    summary["matmul_floor_ms_per_step"] = {k: round(1000 * v, 4)
                                           for k, v in floor.items()}
    summary["matmul_floor_macs_per_row"] = macs
    result = {
        "benchmark": "single-sentence beam 4: steps x cost per step",
        "command": "python " + " ".join(sys.argv),
        "data": f"Multi30k {args.split}, first {len(sentences)} sentences, one at "
                "a time, beam 4, alpha 0.6",
        "threads": f"TF intra_op={args.threads}, inter_op={args.threads}; "
                   f"CTranslate2 intra_threads={args.threads} in its own process",
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%d"),
        "host": host_info(),
        "load_average_at_start_and_end": [load_at_start, os.getloadavg()],
        "summary": summary,
        "sentences": rows,
    }
    write_json(args.out, result)
    print(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
