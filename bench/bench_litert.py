"""Benchmark: the LiteRT translator on Multi30k test_2016_flickr (writes JSON).

    python bench/bench_litert.py [--model /work/artifacts/multi30k/model.keras]
        [--vocab .../vocab_8000.txt] [--savedmodel .../export/1]
        [--quantize float32 dynamic_int8] [--beams 1 4] [--batch-size 100]
        [--threads 2] [--num-sentences 1000] [--out bench/results/litert.json]

1. Exports the trained model with ``export_translator_litert`` (float32 and
   dynamic-range int8) and records the file sizes (MiB).
2. For each file and beam size (1 = greedy, 4 with α = 0.6) translates the
   test sentences with ``LiteRTTranslator`` on ``--threads`` interpreter
   threads: cased sacreBLEU (13a) and sentences/s (host tokenization and
   search included).
3. Agreement with the raw-text SavedModel (``serving_default``, beam 4,
   α 0.6): the share of the first ``--agreement-sentences`` test sentences
   whose LiteRT beam-4 translation is the same string, and the SavedModel's
   sentences/s on them in the same run (TensorFlow on ``--threads``
   threads) for a speed ratio.

``--merge a.json b.json`` combines partial results (e.g. one process per
``--quantize``) into ``--out``.
"""

import argparse
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

from keras_trm.utils import write_json


def _merge(paths, out):
    merged = {}
    for path in paths:
        part = json.loads(pathlib.Path(path).read_text())
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key].update(value)
            else:
                merged.setdefault(key, value)
    write_json(out, merged)
    print(json.dumps(merged, indent=1, ensure_ascii=False))


def random_sources(batch, vocabulary_size=8000, seed=0):
    """int32 ``(batch, longest)`` source ids for the search benchmarks:
    6 to 25 tokens per row (random ids >= 4, END = 3 last, PAD = 0 after)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = rng.integers(6, 26, batch)
    source = np.zeros((batch, int(lengths.max())), "int32")
    for row, n in enumerate(lengths):
        source[row, :n - 1] = rng.integers(4, vocabulary_size, n - 1)
        source[row, n - 1] = 3
    return source


def _cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    art = "/work/artifacts/multi30k"
    parser.add_argument("--model", default=f"{art}/model.keras")
    parser.add_argument("--vocab", default=f"{art}/vocab_8000.txt")
    parser.add_argument("--savedmodel", default=f"{art}/export/1")
    parser.add_argument("--quantize", nargs="+", default=["float32", "dynamic_int8"],
                        choices=["float32", "dynamic_int8"])
    parser.add_argument("--beams", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--batch-size", type=int, default=100,
                        help="sentences per search")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-sentences", type=int, default=1000)
    parser.add_argument("--agreement-sentences", type=int, default=100)
    parser.add_argument("--work-dir", default=None,
                        help="where the .tflite files go (default: a temp dir)")
    parser.add_argument("--out", default="bench/results/litert.json")
    parser.add_argument("--merge", nargs="+", default=None)
    args = parser.parse_args()
    if args.merge:
        return _merge(args.merge, args.out)

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    import keras_trm  # noqa: F401
    from keras_trm.data import load_multi30k
    from keras_trm.decoding.bleu import corpus_bleu
    from keras_trm.export import LiteRTTranslator, export_translator_litert
    from keras_trm.text import load_vocabulary

    sources, references = load_multi30k("test_2016_flickr")
    sources = sources[:args.num_sentences]
    references = references[:args.num_sentences]
    model = keras.saving.load_model(args.model, compile=False)
    vocab = load_vocabulary(args.vocab)
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="bench_litert-"))
    result = {
        "what": "LiteRT translator (export_translator_litert + LiteRTTranslator) "
                "on Multi30k EN->DE test_2016_flickr",
        "host": {"machine": platform.machine(), "processor": platform.processor(),
                 "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                 "tensorflow": tf.__version__,
                 "cpu_model": _cpu_model(),
                 "load_average_at_start": os.getloadavg(),
                 "note": "the host may be shared with other jobs: absolute "
                         "speeds are noisy; compare within one run only"},
        "settings": {"batch_size": args.batch_size, "threads": args.threads,
                     "num_sentences": len(sources), "alpha": args.alpha,
                     "max_source_length": "model max_length (128)"},
        "files": {}, "runs": {},
    }
    out = pathlib.Path(args.out)
    texts = {}
    for quantize in args.quantize:
        path = work / f"transformer_{quantize}.tflite"
        if not path.exists():
            start = time.perf_counter()
            export_translator_litert(
                model, path, vocab,
                quantize=None if quantize == "float32" else quantize)
            export_s = time.perf_counter() - start
        else:
            export_s = None
        result["files"][quantize] = {
            "path": str(path), "mib": round(path.stat().st_size / 2**20, 2),
            "export_seconds": None if export_s is None else round(export_s, 1)}
        for beam in args.beams:
            runner = LiteRTTranslator(path, num_threads=args.threads,
                                      beam_size=beam,
                                      length_penalty=args.alpha,
                                      batch_size=args.batch_size)
            runner.translate_texts(sources[:2])  # warm-up (tokenizer tracing)
            start = time.perf_counter()
            hyps = runner.translate_texts(sources)
            seconds = time.perf_counter() - start
            bleu, signature, line = corpus_bleu(hyps, references)
            name = f"{quantize}_beam{beam}"
            texts[name] = hyps
            result["runs"][name] = {
                "bleu": round(bleu, 2), "bleu_line": line,
                "signature": signature,
                "sentences_per_second": round(len(sources) / seconds, 2),
                "seconds": round(seconds, 1)}
            print(name, result["runs"][name], flush=True)
            write_json(out, result)

    if args.agreement_sentences and args.savedmodel:
        n = min(args.agreement_sentences, len(sources))
        loaded = tf.saved_model.load(args.savedmodel)
        serve = loaded.signatures["serving_default"]
        (_, spec), = serve.structured_input_signature[1].items()
        key = next(iter(serve.structured_input_signature[1]))
        serve(**{key: tf.constant(sources[:2])})  # warm-up
        start = time.perf_counter()
        outputs = serve(**{key: tf.constant(sources[:n])})
        seconds = time.perf_counter() - start
        (saved,) = outputs.values()
        saved = [s.decode("utf-8") for s in saved.numpy()]
        agreement = {"sentences": n, "savedmodel_sentences_per_second":
                     round(n / seconds, 2),
                     "savedmodel": "serving_default, beam 4, alpha 0.6, one "
                                   f"batch of {n}, TF on {args.threads} threads"}
        for name, hyps in texts.items():
            same = sum(a == b for a, b in zip(hyps[:n], saved))
            agreement[f"{name}_identical"] = same
        agreement["first_differences"] = {
            name: [(s, a, b) for s, a, b in zip(sources[:n], hyps[:n], saved)
                   if a != b][:3]
            for name, hyps in texts.items() if name.endswith("beam4")}
        result["savedmodel_agreement"] = agreement
        print(agreement, flush=True)
    write_json(out, result)


if __name__ == "__main__":
    main()
