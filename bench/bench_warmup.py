"""Benchmark: a SavedModel with XLA at batch 1, loaded by the model server
with and without warm-up requests.

    python bench/bench_warmup.py --model <run>/model.keras \\
        --vocab <run>/vocab_8000.txt [--split val]

Exports the beam-4 (alpha 0.6, exact stop) ``Translator`` with
``jit_compile=True, jit_compile_max_batch_size=1`` twice from the same
weights, without and with warm-up requests (one ``--split`` sentence per
8-token source bucket, ``source_bucket_sentences``, as the translation
job writes them). Each is loaded by ``keras_trm.serving``'s
``ServableVersion`` in a fresh process (XLA's compilations live in the
process) and sent one other sentence of each bucket, one at a time: the
load time (the warm-up included) and, per sentence, the first request and
the median of ``--repeats`` more. The outputs must be the same strings
both ways. Writes ``--out`` (default ``bench/results/serving_warmup.json``).
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_decoding import add_model_args, host_info  # noqa: E402

# Run in a fresh process per SavedModel: load, then the probe sentences.
PROBE = """
import json, sys, time
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads({threads})
tf.config.threading.set_inter_op_parallelism_threads(1)
import numpy as np
from keras_trm.serving import ServableVersion
start = time.perf_counter()
version = ServableVersion("m", 1, {path!r})
version.load()
load_s = time.perf_counter() - start
rows = []
for sentence in json.loads(sys.stdin.read()):
    times, outs = [], set()
    for _ in range(1 + {repeats}):
        t = time.perf_counter()
        out = version.predict("serving_default",
                              {{"sentences": np.array([sentence.encode()], object)}})
        times.append(time.perf_counter() - t)
        outs.add(next(iter(out.values()))[0].decode())
    assert len(outs) == 1
    rows.append({{"first_ms": round(1000 * times[0], 1),
                  "steady_ms": round(1000 * sorted(times[1:])[len(times[1:]) // 2], 1),
                  "output": outs.pop()}})
print(json.dumps({{"load_s": round(load_s, 2), "warmup_requests": version.warmup_requests,
                  "warmup_s": round(version.warmup_seconds, 2), "rows": rows}}))
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--split", default="val")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="bench/results/serving_warmup.json")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import keras

    from keras_trm.data import load_multi30k
    from keras_trm.decoding import Translator
    from keras_trm.export import (
        export_module, source_bucket_sentences, translator_warmup_requests)
    from keras_trm.text import TextTokenizer, load_vocabulary
    from keras_trm.training.precision import float32_copy

    sources, _ = load_multi30k(args.split, args.data_dir)
    model = float32_copy(keras.saving.load_model(args.model))
    translator = Translator(model, TextTokenizer(load_vocabulary(args.vocab)),
                            beam_size=4, length_penalty=0.6,
                            jit_compile=True, jit_compile_max_batch_size=1)
    warmup = source_bucket_sentences(translator, sources)
    # The probes: the next sentence of each bucket (not a warm-up one).
    probes = source_bucket_sentences(
        translator, [s for s in sources if s not in set(warmup)])
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="bench_warmup_"))
    results = {}
    for name, requests in (
            ("without_warmup", None),
            ("with_warmup", translator_warmup_requests(translator, sources))):
        path = export_module(translator, workdir, name,
                             signatures={"serving_default": translator.translate},
                             warmup_requests=requests)
        script = PROBE.format(threads=args.threads, path=str(path),
                              repeats=args.repeats)
        done = subprocess.run([sys.executable, "-c", script], input=json.dumps(probes),
                              capture_output=True, text=True, timeout=1800)
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(name, {k: v for k, v in results[name].items() if k != "rows"},
              [r["first_ms"] for r in results[name]["rows"]], flush=True)
    outputs = {name: [r.pop("output") for r in res["rows"]]
               for name, res in results.items()}
    summary = {name: {"load_s": res["load_s"],
                      "first_request_ms_median": statistics.median(
                          r["first_ms"] for r in res["rows"]),
                      "first_request_ms_max": max(r["first_ms"] for r in res["rows"]),
                      "steady_ms_median": statistics.median(
                          r["steady_ms"] for r in res["rows"])}
               for name, res in results.items()}
    report = {
        "what": "XLA-at-batch-1 SavedModel (beam 4, alpha 0.6) loaded by "
                "keras_trm.serving.ServableVersion in a fresh process, without and "
                "with warm-up requests (one sentence per 8-token source bucket); "
                "then one other sentence per bucket, one request at a time",
        "command": "python bench/bench_warmup.py " + " ".join(argv or sys.argv[1:]),
        "split": args.split,
        "buckets": len(warmup),
        "threads": f"TF intra_op={args.threads}, inter_op=1",
        "host": host_info(),
        "date": time.strftime("%Y-%m-%d"),
        "same_outputs": outputs["without_warmup"] == outputs["with_warmup"],
        "summary": summary,
        "results": results,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    if not report["same_outputs"]:
        raise SystemExit("the two SavedModels gave different outputs")


if __name__ == "__main__":
    main()
