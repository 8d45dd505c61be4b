"""Same-run A/B of two revisions of keras_trm: one kind of measurement, A and
B taking turns (A B, B A, A B, ...) so that other load on the host falls on
both alike; the raw figures, their medians and the ratio B/A go to a JSON.

    python bench/ab.py train_step --a main --b . --out /tmp/train_step_ab.json
    python bench/ab.py search --a b6ddd91~1 --b . --out /tmp/search_ab.json
    python bench/ab.py search_tree --a 32da1ca --b . --out /tmp/search_tree_ab.json
    python bench/ab.py saved_model --a <old export>/1 --b <new export>/1 --out ...
    python bench/ab.py job_memory --a bc1b22c --b . --out /tmp/job_memory.json
    python bench/ab.py job_epoch --a 32da1ca --b . --out /tmp/epoch_ab.json

``--a`` / ``--b`` are git revisions (exported once with ``git archive``,
``bench.common.tree_at``) or folders (``.``: this checkout with its
edits); for ``saved_model`` they are SavedModel version folders. Kinds:

- ``train_step``: ``transformer_small`` (8,000 ids, tied, dropout 0.1)
  trained with the paper's recipe (Noam, Adam(0.9, 0.98, 1e-9), label
  smoothing 0.1) on the same synthetic batches, one child process per run
  importing one revision (``bench/ab_child.py``); target tokens/s of the
  timed steps after warm-up. ``--part loss`` times the loss alone: value
  and gradient of ``LabelSmoothedCrossEntropy`` on random
  ``(batch, length, V)`` logits in the compute dtype (the gradient's sum
  of absolute values is compared too). Memory: under TensorFlow the peak
  of live tensors in its CPU allocator over the timed steps; under JAX
  with ``--part loss`` XLA's temporary bytes. Two dtype policies of one
  revision: ``--a . --b . --precision float32 --precision_b mixed_bfloat16``.
- ``search``: the graph searches (``tf.function``, greedy and beam 4) of
  B against A's ``keras_trm/decoding/search.py``, in one child process
  importing B: the same random-weight ``transformer_small`` and batch,
  the two taking turns call by call; every sentence decodes to
  ``--max_length`` (random weights), which times the steps, not the stop.
  The ids must be equal. A's file runs with B's ``graph_search``, so both
  must share its interface: across the search strategies (issue #62) use
  ``search_tree``.
- ``search_tree``: the same searches, model and batch, but each revision's
  whole tree (its layers' cached step too), one child process per run,
  the revisions alternating; both load the weights that A's tree draws
  (seed 0; a newer tree reads an older layout). Per kind the median
  seconds over all timed calls, and whether all runs gave the same ids.
- ``saved_model``: two translation exports loaded in this process; each of
  the first ``--num_sentences`` sentences of a Multi30k split is sent to
  each, one at a time: an untimed first request each (XLA compiles there),
  then ``--repeats`` timed ones each, alternating, each after an untimed
  20 ms pause; per sentence the median of each, then the median of the
  per-sentence ratios A/B (above 1: B is faster). ``--batch_sentences N``
  also times the first N sentences as one request.
- ``job_memory``: the peak RSS of ``keras-trm train-translation``, per
  ``bench/bench_job_memory.py`` (its flags after ``--``).
- ``job_epoch``: the translation job's own training input and model (its
  stages up to ``build``; train-translation's flags after ``--``), wall
  seconds of the last of ``--epochs`` epochs of ``fit``.
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

if __package__ in (None, ""):  # python bench/ab.py: import bench/ as a package
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])
from bench import common  # noqa: E402

CHILD = pathlib.Path(__file__).with_name("ab_child.py")


def run_child(tree, kind, options, backend="tensorflow"):
    """One ``bench/ab_child.py`` measurement importing ``tree``'s keras_trm."""
    env = dict(os.environ, PYTHONPATH=str(tree), KERAS_BACKEND=backend,
               TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, str(CHILD), kind, json.dumps(options)],
                         env=env, cwd=tree, capture_output=True, text=True, timeout=3600)
    if out.returncode:
        sys.exit(f"{kind} in {tree} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["keras_trm"].startswith(str(tree) + os.sep):
        sys.exit(f"the child imported {result['keras_trm']}, not {tree}'s keras_trm")
    return result


def alternate(rounds, measure):
    """``{"a": [...], "b": [...]}``: ``measure("a")`` and ``measure("b")``
    ``rounds`` times each, in the order A B, B A, A B, ..."""
    runs = {"a": [], "b": []}
    for i in range(rounds):
        for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
            runs[name].append(measure(name))
    return runs


def median_of(runs, key):
    """Each side's median of ``key`` over its runs (None if a run has none)."""
    return {name: (statistics.median(r[key] for r in rs)
                   if all(r.get(key) is not None for r in rs) else None)
            for name, rs in runs.items()}


def train_step(args, trees):
    precision = {"a": args.precision, "b": args.precision_b or args.precision}
    runs = alternate(args.runs, lambda name: run_child(trees[name], "train_step", dict(
        steps=args.steps, warmup=args.warmup, batch=args.batch, length=args.length,
        vocabulary=args.vocabulary, precision=precision[name], part=args.part),
        args.backend))
    tokens = median_of(runs, "tokens_per_second")
    return {
        "what": ("transformer_small training step (train_on_batch)" if args.part == "step"
                 else "LabelSmoothedCrossEntropy value and gradient on random "
                 f"(batch, length, {args.vocabulary}) logits in the compute dtype")
        + ", target tokens/s, two revisions alternating in child processes",
        "part": args.part, "batch": args.batch, "length": args.length,
        "steps": args.steps, "warmup": args.warmup, "vocabulary": args.vocabulary,
        "backend": args.backend, "precision": precision, "runs": runs,
        "median_tokens_per_second": tokens, "median_ms": median_of(runs, "ms"),
        "median_peak_tensor_mib": median_of(runs, "peak_tensor_mib"),
        "same_loss": all(x["loss"] == y["loss"] for x, y in zip(runs["a"], runs["b"])),
        "same_gradient_abs_sum": all(
            x["grad_abs_sum"] == y["grad_abs_sum"] for x, y in zip(runs["a"], runs["b"]))
        if args.part == "loss" else None,
        "speed_b_over_a": tokens["b"] / tokens["a"],
    }


def search(args, trees):
    a_search = trees["a"] / "keras_trm" / "decoding" / "search.py"
    child = run_child(trees["b"], "search", dict(
        a_search=str(a_search), batch=args.batch, max_length=args.max_length,
        repeats=args.repeats))
    medians = {name: {kind: statistics.median(s) for kind, s in kinds.items()}
               for name, kinds in child["seconds"].items()}
    return {
        "what": "graph search (tf.function), B's against A's search.py, same "
                "model and batch, alternating call by call in one child process",
        "tensorflow": child["tensorflow"], "batch": args.batch,
        "max_length": args.max_length, "repeats": args.repeats,
        "same_ids": child["same_ids"], "median_seconds": medians,
        "seconds": child["seconds"],
        "speed_b_over_a": {kind: medians["a"][kind] / medians["b"][kind]
                           for kind in ("beam4", "greedy")},
    }


def search_tree(args, trees):
    """``search`` over each revision's whole tree (layers, cached step and
    search.py), one child process per run, the revisions alternating; both
    decode with the weights A's tree draws (seed 0), saved once."""
    with tempfile.TemporaryDirectory(prefix="search_tree_") as folder:
        weights = os.path.join(folder, "model.weights.h5")
        run_child(trees["a"], "search_tree", dict(
            batch=0, max_length=0, repeats=0, weights=weights, save_weights=True))
        runs = alternate(args.runs, lambda name: run_child(trees[name], "search_tree", dict(
            batch=args.batch, max_length=args.max_length, repeats=args.repeats,
            weights=weights)))
    medians = {name: {kind: statistics.median(s for r in rs for s in r["seconds"][kind])
                      for kind in ("beam4", "greedy")} for name, rs in runs.items()}
    return {
        "what": "graph search (tf.function), each revision's tree (layers "
                "included) in its own child processes, alternating; A's "
                "random weights (seed 0) in both",
        "batch": args.batch, "max_length": args.max_length,
        "repeats": args.repeats, "runs": runs,
        "same_ids": {kind: len({r["ids_sha1"][kind] for rs in runs.values()
                                for r in rs}) == 1 for kind in ("beam4", "greedy")},
        "median_seconds": medians,
        "speed_b_over_a": {kind: medians["a"][kind] / medians["b"][kind]
                           for kind in ("beam4", "greedy")},
    }


def saved_model(args, _):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import tensorflow_text  # noqa: F401  (registers the SavedModels' ops)

    from keras_trm.data import load_multi30k

    sources = [s for s in load_multi30k(args.split, args.data_dir)[0] if s.strip()]
    sentences = sources[:args.num_sentences]
    models = {name: tf.saved_model.load(getattr(args, name)).signatures["serving_default"]
              for name in ("a", "b")}

    def call(name, batch):
        return next(iter(models[name](sentences=tf.constant(batch)).values())).numpy()

    same, medians = 0, {"a": [], "b": []}
    for sentence in sentences:
        same += call("a", [sentence])[0] == call("b", [sentence])[0]

        def timed(name):
            time.sleep(args.settle_ms / 1000)
            start = time.perf_counter()
            call(name, [sentence])
            return time.perf_counter() - start
        for name, seconds in alternate(args.repeats, timed).items():
            medians[name].append(statistics.median(seconds))
    ratios = [a / b for a, b in zip(medians["a"], medians["b"])]
    one_batch = None
    if args.batch_sentences:
        request = sources[:args.batch_sentences]
        outputs = {name: call(name, request).tolist() for name in models}  # warmed

        def timed_batch(name):
            start = time.perf_counter()
            call(name, request)
            return time.perf_counter() - start
        seconds = alternate(args.repeats, timed_batch)
        one_batch = {
            "sentences": len(request), "seconds": seconds,
            **{f"{name}_sentences_per_s": round(len(request) / statistics.median(s), 2)
               for name, s in seconds.items()},
            "b_over_a_speed": round(statistics.median(seconds["a"])
                                    / statistics.median(seconds["b"]), 3),
            "same_output": sum(x == y for x, y in zip(outputs["a"], outputs["b"]))}
    return {
        "what": "two translation SavedModels, single sentences, alternating",
        "data": f"Multi30k {args.split}, first {len(sentences)} non-empty "
                "sentences, one per request",
        "threads": f"TF intra_op={args.threads}, inter_op={args.threads}",
        "repeats": args.repeats,
        "summary": {
            "a_ms_median": round(1000 * statistics.median(medians["a"]), 2),
            "b_ms_median": round(1000 * statistics.median(medians["b"]), 2),
            "a_over_b_median_of_ratios": round(statistics.median(ratios), 3),
            "same_output": int(same), "sentences": len(sentences)},
        "one_batch": one_batch,
        "per_sentence_ms": {name: [round(1000 * t, 2) for t in values]
                            for name, values in medians.items()},
    }


def job_memory(args, trees):
    from bench import bench_job_memory

    # The job runs as ``python -m keras_trm.cli``, which puts the current
    # folder first on sys.path: run from an empty one, so that each side
    # imports its own tree.
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="job_memory_cwd_") as cwd:
        try:
            os.chdir(cwd)
            bench_job_memory.main(["--a", str(trees["a"]), "--b", str(trees["b"]),
                                   "--rounds", str(args.runs), "--out", args.out,
                                   *args.job_flags])
        finally:
            os.chdir(here)
    return json.loads(pathlib.Path(args.out).read_text())


def job_epoch(args, trees):
    """Each side's translation job input and model (``ab_child.job_epoch``),
    ``--epochs`` epochs of ``fit``; the last epoch's wall time is compared
    (the first also traces and compiles)."""
    runs = alternate(args.runs, lambda name: run_child(trees[name], "job_epoch", dict(
        workdir=tempfile.mkdtemp(prefix=f"job_epoch_{name}_"), epochs=args.epochs,
        flags=args.job_flags), args.backend))
    last = {name: statistics.median(r["epoch_seconds"][-1] for r in rs)
            for name, rs in runs.items()}
    return {"what": "the translation job's fit (its training input and model, "
                    "default config plus job_flags), wall seconds of the last of "
                    f"{args.epochs} epochs, two revisions alternating in child processes",
            "backend": args.backend, "job_flags": args.job_flags, "runs": runs,
            "median_last_epoch_seconds": last,
            "speed_b_over_a": last["a"] / last["b"]}


KINDS = {"train_step": train_step, "search": search, "search_tree": search_tree,
         "saved_model": saved_model,
         "job_memory": job_memory, "job_epoch": job_epoch}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    common_args = argparse.ArgumentParser(add_help=False)
    common_args.add_argument("--a", required=True, help="A (the baseline): a revision or folder")
    common_args.add_argument("--b", required=True, help="B: a revision or folder")
    common_args.add_argument("--out", required=True, help="the JSON file to write")
    p = kinds.add_parser("train_step", parents=[common_args])
    p.add_argument("--runs", type=int, default=3, help="child processes per revision")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--vocabulary", type=int, default=8000,
                   help="V: the model's ids (step) or the logits' width (loss)")
    p.add_argument("--backend", default="tensorflow", choices=("tensorflow", "jax", "torch"))
    p.add_argument("--precision", default="float32", help="float32 or mixed_bfloat16")
    p.add_argument("--precision_b", default=None, help="B's dtype policy (default: --precision)")
    p.add_argument("--part", default="step", choices=("step", "loss"))
    p = kinds.add_parser("search", parents=[common_args])
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--max_length", type=int, default=30)
    p.add_argument("--repeats", type=int, default=5)
    p = kinds.add_parser("search_tree", parents=[common_args])
    p.add_argument("--runs", type=int, default=3, help="child processes per revision")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--max_length", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3, help="timed calls per run")
    p = kinds.add_parser("saved_model", parents=[common_args])
    p.add_argument("--data_dir", default=None, help="default: $KERAS_TRM_DATA_DIR")
    p.add_argument("--split", default="val")
    p.add_argument("--num_sentences", type=int, default=30)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--settle_ms", type=float, default=20.0)
    p.add_argument("--batch_sentences", type=int, default=0,
                   help="also time the first N sentences as one request")
    p = kinds.add_parser("job_memory", parents=[common_args])
    p.add_argument("--runs", type=int, default=3, help="jobs per revision")
    p.add_argument("job_flags", nargs="*",
                   help="after --: bench_job_memory.py's flags (--epochs, --a_flags, ...)")
    p = kinds.add_parser("job_epoch", parents=[common_args])
    p.add_argument("--runs", type=int, default=2, help="child processes per revision")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--backend", default="tensorflow", choices=("tensorflow", "jax", "torch"))
    p.add_argument("job_flags", nargs="*", help="after --: train-translation's flags")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    args.out = str(pathlib.Path(args.out).resolve())
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    trees, commits = {}, {}
    if args.kind != "saved_model":
        for name in ("a", "b"):
            trees[name], commits[name] = common.tree_at(getattr(args, name))
    started = common.now()
    result = KINDS[args.kind](args, trees)
    result = {"kind": args.kind, "command": "python " + " ".join(sys.argv),
              "date": started, "host": common.host_info(),
              "a": {"revision": args.a, "commit": commits.get("a")},
              "b": {"revision": args.b, "commit": commits.get("b")}, **result}
    common.write_result(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k.startswith(
        ("median", "speed", "same", "summary"))}))


if __name__ == "__main__":
    main()
