"""Benchmark: Multi30k training throughput, CPU use and decoding speed
(writes JSON).

    python bench/bench_translation.py [--model runs/multi30k/model.keras]
        [--vocab runs/multi30k/vocab_8000.txt] [--out bench/results/translation.json]
        [--skip-training] [--skip-epoch] [--skip-decoding] [--epoch-steps N]

1. Training tokens/s, measured in the same run for
   - keras_trm: transformer(N=3, d_model=256, d_ff=1024, h=4), tied
     embeddings, token-count batches (4096 tokens/side) with length buckets,
     in float32 and, on a CPU with native bfloat16 (avx512_bf16 / amx_bf16),
     under mixed_bfloat16 -- both on the same batches, timed in alternating
     slices (``--rounds``) so that other load falls on both alike;
   - keras-hub: the same architecture assembled from keras-hub layers the way
     the keras-io / TF tutorials do (TokenAndPositionEmbedding + 3
     TransformerEncoder + 3 TransformerDecoder + Dense), every sentence
     padded to 40 tokens, batch 64, no tying.
   Both count *real* (non-padding) target tokens per second of training
   steps, after warm-up steps that are not timed.
2. CPU use of one training epoch of the job's model (``--epoch-steps``
   batches; 0 = the whole epoch), each in a fresh child process, with
   glibc's default malloc settings and with the entry points' allocator
   tunables (``keras_trm._runtime``): user / sys / idle share of the CPUs
   available, minor page faults.
3. Decoding sentences/s on test_2016_flickr with the trained model: greedy
   and beam 4, each with and without the key/value cache (without = the
   decoder re-run over the whole prefix at every step).
"""

import argparse
import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_trm  # noqa: E402,F401
from keras_trm.utils import write_json  # noqa: E402
from keras_trm.data import (  # noqa: E402
    TokenBatches,
    load_multi30k,
    prepare_translation_data,
    read_prepared,
)
from keras_trm.decoding import beam_search, greedy_search  # noqa: E402
from keras_trm.jobs.translation import token_encoder, vocabulary_sha256  # noqa: E402
from keras_trm.models import transformer  # noqa: E402
from keras_trm.text import END_ID, START_ID, TextTokenizer, load_vocabulary  # noqa: E402
from keras_trm import _runtime  # noqa: E402
from keras_trm.training import (  # noqa: E402
    LabelSmoothedCrossEntropy,
    NoamSchedule,
    cpu_has_native_bf16,
    paper_adam,
)

D_MODEL, D_FF, HEADS, LAYERS = 256, 1024, 4, 3
BOUNDARIES = (8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)


def job_batches(tokenizer, src, tgt):
    """The translation job's batches of the pairs (its prepared format and
    loader: pairs over 128 ids dropped, 4096 tokens a side, one seeded
    epoch) as a tf.data.Dataset."""
    import tempfile

    folder = pathlib.Path(tempfile.mkdtemp(prefix="bench_translation_"))
    (folder / "train.src").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    (folder / "train.tgt").write_text("".join(s + "\n" for s in tgt), encoding="utf-8")
    prepare_translation_data(
        folder / "prepared", [("train", folder / "train.src", folder / "train.tgt")],
        token_encoder(tokenizer), tokenizer.vocabulary_size,
        vocabulary_sha256(tokenizer), max_train_length=128)
    split = read_prepared(folder / "prepared").splits["train"]
    batches = TokenBatches(split, 4096, BOUNDARIES, seed=0, repeat=False)
    spec = tf.TensorSpec((None, None), tf.int32)
    return tf.data.Dataset.from_generator(
        lambda: (batches[i] for i in range(len(batches))),
        output_signature=({"encoder_tokens": spec, "decoder_tokens": spec}, spec))


def encode(tokenizer, sentences, prefix):
    rows = tokenizer.tokenize(tf.constant(sentences)).to_list()
    return [prefix + r + [END_ID] for r in rows]


def time_fit(model, dataset, steps, warmup):
    it = iter(dataset.repeat())
    batches = [next(it) for _ in range(warmup + steps)]
    real = sum(int(np.count_nonzero(lab)) for _, lab in batches[warmup:])
    warm = tf.data.Dataset.from_generator(
        lambda: iter(batches[:warmup]), output_signature=dataset.element_spec)
    timed = tf.data.Dataset.from_generator(
        lambda: iter(batches[warmup:]), output_signature=dataset.element_spec)
    model.fit(warm, epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(timed, epochs=1, verbose=0)
    seconds = time.perf_counter() - start
    return {"steps": steps, "real_target_tokens": real, "seconds": round(seconds, 2),
            "real_target_tokens_per_second": round(real / seconds, 1)}


def ours_model(vocab, policy):
    """transformer(N=3, d_model=256) compiled as the job does, built under
    the Keras dtype ``policy`` (the global policy is restored after)."""
    before = keras.config.dtype_policy().name
    keras.mixed_precision.set_global_policy(policy)
    try:
        model = transformer(vocab, num_layers=LAYERS, d_model=D_MODEL,
                            num_heads=HEADS, d_ff=D_FF, max_sequence_length=128)
        model.compile(optimizer=paper_adam(NoamSchedule(D_MODEL, 400, 0.6)),
                      loss=LabelSmoothedCrossEntropy(0.1))
    finally:
        keras.mixed_precision.set_global_policy(before)
    return model


def time_interleaved(models, dataset, steps, warmup, rounds):
    """Real target tokens/s of several models on the *same* batches, timed
    in ``rounds`` alternating slices (so that load from other processes on a
    shared machine falls on all of them alike)."""
    it = iter(dataset.repeat())
    warm = [next(it) for _ in range(warmup)]
    timed = [next(it) for _ in range(steps)]
    spec = dataset.element_spec

    def as_ds(rows):
        return tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=spec)

    for model in models.values():
        model.fit(as_ds(warm), epochs=1, verbose=0)
    seconds = dict.fromkeys(models, 0.0)
    per = -(-steps // rounds)
    for r in range(rounds):
        chunk = timed[r * per:(r + 1) * per]
        if not chunk:
            break
        for name, model in models.items():
            start = time.perf_counter()
            model.fit(as_ds(chunk), epochs=1, verbose=0)
            seconds[name] += time.perf_counter() - start
    real = sum(int(np.count_nonzero(lab)) for _, lab in timed)
    return {name: {"steps": steps, "real_target_tokens": real,
                   "seconds": round(sec, 2),
                   "real_target_tokens_per_second": round(real / sec, 1)}
            for name, sec in seconds.items()}


def _peak_rss_mib():
    """This process's peak RSS (VmHWM). Not getrusage's ru_maxrss: Linux
    carries that over from the parent through fork and exec, so a child of
    a large parent reports the parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024)
    return None


def epoch_child(vocab_path, policy, max_steps):
    """Runs in a child process: one training epoch (or ``max_steps``
    batches) of the Multi30k job's model; prints the CPU use of that epoch
    (getrusage: user, sys, minor page faults) as JSON."""
    tokenizer = TextTokenizer(load_vocabulary(vocab_path))
    src, tgt = load_multi30k("train")
    ds = job_batches(tokenizer, src, tgt)
    model = ours_model(tokenizer.vocabulary_size, policy)
    model.fit(ds.take(3), epochs=1, verbose=0)  # trace outside the timing
    if max_steps:
        ds = ds.take(max_steps)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    model.fit(ds, epochs=1, verbose=0)
    r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
    user, sys_ = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    cpus = len(os.sched_getaffinity(0))
    print(json.dumps({
        "policy": policy, "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "steps": max_steps or "epoch", "wall_seconds": round(wall, 1),
        "user_seconds": round(user, 1), "sys_seconds": round(sys_, 1),
        "cpu_percent": round(100 * (user + sys_) / wall, 1),
        "share_of_cpus": {"user": round(user / (wall * cpus), 3),
                          "sys": round(sys_ / (wall * cpus), 3),
                          "idle": round(1 - (user + sys_) / (wall * cpus), 3)},
        "sys_fraction_of_cpu_time": round(sys_ / max(user + sys_, 1e-9), 3),
        "minor_page_faults": r1.ru_minflt - r0.ru_minflt,
        "voluntary_context_switches": r1.ru_nvcsw - r0.ru_nvcsw,
        "involuntary_context_switches": r1.ru_nivcsw - r0.ru_nivcsw,
        "max_rss_mib": _peak_rss_mib(),
    }))


def bench_epoch_cpu(vocab_path, policies, max_steps):
    """The epoch child for each dtype policy in ``policies``, without and
    with the allocator tunables of the entry points
    (``keras_trm._runtime.ALLOCATOR_TUNABLES``), one after the other; with
    several policies also the wall-time ratio of each to the first, with
    the tunables."""
    out = {}
    for policy in policies:
        for label, tunables in (("glibc_default", None),
                                ("allocator_tunables",
                                 _runtime.ALLOCATOR_TUNABLES)):
            env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
            if tunables:
                env["GLIBC_TUNABLES"] = tunables
            proc = subprocess.run(
                [sys.executable, __file__, "--epoch-child", "--vocab",
                 vocab_path, "--precision", policy, "--epoch-steps",
                 str(max_steps)],
                env=env, capture_output=True, text=True, timeout=1800)
            if proc.returncode:
                raise RuntimeError(proc.stderr[-2000:])
            key = label if len(policies) == 1 else f"{policy}/{label}"
            out[key] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(key, out[key], flush=True)
    if len(policies) > 1:
        base = out[f"{policies[0]}/allocator_tunables"]["wall_seconds"]
        out["speedup_vs_" + policies[0]] = {
            policy: round(base / out[f"{policy}/allocator_tunables"]
                          ["wall_seconds"], 2) for policy in policies[1:]}
    return out


def keras_hub_model(vocab_size, length):
    import keras_hub

    enc_in = keras.Input((None,), dtype="int32", name="encoder_tokens")
    dec_in = keras.Input((None,), dtype="int32", name="decoder_tokens")
    x = keras_hub.layers.TokenAndPositionEmbedding(vocab_size, length, D_MODEL,
                                                   mask_zero=True)(enc_in)
    for _ in range(LAYERS):
        x = keras_hub.layers.TransformerEncoder(D_FF, HEADS, dropout=0.1)(x)
    y = keras_hub.layers.TokenAndPositionEmbedding(vocab_size, length, D_MODEL,
                                                   mask_zero=True)(dec_in)
    for _ in range(LAYERS):
        y = keras_hub.layers.TransformerDecoder(D_FF, HEADS, dropout=0.1)(y, x)
    logits = keras.layers.Dense(vocab_size)(y)
    return keras.Model({"encoder_tokens": enc_in, "decoder_tokens": dec_in}, logits)


def bench_training(tokenizer, steps, warmup, rounds=3):
    src, tgt = load_multi30k("train")
    S = encode(tokenizer, src, [])
    T = encode(tokenizer, tgt, [START_ID])
    vocab = tokenizer.vocabulary_size
    results = {}

    ds = job_batches(tokenizer, src, tgt)
    policies = ["float32"] + (["mixed_bfloat16"] if cpu_has_native_bf16() else [])
    models = {p: ours_model(vocab, p) for p in policies}
    timed = time_interleaved(models, ds, steps, warmup, rounds)
    results["keras_trm"] = {"parameters": models["float32"].count_params(),
                            "batching": "token buckets, 4096 tokens/side",
                            "precision": "float32", **timed["float32"]}
    if "mixed_bfloat16" in timed:
        results["keras_trm_bf16"] = {"precision": "mixed_bfloat16",
                                     **timed["mixed_bfloat16"]}
        results["bf16_vs_float32_real_tokens_per_second"] = round(
            timed["mixed_bfloat16"]["real_target_tokens_per_second"]
            / timed["float32"]["real_target_tokens_per_second"], 2)
    results["cpu_native_bf16"] = cpu_has_native_bf16()
    del models

    length = 40
    keep = [i for i in range(len(S)) if len(S[i]) <= length and len(T[i]) <= length + 1]

    def pad(rows):
        out = np.zeros((len(rows), length), "int32")
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return out

    enc = pad([S[i] for i in keep])
    dec = pad([T[i][:-1] for i in keep])
    lab = pad([T[i][1:] for i in keep])
    hub_ds = tf.data.Dataset.from_tensor_slices(
        ({"encoder_tokens": enc, "decoder_tokens": dec}, lab)).shuffle(4096, seed=0).batch(64)
    hub = keras_hub_model(vocab, length)
    hub.compile(optimizer=keras.optimizers.Adam(5e-4),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True, ignore_class=0),
                jit_compile=True)
    hub_steps = max(steps * 2, 20)
    results["keras_hub"] = {"parameters": hub.count_params(),
                            "batching": "padded to 40 tokens, batch 64",
                            **time_fit(hub, hub_ds, hub_steps, warmup)}
    results["speedup_real_tokens_per_second"] = round(
        results["keras_trm"]["real_target_tokens_per_second"]
        / results["keras_hub"]["real_target_tokens_per_second"], 2)
    if "keras_trm_bf16" in results:
        results["bf16_speedup_vs_keras_hub"] = round(
            results["keras_trm_bf16"]["real_target_tokens_per_second"]
            / results["keras_hub"]["real_target_tokens_per_second"], 2)
    return results


def bench_decoding(model, tokenizer, sentences, batch_size):
    batches = []
    for start in range(0, len(sentences), batch_size):
        rows = encode(tokenizer, sentences[start:start + batch_size], [])
        width = max(len(r) for r in rows)
        batches.append(np.array([r + [0] * (width - len(r)) for r in rows], "int32"))
    spec = tf.TensorSpec([None, None], tf.int32)
    variants = {
        "greedy_cache": lambda x: greedy_search(model, x),
        "greedy_no_cache": lambda x: greedy_search(model, x, use_cache=False),
        "beam4_cache": lambda x: beam_search(model, x, 4, 0.6),
        "beam4_no_cache": lambda x: beam_search(model, x, 4, 0.6, use_cache=False),
    }
    results = {}
    for name, fn in variants.items():
        fn = tf.function(fn, input_signature=[spec])
        fn(batches[0][:2])  # trace
        start = time.perf_counter()
        for batch in batches:
            fn(batch)
        seconds = time.perf_counter() - start
        results[name] = {"sentences": len(sentences), "seconds": round(seconds, 2),
                         "sentences_per_second": round(len(sentences) / seconds, 1)}
        print(name, results[name], flush=True)
    ratios = {
        "beam4_cache_vs_greedy_no_cache": results["beam4_cache"]["sentences_per_second"]
        / results["greedy_no_cache"]["sentences_per_second"],
        "greedy_cache_vs_no_cache": results["greedy_cache"]["sentences_per_second"]
        / results["greedy_no_cache"]["sentences_per_second"],
        "beam4_cache_vs_no_cache": results["beam4_cache"]["sentences_per_second"]
        / results["beam4_no_cache"]["sentences_per_second"],
    }
    results["ratios"] = {k: round(v, 2) for k, v in ratios.items()}
    return results


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="runs/multi30k/model.keras")
    parser.add_argument("--vocab", default="runs/multi30k/vocab_8000.txt")
    parser.add_argument("--out", default="bench/results/translation.json")
    parser.add_argument("--train-steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--decode-sentences", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating timed slices, float32 vs bf16")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-decoding", action="store_true")
    parser.add_argument("--skip-epoch", action="store_true")
    parser.add_argument("--epoch-steps", type=int, default=0,
                        help="CPU-share run: batches (0: a full epoch)")
    parser.add_argument("--precision", default="float32",
                        help="CPU-share run: Keras dtype policies, comma-"
                             "separated (e.g. float32,mixed_bfloat16)")
    parser.add_argument("--epoch-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.epoch_child:
        return epoch_child(args.vocab, args.precision, args.epoch_steps)

    tokenizer = TextTokenizer(load_vocabulary(args.vocab))
    report = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "python": sys.version.split()[0], "tensorflow": tf.__version__,
                          "keras": keras.__version__}}
    if not args.skip_training:
        report["training"] = bench_training(tokenizer, args.train_steps,
                                            args.warmup_steps, args.rounds)
        print(json.dumps(report["training"], indent=1), flush=True)
    if not args.skip_epoch:
        report["epoch_cpu"] = bench_epoch_cpu(
            args.vocab, args.precision.split(","), args.epoch_steps)
    if not args.skip_decoding:
        model = keras.models.load_model(args.model)
        test_src, _ = load_multi30k("test_2016_flickr")
        report["decoding"] = bench_decoding(
            model, tokenizer, test_src[: args.decode_sentences], args.batch_size)
    write_json(args.out, report)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
