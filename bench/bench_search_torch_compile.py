"""Does ``torch.compile`` speed up the searches under PyTorch? Same-run A/B
on the CPU: ``keras_trm.decoding.search`` as shipped (eager, under
``torch.no_grad``) against the same search with the body of its
``keras.ops.while_loop`` (one decoder step and the search's update)
compiled by ``torch.compile(dynamic=False)``, on the same model and batch,
timed in alternation after both have run once. The compile seconds (the
first call) are reported apart, and Dynamo's count of graphs it compiled:
a graph per call means each search recompiles (until Dynamo's
``recompile_limit``, after which the body runs eagerly).

    python bench/bench_search_torch_compile.py \\
        --out bench/results/search_torch_compile_cpu.json

The model is ``transformer_small`` (8,000 ids, tied) with random weights,
so every sentence decodes to ``--max_decoding_length`` (the search's steps
are timed, not its stopping). The ids of both variants must be equal.
Needs PyTorch and a C++ compiler (inductor's CPU code); TensorFlow is not
used.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

if "keras" in sys.modules and os.environ.get("KERAS_BACKEND") != "torch":
    raise SystemExit("run with KERAS_BACKEND=torch (keras is already imported)")
os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from keras import ops  # noqa: E402

from bench_litert import _cpu_model, random_sources  # noqa: E402
from keras_trm.decoding import search  # noqa: E402
from keras_trm.models import transformer_small  # noqa: E402
from keras_trm.utils import write_json  # noqa: E402


@contextlib.contextmanager
def compiled_bodies():
    """``keras.ops.while_loop`` with its body wrapped in ``torch.compile``
    (Dynamo caches the compiled code by the body's code object, so each
    new closure reuses it while its guards hold)."""
    original = ops.while_loop

    def while_loop(cond, body, loop_vars, maximum_iterations=None):
        return original(cond, torch.compile(body, dynamic=False), loop_vars,
                        maximum_iterations=maximum_iterations)

    search.ops.while_loop = while_loop
    try:
        yield
    finally:
        search.ops.while_loop = original


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--max_decoding_length", type=int, default=30)
    parser.add_argument("--beam_size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    model = transformer_small(8000, max_sequence_length=128)
    source = random_sources(args.batch)
    kinds = {
        "greedy": lambda: search.greedy_search(
            model, source, max_decoding_length=args.max_decoding_length),
        f"beam{args.beam_size}": lambda: search.beam_search(
            model, source, beam_size=args.beam_size,
            max_decoding_length=args.max_decoding_length)[0],
    }
    variants = {"eager": contextlib.nullcontext, "compiled": compiled_bodies}
    first, ids = {}, {}
    for kind, run in kinds.items():
        for name, context in variants.items():
            with context():
                start = time.perf_counter()
                ids[name, kind] = np.asarray(ops.convert_to_numpy(run()))
                first[f"{name}/{kind}"] = time.perf_counter() - start
    seconds = {f"{n}/{k}": [] for n in variants for k in kinds}
    for repeat in range(args.repeats):
        for kind, run in kinds.items():
            order = list(variants) if repeat % 2 == 0 else list(variants)[::-1]
            for name in order:
                with variants[name]():
                    start = time.perf_counter()
                    ops.convert_to_numpy(run())
                    seconds[f"{name}/{kind}"].append(
                        time.perf_counter() - start)
    median = {key: statistics.median(v) for key, v in seconds.items()}
    stats = torch._dynamo.utils.counters["stats"]
    result = {
        "what": "keras_trm searches under PyTorch on the CPU: eager (as "
                "shipped) vs the while_loop body compiled by "
                "torch.compile(dynamic=False); same model and batch, "
                "alternating, after one call of each",
        "host": _cpu_model(),
        "load_average_at_start": os.getloadavg(),
        "torch": torch.__version__, "keras": keras.__version__,
        "threads": torch.get_num_threads(),
        "batch": args.batch, "max_decoding_length": args.max_decoding_length,
        "repeats": args.repeats,
        "same_ids": {k: bool(np.array_equal(ids["eager", k],
                                            ids["compiled", k]))
                     for k in kinds},
        "first_call_seconds": first,
        "dynamo_calls_captured": stats["calls_captured"],
        "dynamo_unique_graphs": stats["unique_graphs"],
        "dynamo_recompile_limit": torch._dynamo.config.recompile_limit,
        "median_seconds": median,
        "seconds": seconds,
        "speed_compiled_over_eager": {
            k: median[f"eager/{k}"] / median[f"compiled/{k}"] for k in kinds},
    }
    write_json(args.out, result)
    print(json.dumps({k: result[k] for k in (
        "same_ids", "first_call_seconds", "median_seconds",
        "speed_compiled_over_eager")}, indent=1))


if __name__ == "__main__":
    main()
