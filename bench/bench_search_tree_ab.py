"""Same-run A/B of the graph searches of two checkouts of keras_trm.

    python bench/bench_search_tree_ab.py --a /tmp/old --b . --runs 3 \\
        --out bench/results/search_tree_ab.json

Unlike ``bench_search_ab.py`` (two versions of ``search.py`` over this
checkout's layers), each run is a child process importing one checkout's
``keras_trm`` (from its folder), so changes to the layers of the cached
decoding step are measured too. The model is ``transformer_small`` (8,000
ids, tied, random weights from seed 0): every sentence decodes to its limit
(``--max_length``), which times the steps rather than the stopping. Each
child traces greedy and beam 4 (``tf.function``), calls each once to warm
up, then times ``--repeats`` calls of each on the same batch; the checkouts
alternate. Sentences/s (medians over runs) and the ids (which must be
equal) are compared. TensorFlow, float32, CPU.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

CHILD = r"""
import hashlib, json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import tensorflow as tf
import keras_trm
from keras_trm.models import transformer_small
from keras_trm.decoding.search import beam_search, greedy_search
batch, max_length, repeats = (int(a) for a in sys.argv[2:5])
assert keras_trm.__file__.startswith(sys.argv[1]), keras_trm.__file__
tf.keras.utils.set_random_seed(0)
model = transformer_small(8000, max_sequence_length=128)
rng = np.random.default_rng(0)
lengths = rng.integers(5, 21, size=batch)
source = rng.integers(3, 8000, size=(batch, 20)).astype("int32")
source[np.arange(20)[None, :] >= lengths[:, None]] = 0
source = tf.constant(source)
runs = {
    "beam4": tf.function(lambda ids: beam_search(
        model, ids, beam_size=4, max_length=max_length)),
    "greedy": tf.function(lambda ids: greedy_search(
        model, ids, max_length=max_length)),
}
result = {}
for name, search in runs.items():
    ids = np.asarray(search(source))
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        search(source)
        seconds.append(time.perf_counter() - start)
    result[name] = {"seconds": seconds,
                    "ids_sha1": hashlib.sha1(ids.tobytes()).hexdigest()}
print(json.dumps(result))
"""


def child(tree, args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               KERAS_BACKEND="tensorflow")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, os.path.abspath(tree), str(args.batch),
         str(args.max_length), str(args.repeats)],
        env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="checkout A (baseline)")
    parser.add_argument("--b", required=True, help="checkout B")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--max_length", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()
    runs = {"a": [], "b": []}
    for i in range(args.runs):
        for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
            runs[name].append(child(getattr(args, name), args))
            print(name, json.dumps(runs[name][-1]), flush=True)
    summary = {}
    for kind in ("greedy", "beam4"):
        rate = {name: [args.batch / statistics.median(r[kind]["seconds"])
                       for r in rs] for name, rs in runs.items()}
        ids = {r[kind]["ids_sha1"] for rs in runs.values() for r in rs}
        summary[kind] = {
            "sentences_per_second_a": rate["a"],
            "sentences_per_second_b": rate["b"],
            "median_a": statistics.median(rate["a"]),
            "median_b": statistics.median(rate["b"]),
            "b_over_a": statistics.median(rate["b"])
            / statistics.median(rate["a"]),
            "same_ids": len(ids) == 1,
        }
        print(kind, json.dumps(summary[kind]), flush=True)
    result = {"what": "graph searches (TensorFlow, float32, CPU) of "
                      "checkout b against checkout a, alternating runs",
              "a": os.path.abspath(args.a), "b": os.path.abspath(args.b),
              "args": vars(args), "host": platform.processor()
              or platform.machine(), "load_at_start": load_at_start,
              "load_at_end": os.getloadavg(), "summary": summary,
              "runs": runs}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
