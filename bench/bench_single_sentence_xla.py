"""Benchmark: single-sentence requests to a SavedModel with the graph search
against one with ``jit_compile_max_batch_size=1`` (XLA at batch 1).

    python bench/bench_single_sentence_xla.py --model <run>/model.keras \\
        --vocab <run>/vocab_8000.txt [--split val] [--words 4,5,6,7,8,9]

Exports the beam-4 (alpha 0.6, exact stop) ``Translator`` twice from the
same weights, with the graph search only and with
``jit_compile=True, jit_compile_max_batch_size=1``, loads both and sends
each one sentence at a time: for each word count in ``--words`` the first
sentence of the split with that many words. Per sentence and SavedModel:
the first request (for the XLA one, its compilation when the sentence's
8-token source-length bucket is new) and the median of ``--repeats`` more,
the two SavedModels taking turns; the outputs must be the same strings.
Writes ``--out`` (default ``bench/results/single_sentence_xla.json``).
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

from bench_decoding import add_model_args, host_info, set_tf_threads  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--split", default="val")
    p.add_argument("--words", default="4,5,6,7,8,9,12,16")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench/results/single_sentence_xla.json")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    set_tf_threads(args.threads, 1)
    import keras
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SavedModel's ops)

    from keras_trm.data import load_multi30k
    from keras_trm.decoding import Translator
    from keras_trm.export.saved_model import export_module
    from keras_trm.text import TextTokenizer, load_vocabulary
    from keras_trm.training.precision import float32_copy

    sources, _ = load_multi30k(args.split, args.data_dir)
    wanted = [int(w) for w in args.words.split(",")]
    by_words = {}
    for sentence in sources:
        by_words.setdefault(len(sentence.split()), sentence)
    missing = [w for w in wanted if w not in by_words]
    if missing:
        raise SystemExit(f"--words: no {args.split} sentence with {missing} words")
    model = float32_copy(keras.saving.load_model(args.model))
    tokenizer = TextTokenizer(load_vocabulary(args.vocab))
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="bench_xla_"))
    serving = {}
    for name, options in (("graph", {}),
                          ("xla_batch1", {"jit_compile": True,
                                          "jit_compile_max_batch_size": 1})):
        translator = Translator(model, tokenizer, beam_size=4,
                                length_penalty=0.6, **options)
        path = export_module(translator, workdir, name,
                             signatures={"serving_default": translator.translate})
        serving[name] = tf.saved_model.load(str(path)).signatures["serving_default"]

    def call(name, sentence):
        start = time.perf_counter()
        out = next(iter(serving[name](sentences=tf.constant([sentence])).values()))
        return time.perf_counter() - start, out.numpy()[0].decode("utf-8")

    rows = []
    for words in wanted:
        sentence = by_words[words]
        row = {"words": words}
        outputs = {}
        for name in serving:  # first requests
            seconds, outputs[name] = call(name, sentence)
            row[f"{name}_first_request_s"] = round(seconds, 3)
        times = {name: [] for name in serving}
        for r in range(args.repeats):
            for name in (list(serving) if r % 2 == 0 else list(serving)[::-1]):
                seconds, text = call(name, sentence)
                times[name].append(seconds)
                if text != outputs[name]:
                    raise SystemExit(f"{name}: another output on repeat {r}")
        for name in serving:
            row[f"{name}_ms_median"] = round(1000 * statistics.median(times[name]), 2)
        row["xla_over_graph"] = round(row["xla_batch1_ms_median"]
                                      / row["graph_ms_median"], 3)
        row["same_output"] = outputs["graph"] == outputs["xla_batch1"]
        rows.append(row)
        print(row, flush=True)
    ratios = [row["xla_over_graph"] for row in rows]
    report = {
        "benchmark": "single-sentence beam 4 requests: graph SavedModel vs "
                     "jit_compile_max_batch_size=1 (XLA at batch 1)",
        "command": "python bench/bench_single_sentence_xla.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "model": str(args.model),
        "split": args.split,
        "threads": args.threads,
        "host": host_info(),
        "tensorflow": tf.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "sentences": rows,
        "summary": {
            "xla_over_graph_median": round(statistics.median(ratios), 3),
            "same_output": sum(row["same_output"] for row in rows),
            "sentences": len(rows),
        },
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
