"""Benchmark: the translation job's input pipeline -- the prepared format
(``keras_trm.data.prepare_translation_data``) and its loader
(``keras_trm.data.TokenBatches``) -- at growing corpus sizes.

    python bench/bench_data_pipeline.py --sizes 200000 1000000 [5000000]
        [--workdir /tmp/keras_trm_bench_data] [--vocabulary sentencepiece_bpe]
        [--out bench/results/data_pipeline_prepared.json]

Corpora: ``n`` real sentence pairs drawn with replacement (seeded) from the
pairs of ``<data_dir>``: Multi30k train (29,000), the Europarl v7 slice
(20,000) and the 2008-2022 news pool (36,826) of ``wmt14_en_de/``, blank
pairs left out; written as ``.gz`` under ``--workdir`` (never into the
repository). One joint vocabulary (SentencePiece BPE 8,000, the job's
default for WMT and user files, or WordPiece) is learned once from the
pool.

Each configuration runs in a fresh child process (``ru_maxrss`` of that
process is its peak RSS):

- ``prepare``: ``prepare_translation_data`` (streaming read + tokenize +
  ``.npy`` chunk write), timed once per size; not part of the time to
  first batch.
- ``loader``: ``read_prepared`` (manifest and SHA-256 checks, memory-mapped
  splits) + ``TokenBatches(repeat=False)``, iterating one whole epoch of
  batches.

Figures: ``rss_mb`` (peak, ``ru_maxrss``), ``rss_now_mb`` (VmRSS at the
end), ``rss_after_imports_mb`` (peak of the same process after its
imports, before touching data: Keras and its backend, ``KERAS_BACKEND``
as set, TensorFlow by default; the ``prepare`` child also builds the
tokenizer), ``first_batch_s`` (from opening the prepared folder to the
first batch in hand), ``batches_per_s`` over the rest of the epoch (the
loader alone, no model), ``batches``, pairs. Job settings:
tokens_per_batch 4096, max_length 128, the job's boundaries.

History: ``bench/results/data_pipeline.json`` holds this benchmark's
figures for the pipeline before issue #61 (TFRecord shards read by
tf.data, ``keras_trm.data.shards`` at commit 32da1ca; its ``new`` rows),
and for the in-memory path before issue #23 (its ``old`` rows, measured
at commit 4e0ac09). The script writes ``data_pipeline_prepared.json`` by
default, so as not to overwrite them.

The machine may be shared with other jobs; the host line names the CPU.
"""

import argparse
import gzip
import json
import os
import pathlib
import platform
import random
import resource
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Measure this checkout, whatever keras_trm is installed elsewhere.
sys.path.insert(0, str(ROOT))
BOUNDARIES = (8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)
MAX_LENGTH = 128
TOKENS_PER_BATCH = 4096


def _rss_mb():
    """Peak RSS of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _rss_now_mb():
    """Current RSS of this process (MB), from /proc (None elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None


def _pool(data_dir):
    from keras_trm.data import load_multi30k, read_lines

    src, tgt = load_multi30k("train", data_dir)
    pairs = list(zip(src, tgt))
    wmt = pathlib.Path(data_dir) / "wmt14_en_de"
    for stem in ("europarl-v7.de-en.first20000", "newstest2008-2022-pool"):
        pairs += list(zip(read_lines(wmt / f"{stem}.en.gz"),
                          read_lines(wmt / f"{stem}.de.gz")))
    return [(s, t) for s, t in pairs if s.strip() and t.strip()]


def build_corpus(pool, n, folder, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    src, tgt = folder / f"corpus_{n}.en.gz", folder / f"corpus_{n}.de.gz"
    if src.is_file() and tgt.is_file():
        return src, tgt
    rng = random.Random(seed)
    tmp_s, tmp_t = src.with_suffix(".tmp"), tgt.with_suffix(".tmp")
    with gzip.open(tmp_s, "wt", encoding="utf-8", compresslevel=1) as fs, \
            gzip.open(tmp_t, "wt", encoding="utf-8", compresslevel=1) as ft:
        for i in range(0, n, 10_000):
            block = [pool[rng.randrange(len(pool))]
                     for _ in range(min(10_000, n - i))]
            fs.write("".join(s + "\n" for s, _ in block))
            ft.write("".join(t + "\n" for _, t in block))
    os.replace(tmp_s, src)
    os.replace(tmp_t, tgt)
    return src, tgt


def _tokenizer(kind, path):
    """The job's tokenizer for preparing: SentencePiece on the host (the
    ``sentencepiece`` package, as ``keras-trm train-translation``), or
    WordPiece (tensorflow-text)."""
    from keras_trm.text import HostSentencePieceTokenizer

    if kind == "wordpiece":
        from keras_trm.text import TextTokenizer, load_vocabulary

        return TextTokenizer(load_vocabulary(path))
    return HostSentencePieceTokenizer(path)


def learn_tokenizer(kind, pool, folder, size=8000):
    from keras_trm.text import learn_sentencepiece, learn_vocabulary

    path = folder / (f"vocab_{size}.txt" if kind == "wordpiece"
                     else f"spm_bpe_{size}.model")
    if not path.is_file():
        sentences = [s for p in pool for s in p]
        if kind == "wordpiece":
            learn_vocabulary(sentences, size, path)
        else:
            learn_sentencepiece(sentences, size, path, model_type="bpe",
                                sample_size=200_000, num_threads=2)
    return path


def child(args):
    import keras

    import keras_trm

    out = {"mode": args.child, "backend": keras.backend.backend(),
           "keras_trm": str(pathlib.Path(keras_trm.__file__).parent)}
    if args.child == "prepare":
        from keras_trm.data import prepare_translation_data
        from keras_trm.jobs.translation import token_encoder, vocabulary_sha256

        tok = _tokenizer(args.vocabulary, args.tokenizer_path)
        encode = token_encoder(tok)
        encode(["warm up"])  # trace outside the timings
        out["rss_after_imports_mb"] = _rss_mb()
        start = time.perf_counter()
        manifest = prepare_translation_data(
            args.prepared, [("train", args.source, args.target)], encode,
            len(tok.vocabulary), vocabulary_sha256(tok), max_train_length=MAX_LENGTH)
        split = manifest["splits"]["train"]
        out.update(prepare_s=time.perf_counter() - start, pairs=split["pairs"],
                   chunks=len(split["chunks"]), reused=manifest["reused"],
                   prepared_bytes=sum(f["bytes"] for f in manifest["files"].values()))
        out["rss_mb"], out["rss_now_mb"] = _rss_mb(), _rss_now_mb()
        return out
    from keras_trm.data import TokenBatches, read_prepared

    out["rss_after_imports_mb"] = _rss_mb()
    start = time.perf_counter()
    split = read_prepared(args.prepared).splits["train"]
    batches = TokenBatches(split, TOKENS_PER_BATCH, BOUNDARIES, seed=0, repeat=False)
    out["pairs"], out["batches"] = len(split), len(batches)
    batches[0]
    out["first_batch_s"] = time.perf_counter() - start
    t0 = time.perf_counter()
    for i in range(1, len(batches)):  # the rest of the epoch
        batches[i]
    out["batches_per_s"] = (len(batches) - 1) / (time.perf_counter() - t0)
    out["rss_mb"], out["rss_now_mb"] = _rss_mb(), _rss_now_mb()
    return out


def _run_child(mode, extra):
    cmd = [sys.executable, __file__, "--child", mode] + extra
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(
                   [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"{mode} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result.get("keras_trm") != str(ROOT / "keras_trm"):
        raise RuntimeError(f"{mode} measured {result.get('keras_trm')}, not {ROOT}")
    result["process_wall_s"] = time.perf_counter() - t0
    print(json.dumps(result), flush=True)
    return result


def _host():
    info = {"python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in text.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
            if line.startswith("Flags:"):
                info["avx512"] = sorted(f for f in line.split() if f.startswith("avx512"))
    except OSError:
        pass
    try:
        import tensorflow as tf

        info["tensorflow"] = tf.__version__
    except ImportError:
        pass
    info["load_average_at_start"] = os.getloadavg()
    return info


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[200_000, 1_000_000])
    parser.add_argument("--workdir", type=pathlib.Path,
                        default=pathlib.Path("/tmp/keras_trm_bench_data"))
    parser.add_argument("--vocabulary", default="sentencepiece_bpe",
                        choices=("sentencepiece_bpe", "wordpiece"))
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "bench" / "results" / "data_pipeline_prepared.json")
    parser.add_argument("--data-dir", default=None)
    # child mode (internal)
    parser.add_argument("--child", choices=("prepare", "loader"))
    parser.add_argument("--source"), parser.add_argument("--target")
    parser.add_argument("--prepared"), parser.add_argument("--tokenizer-path")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return

    from keras_trm.data import resolve_data_dir

    data_dir = resolve_data_dir(args.data_dir)
    started = time.time()
    pool = _pool(data_dir)
    tok_path = learn_tokenizer(args.vocabulary, pool, args.workdir)
    result = {
        "command": "python bench/bench_data_pipeline.py " + " ".join(sys.argv[1:]),
        "host": _host(),
        "settings": {"tokens_per_batch": TOKENS_PER_BATCH,
                     "max_length": MAX_LENGTH, "boundaries": list(BOUNDARIES),
                     "vocabulary": f"{args.vocabulary} {tok_path.name}",
                     "pool_pairs": len(pool),
                     "keras_backend": os.environ.get("KERAS_BACKEND", "tensorflow")},
        "sizes": {},
    }
    for n in args.sizes:
        src, tgt = build_corpus(pool, n, args.workdir)
        prepared = args.workdir / f"prepared_{n}"
        common = ["--source", str(src), "--target", str(tgt),
                  "--prepared", str(prepared), "--tokenizer-path", str(tok_path),
                  "--vocabulary", args.vocabulary]
        row = {"corpus_gz_mb": (src.stat().st_size + tgt.stat().st_size) / 2**20}
        row["prepare"] = _run_child("prepare", common)
        row["loader"] = _run_child("loader", common)
        result["sizes"][str(n)] = row
    sizes = [str(n) for n in args.sizes]
    summary = {}
    for mode in ("loader", "prepare"):
        have = [n for n in sizes if mode in result["sizes"][n]]
        for key in ("rss_mb", "first_batch_s", "batches_per_s", "prepare_s"):
            values = {n: result["sizes"][n][mode].get(key) for n in have}
            if any(v is not None for v in values.values()):
                summary[f"{mode}_{key}"] = values
        if len(have) > 1:
            summary[f"{mode}_rss_growth_mb_{have[0]}_to_{have[-1]}"] = (
                result["sizes"][have[-1]][mode]["rss_mb"]
                - result["sizes"][have[0]][mode]["rss_mb"])
    result["summary"] = summary
    result["wall_minutes"] = (time.time() - started) / 60
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
