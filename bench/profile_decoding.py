"""Profile: where a batched search spends its time, by TensorFlow op type.

    python bench/profile_decoding.py --model <run>/model.keras \\
        --vocab <run>/vocab_8000.txt [--split val] [--num-sentences 500]

Same weights and ids-in/ids-out search as ``bench_encode_by_length.py``
(``Translator.generate_ids`` in a ``tf.function``, batches of
``--batch-size`` of the first ``--num-sentences`` sentences of a Multi30k
split, greedy and beam 4 with alpha 0.6). For each search: one untimed
warm-up batch, one timed pass (wall seconds, sentences/s), then one pass
under ``tf.profiler`` whose trace is summed by op type (milliseconds,
calls, microseconds per call, share of all op time; only the events of
TensorFlow's thread pools, without the executor's bookkeeping,
``ExecutorState::*``). The op times are summed
over TensorFlow's threads, so with inter-op parallelism they can add up to
more than the wall time.

Greedy also gets its decoder work: each sentence's row runs one decoder
step per output token (END included), so ``row_steps`` is the sum of the
output lengths, and the dense projections of one row-step cost
``num_layers * (6 d_model^2 + 2 d_model d_ff) + d_model * vocabulary``
multiply-adds (self-attention Q, K, V, output; cross-attention Q, output;
the feed-forward pair; the output projection; the cross-attention keys and
values are computed once per sentence). ``matmul_gflop_per_s`` divides
those FLOPs by the time of the MatMul ops: how fast our dense matmuls run.

Writes ``--out`` (default ``bench/results/profile_decoding.json``).
"""

import argparse
import collections
import glob
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_decoding import (  # noqa: E402
    add_model_args, host_info, load_encoded_batches, set_tf_threads)

MATMUL_OPS = ("MatMul", "_MklMatMul", "_MklNativeMatMul", "_MklFusedMatMul")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--split", default="val")
    p.add_argument("--num-sentences", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=15,
                   help="op types listed, by time (the rest summed as 'other')")
    p.add_argument("--out", default="bench/results/profile_decoding.json")
    return p.parse_args(argv)


def op_times(logdir):
    """{op type: [milliseconds, calls]} summed over the trace in ``logdir``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    files = sorted(glob.glob(f"{logdir}/plugins/profile/*/*.xplane.pb"))
    if not files:
        raise FileNotFoundError(f"no profiler trace under {logdir!r}")
    space = xplane_pb2.XSpace()
    space.ParseFromString(pathlib.Path(files[-1]).read_bytes())
    totals = collections.defaultdict(lambda: [0.0, 0])
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("tf_"):  # TF's thread pools only
                continue
            for event in line.events:
                name = names.get(event.metadata_id, "")
                # TF op events are named "<node name>:<op type>".
                if ":" not in name or name.startswith("ExecutorState::"):
                    continue
                op = name.rsplit(":", 1)[-1]
                totals[op][0] += event.duration_ps / 1e9
                totals[op][1] += 1
    return totals


def row_steps(ids, end_id):
    """``(row_steps, loop_steps)`` of one greedy batch: the output tokens of
    every sentence, END included (or up to its own token limit, after which
    its row holds PAD), summed (each is one decoder row-step), and the
    longest sentence's count (the search's steps: it stops when the last
    row ends, before the output's full width)."""
    import numpy as np

    ids = np.asarray(ids)
    ends = ids == end_id
    # A row without END stopped at its own token limit: its last non-PAD id.
    last = ids.shape[1] - (ids[:, ::-1] != 0).argmax(1)
    lengths = np.where(ends.any(1), ends.argmax(1) + 1, last)
    return int(lengths.sum()), int(lengths.max())


def main(argv=None):
    args = parse_args(argv)
    set_tf_threads(args.threads, 1)
    import tensorflow as tf

    from keras_trm.decoding import Translator
    from keras_trm.text.wordpiece import END_ID
    from keras_trm.utils import write_json

    load_at_start = os.getloadavg()
    model, tokenizer, sources, batches = load_encoded_batches(args)
    macs_per_row_step = (
        model.num_layers * (6 * model.d_model ** 2 + 2 * model.d_model * model.d_ff)
        + model.d_model * (model.target_vocabulary_size or model.vocabulary_size))
    spec = [tf.TensorSpec([None, None], tf.int32)]
    searches = {}
    for name, beam in (("greedy", 1), ("beam4", 4)):
        translator = Translator(model, tokenizer, beam_size=beam,
                                length_penalty=0.6)
        search = tf.function(translator.generate_ids, input_signature=spec)
        search(batches[0])  # trace and warm up
        start = time.perf_counter()
        ids = [search(batch).numpy() for batch in batches]
        wall = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as logdir:
            tf.profiler.experimental.start(logdir)
            for batch in batches:
                search(batch).numpy()
            tf.profiler.experimental.stop()
            totals = op_times(logdir)
        op_ms = sum(ms for ms, _ in totals.values())
        ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])
        ops = {op: {"ms": round(ms, 1), "calls": calls,
                    "us_per_call": round(1000 * ms / calls, 1),
                    "share": round(ms / op_ms, 3)}
               for op, (ms, calls) in ranked[:args.top]}
        rest = ranked[args.top:]
        if rest:
            ms = sum(v[0] for _, v in rest)
            ops["other"] = {"ms": round(ms, 1), "calls": sum(v[1] for _, v in rest),
                            "share": round(ms / op_ms, 3)}
        matmul_ms = sum(totals[op][0] for op in MATMUL_OPS if op in totals)
        result = {
            "wall_seconds": round(wall, 3),
            "sentences_per_second": round(len(sources) / wall, 2),
            "op_ms_total": round(op_ms, 1),
            "matmul_share": round(matmul_ms / op_ms, 3),
            "ops": ops,
        }
        if beam == 1:
            counts = [row_steps(x, END_ID) for x in ids]
            rows = sum(r for r, _ in counts)
            result["row_steps"] = rows
            result["loop_steps"] = sum(s for _, s in counts)
            result["mean_rows_per_step"] = round(rows / result["loop_steps"], 1)
            result["matmul_gflop_per_s"] = round(
                2 * macs_per_row_step * rows / (matmul_ms / 1000) / 1e9, 1)
        searches[name] = result
        print(name, {k: v for k, v in result.items() if k != "ops"}, flush=True)

    report = {
        "benchmark": "profile of one pass of the batched search by TF op type",
        "command": " ".join(["python", "bench/profile_decoding.py", *sys.argv[1:]]),
        "data": f"Multi30k {args.split}, first {len(sources)} sentences, "
                f"batches of {args.batch_size}",
        "threads": f"TF intra_op={args.threads}, inter_op={args.threads}",
        "macs_per_row_step": macs_per_row_step,
        "date": time.strftime("%Y-%m-%d"),
        "host": host_info(),
        "load_average_at_start_and_end": [load_at_start, os.getloadavg()],
        "searches": searches,
    }
    write_json(pathlib.Path(args.out), report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
