"""Benchmark: decoding speed and BLEU of one trained model, four runtimes.

    python bench/bench_decoding.py [--model runs/multi30k/model.keras]
        [--vocab runs/multi30k/vocab_8000.txt]
        [--saved-model export/transformer_multi30k_en_de/<latest version>]
        [--litert] [--out bench/results/decoding.json]

Same weights, same 1,000 Multi30k test_2016_flickr sentences (EN->DE),
batches of 100, greedy and beam 4 with length-penalty alpha 0.6, 2 threads:

- ``keras_trm``: ``keras_trm.decoding.Translator`` in process (tokenizer,
  search and detokenizer in one ``tf.function``);
- ``saved_model``: the raw-text SavedModel the Multi30k job exports
  (``tf.saved_model.load(...).signatures["serving_default"]``); it serves
  the beam size it was exported with (4), so it has no greedy row;
- ``ctranslate2_float32`` / ``ctranslate2_int8``: the model converted by
  ``keras_trm.export.ctranslate2.export_ctranslate2`` (weights float32 /
  int8), run by ``CTranslate2Translator`` (our WordPiece tokenization and
  detokenization around ``ctranslate2.Translator.translate_batch``);
- ``litert`` / ``litert_int8`` (``--litert``): ``keras_trm.export.litert``'s
  translator export, if that module provides it (skipped otherwise);
- ``saved_model_xla`` (beam only): the exact search compiled whole by XLA
  (``Translator(jit_compile=True)``), exported here from the same weights;
  XLA's compilations (one per batch shape) fall in the timed calls;
- ``keras_trm_first_end`` / ``saved_model_first_end`` (beam only): the same
  in process and as a SavedModel exported here from the same weights, with
  ``early_stopping="first_end"`` (CTranslate2's early exit: a sentence
  stops when its best candidate ends) instead of the exact default; their
  outputs may differ (``same_output_as_keras_trm``);
- ``keras_trm_parallel`` / ``saved_model_parallel`` (``--parallel N`` > 1):
  ``Translator(parallel_searches=N)`` in process and as a SavedModel
  exported here from the same weights: each batch dealt into N parts
  searched at once. With ``--parallel N`` the first_end and XLA rows are
  built with ``parallel_searches=N`` too (``saved_model`` is the given
  export as it is).

Threads: by default TF runs intra_op=threads, inter_op=threads (TF's own
default on a machine of that many cores: independent ops of a step run at
once) and CTranslate2 intra_threads=threads, inter_threads=1 (one batch
at a time, its ops multi-threaded). ``--parallel N`` splits the same
threads into N parallel parts for both: TF intra_op=threads/N (inter_op
stays threads, ``--inter-op``); CTranslate2 intra_threads=threads/N,
inter_threads=N (each batch decoded as N sub-batches at once). ``--only a,b`` runs just those rows.

Per runtime and search: sentences/s over the 1,000 sentences (after one
untimed warm-up batch; the runtimes take turns batch by batch, so that load
from other jobs falls on all of them alike), sacreBLEU (``keras_trm.decoding.corpus_bleu``) and
the batch-1 latency p50/p90 over the first ``--latency-sentences``
sentences. Length penalty: ours ((5 + len) / 6) ** alpha (GNMT), CT2
len ** alpha, so beam BLEU may differ slightly; greedy should agree.

CTranslate2 runs as one deploys it: each model (float32, int8) in a worker
process of its own (``SubprocessCTranslate2``, timed inside the worker),
its OpenMP threads at their default wait policy (libgomp's threads spin a
few milliseconds before they sleep: its fastest setting on an idle
machine). Every timed call of every runtime starts after an untimed pause
(``--settle-ms``, 20), so none pays for the spinning threads of the one
before and each starts from idle cores. Until 2026-11-25 this benchmark
ran CTranslate2 with ``OMP_WAIT_POLICY=PASSIVE`` next to a second
CTranslate2 translator in the same process (which makes libgomp cut its
threads' spinning: more OpenMP threads than cores), which slowed it and
overstated every ratio against it (``bench/results/decoding_ct2_passive.json``
against ``decoding.json``; ``--omp-wait-policy PASSIVE`` still asks for
PASSIVE).

The headline figure is ``ratio_saved_model_beam4_over_ct2_float32``
(sentences/s, same run). The machine this ran on may be shared with other
jobs: absolute sentences/s are noisy; ratios measured in one run are what
count.
"""

import argparse
import functools
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def add_model_args(p):
    """--model, --vocab, --data-dir: a trained Multi30k job's files."""
    p.add_argument("--model", default="runs/multi30k/model.keras")
    p.add_argument("--vocab", default="runs/multi30k/vocab_8000.txt")
    p.add_argument("--data-dir", default=None,
                   help="data folder (default: $KERAS_TRM_DATA_DIR)")


def set_tf_threads(threads, parallel, inter_op=None):
    """TF intra_op = threads / parallel (the split ``--parallel`` asks
    for) and inter_op = ``inter_op`` (default ``parallel``); returns the
    threads per part. Call before TensorFlow runs an op."""
    if parallel < 1 or threads % parallel:
        raise SystemExit(f"--parallel must divide --threads, got "
                         f"--parallel {parallel} --threads {threads}")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads // parallel)
    tf.config.threading.set_inter_op_parallelism_threads(
        parallel if inter_op is None else inter_op)
    return threads // parallel


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--saved-model", default=None,
                   help="SavedModel version folder (default: the latest under "
                        "export/transformer_multi30k_en_de/)")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--num-sentences", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--beam-size", type=int, default=4)
    p.add_argument("--length-penalty", type=float, default=0.6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=1,
                   help="parts each batch is split into and decoded at once, "
                        "the threads shared among them (TF and CTranslate2)")
    p.add_argument("--only", default="",
                   help="comma-separated rows to run (default: all)")
    p.add_argument("--latency-sentences", type=int, default=50)
    p.add_argument("--repeats", type=int, default=1,
                   help="interleaved passes over the sentences (times add up)")
    p.add_argument("--litert", action="store_true",
                   help="also run keras_trm.export.litert's translator")
    p.add_argument("--litert-batch-size", type=int, default=None,
                   help="sentences per LiteRT search (default: --batch-size)")
    p.add_argument("--inter-op", type=int, default=None,
                   help="TF inter_op threads (default: --threads, TF's own "
                        "default on a machine of that many cores)")
    p.add_argument("--omp-wait-policy", default="",
                   help="OMP_WAIT_POLICY for CTranslate2's OpenMP threads "
                        "(default '': the environment's, i.e. libgomp's "
                        "default, which spins briefly; PASSIVE makes them "
                        "sleep at once, slower when the machine is idle)")
    p.add_argument("--settle-ms", type=float, default=20.0,
                   help="untimed pause before every timed call, so that the "
                        "previous system's threads have stopped spinning")
    p.add_argument("--workdir", default=None,
                   help="where converted models go (default: a temp folder)")
    p.add_argument("--out", default="bench/results/decoding.json")
    return p.parse_args(argv)


def latest_version(model_dir):
    model_dir = pathlib.Path(model_dir)
    versions = sorted((int(p.name) for p in model_dir.glob("*")
                       if p.name.isdigit()), reverse=True)
    if not versions:
        raise FileNotFoundError(f"no SavedModel version under {str(model_dir)!r}")
    return model_dir / str(versions[0])


def host_info():
    info = {"platform": platform.platform(), "python": sys.version.split()[0],
            "cpu_count": os.cpu_count()}
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and "cpu_model" not in info:
                info["cpu_model"] = value.strip()
            if key.strip() == "flags" and "cpu_flags" not in info:
                flags = value.split()
                keep = ("avx", "fma", "f16c", "amx", "vnni", "bf16", "sse4")
                info["cpu_flags"] = sorted(
                    f for f in flags if any(k in f for k in keep))
    except OSError:
        pass
    return info


def add_ab_args(p, out):
    """The arguments of the A/B benchmarks that time two searches with
    ``time_interleaved`` on encoded ``val`` batches."""
    add_model_args(p)
    p.add_argument("--split", default="val")
    p.add_argument("--num-sentences", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=out)


def load_encoded_batches(args):
    """``(model, tokenizer, sources, batches)`` for ``add_ab_args``: the
    model's float32 copy, the first ``--num-sentences`` sources of
    ``--split`` and their id batches of ``--batch-size``."""
    import keras
    import tensorflow as tf

    from keras_trm.data import load_multi30k
    from keras_trm.decoding import Translator
    from keras_trm.text import TextTokenizer, load_vocabulary
    from keras_trm.training.precision import float32_copy

    model = float32_copy(keras.saving.load_model(args.model))
    tokenizer = TextTokenizer(load_vocabulary(args.vocab))
    sources, _ = load_multi30k(args.split, args.data_dir)
    sources = sources[:args.num_sentences]
    encode = Translator(model, tokenizer).encode_text
    batches = [encode(tf.constant(sources[i:i + args.batch_size]))
               for i in range(0, len(sources), args.batch_size)]
    return model, tokenizer, sources, batches


def ab_summary(seconds, ids, base, new, repeats, sentences):
    """One A/B result of ``time_interleaved``: sentences/s of each search,
    the speed-up of ``new`` over ``base`` and how many sentences got
    identical ids."""
    return {
        "sentences_per_second": {key: round(repeats * sentences / s, 2)
                                 for key, s in seconds.items()},
        "speedup": round(seconds[base] / seconds[new], 3),
        "identical_ids": sum(a == b for a, b in zip(ids[base], ids[new])),
        "sentences": sentences,
    }


def write_ab_run(args, benchmark, run, load_at_start, result, **fields):
    """Adds (or replaces) ``run`` in the JSON at ``--out`` (created with
    the ``benchmark`` description): the command, data, host and load, the
    ``fields`` and the ``result``."""
    from keras_trm.utils import write_json

    out = pathlib.Path(args.out)
    report = json.loads(out.read_text()) if out.is_file() else {
        "benchmark": benchmark, "runs": {}}
    sentences = next(iter(result.values()))["sentences"]
    report["runs"][run] = {
        "command": " ".join(["python", f"bench/{pathlib.Path(sys.argv[0]).name}",
                             *sys.argv[1:]]),
        "data": f"Multi30k {args.split}, first {sentences} sentences, "
                f"batches of {args.batch_size}",
        **fields,
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%d"),
        "host": host_info(),
        "load_average_at_start_and_end": [load_at_start, os.getloadavg()],
        **result,
    }
    write_json(out, report)
    print(f"wrote {out}")


def time_interleaved(searches, batches, repeats):
    """Times ``searches`` (name -> callable on an id batch returning ids)
    taking turns batch by batch, the order swapped every batch and every
    pass, ``repeats`` passes; returns ``(seconds per name, ids per name)``
    with the first pass's ids of each sentence (padding trimmed) as bytes."""
    import numpy as np

    seconds = dict.fromkeys(searches, 0.0)
    ids = {key: [] for key in searches}
    for rep in range(repeats):
        for i, batch in enumerate(batches):
            order = list(searches)
            if (i + rep) % 2:
                order.reverse()
            for key in order:
                start = time.perf_counter()
                out = searches[key](batch).numpy()
                seconds[key] += time.perf_counter() - start
                if rep == 0:
                    ids[key].extend(np.trim_zeros(row, "b").tobytes()
                                    for row in out)
    return seconds, ids


def _timed_call(translate, sentences, settle_seconds=0.0):
    """``(outputs, seconds)`` of one call, after an untimed pause of
    ``settle_seconds`` (the previous system's idle threads stop spinning:
    CTranslate2's OpenMP threads spin about 10 ms after a call); a system
    that times itself (``translate.timed``) returns both."""
    time.sleep(settle_seconds)
    if getattr(translate, "timed", False):
        return translate(sentences)
    start = time.perf_counter()
    out = translate(sentences)
    return out, time.perf_counter() - start


def _ct2_worker(conn, path, options):
    """Worker process of ``SubprocessCTranslate2``: one translator; each
    request is timed here, without the pipe."""
    try:
        from keras_trm.export.ctranslate2 import CTranslate2Translator

        translator = CTranslate2Translator(path, **options)
        conn.send("ready")
    except Exception as err:  # reported to the parent, which raises
        conn.send(err)
        return
    while True:
        request = conn.recv()
        if request is None:
            return
        method, args, kwargs = request
        start = time.perf_counter()
        out = getattr(translator, method)(*args, **kwargs)
        conn.send((out, time.perf_counter() - start))


class SubprocessCTranslate2:
    """A ``CTranslate2Translator`` alone in a process of its own, as one
    deploys it. Two CTranslate2 translators in one process (float32 and
    int8) give libgomp more OpenMP threads than cores, and it then cuts
    the time its idle threads spin before sleeping, which slows
    CTranslate2. The worker times each call itself (``timed``), so the
    pipe costs CTranslate2 nothing."""

    timed = True

    def __init__(self, path, **options):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_ct2_worker,
                                       args=(child, str(path), options),
                                       daemon=True)
        self.process.start()
        reply = self.conn.recv()
        if reply != "ready":
            raise reply

    def __call__(self, sentences, **kwargs):
        """``translate_texts``, all sentences in one batch by default."""
        kwargs.setdefault("max_batch_size", max(1, len(sentences)))
        return self.call("translate_texts", list(sentences), **kwargs)

    def call(self, method, *args, **kwargs):
        """``(result, seconds)`` of the worker's
        ``CTranslate2Translator.<method>(*args, **kwargs)``."""
        self.conn.send((method, args, kwargs))
        return self.conn.recv()

    def close(self):
        self.conn.send(None)
        self.process.join(timeout=30)


def measure(systems, sentences, references, batch_size, latency_sentences,
            repeats=1, settle_seconds=0.0):
    """Times every system on the same batches, interleaved.

    With ``repeats`` > 1 the whole interleaved pass (and the latency pass)
    runs that many times, the order of the systems reversed every other
    pass, and the times add up (less noise on a shared machine); the
    outputs are those of the first pass.

    Every timed call starts after an untimed pause of ``settle_seconds``,
    so that no system pays for the spinning threads of the one before.

    ``systems``: dict name -> translate(list[str]) -> list[str]. Each gets
    one untimed warm-up batch; then, batch after batch, every system
    translates the same batch in turn (so load from other jobs on a shared
    machine falls on all of them alike), and likewise for the batch-1
    latency sentences. Returns (rows, hypotheses) keyed by name.
    """
    from keras_trm.decoding import corpus_bleu

    for translate in systems.values():
        translate(sentences[:batch_size])
    seconds = dict.fromkeys(systems, 0.0)
    hyps = {name: [] for name in systems}
    times = {name: [] for name in systems}
    for rep in range(repeats):
        order = list(systems.items())
        order = order if rep % 2 == 0 else order[::-1]
        for i in range(0, len(sentences), batch_size):
            batch = sentences[i:i + batch_size]
            for name, translate in order:
                out, elapsed = _timed_call(translate, batch, settle_seconds)
                seconds[name] += elapsed
                if rep == 0:
                    hyps[name].extend(out)
            print(f"  pass {rep + 1}: {i + len(batch)}/{len(sentences)} sentences",
                  flush=True)
        for sentence in sentences[:latency_sentences]:
            for name, translate in order:
                _, elapsed = _timed_call(translate, [sentence], settle_seconds)
                times[name].append(elapsed * 1000.0)
    rows = {}
    for name in systems:
        bleu, signature, _ = corpus_bleu(hyps[name], references)
        row = {"sentences_per_second": round(repeats * len(sentences) / seconds[name], 2),
               "seconds": round(seconds[name], 2), "bleu": round(bleu, 2),
               "bleu_signature": signature}
        if len(times[name]) >= 2:
            row["batch1_latency_ms_p50"] = round(statistics.median(times[name]), 2)
            row["batch1_latency_ms_p90"] = round(
                statistics.quantiles(times[name], n=10)[8], 2)
            row["latency_sentences"] = len(times[name])
        rows[name] = row
    return rows, hyps


def main(argv=None):
    args = parse_args(argv)
    load_at_start = os.getloadavg()
    # OMP_WAIT_POLICY is read by libgomp when ctranslate2 loads (in the
    # workers, which inherit the environment), so set it first.
    if args.omp_wait_policy:
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy
    import tensorflow as tf

    inter_op = args.threads if args.inter_op is None else args.inter_op
    per_part = set_tf_threads(args.threads, args.parallel, inter_op)
    only = set(filter(None, args.only.split(",")))

    def want(name):
        return not only or name in only

    import keras
    import tensorflow_text  # noqa: F401  (registers the SavedModel's ops)

    import keras_trm  # noqa: F401
    from keras_trm.data import load_multi30k
    from keras_trm.decoding import Translator
    from keras_trm.text import TextTokenizer, load_vocabulary

    sources, references = load_multi30k(args.split, args.data_dir)
    sources = sources[:args.num_sentences]
    references = references[:args.num_sentences]
    vocab = load_vocabulary(args.vocab)
    from keras_trm.training.precision import float32_copy

    # A model trained in mixed_bfloat16 decodes in float32, as the job's
    # SavedModel export does (the same weights).
    model = float32_copy(keras.saving.load_model(args.model))
    saved_model_dir = pathlib.Path(args.saved_model) if args.saved_model \
        else latest_version("export/transformer_multi30k_en_de")
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="bench_decoding_"))
    beam, alpha = args.beam_size, args.length_penalty
    searches = {"greedy": 1, f"beam{beam}": beam}

    systems = {search: {} for search in searches}  # search -> name -> fn
    skipped = {}
    ct2_workers = []  # SubprocessCTranslate2, closed at the end

    # 1. keras_trm in process (and in parallel parts).
    tokenizer = TextTokenizer(vocab)
    for search, size in searches.items():
        for name, parts in (("keras_trm", 1), ("keras_trm_parallel", args.parallel)):
            if want(name) and (name == "keras_trm" or parts > 1):
                translator = Translator(model, tokenizer, beam_size=size,
                                        length_penalty=alpha,
                                        parallel_searches=parts)
                systems[search][name] = (lambda s, t=translator:
                                         t.translate_texts(s, batch_size=len(s)))

    # 2. Our SavedModel (serves the beam size it was exported with).
    serving = tf.saved_model.load(str(saved_model_dir)).signatures["serving_default"]
    exported_beam = beam
    exported = {}
    config_path = saved_model_dir / "assets.extra" / "config.json"
    if config_path.is_file():
        exported = json.loads(config_path.read_text())
        exported_beam = exported.get("beam_size", beam)
        if exported_beam != beam or exported.get("length_penalty") != alpha:
            print(f"warning: the SavedModel was exported with beam "
                  f"{exported_beam}, alpha {exported.get('length_penalty')}",
                  flush=True)

    def serve(signature):
        """list[str] -> list[str] through a SavedModel's signature."""
        def translate(batch):
            out = signature(sentences=tf.constant(batch))
            return [s.decode("utf-8") for s in next(iter(out.values())).numpy()]
        return translate

    if want("saved_model"):
        systems.setdefault(f"beam{exported_beam}", {})["saved_model"] = serve(serving)
    from keras_trm.export.saved_model import export_module

    def export_beam_search(name, **options):
        """Exports the beam search with ``options`` from the same weights
        and adds its SavedModel as row ``name``."""
        options.setdefault("parallel_searches", args.parallel)
        translator = Translator(model, tokenizer, beam_size=beam,
                                length_penalty=alpha, **options)
        path = export_module(translator, workdir / name, "transformer",
                             signatures={"serving_default": translator.translate})
        systems[f"beam{beam}"][name] = serve(
            tf.saved_model.load(str(path)).signatures["serving_default"])

    if args.parallel > 1 and want("saved_model_parallel"):
        export_beam_search("saved_model_parallel")

    # 2b. The same search with CTranslate2's early exit, in process and as a
    # SavedModel exported from the same weights.
    if want("keras_trm_first_end"):
        first_end = Translator(model, tokenizer, beam_size=beam,
                               length_penalty=alpha,
                               early_stopping="first_end",
                               parallel_searches=args.parallel)
        systems[f"beam{beam}"]["keras_trm_first_end"] = (
            lambda s, t=first_end: t.translate_texts(s, batch_size=len(s)))
    if want("saved_model_first_end"):
        export_beam_search("saved_model_first_end", early_stopping="first_end")

    # 2c. The exact search compiled whole by XLA (``jit_compile=True``),
    # exported likewise from the same weights; XLA compiles once per
    # batch shape (sources padded to a multiple of 8), in the timed calls.
    if want("saved_model_xla"):
        export_beam_search("saved_model_xla", jit_compile=True)
    skipped["saved_model greedy"] = (
        f"the SavedModel serves the search it was exported with "
        f"(beam {exported_beam})")

    # 3. CTranslate2, weights float32 and int8.
    try:
        from keras_trm.export.ctranslate2 import export_ctranslate2

        for quantization in ("float32", "int8"):
            if not want(f"ctranslate2_{quantization}"):
                continue
            path = workdir / f"ct2_{quantization}"
            if not path.exists():
                export_ctranslate2(model, path, vocab, quantization=quantization)
            ct2 = SubprocessCTranslate2(path, num_threads=per_part,
                                        inter_threads=args.parallel)
            ct2_workers.append(ct2)
            for search, size in searches.items():
                call = functools.partial(ct2, beam_size=size,
                                         length_penalty=alpha)
                call.timed = True
                systems[search][f"ctranslate2_{quantization}"] = call
    except ImportError as err:
        skipped["ctranslate2"] = str(err)

    # 4. LiteRT (optional; the module may not provide a translator yet).
    if args.litert:
        try:
            from keras_trm.export.litert import (
                LiteRTTranslator,
                export_translator_litert,
            )

            for quantize in (None, "dynamic_int8"):
                name = "litert" if quantize is None else "litert_int8"
                if not want(name):
                    continue
                path = workdir / f"{name}.tflite"
                if not path.exists():
                    export_translator_litert(model, path, vocab,
                                             quantize=quantize)
                for search, size in searches.items():
                    lite = LiteRTTranslator(
                        path, num_threads=args.threads, beam_size=size,
                        length_penalty=alpha,
                        batch_size=args.litert_batch_size or args.batch_size)
                    systems[search][name] = lambda s, t=lite: t.translate_texts(s)
        except (ImportError, AttributeError, TypeError) as err:
            skipped["litert"] = f"{type(err).__name__}: {err}"

    results = {"rows": {}, "skipped": skipped}
    hyps_by = {}
    for search, by_name in systems.items():
        print(f"{search}: {', '.join(by_name)}", flush=True)
        rows, hyps = measure(by_name, sources, references, args.batch_size,
                             args.latency_sentences, args.repeats,
                             args.settle_ms / 1000.0)
        for name, row in rows.items():
            results["rows"].setdefault(name, {})[search] = row
            hyps_by[(name, search)] = hyps[name]
            print(f"  {name} {search}: {row}", flush=True)
    for worker in ct2_workers:
        worker.close()

    rows = results["rows"]
    beam_key = f"beam{beam}"
    ratios = {}
    ct2 = rows.get("ctranslate2_float32", {})
    latency_ratios = {}
    for name in ("saved_model", "keras_trm", "saved_model_first_end",
                 "keras_trm_first_end", "saved_model_xla",
                 "saved_model_parallel", "keras_trm_parallel"):
        for search in searches:
            if search in rows.get(name, {}) and search in ct2:
                mine, theirs = rows[name][search], ct2[search]
                ratios[f"{name}_{search}_over_ct2_float32"] = round(
                    mine["sentences_per_second"]
                    / theirs["sentences_per_second"], 3)
                if "batch1_latency_ms_p50" in mine:
                    latency_ratios[f"{name}_{search}_over_ct2_float32"] = round(
                        mine["batch1_latency_ms_p50"]
                        / theirs["batch1_latency_ms_p50"], 3)
    headline = ratios.get(f"saved_model_{beam_key}_over_ct2_float32")
    # Token agreement between our greedy output and CT2's, sentence level.
    agreement = {}
    for name in ("saved_model", "ctranslate2_float32", "ctranslate2_int8",
                 "litert", "litert_int8",
                 "keras_trm_first_end", "saved_model_first_end",
                 "saved_model_xla", "saved_model_parallel",
                 "keras_trm_parallel"):
        for search in searches:
            other = hyps_by.get((name, search))
            mine = hyps_by.get(("keras_trm", search))
            if other is not None and mine is not None:
                agreement[f"{name}_{search}"] = round(
                    sum(a == b for a, b in zip(mine, other)) / len(mine), 4)

    report = {
        "benchmark": "decoding: keras_trm vs SavedModel vs CTranslate2 (vs LiteRT)",
        "command": "python bench/bench_decoding.py " + " ".join(sys.argv[1:]),
        "model": str(args.model),
        "saved_model": str(saved_model_dir),
        # How the given SavedModel searches (its job's config.json).
        "saved_model_search": {
            key: exported[key] for key in (
                "beam_size", "length_penalty", "early_stopping",
                "parallel_searches", "export_jit_compile_max_batch_size")
            if key in exported},
        "data": f"Multi30k {args.split} EN->DE, first {len(sources)} sentences",
        "batch_size": args.batch_size,
        "beam_size": beam,
        "length_penalty_alpha": alpha,
        "length_penalty_forms": {
            "keras_trm / saved_model": "((5 + length) / 6) ** alpha (GNMT)",
            "ctranslate2": "length ** alpha"},
        "threads": args.threads,
        "parallel": args.parallel,
        "threads_how": (f"TF: intra_op={per_part}, inter_op={inter_op}; "
                        f"CTranslate2: intra_threads={per_part}, "
                        f"inter_threads={args.parallel}"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "measurement": "systems interleaved batch by batch on the same "
                       "batches (one untimed warm-up batch each); latency "
                       "likewise sentence by sentence; each CTranslate2 "
                       "model in a worker process of its own "
                       "(SubprocessCTranslate2), timed there",
        "repeats": args.repeats,
        "settle_ms": args.settle_ms,
        "host": host_info(),
        "load_average_at_start_and_end": [load_at_start, os.getloadavg()],
        "caveat": "absolute sentences/s and latencies depend on the host and "
                  "its load (hosts of one kind differ up to 2.4x); compare "
                  "the ratios measured in this one run",
        "versions": versions(),
        "rows": rows,
        "skipped": results["skipped"],
        "ratios_sentences_per_second": ratios,
        "ratios_batch1_latency_p50 (lower is faster)": latency_ratios,
        "ratio_saved_model_beam4_over_ct2_float32": headline,
        "ratio_saved_model_first_end_beam4_over_ct2_float32": ratios.get(
            f"saved_model_first_end_{beam_key}_over_ct2_float32"),
        "target_ratio": 1.0,
        "same_output_as_keras_trm (fraction of sentences)": agreement,
    }
    out = pathlib.Path(args.out)
    from keras_trm.utils import write_json

    write_json(out, report)
    print(json.dumps({"ratios": ratios, "agreement": agreement}, indent=1))
    print(f"wrote {out}")


def versions():
    out = {}
    for name in ("tensorflow", "keras", "ctranslate2", "sacrebleu"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except ImportError:
            out[name] = None
    return out


if __name__ == "__main__":
    main()
