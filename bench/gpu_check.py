"""GPU check (issue #23): a short transformer_base run on WMT14 EN->DE in
four configurations (XLA on/off x float32/mixed_float16) with
MirroredStrategy over all visible GPUs, then beam-4 decoding and BLEU on the
first sentences of newstest2014 (writes JSON).

On a machine with GPUs, from the repository root:

    KERAS_TRM_DATA_DIR=/path/to/shared/data python bench/gpu_check.py

(defaults: 300 training steps per configuration, 4096 padded tokens per
side per GPU replica, 100 decoded newstest2014 sentences; ``--help`` lists
the flags). It writes ``bench/results/gpu_check.json``: the host (platform,
CPU count, TensorFlow / Keras versions, GPU names, ``nvidia-smi``), the
command, and for each configuration: steps/s and real (non-padding) target
tokens/s of the timed steps (the first ``warmup_steps`` are not timed: they
include tracing and XLA compilation; batch shapes first met after them
still retrace/recompile inside the timed steps, counted in
``new_shapes_after_warmup``), peak GPU memory of training
(``tf.config.experimental.get_memory_info(...)["peak"]`` per GPU, GPU:0
first), the mean training loss of the first and last logging intervals,
the target tokens counted by the model (``TokenCount``) and by the data
pipeline, beam-4 BLEU (sacreBLEU 13a) of the short run on the decoded
newstest2014 sentences, and wall seconds. Each configuration runs in a
fresh child process, so that dtype policies, XLA and GPU memory do not leak
from one into the next. The training data is the local WMT14 training
split (the Europarl v7 slice, ``keras_trm.data.load_wmt14``) with a joint
SentencePiece BPE learned once, in the parent, from it.

Without a visible GPU it exits with status 2 and says so. The same code
path runs on a CPU, as a smoke test, with a tiny configuration:

    python bench/gpu_check.py --tiny --allow-cpu --out /tmp/gpu_check.json

(1 layer, d_model 32, 50 training pairs, 3 steps, 4 decoded sentences, a
~400-piece vocabulary; on a CPU the MirroredStrategy has 2 logical CPU
devices, and the mixed_float16 configurations are skipped with the reason
recorded: float16 training is not a supported CPU setup).
"""

import argparse
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CONFIGS = {
    "float32": dict(precision="float32", jit_compile=False),
    "float32_xla": dict(precision="float32", jit_compile=True),
    "mixed_float16": dict(precision="mixed_float16", jit_compile=False),
    "mixed_float16_xla": dict(precision="mixed_float16", jit_compile=True),
}
NO_GPU_EXIT = 2
NO_GPU_MESSAGE = (
    "gpu_check: no GPU is visible to TensorFlow "
    "(tf.config.list_physical_devices('GPU') is empty), so there is nothing "
    "to check here. Run it on a machine with GPUs, or run the CPU smoke "
    "configuration of the same code path with:\n"
    "    python bench/gpu_check.py --tiny --allow-cpu --out /tmp/gpu_check.json"
)
TINY = dict(num_layers=1, d_model=32, num_heads=2, d_ff=64, train_pairs=50,
            steps=3, decode_sentences=4, vocabulary_size=400,
            tokens_per_batch=256, max_length=64, warmup_steps=1)
FULL = dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, train_pairs=0,
            steps=300, decode_sentences=100, vocabulary_size=8000,
            tokens_per_batch=4096, max_length=256, warmup_steps=10)
# The flags that override FULL's (or --tiny's) value, with their help.
OVERRIDES = {
    "steps": "training steps per configuration; rounded up to a multiple "
             "of --log-every",
    "tokens_per_batch": "padded tokens per side per replica in one batch; the "
                        "global batch is this x the number of replicas",
    "decode_sentences": "first n newstest2014 sentences decoded with beam 4 "
                        "and scored with BLEU",
    "warmup_steps": "first steps not timed (tracing, XLA compilation)",
    "vocabulary_size": "joint SentencePiece BPE size",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    for key, what in OVERRIDES.items():
        p.add_argument("--" + key.replace("_", "-"), type=int, default=None,
                       help=f"{what} (default: {FULL[key]}; --tiny: {TINY[key]})")
    p.add_argument("--out", default="bench/results/gpu_check.json",
                   help="the JSON file written (default: %(default)s)")
    p.add_argument("--tiny", action="store_true",
                   help="tiny configuration for a CPU smoke run: 1 layer, "
                        "d_model 32, 50 training pairs, 3 steps, 4 decoded "
                        "sentences, ~400-piece vocabulary (instead of "
                        "transformer_base on the whole training split)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="run even when no GPU is visible (on the CPU; the "
                        "mixed_float16 configurations are then skipped)")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help="comma-separated configurations to run, of "
                        f"{', '.join(CONFIGS)} (default: all four)")
    p.add_argument("--log-every", type=int, default=None,
                   help="steps per logging interval; the loss reported is "
                        "the mean of the first and of the last interval "
                        "(default: steps // 10, at least 1)")
    p.add_argument("--timeout", type=float, default=3600,
                   help="seconds one configuration's child process may run "
                        "(default: %(default)s)")
    p.add_argument("--data-dir", default=None,
                   help="data directory (default: KERAS_TRM_DATA_DIR, see "
                        "keras_trm.data.resolve_data_dir)")
    p.add_argument("--workdir", default=None,
                   help="folder for the vocabulary and the children's "
                        "results (default: a temporary folder, removed)")
    # Internal: a child process runs one configuration.
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    base = TINY if args.tiny else FULL
    for key in OVERRIDES:
        if getattr(args, key) is None:
            setattr(args, key, base[key])
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    if args.log_every is None:
        args.log_every = max(1, args.steps // 10)
    args.steps = -(-args.steps // args.log_every) * args.log_every
    if not 0 <= args.warmup_steps < args.steps:
        p.error(f"--warmup-steps must be in [0, steps), got {args.warmup_steps}")
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown or not args.configs:
        p.error(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
    args.model = {k: base[k] for k in ("num_layers", "d_model", "num_heads",
                                       "d_ff", "train_pairs", "max_length")}
    return args


def _load_data(args, workdir):
    """newstest2013/2014 and the WMT14 training corpora as files (the
    Europarl slice and the news pool; their first ``train_pairs`` lines
    when the model sets it), as the translation job reads them."""
    from keras_trm.data import (load_translation_splits, resolve_data_dir,
                                translation_train_files)
    from keras_trm.jobs.translation import first_lines

    data_dir = resolve_data_dir(args.data_dir)
    splits = load_translation_splits("wmt14", data_dir, "en", "de",
                                     include_train=False)
    corpora = translation_train_files("wmt14", data_dir, "en", "de")
    if args.model["train_pairs"]:
        corpora = first_lines(corpora, args.model["train_pairs"], workdir)
    return splits, corpora


def _host_info():
    import keras
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    info = {
        "platform": platform.platform(), "python": platform.python_version(),
        "machine": platform.machine(), "cpu_count": os.cpu_count(),
        "tensorflow": tf.__version__, "keras": keras.__version__,
        "gpus": [dict(name=g.name, **{k: str(v) for k, v in
                      tf.config.experimental.get_device_details(g).items()})
                 for g in gpus],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    try:
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
             "--format=csv,noheader"], capture_output=True, text=True,
            timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        info["nvidia_smi"] = None
    return info


class _Timer:
    """Keras callback: syncs and timestamps the end of the warm-up and of the
    last step; records each epoch's (= logging interval's) loss and tokens."""

    def __new__(cls, *a, **k):
        import keras

        class Timer(keras.callbacks.Callback):
            def __init__(self, warmup, total, steps_per_epoch):
                super().__init__()
                self.warmup, self.total = warmup, total
                self.steps_per_epoch = steps_per_epoch
                self.start = self.end = None
                self.losses, self.tokens = [], []
                self.epoch = 0

            def on_train_begin(self, logs=None):
                self.start = time.perf_counter()  # when warmup == 0

            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                step = self.epoch * self.steps_per_epoch + batch + 1
                if step == self.warmup or step == self.total:
                    float(logs["loss"])  # wait for the device
                    if step == self.warmup:
                        self.start = time.perf_counter()
                    if step == self.total:
                        self.end = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                self.losses.append(float(logs["loss"]))
                self.tokens.append(float(logs["tokens"]))

        return Timer(*a, **k)


def run_child(args):
    """One configuration, in this (fresh) process; returns its result dict."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_trm.decoding import BeamSearch, Translator, corpus_bleu
    from keras_trm.jobs.translation import (TranslationConfig, prepare_training_batches,
                                            tf_dataset)
    from keras_trm.models import transformer_base
    from keras_trm.text import HostSentencePieceTokenizer
    from keras_trm.training import (
        DataPosition, LabelSmoothedCrossEntropy, NoamSchedule, TokenCount,
        apply_precision, make_strategy, paper_adam, resolve_jit_compile)
    from keras_trm.training.precision import float32_copy

    wall0 = time.perf_counter()
    name, cfg = args.child, CONFIGS[args.child]
    m = args.model
    keras.utils.set_random_seed(0)
    strategy_note = "MirroredStrategy over all visible GPUs"
    if cfg["jit_compile"] and not tf.config.list_physical_devices("GPU"):
        # XLA cannot reach variables on the other logical CPU devices of a
        # multi-replica CPU strategy (resolve_jit_compile turns it off there
        # for that reason): a one-device MirroredStrategy, same code path.
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
        strategy_note = ("MirroredStrategy on 1 CPU device: XLA does not "
                         "support variables on several logical CPU devices")
    else:
        strategy = make_strategy("mirrored")  # before TF initializes devices
        if not tf.config.list_physical_devices("GPU"):
            strategy_note = "MirroredStrategy on 2 logical CPU devices (no GPU)"
    policy = apply_precision(cfg["precision"])
    gpus = tf.config.list_physical_devices("GPU")
    replicas = strategy.num_replicas_in_sync

    workdir = pathlib.Path(args.workdir)
    splits, corpora = _load_data(args, workdir)
    tokenizer = HostSentencePieceTokenizer(workdir / "spm.model")
    limit = min(m["max_length"], 128)
    boundaries = tuple(b for b in (8, 12, 16, 20, 24, 32, 40, 48, 64, 96)
                       if b < limit) + (limit,)
    tokens_per_batch = args.tokens_per_batch * replicas
    # The translation job's pipeline: token ids prepared once (the first
    # child writes them, the others reuse them), TokenBatches through the
    # job's thin tf.data wrapper; both corpora, each pair equally likely.
    # Iterating the dataset again starts the same seeded stream, so counting
    # its batches here sees exactly the batches fit() trains on.
    stream = prepare_training_batches(
        TranslationConfig(dataset="wmt14", max_sequence_length=limit,
                          tokens_per_batch=tokens_per_batch, seed=0),
        corpora, tokenizer, workdir / "prepared", boundaries, DataPosition())
    train = tf_dataset(stream["batches"])
    step_tokens, padded, shapes = [], 0, []
    for _, labels in train.take(args.steps).as_numpy_iterator():
        step_tokens.append(int(np.count_nonzero(labels)))
        padded += labels.size
        shapes.append(tuple(labels.shape))
    # Each new (batch, length) shape retraces the step (and, with XLA,
    # recompiles it): timed steps with shapes unseen in the warm-up include
    # that time.
    new_shapes = len(set(shapes[args.warmup_steps:]) - set(shapes[:args.warmup_steps]))
    timed_tokens = sum(step_tokens[args.warmup_steps:])

    jit = resolve_jit_compile(cfg["jit_compile"], strategy)
    with strategy.scope():
        model = transformer_base(
            tokenizer.vocabulary_size if hasattr(tokenizer, "vocabulary_size")
            else len(tokenizer.vocabulary),
            num_layers=m["num_layers"], d_model=m["d_model"],
            num_heads=m["num_heads"], d_ff=m["d_ff"],
            max_sequence_length=m["max_length"])
        model.compile(
            optimizer=paper_adam(NoamSchedule(m["d_model"], 4000)),
            loss=LabelSmoothedCrossEntropy(0.1),
            metrics=[TokenCount()], jit_compile=jit)
    for i in range(len(gpus)):
        tf.config.experimental.reset_memory_stats(f"GPU:{i}")
    epochs = args.steps // args.log_every
    timer = _Timer(args.warmup_steps, args.steps, args.log_every)
    model.fit(train, epochs=epochs, steps_per_epoch=args.log_every,
              callbacks=[timer], shuffle=False, verbose=2)
    train_peak = [int(tf.config.experimental.get_memory_info(f"GPU:{i}")["peak"])
                  for i in range(len(gpus))]
    timed_steps = args.steps - args.warmup_steps
    seconds = timer.end - timer.start

    # Decoding computes in float32 (the jobs' way): same weights, no casts.
    test_src, test_tgt = splits.test
    n = args.decode_sentences
    translator = Translator(float32_copy(model), tokenizer,
                            search=BeamSearch(beam_size=4, length_penalty=0.6))
    t0 = time.perf_counter()
    hyps = translator.translate_texts(test_src[:n], batch_size=50)
    decode_seconds = time.perf_counter() - t0
    bleu, signature, _ = corpus_bleu(hyps, test_tgt[:n])
    return {
        "config": name, "precision": policy, "jit_compile": bool(jit),
        "replicas": replicas, "strategy": strategy_note,
        "devices": [d for d in strategy.extended.worker_devices],
        "parameters": int(model.count_params()),
        "steps": args.steps, "warmup_steps": args.warmup_steps,
        "timed_steps": timed_steps, "timed_seconds": round(seconds, 3),
        "steps_per_second": round(timed_steps / seconds, 3),
        "target_tokens_per_second": round(timed_tokens / seconds, 1),
        "tokens_per_batch_per_replica": args.tokens_per_batch,
        "target_tokens_data": sum(step_tokens),
        "target_tokens_model": int(round(sum(timer.tokens))),
        "target_tokens_per_step": step_tokens,
        "padded_label_slots": int(padded),
        "distinct_batch_shapes": len(set(shapes)),
        "new_shapes_after_warmup": new_shapes,
        "peak_gpu_memory_bytes": train_peak[0] if train_peak else None,
        "peak_gpu_memory_bytes_per_gpu": train_peak,
        "first_loss": timer.losses[0], "final_loss": timer.losses[-1],
        "interval_losses": timer.losses, "log_every": args.log_every,
        "train_pairs_within_max_length": sum(
            split["pairs"] for split in stream["manifest"]["splits"].values()),
        "bleu": round(float(bleu), 2), "bleu_split": "newstest2014",
        "bleu_sentences": len(hyps), "bleu_beam_size": 4,
        "bleu_signature": signature,
        "decode_seconds": round(decode_seconds, 2),
        "sample": {"source": test_src[0], "hypothesis": hyps[0]} if hyps else None,
        "wall_seconds": round(time.perf_counter() - wall0, 1),
    }


def _child_argv(args, name, out):
    argv = [sys.executable, os.path.abspath(__file__), "--child", name,
            "--child-out", str(out), "--workdir", str(args.workdir),
            "--steps", str(args.steps), "--log-every", str(args.log_every),
            "--warmup-steps", str(args.warmup_steps),
            "--tokens-per-batch", str(args.tokens_per_batch),
            "--decode-sentences", str(args.decode_sentences),
            "--vocabulary-size", str(args.vocabulary_size)]
    if args.tiny:
        argv.append("--tiny")
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    return argv


def run_parent(args, argv):
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and not args.allow_cpu:
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return NO_GPU_EXIT
    from keras_trm.data import sample_lines
    from keras_trm.text import learn_sentencepiece
    from keras_trm.utils import write_json

    wall0 = time.perf_counter()
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="gpu_check_")
        args.workdir = tmp.name
    workdir = pathlib.Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    splits, corpora = _load_data(args, workdir)
    spm = workdir / "spm.model"
    if not spm.is_file():
        sentences = sample_lines([c[1] for c in corpora] + [c[2] for c in corpora], 0)
        print(f"learning a joint SentencePiece BPE ({args.vocabulary_size}) from "
              f"{len(sentences):,} WMT14 training sentences ...", flush=True)
        learn_sentencepiece(sentences, args.vocabulary_size, spm, sample_size=0)
        del sentences
    result = {
        "command": shlex.join([sys.executable] + argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": _host_info(),
        "on_gpu": bool(gpus),
        "model": "transformer_base" + (" (tiny overrides)" if args.tiny else ""),
        "model_overrides": args.model,
        "strategy": "MirroredStrategy (all visible GPUs; 2 logical CPU "
                    "devices without one)",
        "train_split": "+".join(c[0] for c in corpora),
        "train_lines_per_corpus_limit": args.model["train_pairs"] or None,
        "bleu_split": splits.names["test"],
        "vocabulary": f"joint SentencePiece BPE {args.vocabulary_size}",
        "optimizer": "paper_adam + NoamSchedule(d_model, warmup 4000), "
                     "LabelSmoothedCrossEntropy(0.1)",
        "configs": {},
    }
    failed = False
    for name in args.configs:
        cfg = CONFIGS[name]
        if cfg["precision"] == "mixed_float16" and not gpus:
            result["configs"][name] = {
                "config": name, "skipped": True,
                "reason": "no GPU: mixed_float16 (float16 matmuls) training on "
                          "a CPU is not a supported setup; it runs on GPUs only"}
            print(f"[{name}] skipped (no GPU)", flush=True)
            continue
        out = workdir / f"{name}.json"
        print(f"[{name}] child process ...", flush=True)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(_child_argv(args, name, out), text=True,
                                  capture_output=True, timeout=args.timeout)
            rc, log = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, log = "timeout", f"{e.stdout or ''}{e.stderr or ''}"
            log = log if isinstance(log, str) else str(log)
        if rc == 0 and out.is_file():
            entry = json.loads(out.read_text())
            entry["process_wall_seconds"] = round(time.perf_counter() - t0, 1)
            print(f"[{name}] {entry['steps_per_second']} steps/s, "
                  f"{entry['target_tokens_per_second']} tokens/s, loss "
                  f"{entry['final_loss']:.3f}, BLEU {entry['bleu']}", flush=True)
        else:
            failed = True
            entry = {"config": name, "error": f"child exit {rc}",
                     "log_tail": log[-4000:]}
            print(f"[{name}] FAILED ({rc}):\n{log[-2000:]}", file=sys.stderr,
                  flush=True)
        result["configs"][name] = entry
    result["wall_seconds"] = round(time.perf_counter() - wall0, 1)
    path = write_json(args.out, result)
    print(f"wrote {path}", flush=True)
    if tmp is not None:
        tmp.cleanup()
    return 1 if failed else 0


def main(argv=None):
    argv = sys.argv if argv is None else [sys.argv[0]] + list(argv)
    args = parse_args(argv[1:])
    if args.child:
        from keras_trm.utils import write_json

        write_json(args.child_out, run_child(args))
        return 0
    return run_parent(args, argv)


if __name__ == "__main__":
    sys.exit(main())
