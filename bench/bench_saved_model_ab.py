"""Benchmark: two translation SavedModels A/B on single sentences, in one run.

    python bench/bench_saved_model_ab.py --a <old export>/1 --b <new export>/1 \\
        [--split val] [--num-sentences 30] [--repeats 5] [--out ...]

For comparing two exports of the same weights (two revisions of the code,
or two export options): both are loaded in one process, and each of the
first ``--num-sentences`` sentences of the split is sent to each, one at a
time: an untimed first request each (XLA compiles there, once per
source-length bucket), then ``--repeats`` timed requests each, the order
alternating, each after an untimed 20 ms pause. Per sentence the median of
each; the JSON has the medians over sentences, the median of the per-
sentence ratios a / b (above 1: b is faster) and how many outputs are the
same strings. With ``--batch-sentences N`` the first N sentences are also
sent as one request, ``--repeats`` times each, alternating (sentences/s).
Writes ``--out`` (default
``bench/results/saved_model_ab.json``).
"""

import argparse
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_decoding import host_info, set_tf_threads  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="SavedModel version folder A")
    p.add_argument("--b", required=True, help="SavedModel version folder B")
    p.add_argument("--data-dir", default=None,
                   help="data folder (default: $KERAS_TRM_DATA_DIR)")
    p.add_argument("--split", default="val")
    p.add_argument("--num-sentences", type=int, default=30)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--settle-ms", type=float, default=20.0)
    p.add_argument("--batch-sentences", type=int, default=0,
                   help="also time the first N sentences sent as one "
                        "request (0: single sentences only)")
    p.add_argument("--out", default="bench/results/saved_model_ab.json")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    load_at_start = os.getloadavg()
    set_tf_threads(args.threads, 1, args.threads)
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SavedModels' ops)

    from keras_trm.data import load_multi30k
    from keras_trm.utils import write_json

    sources, _ = load_multi30k(args.split, args.data_dir)
    sentences = [s for s in sources if s.strip()][:args.num_sentences]
    models = {name: tf.saved_model.load(path).signatures["serving_default"]
              for name, path in (("a", args.a), ("b", args.b))}

    def translate(name, sentence):
        out = models[name](sentences=tf.constant([sentence]))
        return next(iter(out.values())).numpy()[0].decode("utf-8")

    medians = {"a": [], "b": []}
    same = 0
    for sentence in sentences:
        same += translate("a", sentence) == translate("b", sentence)
        times = {"a": [], "b": []}
        for repeat in range(args.repeats):
            for name in ("ab" if repeat % 2 == 0 else "ba"):
                time.sleep(args.settle_ms / 1000)
                start = time.perf_counter()
                translate(name, sentence)
                times[name].append(time.perf_counter() - start)
        for name in medians:
            medians[name].append(statistics.median(times[name]))
    ratios = [a / b for a, b in zip(medians["a"], medians["b"])]
    batch = None
    if args.batch_sentences:
        request = tf.constant([s for s in sources if s.strip()]
                              [:args.batch_sentences])
        outputs = {name: next(iter(models[name](sentences=request).values()))
                   .numpy().tolist() for name in models}  # traced, warmed
        seconds = {"a": [], "b": []}
        for repeat in range(args.repeats):
            for name in ("ab" if repeat % 2 == 0 else "ba"):
                start = time.perf_counter()
                models[name](sentences=request)
                seconds[name].append(time.perf_counter() - start)
        n = int(request.shape[0])
        batch = {
            "sentences": n,
            "a_sentences_per_s": round(n / statistics.median(seconds["a"]), 2),
            "b_sentences_per_s": round(n / statistics.median(seconds["b"]), 2),
            "b_over_a_speed": round(statistics.median(seconds["a"])
                                    / statistics.median(seconds["b"]), 3),
            "same_output": sum(x == y for x, y in zip(outputs["a"],
                                                       outputs["b"])),
            "seconds": seconds,
        }
    result = {
        "benchmark": "two translation SavedModels, single sentences, A/B",
        "command": "python " + " ".join(sys.argv),
        "a": str(args.a),
        "b": str(args.b),
        "data": f"Multi30k {args.split}, first {len(sentences)} non-empty "
                "sentences, one per request",
        "threads": f"TF intra_op={args.threads}, inter_op={args.threads}",
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%d"),
        "host": host_info(),
        "load_average_at_start_and_end": [load_at_start, os.getloadavg()],
        "summary": {
            "a_ms_median": round(1000 * statistics.median(medians["a"]), 2),
            "b_ms_median": round(1000 * statistics.median(medians["b"]), 2),
            "a_over_b_median_of_ratios": round(statistics.median(ratios), 3),
            "same_output": same,
            "sentences": len(sentences),
        },
        "one_batch": batch,
        "per_sentence_ms": {name: [round(1000 * t, 2) for t in values]
                            for name, values in medians.items()},
    }
    write_json(args.out, result)
    print(result["summary"])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
