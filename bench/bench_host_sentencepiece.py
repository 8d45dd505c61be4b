"""Benchmark: SentencePiece on the host (``HostSentencePieceTokenizer``,
the ``sentencepiece`` package) against the tensorflow-text graph
(``SentencePieceTokenizer``), tokenizing and detokenizing Multi30k train.

    PYTHONPATH=. python bench/bench_host_sentencepiece.py [--repeats 3] [--chunk 10000]
        [--out bench/results/host_sentencepiece.json]

The vocabulary is learned as the translation job learns it
(``keras_trm.jobs.translation.prepare_tokenizer``: joint SentencePiece BPE
of 10,000 ids from Multi30k train, source and target), into a temporary
folder. Both tokenizers then read the same 58,000 lines (train EN + DE) in
chunks of ``--chunk`` lines, in the same process, alternating, and the best
of ``--repeats`` passes is kept (lines/s). ``encode``: str lines -> int32
id arrays (the host's numpy arrays; the graph's ragged tensor read back
with ``.numpy()`` per row, what data preparation needs);
``detokenize``: the ids -> str lines (for tf-text, from the host arrays
through ``tf.ragged.constant``, what a host caller pays). The ids and texts of the two are
compared (``same_ids``, ``same_text``: lines equal out of ``lines``).

The machine may be shared with other jobs; the host line names the CPU.
"""

import argparse
import gzip
import json
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_decoding import host_info  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunk", type=int, default=10_000)
    p.add_argument("--out", default="bench/results/host_sentencepiece.json")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf

    from keras_trm.data import resolve_data_dir
    from keras_trm.jobs.translation import TranslationConfig, prepare_tokenizer
    from keras_trm.text import HostSentencePieceTokenizer

    folder = pathlib.Path(resolve_data_dir()) / "multi30k"
    corpora = [("multi30k", folder / "train.en.gz", folder / "train.de.gz")]
    lines = [line.rstrip("\n") for name in ("train.en.gz", "train.de.gz")
             for line in gzip.open(folder / name, "rt", encoding="utf-8")]
    with tempfile.TemporaryDirectory() as workdir:
        graph = prepare_tokenizer(TranslationConfig(), corpora, workdir)
        host = HostSentencePieceTokenizer(
            pathlib.Path(workdir) / "spm_bpe_10000.model")
    chunks = [lines[i:i + args.chunk] for i in range(0, len(lines), args.chunk)]

    def host_encode():
        return [row for chunk in chunks for row in host.encode(chunk)]

    def graph_encode():
        return [row for chunk in chunks
                for row in graph.tokenize(tf.constant(chunk)).numpy()]

    def host_decode(ids):
        return [t for i in range(0, len(ids), args.chunk)
                for t in host.detokenize(ids[i:i + args.chunk])]

    def graph_decode(ids):
        out = []
        for i in range(0, len(ids), args.chunk):
            ragged = tf.ragged.constant([r.tolist() for r in ids[i:i + args.chunk]],
                                        dtype=tf.int32)
            out.extend(t.decode() for t in graph.detokenize(ragged).numpy())
        return out

    best = {}
    results = {}
    for _ in range(args.repeats):
        for name, encode, decode in (
                ("sentencepiece_host", host_encode, host_decode),
                ("tensorflow_text", graph_encode, graph_decode)):
            t0 = time.perf_counter()
            ids = encode()
            t1 = time.perf_counter()
            text = decode(ids)
            t2 = time.perf_counter()
            b = best.setdefault(name, {"encode_s": float("inf"),
                                       "detokenize_s": float("inf")})
            b["encode_s"] = min(b["encode_s"], t1 - t0)
            b["detokenize_s"] = min(b["detokenize_s"], t2 - t1)
            results[name] = (ids, text)
    (host_ids, host_text), (graph_ids, graph_text) = results["sentencepiece_host"], results["tensorflow_text"]
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "host": host_info(),
        "load_average_1min": round(os.getloadavg()[0], 2),  # a shared host
        "lines": len(lines),
        "vocabulary_size": host.vocabulary_size,
        "chunk": args.chunk,
        "repeats": args.repeats,
        "same_ids": sum(a.tolist() == b.tolist() for a, b in zip(host_ids, graph_ids)),
        "same_text": sum(a == b for a, b in zip(host_text, graph_text)),
    }
    for name, b in best.items():
        report[name] = {
            "encode_lines_per_s": round(len(lines) / b["encode_s"]),
            "detokenize_lines_per_s": round(len(lines) / b["detokenize_s"]),
            **{k: round(s, 3) for k, s in b.items()}}
    for what in ("encode", "detokenize"):
        report[f"{what}_speedup"] = round(
            report["sentencepiece_host"][f"{what}_lines_per_s"]
            / report["tensorflow_text"][f"{what}_lines_per_s"], 2)
    print(json.dumps(report, indent=1))
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
