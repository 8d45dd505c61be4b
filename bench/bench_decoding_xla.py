"""Benchmark: does XLA pay for beam search on this CPU? Compile time counted.

    python bench/bench_decoding_xla.py --model runs/multi30k/model.keras
        --vocab runs/multi30k/vocab_8000.txt [--split val]
        [--out bench/results/decoding_xla.json]

Same weights, same validation sentences (Multi30k ``val`` by default: a
tuning question, so not the test split), beam 4, alpha 0.6, 2 threads
(TF intra_op=2, inter_op=1), token ids in and out (tokenization is not
timed). Three ways to run ``keras_trm.decoding.beam_search``:

- ``graph``: ``tf.function`` over the default growing head-major caches
  (what ``Translator`` and the SavedModel run); finished sentences leave
  the batch;
- ``xla_search``: the whole search in ``tf.function(jit_compile=True)``
  with ``static_cache=True`` (fixed-size caches, shapes XLA can compile;
  no sentence leaves the batch); XLA compiles once per input shape;
- ``xla_step``: the search in a plain graph, only the model's
  ``static_decode_step`` in ``tf.function(jit_compile=True)``.

For each batch size (``--batch-sizes``: batches of consecutive
sentences, padded to their longest) the first call of each way is
timed apart (tracing + XLA compilation + one run; each way is traced
once for any shape, as in a SavedModel) from the steady
state (the best of ``--repeats`` further calls over the same batches),
and the ids are compared with ``graph``'s (``sentences_with_graph_ids``:
how many sentences got the graph's ids). Writes one JSON file; figures are in
docs/measurements.md (Decoding runtimes).
"""

import argparse
import json
import os
import sys
import time

from bench_decoding import add_model_args, host_info

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--split", default="val")
    p.add_argument("--batch-sizes", default="1,100",
                   help="comma-separated batch sizes")
    p.add_argument("--batches", type=int, default=1,
                   help="batches per batch size (batch 1: ten times more)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench/results/decoding_xla.json")
    return p.parse_args(argv)


def _same_rows(a, b):
    """Rows of two int id arrays that are equal, the shorter 0-padded."""
    import numpy as np

    width = max(a.shape[1], b.shape[1])
    a, b = (np.pad(x, [(0, 0), (0, width - x.shape[1])]) for x in (a, b))
    return int((a == b).all(axis=1).sum())


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    import keras_trm  # noqa: F401
    from keras_trm.data import load_multi30k
    from keras_trm.decoding import Translator
    from keras_trm.decoding.search import beam_search
    from keras_trm.text import TextTokenizer, load_vocabulary
    from keras_trm.training.precision import float32_copy

    model = float32_copy(keras.saving.load_model(args.model))
    encode_text = Translator(model, TextTokenizer(load_vocabulary(args.vocab))
                             ).encode_text  # ids + END, 0-padded
    sources, _ = load_multi30k(args.split, args.data_dir)
    beam, alpha = 4, 0.6

    def search(x, **kw):
        return beam_search(model, x, beam_size=beam, length_penalty=alpha,
                           **kw)

    step = model.static_decode_step
    jit_step = tf.function(step, jit_compile=True)

    def with_jit_step(x):
        model.static_decode_step = jit_step
        try:
            return search(x, static_cache=True)
        finally:
            model.static_decode_step = step

    # Traced once for any shape (as the SavedModel is); XLA still compiles
    # once per concrete input shape.
    ids_spec = [tf.TensorSpec([None, None], tf.int32)]
    ways = {
        "graph": tf.function(search, input_signature=ids_spec),
        "xla_search": tf.function(lambda x: search(x, static_cache=True),
                                  input_signature=ids_spec, jit_compile=True),
        "xla_step": tf.function(with_jit_step, input_signature=ids_spec),
    }
    results = {}
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        count = args.batches * (10 if batch_size == 1 else 1)
        batches = []
        for b in range(count):
            texts = sources[b * batch_size:(b + 1) * batch_size]
            batches.append(encode_text(tf.constant(texts)).numpy())
        row = {"sentences": sum(len(b) for b in batches),
               "batches": len(batches)}
        ids = {}
        for name, fn in ways.items():
            t0 = time.perf_counter()
            out = [fn(b).numpy() for b in batches]
            first = time.perf_counter() - t0
            steady = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                for b in batches:
                    fn(b).numpy()
                steady.append(time.perf_counter() - t0)
            ids[name] = out
            row[name] = {
                "first_call_s": round(first, 3),
                "steady_s": round(min(steady), 4),
                "compile_and_trace_s": round(first - min(steady), 3),
                "sentences_per_s": round(row["sentences"] / min(steady), 2),
            }
            print(batch_size, name, row[name], flush=True)
        for name in ways:
            # Sentences whose ids equal the graph's (outputs padded alike).
            row[name]["sentences_with_graph_ids"] = sum(
                _same_rows(a, b) for a, b in zip(ids[name], ids["graph"]))
            row[name]["speed_over_graph"] = round(
                row["graph"]["steady_s"] / row[name]["steady_s"], 3)
        results[f"batch{batch_size}"] = row

    out = {
        "what": "beam 4 (alpha 0.6) over token ids: graph (growing caches) "
                "vs XLA (whole search / decoder step only, static caches)",
        "command": "python bench/bench_decoding_xla.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "split": args.split,
        "threads": args.threads,
        "host": host_info(),
        "tensorflow": tf.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "results": results,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
