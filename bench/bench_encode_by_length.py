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

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_decoding import (  # noqa: E402
    ab_summary, add_ab_args, load_encoded_batches, set_tf_threads,
    time_interleaved, write_ab_run)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_ab_args(p, "bench/results/encode_by_length.json")
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--groups", type=int, default=4)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    set_tf_threads(args.threads, args.parallel)
    import tensorflow as tf

    from keras_trm.decoding import Translator

    load_at_start = os.getloadavg()
    model, tokenizer, sources, batches = load_encoded_batches(args)
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
        result[name] = ab_summary(seconds, ids, "groups_1",
                                  f"groups_{args.groups}", args.repeats,
                                  len(sources))
        print(name, json.dumps(result[name]), flush=True)

    write_ab_run(
        args, "encode_by_length: the encoder in length groups vs the "
              "whole batch at its longest (Translator encode_groups)",
        f"{args.split}_parallel{args.parallel}", load_at_start, result,
        groups=args.groups,
        threads=(f"TF intra_op={args.threads // args.parallel}, "
                 f"inter_op={args.parallel}; parallel_searches="
                 f"{args.parallel}"))

if __name__ == "__main__":
    main()
