"""Same-run A/B of the training step of two checkouts of keras_trm (for
example before and after the core moved to ``keras.ops``): each run is a
child process importing one checkout's ``keras_trm`` (from its folder),
training ``transformer_small`` (8,000 ids, tied, dropout 0.1) with the paper's recipe
(Noam, Adam(0.9, 0.98, 1e-9), label smoothing 0.1) on the same synthetic
token batches; the checkouts alternate, and target tokens per second of the
timed steps (after warm-up) are compared. ``--part loss`` times the loss
alone instead: value and gradient of ``LabelSmoothedCrossEntropy`` on
random ``(batch, length, V)`` logits in the policy's compute dtype
(``--vocabulary V``, 8,000 by default). Memory: under TensorFlow the peak
of live tensors in TensorFlow's CPU allocator over the timed steps
(``tf.config.experimental.get_memory_info``); under JAX with ``--part loss``
XLA's temporary buffer bytes of the compiled value-and-gradient. With
``--part loss`` the gradient's sum of absolute values is compared too.

    git worktree add /tmp/keras_trm_old c009446
    python bench/bench_train_step_ab.py --a /tmp/keras_trm_old --b . \\
        --out bench/results/train_step_keras_ops_ab.json \\
        [--backend jax] [--precision mixed_bfloat16]

Two dtype policies on one checkout: ``--a . --b . --precision float32
--precision_b mixed_bfloat16``.
"""

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys

from bench_litert import _cpu_model

CHILD = r"""
import importlib.util, json, os, sys, time
# This checkout's keras_trm, whatever is installed (an editable install's
# import hook would win over PYTHONPATH).
root = os.path.join(os.environ["AB_CHECKOUT"], "keras_trm")
spec = importlib.util.spec_from_file_location(
    "keras_trm", os.path.join(root, "__init__.py"),
    submodule_search_locations=[root])
package = importlib.util.module_from_spec(spec)
sys.modules["keras_trm"] = package
spec.loader.exec_module(package)
import numpy as np, keras
from keras_trm.models import transformer_small
from keras_trm.training import LabelSmoothedCrossEntropy, NoamSchedule, paper_adam
steps, warmup, batch, length, vocab = (int(x) for x in sys.argv[1:5] + sys.argv[7:8])
keras.mixed_precision.set_global_policy(sys.argv[5])
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
src = rng.integers(4, vocab, (batch, length)).astype("int32")
tgt = rng.integers(4, vocab, (batch, length + 1)).astype("int32")
peak_mib = grad_sum = None
loss_fn = LabelSmoothedCrossEntropy(label_smoothing=0.1)
if sys.argv[6] == "step":
    # Dropout pinned: the preset's default went from 0.1 to 0.3 on
    # 2026-11-28, and both checkouts must build the same model.
    model = transformer_small(vocab, max_sequence_length=128, dropout_rate=0.1)
    model.compile(optimizer=paper_adam(NoamSchedule(d_model=256, warmup_steps=400)),
                  loss=loss_fn)
    x = {"encoder_tokens": src, "decoder_tokens": tgt[:, :-1]}
    y = tgt[:, 1:]
    run = lambda: model.train_on_batch(x, y)
else:  # the loss alone: value and gradient, synced
    backend = keras.backend.backend()
    dtype = keras.mixed_precision.global_policy().compute_dtype
    logits = keras.ops.convert_to_tensor(
        rng.normal(size=(batch, length, vocab)).astype("float32"), dtype=dtype)
    labels = keras.ops.convert_to_tensor(tgt[:, 1:])
    if backend == "tensorflow":
        import tensorflow as tf
        @tf.function
        def value_and_grad(z):
            with tf.GradientTape() as tape:
                tape.watch(z)
                value = loss_fn(labels, z)
            return value, tape.gradient(value, z)
    elif backend == "jax":
        import jax
        value_and_grad = jax.jit(jax.value_and_grad(lambda z: loss_fn(labels, z)))
        peak_mib = value_and_grad.lower(logits).compile().memory_analysis(
            ).temp_size_in_bytes / 2**20
    else:
        def value_and_grad(z):
            z = z.detach().requires_grad_(True)
            value = loss_fn(labels, z)
            value.backward()
            return value.detach(), z.grad
    def run():
        global grad_sum
        value, grad = value_and_grad(logits)
        grad_sum = float(np.abs(keras.ops.convert_to_numpy(
            keras.ops.cast(grad, "float32")).astype("float64")).sum())
        return float(keras.ops.convert_to_numpy(value))
for _ in range(warmup):
    run()
tf_memory = keras.backend.backend() == "tensorflow"
if tf_memory:
    import tensorflow as tf
    tf.config.experimental.reset_memory_stats("CPU:0")
start = time.perf_counter()
for _ in range(steps):
    loss = run()
seconds = time.perf_counter() - start
if tf_memory:
    peak_mib = tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20
print(json.dumps({"tokens_per_second": steps * batch * length / seconds,
                  "ms": 1000 * seconds / steps, "peak_tensor_mib": peak_mib,
                  "grad_abs_sum": grad_sum,
                  "loss": float(loss), "file": keras_trm_file}))
""".replace("keras_trm_file", "__import__('keras_trm').__file__")


def run_once(checkout, precision, args):
    env = dict(os.environ, AB_CHECKOUT=str(pathlib.Path(checkout).resolve()),
               KERAS_BACKEND=args.backend, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(args.steps), str(args.warmup),
         str(args.batch), str(args.length), precision, args.part,
         str(args.vocabulary)],
        env=env, check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", required=True, help="checkout B")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--runs", type=int, default=3, help="runs per checkout")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--vocabulary", type=int, default=8000,
                        help="V: the model's ids (step) or the logits' width (loss)")
    parser.add_argument("--backend", default="tensorflow",
                        choices=("tensorflow", "jax", "torch"))
    parser.add_argument("--precision", default="float32",
                        help="dtype policy: float32 or mixed_bfloat16")
    parser.add_argument("--part", default="step", choices=("step", "loss"),
                        help="time the training step, or the loss alone "
                             "(value and gradient)")
    parser.add_argument("--precision_b", default=None,
                        help="B's dtype policy (default: --precision)")
    args = parser.parse_args(argv)
    precision = {"a": args.precision, "b": args.precision_b or args.precision}
    runs = {"a": [], "b": []}
    for i in range(args.runs):
        for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
            runs[name].append(run_once(getattr(args, name), precision[name], args))
    median = {k: statistics.median(r["tokens_per_second"] for r in v)
              for k, v in runs.items()}
    result = {
        "what": ("transformer_small training step (train_on_batch)"
                 if args.part == "step" else
                 "LabelSmoothedCrossEntropy value and gradient on random "
                 f"(batch, length, {args.vocabulary}) logits in the compute dtype")
        + ", target tokens/s, two checkouts alternating in child processes",
        "part": args.part,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": _cpu_model(), "a": str(args.a), "b": str(args.b),
        "batch": args.batch, "length": args.length, "steps": args.steps,
        "vocabulary": args.vocabulary,
        "backend": args.backend, "precision": precision,
        "runs": runs, "median_tokens_per_second": median,
        "median_ms": {k: statistics.median(r["ms"] for r in v)
                      for k, v in runs.items()},
        "same_loss": all(ra["loss"] == rb["loss"]
                         for ra, rb in zip(runs["a"], runs["b"])),
        "same_gradient_abs_sum": all(
            ra.get("grad_abs_sum") == rb.get("grad_abs_sum")
            for ra, rb in zip(runs["a"], runs["b"])) if args.part == "loss" else None,
        "median_peak_tensor_mib": {
            k: (statistics.median(r["peak_tensor_mib"] for r in v)
                if all(r.get("peak_tensor_mib") is not None for r in v) else None)
            for k, v in runs.items()},
        "speed_b_over_a": median["b"] / median["a"],
    }
    from keras_trm.utils.files import write_json

    write_json(args.out, result)
    print(json.dumps({k: result[k] for k in (
        "median_tokens_per_second", "median_peak_tensor_mib", "same_loss",
        "same_gradient_abs_sum", "speed_b_over_a")}))


if __name__ == "__main__":
    main()
