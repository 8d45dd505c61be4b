"""Benchmark: encoding in length groups (``Translator(encode_groups=g)``)
against the whole batch at its longest (``encode_groups=1``).

    python bench/bench_encode_by_length.py --model <run>/model.keras \\
        --vocab <run>/vocab_8000.txt [--split val] [--parallel 2] [--groups 4]

Same weights, the first ``--num-sentences`` sentences of a Multi30k split
in batches of 100, greedy and beam 4 (alpha 0.6), ids in and out (no
tokenizer). The two translators take turns batch by batch (the order
swapped every batch and every pass), ``--repeats`` passes, times added.
Checks that both give the same ids for every sentence. ``--parallel N``:
``parallel_searches=N`` for both, TF intra_op = threads / N, inter_op = N
(as ``bench_decoding.py --parallel``). Each run adds its result under the
key ``<split>_parallel<N>`` of ``--out`` (other keys are kept).
"""

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_decoding import (  # noqa: E402
    add_model_args, host_info, set_tf_threads, time_interleaved)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--split", default="val")
    p.add_argument("--num-sentences", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default="bench/results/encode_by_length.json")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    set_tf_threads(args.threads, args.parallel)
    import keras
    import tensorflow as tf

    from keras_trm.data import load_multi30k
    from keras_trm.decoding import Translator
    from keras_trm.text import TextTokenizer, load_vocabulary
    from keras_trm.training.precision import float32_copy
    from keras_trm.utils import write_json

    load_at_start = os.getloadavg()
    model = float32_copy(keras.saving.load_model(args.model))
    tokenizer = TextTokenizer(load_vocabulary(args.vocab))
    sources, _ = load_multi30k(args.split, args.data_dir)
    sources = sources[:args.num_sentences]
    encode = Translator(model, tokenizer).encode_text
    batches = [encode(tf.constant(sources[i:i + args.batch_size]))
               for i in range(0, len(sources), args.batch_size)]
    spec = [tf.TensorSpec([None, None], tf.int32)]
    result = {}
    for name, beam in (("greedy", 1), ("beam4", 4)):
        searches = {}
        for groups in (1, args.groups):
            translator = Translator(model, tokenizer, beam_size=beam,
                                    parallel_searches=args.parallel,
                                    encode_groups=groups)
            searches[f"groups_{groups}"] = tf.function(
                translator.generate_ids, input_signature=spec)
        for search in searches.values():  # trace and warm up
            search(batches[0])
        seconds, ids = time_interleaved(searches, batches, args.repeats)
        plain, grouped = "groups_1", f"groups_{args.groups}"
        result[name] = {
            "sentences_per_second": {
                key: round(args.repeats * len(sources) / s, 2)
                for key, s in seconds.items()},
            "speedup": round(seconds[plain] / seconds[grouped], 3),
            "identical_ids": sum(a == b for a, b in zip(ids[plain], ids[grouped])),
            "sentences": len(sources),
        }
        print(name, json.dumps(result[name]), flush=True)

    out = pathlib.Path(args.out)
    report = json.loads(out.read_text()) if out.is_file() else {
        "benchmark": "encode_by_length: the encoder in length groups vs the "
                     "whole batch at its longest (Translator encode_groups)",
        "runs": {}}
    report["runs"][f"{args.split}_parallel{args.parallel}"] = {
        "command": "python bench/bench_encode_by_length.py " + " ".join(sys.argv[1:]),
        "data": f"Multi30k {args.split}, first {len(sources)} sentences, "
                f"batches of {args.batch_size}",
        "groups": args.groups,
        "threads": (f"TF intra_op={args.threads // args.parallel}, "
                    f"inter_op={args.parallel}; parallel_searches="
                    f"{args.parallel}"),
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%d"),
        "host": host_info(),
        "load_average_at_start_and_end": [load_at_start, os.getloadavg()],
        **result,
    }
    write_json(out, report)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
