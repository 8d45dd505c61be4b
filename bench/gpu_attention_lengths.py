"""Where the fused attention op pays: keras_trm's MultiHeadAttention, one
training step's forward and backward (gradients of the weights and the
input), through ``keras.ops.dot_product_attention`` (cuDNN under JAX on a
GPU, SDPA under PyTorch) against the einsum path, by key length.

Sets ``MultiHeadAttention.fused_min_key_length`` (issue #39: at the
paper's 32-token batches the einsums trained transformer_base 1.10x faster
than cuDNN on an H200). One backend per process:

    python bench/gpu_attention_lengths.py --backend jax --out a.json
    python bench/gpu_attention_lengths.py --backend torch --out b.json
    python bench/gpu_attention_lengths.py --tiny --backend jax   # CPU, seconds

Batches hold about ``--tokens`` tokens (rows = tokens // T), keys padded
at random lengths in [T/2, T]; mixed bf16 on a GPU (float32 on CPU);
d_model 512, 8 heads (transformer_base's attention). The median of
``--steps`` timed steps after 3 untimed ones, synchronised each. Also
the largest output difference between the two paths (same weights).
"""
import argparse
import json
import os
import platform
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("jax", "torch"), default="jax")
    p.add_argument("--lengths", default="16,32,64,128,256,512,1024")
    p.add_argument("--tokens", type=int, default=25000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: small shapes")
    p.add_argument("--time-limit", type=float, default=120.0, help="seconds; later lengths are skipped")
    p.add_argument("--out")
    args = p.parse_args(argv)
    os.environ["KERAS_BACKEND"] = args.backend
    import keras
    import numpy as np

    from keras_trm.layers import MultiHeadAttention

    t0 = time.time()
    if args.tiny:
        args.lengths, args.tokens, args.steps = "8,16,32", 256, 3
    d_model, heads = (64, 4) if args.tiny else (512, 8)
    if args.backend == "jax":
        import jax
        gpu = jax.devices()[0].platform == "gpu"
        versions = {"jax": jax.__version__}
    else:
        import torch
        gpu = torch.cuda.is_available()
        versions = {"torch": torch.__version__}
    keras.mixed_precision.set_global_policy("mixed_bfloat16" if gpu else "float32")
    layer = MultiHeadAttention(num_heads=heads, key_dim=d_model // heads)
    rng = np.random.default_rng(0)
    rows = []
    for T in [int(t) for t in args.lengths.split(",")]:
        if time.time() - t0 > args.time_limit:
            rows.append({"key_length": T, "skipped": f"--time-limit {args.time_limit}"})
            continue
        B = max(1, args.tokens // T)
        x = rng.standard_normal((B, T, d_model)).astype("float32")
        lengths = rng.integers(T // 2, T + 1, size=B)
        mask = (np.arange(T)[None, :] < lengths[:, None])[:, None, :]  # (B, 1, T)
        for causal in (False, True):
            row = {"key_length": T, "rows": B, "causal": causal}
            outs = {}
            for path, min_len in (("fused", 0), ("einsum", 10 ** 9)):
                layer.fused_min_key_length = min_len
                step, out = _step(args.backend, layer, x, mask, causal)
                for _ in range(3):
                    step()
                times = []
                for _ in range(args.steps):
                    s = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - s)
                row[f"{path}_ms"] = round(1000 * float(np.median(times)), 3)
                outs[path] = out()
            # Padded query rows differ (uniform vs masked softmax): compare kept rows.
            keep = mask[:, 0, :]
            row["max_abs_diff_kept_rows"] = float(np.abs(outs["fused"] - outs["einsum"])[keep].max())
            row["einsum_speedup"] = round(row["fused_ms"] / row["einsum_ms"], 3)
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {
        "benchmark": "MultiHeadAttention forward+backward, fused op vs einsums, by key length",
        "command": "python bench/gpu_attention_lengths.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "backend": args.backend, "gpu": gpu, "device": _device(args.backend),
        "versions": dict(versions, keras=keras.__version__, python=platform.python_version()),
        "d_model": d_model, "num_heads": heads, "tokens_per_batch": args.tokens,
        "steps": args.steps, "precision": keras.mixed_precision.global_policy().name,
        "rows": rows, "wall_seconds": round(time.time() - t0, 1),
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _step(backend, layer, x, mask, causal):
    """A synchronised training step of the layer; and its last output (numpy)."""
    import keras
    import numpy as np
    if backend == "jax":
        import jax
        import jax.numpy as jnp
        layer(x[:1], x[:1])  # build
        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]
        xj, mj = jnp.asarray(x), jnp.asarray(mask)

        def loss(tv, xin):
            out, _ = layer.stateless_call(tv, non_trainable, xin, xin, attention_mask=mj,
                                          use_causal_mask=causal, training=True)
            return jnp.sum(out.astype("float32")), out

        grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
        last = {}

        def step():
            (_, out), g = grad(trainable, xj)
            jax.block_until_ready(g)
            last["out"] = out
        return step, lambda: np.asarray(last["out"].astype("float32"))
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    xt = torch.tensor(x, device=dev, requires_grad=True)
    mt = torch.tensor(mask, device=dev)
    layer(xt[:1], xt[:1])
    last = {}

    def step():
        out = layer(xt, xt, attention_mask=mt, use_causal_mask=causal, training=True)
        out.float().sum().backward()
        if dev == "cuda":
            torch.cuda.synchronize()
        last["out"] = out
    return step, lambda: keras.ops.convert_to_numpy(keras.ops.cast(last["out"], "float32"))


def _device(backend):
    try:
        if backend == "jax":
            import jax
            return jax.devices()[0].device_kind
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception as e:  # noqa: BLE001 - a label only
        return repr(e)


if __name__ == "__main__":
    main()
