"""Same-run A/B of two versions of ``keras_trm.decoding.search`` on
TensorFlow: the graph searches (``tf.function``) of this checkout against
an earlier ``search.py`` (for example the TensorFlow-only one before the
searches moved to ``keras.ops``), on the same model and the same batches,
timed in alternation.

    git show b6ddd91~1:keras_trm/decoding/search.py > /tmp/old_search.py
    python bench/bench_search_ab.py --old /tmp/old_search.py \\
        --out bench/results/search_keras_ops_ab.json

The model is ``transformer_small`` (8,000 ids, tied) with random weights,
so its outputs are not translations: every sentence decodes to its limit
(``--max_length``), which times the search's steps rather than its
stopping. The ids of both versions are compared (they must be equal).
"""

import argparse
import importlib.util
import json
import statistics
import time

import numpy as np
import tensorflow as tf

from bench_litert import _cpu_model, random_sources
from keras_trm.decoding import search as new_search
from keras_trm.models import transformer_small
from keras_trm.utils.files import write_json


def _load(path):
    spec = importlib.util.spec_from_file_location("old_search", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the earlier search.py")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--max_length", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    tf.keras.utils.set_random_seed(0)
    model = transformer_small(8000, max_sequence_length=128)
    source = random_sources(args.batch)
    source = tf.constant(source)
    versions = {"old": _load(args.old), "new": new_search}
    runs = {}
    for name, module in versions.items():
        beam = tf.function(lambda ids, m=module: m.beam_search(
            model, ids, beam_size=4, max_length=args.max_length))
        greedy = tf.function(lambda ids, m=module: m.greedy_search(
            model, ids, max_length=args.max_length))
        runs[name] = {"beam4": beam, "greedy": greedy}
    ids = {name: {kind: f(source).numpy() for kind, f in fs.items()}
           for name, fs in runs.items()}  # traced and warmed
    same = {kind: bool(np.array_equal(ids["old"][kind], ids["new"][kind]))
            for kind in ("beam4", "greedy")}
    seconds = {name: {"beam4": [], "greedy": []} for name in versions}
    for _ in range(args.repeats):
        for kind in ("beam4", "greedy"):
            for name in ("old", "new") if _ % 2 == 0 else ("new", "old"):
                start = time.perf_counter()
                runs[name][kind](source).numpy()
                seconds[name][kind].append(time.perf_counter() - start)
    result = {
        "what": "graph search (tf.function), this checkout vs --old, same model and batch, alternating",
        "host": _cpu_model(),
        "tensorflow": tf.__version__,
        "batch": args.batch, "max_length": args.max_length,
        "repeats": args.repeats,
        "same_ids": same,
        "median_seconds": {name: {kind: statistics.median(v)
                                  for kind, v in kinds.items()}
                           for name, kinds in seconds.items()},
        "seconds": seconds,
    }
    result["speed_new_over_old"] = {
        kind: result["median_seconds"]["old"][kind]
        / result["median_seconds"]["new"][kind] for kind in ("beam4", "greedy")}
    write_json(args.out, result)
    print(json.dumps({k: result[k] for k in ("same_ids", "median_seconds",
                                              "speed_new_over_old")}, indent=1))


if __name__ == "__main__":
    main()
