"""Benchmark: the cached step's attention kernels (``BatchMatMulV3`` and a
written-out softmax) against the oneDNN ones TensorFlow picks for
``ops.matmul`` / ``ops.softmax`` (``BatchMatMulV2`` / ``Softmax``).

    python bench/bench_attention_kernels.py --model <run>/model.keras \\
        --vocab <run>/vocab_8000.txt [--split val]

Same weights, the first ``--num-sentences`` sentences of a Multi30k split
in batches of 100, greedy and beam 4 (alpha 0.6), ids in and out (no
tokenizer), the default ``Translator``. The "onednn" search is traced with
``keras_trm.layers.multi_head_attention``'s two kernel helpers swapped for
``ops.matmul`` and ``ops.softmax`` (what ``call_with_cache`` used before);
the two searches take turns batch by batch (the order swapped every batch
and every pass), ``--repeats`` passes, times added. Checks that both give
the same ids for every sentence. Each run adds its result under the key
``<split>`` of ``--out`` (other keys are kept).
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
    add_ab_args(p, "bench/results/attention_kernels.json")
    return p.parse_args(argv)


def onednn_matmul(x, y, transpose_y=False):
    from keras import ops

    return ops.matmul(x, ops.swapaxes(y, -1, -2) if transpose_y else y)


def onednn_softmax(scores):
    from keras import ops

    return ops.softmax(scores, axis=-1)


def main(argv=None):
    args = parse_args(argv)
    set_tf_threads(args.threads, 1)
    import tensorflow as tf

    import keras_trm.layers.multi_head_attention as mha
    from keras_trm.decoding import Translator

    load_at_start = os.getloadavg()
    model, tokenizer, sources, batches = load_encoded_batches(args)
    spec = [tf.TensorSpec([None, None], tf.int32)]
    kernels = {"onednn": (onednn_matmul, onednn_softmax),
               "eigen": (mha._cached_matmul, mha._cached_softmax)}
    result = {}
    for name, beam in (("greedy", 1), ("beam4", 4)):
        searches = {}
        for key, (matmul, softmax) in kernels.items():
            translator = Translator(model, tokenizer, beam_size=beam)
            searches[key] = tf.function(translator.generate_ids,
                                        input_signature=spec)
            # Traced (and warmed up) with these kernels.
            mha._cached_matmul, mha._cached_softmax = matmul, softmax
            try:
                searches[key](batches[0])
            finally:
                mha._cached_matmul, mha._cached_softmax = kernels["eigen"]
        seconds, ids = time_interleaved(searches, batches, args.repeats)
        result[name] = ab_summary(seconds, ids, "onednn", "eigen",
                                  args.repeats, len(sources))
        print(name, json.dumps(result[name]), flush=True)

    write_ab_run(
        args, "the cached step's attention kernels: BatchMatMulV3 + "
              "written-out softmax (eigen) vs ops.matmul + ops.softmax "
              "(TensorFlow's oneDNN rewrites)",
        args.split, load_at_start, result,
        threads=f"TF intra_op={args.threads}, inter_op=1")

if __name__ == "__main__":
    main()
