"""Decoder speed before/after, in one run: greedy and beam-4 sentences/s.

Decodes the 1,000 Multi30k ``test_2016_flickr`` sentences in batches of 100
on 2 threads with the trained artifact model, with today's search
(``keras_trm/decoding/search.py``) and with the search of a given git
revision (default ``main``, loaded as a separate module from
``git show <rev>:keras_trm/decoding/search.py``), alternating the two, and
checks that both give the same ids (and BLEU). Then exports the raw-text
``Translator`` (beam 4, α 0.6) as a SavedModel twice, with today's search
and with the old one, and measures each, in a fresh process that imports
only tensorflow and tensorflow_text, alternating: the time from
``tf.saved_model.load`` to the first translation, and the throughput
(optionally also an existing export, ``--old-export``).

Usage:
    PYTHONPATH=$PWD KERAS_TRM_DATA_DIR=/work/shared/data \\
        python bench/bench_decoder_speed.py [--sentences 1000]

Writes ``bench/results/decoder_speed.json``.
"""

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]

_THROUGHPUT_CHILD = r"""
import json, sys, time
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tokenizer ops)
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(2)
paths, sentences_file, batch = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
sentences = json.load(open(sentences_file))
fns = {k: tf.saved_model.load(p).signatures["serving_default"] for k, p in paths.items()}
for fn in fns.values():
    fn(tf.constant(sentences[:batch]))  # warm up
total = {k: 0.0 for k in fns}
out = {k: [] for k in fns}
for s in range(0, len(sentences), batch):  # alternate batch by batch
    for k, fn in fns.items():
        t = time.perf_counter()
        res = fn(tf.constant(sentences[s:s + batch]))
        total[k] += time.perf_counter() - t
        out[k].extend(x.decode() for x in list(res.values())[0].numpy())
assert "keras_trm" not in sys.modules
print(json.dumps({k: {"sentences_per_second": len(sentences) / total[k],
                      "hypotheses": out[k]} for k in fns}))
"""

_SAVED_MODEL_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tokenizer ops)
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(2)
path, sentences_file, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
sentences = json.load(open(sentences_file))
t1 = time.perf_counter()
loaded = tf.saved_model.load(path)
fn = loaded.signatures["serving_default"]
t2 = time.perf_counter()
first = fn(tf.constant(sentences[:1]))
t3 = time.perf_counter()
out = []
t4 = time.perf_counter()
for s in range(0, len(sentences), batch):
    res = fn(tf.constant(sentences[s:s + batch]))
    out.extend(x.decode() for x in list(res.values())[0].numpy())
t5 = time.perf_counter()
assert "keras_trm" not in sys.modules
print(json.dumps({"load_s": t2 - t1, "first_translation_s": t3 - t2,
                  "load_plus_first_s": t3 - t1,
                  "sentences_per_second": len(sentences) / (t5 - t4),
                  "hypotheses": out}))
"""


def load_module(rev, relpath, name):
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{relpath}"],
                            check=True, capture_output=True, text=True).stdout
    tmp = pathlib.Path(tempfile.mkdtemp()) / f"{name}.py"
    tmp.write_text(source)
    spec = importlib.util.spec_from_file_location(name, tmp)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def saved_model_run(path, sentences, batch, child=_SAVED_MODEL_CHILD):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(sentences, f)
    env = dict(os.environ, PYTHONPATH="")  # keras_trm must not be needed
    proc = subprocess.run([sys.executable, "-c", child, str(path),
                           f.name, str(batch)], capture_output=True, text=True,
                          env=env, cwd="/", timeout=1200)
    os.unlink(f.name)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="/work/artifacts/multi30k/model.keras")
    parser.add_argument("--vocab", default="/work/artifacts/multi30k/vocab_8000.txt")
    parser.add_argument("--old-export", default="",
                        help="also time this SavedModel (e.g. the artifact's)")
    parser.add_argument("--old-rev", default="main")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=str(REPO / "bench/results/decoder_speed.json"))
    parser.add_argument("--skip-saved-model", action="store_true")
    parser.add_argument("--skip-in-process", action="store_true",
                        help="keep the in-process section of an existing --out")
    args = parser.parse_args(argv)

    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras
    import numpy as np

    from keras_trm.data import load_multi30k
    from keras_trm.decoding import Translator, corpus_bleu
    from keras_trm.decoding import search as new
    from keras_trm.models import as_transformer
    from keras_trm.text import END_ID, TextTokenizer, load_vocabulary

    old = load_module(args.old_rev, "keras_trm/decoding/search.py", "old_search")
    tokenizer = TextTokenizer(load_vocabulary(args.vocab))
    from keras_trm.training import float32_copy

    # --old-rev: a revision whose searches take a Transformer (2026-11-25 on).
    # A bf16-trained model is decoded in float32, as the jobs export it.
    model = float32_copy(as_transformer(keras.models.load_model(args.model)))
    src, ref = load_multi30k("test_2016_flickr")
    src, ref = src[: args.sentences], ref[: args.sentences]
    batches = []
    for s in range(0, len(src), args.batch_size):
        ids = tokenizer.tokenize(tf.constant(src[s:s + args.batch_size]))
        end = tf.fill([ids.nrows(), 1], END_ID)
        ids = tf.concat([ids, tf.RaggedTensor.from_tensor(end)], 1).to_tensor()
        batches.append(tf.cast(ids, tf.int32))

    fns = {}
    # One trace per function: batches differ in T_src.
    signature = [tf.TensorSpec([None, None], tf.int32)]
    for label, mod in (("old", old), ("new", new)):
        fns[label, "greedy"] = tf.function(
            lambda x, m=mod: m.greedy_search(model, x),
            input_signature=signature)
        fns[label, "beam4"] = tf.function(
            lambda x, m=mod: m.beam_search(model, x, beam_size=4,
                                           length_penalty_alpha=0.6),
            input_signature=signature)
    report = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "tensorflow": tf.__version__, "threads": 2,
                          "load_average_at_start": os.getloadavg(),
                          "note": "compare old/new ratios of one run; "
                                  "absolute figures depend on the load"},
              "sentences": len(src), "batch_size": args.batch_size,
              "old_rev": subprocess.run(
                  ["git", "-C", str(REPO), "rev-parse", "--short", args.old_rev],
                  check=True, capture_output=True, text=True).stdout.strip()}
    results = {}
    for search in () if args.skip_in_process else ("greedy", "beam4"):
        times = {"old": [], "new": []}
        ids = {}
        for label in ("old", "new"):  # trace + warm up
            t = time.perf_counter()
            fns[label, search](batches[0])
            results[f"{search}_{label}_first_call_s"] = round(time.perf_counter() - t, 2)
        for _ in range(args.repeats):
            total = {"old": 0.0, "new": 0.0}
            outs = {"old": [], "new": []}
            for b in batches:  # alternate batch by batch to share the load
                for label in ("old", "new"):
                    t = time.perf_counter()
                    outs[label].append(fns[label, search](b).numpy())
                    total[label] += time.perf_counter() - t
            for label in ("old", "new"):
                times[label].append(total[label])
            ids = outs
        same = sum(int(np.array_equal(a[i], b[i]))
                   for a, b in zip(ids["old"], ids["new"]) for i in range(len(a)))
        bleu = {}
        for label in ("old", "new"):
            hyps = [s.decode() for o in ids[label]
                    for s in tokenizer.detokenize(o).numpy()]
            bleu[label] = round(corpus_bleu(hyps, ref)[0], 2)
        old_sps = len(src) / min(times["old"])
        new_sps = len(src) / min(times["new"])
        results[search] = {
            "old_sentences_per_second": round(old_sps, 1),
            "new_sentences_per_second": round(new_sps, 1),
            "speedup": round(new_sps / old_sps, 2),
            "identical_ids": f"{same}/{len(src)}",
            "bleu_old": bleu["old"], "bleu_new": bleu["new"],
        }
        print(search, json.dumps(results[search]), flush=True)
    out = pathlib.Path(args.out)
    previous = json.loads(out.read_text()) if out.exists() else {}
    report["in_process"] = results or previous.get("in_process")
    if args.skip_saved_model and "saved_model" in previous:
        report["saved_model"] = previous["saved_model"]

    if not args.skip_saved_model:
        from keras_trm.export.saved_model import export_module

        class OldTranslator(Translator):  # the same module, old search
            def generate_ids(self, encoder_tokens):
                return old.beam_search(
                    self.model, encoder_tokens, beam_size=self.beam_size,
                    length_penalty_alpha=self.length_penalty)

        export_root = pathlib.Path(tempfile.mkdtemp())
        paths = {}
        for label, cls in (("old", OldTranslator), ("new", Translator)):
            translator = cls(model, tokenizer, beam_size=4,
                             length_penalty=0.6)
            paths[label] = export_module(
                translator, export_root, f"bench_{label}",
                signatures={"serving_default": translator.translate})
        if args.old_export:
            paths["artifact"] = args.old_export
        sm, hyps = {}, {}
        for label, path in paths.items():  # load + first call, fresh process
            run = saved_model_run(path, src[:1], 1)
            run.pop("hypotheses")
            sm[label] = {k: round(v, 2) for k, v in run.items()
                         if k != "sentences_per_second"}
        both = saved_model_run(json.dumps({k: str(p) for k, p in paths.items()}),
                               src, args.batch_size, child=_THROUGHPUT_CHILD)
        for label, run in both.items():
            hyps[label] = run["hypotheses"]
            sm[label]["sentences_per_second"] = round(run["sentences_per_second"], 2)
            sm[label]["bleu"] = round(corpus_bleu(hyps[label], ref)[0], 2)
            print("saved_model", label, json.dumps(sm[label]), flush=True)
        for label in paths:
            if label != "new":
                same = sum(a == b for a, b in zip(hyps[label], hyps["new"]))
                sm[label]["identical_translations_to_new"] = f"{same}/{len(src)}"
        if "artifact" in sm:
            sm["artifact"]["path"] = str(args.old_export)
        sm["beam_size"], sm["length_penalty_alpha"] = 4, 0.6
        sm["speedup"] = round(sm["new"]["sentences_per_second"]
                              / sm["old"]["sentences_per_second"], 2)
        report["saved_model"] = sm
    report["machine"]["load_average_at_end"] = os.getloadavg()

    from keras_trm.utils import write_json

    write_json(out, report)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
