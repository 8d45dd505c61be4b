"""Training throughput of transformer_base / transformer_big on one GPU, against
PyTorch's ``torch.nn.Transformer`` + ``torch.compile`` on the same batches.

    python bench/gpu_train.py [--backend jax|torch] [--models transformer_base,transformer_big]
    python bench/gpu_train.py --tiny --backend jax          # CPU smoke run, seconds
    python bench/gpu_train.py --prepare-lengths wmt         # needs TensorFlow (once)

Needs Keras, one Keras backend (JAX by default, or PyTorch), PyTorch for the
baseline, and numpy; TensorFlow is never imported (``tensorflow_imported`` in
the JSON says so), except by ``--prepare-lengths``.

Batches (Vaswani et al. 2017, §5.1): about ``--tokens-per-batch`` (25,000)
padded source and as many target tokens per step. Each pair of real subword
lengths (``--lengths`` .npz, written by ``--prepare-lengths``) goes to the
smallest bucket width L of ``BOUNDARIES`` (those of keras_trm.data.batching)
that holds source + END and START + target; a bucket's batches hold
``tokens_per_batch // L`` pairs padded to (batch, L); batches are shuffled.
Token ids are random (synthetic); only the lengths are real. Each new shape
compiles once per framework, so the timed steps are the first ``--steps``
shuffled batches whose width is one of the ``--max-shapes`` widths that hold
the most target tokens (``coverage``: their share of the corpus' target tokens).

FLOPs: matmul FLOPs only, training = 3 x forward (backward = 2 x forward).
Per sentence pair with source width S, target width T, d = d_model,
f = d_ff, N layers, V vocabulary (a multiply-add is 2 FLOPs):
    encoder  N * S * (8 d^2 + 4 d f + 4 S d)       q,k,v,o; FFN; QK^T and AV
    decoder  N * (T * (8 d^2 + 4 T d)              self-attention
                  + 4 d^2 (T + S) + 4 T S d        cross-attention (q,o on T; k,v on S)
                  + 4 T d f)                       FFN
    output   2 T d V                               logits
``tflops_per_s`` counts padded widths (the work the step executes);
``useful_tflops_per_s`` counts each pair's real lengths (MFU-style), and
``fraction_of_peak`` divides it by the GPU's bf16 dense peak (``PEAK_BF16``)
and ``fraction_of_matmul`` by a large bf16 matmul timed in the same run.
Tokens/s count non-padding target tokens (target + END); padding apart.

Timing: the headline (``ms_per_step_mean``, tokens/s, FLOP/s) is the
timed batches run as a training loop runs them, total time over steps:
ours in one ``model.fit`` call (the state stays on the device between
steps, nothing waits for a step), torch without a ``loss.item()`` per step.
``ms_per_step_median_synced`` times ``--synced-steps`` steps one by one,
each waited for (ours through ``train_on_batch``, which also copies every
variable back per call: the first model only, as it compiles again).
``--profile-steps N`` then traces N steps and reports device time by
kernel (``profile``: matmul kernels apart, the busy fraction, the top 30);
under JAX also by part of the model (``profile.by_part``: attention,
feed-forward, LayerNorm, dropout, embedding, logits, loss, optimizer, each
split into matmul and other kernels, forward and backward), for which XLA
dumps the step's optimized HLO (bench/step_parts.py; ``--trace-dir`` keeps
the trace and that HLO).

Lengths without TensorFlow: ``--prepare-lengths`` writes the length pairs
(no text) to bench/results/lengths_{multi30k,wmt}.npz: Multi30k train with a
joint WordPiece of 8,000 (the Multi30k job's vocabulary when the file was
written), the WMT news pool with a joint SentencePiece BPE of 37,000 (the
paper's size) learned on 0.1M sentences of the offline WMT training text, so
it likely splits words less than the paper's BPE of 4.5M pairs. Without such
a file, whitespace-token lengths times ``WHITESPACE_FACTOR`` are used.
"""

import argparse
import datetime
import gc
import gzip
import json
import os
import pathlib
import platform
import random
import shutil
import subprocess
import sys
import time

import numpy as np

if __package__ in (None, ""):  # python bench/gpu_train.py: import bench/ as a package
    sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])
from bench import step_parts  # noqa: E402  (the standard library only)

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BOUNDARIES = (8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256)
START, END, FIRST_WORD = 2, 3, 4
CORPORA = {  # name: (directory under the data dir, file stems of the pairs)
    "multi30k": ("multi30k", ["train"]),
    "wmt": ("wmt14_en_de", ["newstest2008-2022-pool"]),
}
VOCAB_TEXT = {"wmt": ["europarl-v7.de-en.first20000", "newstest2008-2022-pool"]}
WHITESPACE_FACTOR = {"multi30k": 1.28, "wmt": 1.35}  # subwords per word, see above
# bf16 dense (no sparsity) Tensor Core peak in TFLOP/s; NVIDIA's datasheets
# print the 2:4-sparse figure, twice this. First matching name wins.
PEAK_BF16 = [
    ("H100 PCIe", 756, "NVIDIA H100 datasheet: BF16 1,513 TFLOPS with sparsity (PCIe)"),
    ("H100 NVL", 835, "NVIDIA H100 datasheet: BF16 1,671 TFLOPS with sparsity (NVL)"),
    ("H200 NVL", 835, "NVIDIA H200 datasheet: BF16 1,671 TFLOPS with sparsity (NVL)"),
    ("H200", 989, "NVIDIA H200 datasheet: BF16 1,979 TFLOPS with sparsity (SXM)"),
    ("H100", 989, "NVIDIA H100 datasheet: BF16 1,979 TFLOPS with sparsity (SXM)"),
    ("A100", 312, "NVIDIA A100 datasheet: BF16 312 TFLOPS dense (624 with sparsity)"),
    ("L40S", 362, "NVIDIA L40S datasheet: BF16 362 TFLOPS dense (733 with sparsity)"),
    ("L4", 121, "NVIDIA L4 datasheet: BF16 242 TFLOPS with sparsity"),
    ("A10", 125, "NVIDIA A10 datasheet: BF16 125 TFLOPS dense (250 with sparsity)"),
]
MODELS = {  # keras_trm.models' presets (checked when built), and a tiny one
    "transformer_base": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, dropout_rate=0.1),
    "transformer_big": dict(num_layers=6, d_model=1024, num_heads=16, d_ff=4096, dropout_rate=0.3),
    "tiny": dict(num_layers=2, d_model=32, num_heads=2, d_ff=64, dropout_rate=0.1),
}


# -- lengths and batches --------------------------------------------------

def _read_gz(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _pairs(data_dir, stems):
    src, tgt = [], []
    for stem in stems:
        src += _read_gz(data_dir / f"{stem}.en.gz")
        tgt += _read_gz(data_dir / f"{stem}.de.gz")
    return src, tgt


def prepare_lengths(name, data_dir, out):
    """Tokenizes a corpus with the project's tokenizer (TensorFlow) and
    writes only the (source, target) subword counts, without END."""
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import tempfile

    from keras_trm import text

    folder, stems = CORPORA[name]
    src, tgt = _pairs(data_dir / folder, stems)
    if name == "multi30k":
        tokenizer = text.TextTokenizer(text.learn_vocabulary(src + tgt, 8000))
        kind = "joint WordPiece 8000 (keras_trm.text.learn_vocabulary)"
    else:
        vocab_src, vocab_tgt = _pairs(data_dir / folder, VOCAB_TEXT[name])
        model = text.learn_sentencepiece(vocab_src + vocab_tgt, 37000,
                                         pathlib.Path(tempfile.mkdtemp()) / "bpe.model")
        tokenizer = text.SentencePieceTokenizer(model)
        kind = "joint SentencePiece BPE 37000 (keras_trm.text.learn_sentencepiece)"

    def count(lines):
        return np.concatenate([tokenizer.tokenize(lines[i:i + 4096]).row_lengths().numpy()
                               for i in range(0, len(lines), 4096)]).astype(np.uint16)

    s, t = count(src), count(tgt)
    words = sum(len(x.split()) for x in src + tgt)
    meta = dict(corpus=f"{folder}/{'+'.join(stems)}", tokenizer=kind, vocabulary_size=tokenizer.vocabulary_size,
                subwords_per_whitespace_word=round(float(s.sum() + t.sum()) / words, 3))
    np.savez_compressed(out, source=s, target=t, meta=json.dumps(meta))
    print(json.dumps({**meta, "pairs": len(s), "file": str(out)}))


def load_lengths(path, corpus, data_dir):
    """(source, target) int arrays of subword counts, and where they came from."""
    if path and pathlib.Path(path).is_file():
        f = np.load(path)
        return (f["source"].astype(np.int64), f["target"].astype(np.int64),
                {"file": str(path), **json.loads(str(f["meta"]))})
    folder, stems = CORPORA[corpus]
    src, tgt = _pairs(data_dir / folder, stems)
    factor = WHITESPACE_FACTOR[corpus]

    def count(lines):
        return np.array([max(1, round(len(x.split()) * factor)) for x in lines])

    return count(src), count(tgt), {"corpus": f"{folder}/{'+'.join(stems)}",
                                    "tokenizer": f"whitespace words x {factor}"}


def plan_batches(src, tgt, tokens_per_batch, boundaries, seed):
    """Shuffled list of (width, pair indices): each pair in the smallest
    bucket that holds src + END and START + tgt; full batches only."""
    width = np.maximum(src, tgt) + 1
    keep = width <= boundaries[-1]
    bucket = np.searchsorted(boundaries, width)
    rng = np.random.default_rng(seed)
    batches = []
    for b, L in enumerate(boundaries):
        idx = rng.permutation(np.flatnonzero(keep & (bucket == b)))
        size = tokens_per_batch // L
        batches += [(L, idx[i:i + size]) for i in range(0, len(idx) - size + 1, size)]
    order = rng.permutation(len(batches))
    return [batches[i] for i in order], int((~keep).sum())


def pick_steps(batches, tgt, steps, max_shapes):
    """The first ``steps`` batches whose width is one of the ``max_shapes``
    widths holding the most target tokens; those widths; their token share."""
    share = {}
    for L, idx in batches:
        share[L] = share.get(L, 0) + int(tgt[idx].sum())
    shapes = sorted(sorted(share, key=share.get)[-max_shapes:])
    picked = [(L, idx) for L, idx in batches if L in shapes][:steps]
    return picked, shapes, sum(share[L] for L in shapes) / sum(share.values())


def make_batch(rng, L, src_len, tgt_len, vocab):
    """Random ids with real lengths: source ids + END; START + target ids
    (decoder input); target ids + END (labels); 0-padded to width L."""
    B = len(src_len)
    pos = np.arange(L)[None, :]
    ids = rng.integers(FIRST_WORD, vocab, (3, B, L), dtype=np.int32)
    src = np.where(pos < src_len[:, None], ids[0], np.where(pos == src_len[:, None], END, 0))
    lab = np.where(pos < tgt_len[:, None], ids[1], np.where(pos == tgt_len[:, None], END, 0))
    dec = np.where(pos == 0, START, np.where(pos <= tgt_len[:, None], np.roll(lab, 1, 1), 0))
    return dict(L=L, src=src.astype(np.int32), dec=dec.astype(np.int32),
                lab=lab.astype(np.int32), src_len=src_len + 1, tgt_len=tgt_len + 1)


def train_flops(S, T, cfg, vocab):
    """Matmul FLOPs of one training step (3 x forward; see the docstring)."""
    S, T = np.asarray(S, np.float64), np.asarray(T, np.float64)
    d, f, N = cfg["d_model"], cfg["d_ff"], cfg["num_layers"]
    enc = N * S * (8 * d * d + 4 * d * f + 4 * S * d)
    dec = N * (T * (8 * d * d + 4 * T * d) + 4 * d * d * (T + S) + 4 * T * S * d + 4 * T * d * f)
    return float(3 * np.sum(enc + dec + 2 * T * d * vocab))


# -- timing ---------------------------------------------------------------

def _seconds(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(runner, batches, warmup, deadline, synced_steps):
    """``runner`` = (step, run): ``step(b)`` trains on one batch and waits
    for its loss; ``run(bs)`` trains on a list of batches the way a training
    loop does (Keras: ``model.fit``; torch: no sync between steps) and
    returns their losses once the last one is done. The first batch of each
    shape compiles (timed one by one), then ``warmup`` more steps, then all
    batches pipelined (the headline: total time / steps), then
    ``synced_steps`` batches one by one (each waited for: per-step times).
    Returns the pipelined seconds, batches and losses, the synced times and
    the compile seconds."""
    step, run = runner
    first, losses, firsts = {}, [], {}
    for b in batches:
        firsts.setdefault(b["L"], b)
    for b in firsts.values():
        first[b["L"]] = _seconds(lambda: losses.extend(run([b])))  # noqa: B023
    losses.extend(run(batches[:warmup]))
    total = _seconds(lambda: losses.extend(run(batches)))
    synced = []
    for b in batches[:synced_steps]:
        if time.monotonic() > deadline:
            break
        synced.append(_seconds(lambda: losses.append(step(b))))  # noqa: B023
    med = np.median(synced) if synced else total / len(batches)
    compile_s = sum(max(0.0, first[L] - med) for L in first)
    return total, batches, losses, synced, compile_s


def summarize(total, done, losses, synced, compile_s, cfg, vocab, peak, ceiling, memory):
    tgt = sum(int(b["tgt_len"].sum()) for b in done)
    padded = sum(b["lab"].size for b in done)
    useful = sum(train_flops(b["src_len"], b["tgt_len"], cfg, vocab) for b in done)
    executed = sum(train_flops([b["L"]] * len(b["lab"]), [b["L"]] * len(b["lab"]), cfg, vocab)
                   for b in done)
    return dict(
        steps=len(done), ms_per_step_mean=round(1e3 * total / len(done), 2),
        ms_per_step_median_synced=round(1e3 * float(np.median(synced)), 2) if synced else None,
        synced_steps=len(synced),
        target_tokens_per_s=round(tgt / total), target_padding_tokens_per_s=round((padded - tgt) / total),
        source_tokens_per_s=round(sum(int(b["src_len"].sum()) for b in done) / total),
        tflops_per_s=round(executed / total / 1e12, 4), useful_tflops_per_s=round(useful / total / 1e12, 4),
        fraction_of_peak=round(useful / total / 1e12 / peak, 4) if peak else None,
        fraction_of_matmul=round(useful / total / 1e12 / ceiling, 4) if ceiling else None,
        compile_seconds=round(compile_s, 2), peak_memory_gib=memory,
        losses=[round(float(x), 4) for x in losses], loss_finite=bool(np.all(np.isfinite(losses))))


FUSED_ATTENTION = True  # --no-fused-attention sets it False
FUSE_PROJECTIONS = False  # --fuse-projections
LOSS = "keras_trm"  # --loss


def log_softmax_loss(label_smoothing):
    """The lever ``--loss log_softmax``: LabelSmoothedCrossEntropy as it was
    before 2026-11-27, through a float32 (B, T, V) tensor of
    log-probabilities and a gather (whose gradient is a dense scatter); the
    library now computes logsumexp(z) - (1 - ε) z[y] - ε mean(z)."""
    from keras import ops

    from keras_trm.training import LabelSmoothedCrossEntropy
    from keras_trm.training.losses import _global_sum

    class LogSoftmaxLoss(LabelSmoothedCrossEntropy):
        def call(self, y_true, y_pred):
            y_true = ops.cast(y_true, "int32")
            log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
            nll = -ops.squeeze(ops.take_along_axis(log_probs, y_true[..., None], axis=-1), -1)
            eps = self.label_smoothing
            per_token = (1.0 - eps) * nll - eps * ops.mean(log_probs, axis=-1)
            mask = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
            return ops.sum(per_token * mask) / ops.maximum(_global_sum(ops.sum(mask)), 1.0)
    return LogSoftmaxLoss(label_smoothing)


def patch_jax_dropout(kind):
    """The ``--dropout-mask`` lever: Keras' JAX dropout with another mask.
    ``rbg``: the keep mask from XLA's RngBitGenerator (``jax.random``'s
    "rbg" implementation, its key made of Keras' 2-word seed twice);
    ``bits16``: threefry as Keras', but 16 random bits per element, not
    32 (keep where bits >= round(rate * 2^16), so p is off by < 2^-17)."""
    import jax
    import jax.numpy as jnp
    from keras.src.backend.jax import random as keras_jax_random

    def dropout(inputs, rate, noise_shape=None, seed=None):
        if rate == 0.0:
            return inputs
        seed = keras_jax_random.jax_draw_seed(seed)
        shape = keras_jax_random._get_concrete_noise_shape(inputs, noise_shape)
        if kind == "rbg":
            key = jax.random.wrap_key_data(jnp.concatenate([seed, seed]).astype("uint32"),
                                           impl="rbg")
            keep = jax.random.bernoulli(key, p=1.0 - rate, shape=shape)
        else:
            bits = jax.random.bits(jax.random.wrap_key_data(seed.astype("uint32"),
                                                            impl="threefry2x32"),
                                   shape, dtype=jnp.uint16)
            keep = bits >= jnp.uint16(round(rate * 65536))
        keep = jnp.broadcast_to(keep, inputs.shape)
        return jax.lax.select(keep, inputs / (1.0 - rate), jnp.zeros_like(inputs))

    keras_jax_random.dropout = dropout


def patch_logits_in_compute_dtype():
    """The ``--logits compute`` lever: the tied output projection returns
    its logits in the compute dtype (bf16), not cast to float32, so no
    float32 (batch, T, V) tensor is written; the loss casts as it reduces
    (the same values: bf16 -> float32 is exact)."""
    import keras
    from keras import ops

    from keras_trm.layers import PositionalEmbedding

    call, spec = PositionalEmbedding.call, PositionalEmbedding.compute_output_spec

    def logits_call(self, inputs, start_index=0, reverse=False):
        if reverse:
            return ops.matmul(inputs, ops.transpose(ops.cast(self.embeddings, inputs.dtype)))
        return call(self, inputs, start_index, reverse)

    def logits_spec(self, inputs, start_index=0, reverse=False):
        if reverse:
            return keras.KerasTensor(tuple(inputs.shape[:-1]) + (self.vocabulary_size,),
                                     self.compute_dtype)
        return spec(self, inputs, start_index, reverse)

    PositionalEmbedding.call, PositionalEmbedding.compute_output_spec = logits_call, logits_spec


def keras_runner(name, cfg, vocab, bf16, jit, warmup_steps):
    import keras

    from keras_trm import models
    from keras_trm.training import LabelSmoothedCrossEntropy, NoamSchedule, paper_adam

    keras.mixed_precision.set_global_policy("mixed_bfloat16" if bf16 else "float32")
    if not FUSED_ATTENTION:  # the lever: every attention through the einsums
        from keras_trm.layers import MultiHeadAttention

        MultiHeadAttention._fused_applies = lambda *args: False
    if FUSE_PROJECTIONS:  # the lever: Q/K/V of one tensor through one matmul
        from keras_trm.layers import MultiHeadAttention

        MultiHeadAttention.fuse_projections = True
    if DROPOUT_MASK != "keras":
        patch_jax_dropout(DROPOUT_MASK)
    if LOGITS == "compute":
        patch_logits_in_compute_dtype()
    random.seed(0)  # keras' layer seeds; set_random_seed would import TF
    np.random.seed(0)
    build = getattr(models, name, None) if name != "tiny" else None
    model = (build(vocab, max_sequence_length=BOUNDARIES[-1], dropout_rate=cfg["dropout_rate"])
             if build
             else models.transformer(vocab, max_sequence_length=BOUNDARIES[-1],
                                     **cfg))
    assert all(getattr(model, k) == v for k, v in cfg.items()), (name, cfg)
    model.compile(optimizer=paper_adam(NoamSchedule(model.d_model, warmup_steps)),
                  loss=(LabelSmoothedCrossEntropy(0.1) if LOSS == "keras_trm"
                        else log_softmax_loss(0.1)), jit_compile=jit,
                  steps_per_execution=STEPS_PER_EXECUTION)

    def inputs(b):
        return {"encoder_tokens": b["src"], "decoder_tokens": b["dec"]}, b["lab"]

    def step(b):  # the old timing: train_on_batch syncs every variable back per call
        return float(model.train_on_batch(*inputs(b)))

    def run(bs):  # as the jobs train: fit keeps the state on the device, no sync per step
        if not bs:
            return []
        history = model.fit((inputs(b) for b in bs), steps_per_epoch=len(bs), epochs=1, verbose=0)
        return history.history["loss"]  # the mean over bs: a per-step loss would sync
    return model, (step, run)


def torch_baseline(cfg, vocab, bf16, compiled, warmup_steps):
    """torch.nn.Transformer of the same shape as keras_trm's: post-LN, ReLU,
    LayerNorm eps 1e-6, no final LayerNorms, embedding x sqrt(d) + sinusoids,
    one embedding for source, target and output; the same loss, Adam, Noam."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    d, h, f, N, p = (cfg[k] for k in ("d_model", "num_heads", "d_ff", "num_layers", "dropout_rate"))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            kw = dict(dropout=p, batch_first=True, layer_norm_eps=1e-6)
            self.emb = nn.Embedding(vocab, d)
            nn.init.normal_(self.emb.weight, std=d ** -0.5)
            pos = torch.arange(BOUNDARIES[-1])[:, None] / 10000 ** (torch.arange(0, d, 2) / d)
            self.register_buffer("pe", torch.cat([pos.sin(), pos.cos()], 1))
            self.drop = nn.Dropout(p)
            self.net = nn.Transformer(
                d, h, N, N, f, custom_encoder=nn.TransformerEncoder(
                    nn.TransformerEncoderLayer(d, h, f, **kw), N, enable_nested_tensor=False),
                custom_decoder=nn.TransformerDecoder(nn.TransformerDecoderLayer(d, h, f, **kw), N),
                **kw)

        def forward(self, src, dec):
            x = self.drop(self.emb(src) * d ** 0.5 + self.pe[:src.shape[1]])
            y = self.drop(self.emb(dec) * d ** 0.5 + self.pe[:dec.shape[1]])
            T = dec.shape[1]
            causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=dec.device), 1)
            y = self.net(x, y, tgt_mask=causal, src_key_padding_mask=src == 0,
                         tgt_key_padding_mask=dec == 0, memory_key_padding_mask=src == 0,
                         tgt_is_causal=True)
            return y @ self.emb.weight.T  # tied, as keras_trm's tie_embeddings='all'

    model = Model().to(dev).train()

    def loss_fn(src, dec, lab):
        with torch.autocast(dev.type, torch.bfloat16, enabled=bf16):
            logits = model(src, dec)
        return nn.functional.cross_entropy(logits.float().flatten(0, 1), lab.flatten(),
                                           ignore_index=0, label_smoothing=0.1)

    fwd = torch.compile(loss_fn, dynamic=False) if compiled else loss_fn
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                           fused=dev.type == "cuda")
    noam = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: d ** -0.5 * min(
        (s + 1) ** -0.5, (s + 1) * warmup_steps ** -1.5))

    def train(b):
        src, dec, lab = (torch.from_numpy(b[k]).to(dev, non_blocking=True).long()
                         for k in ("src", "dec", "lab"))
        loss = fwd(src, dec, lab)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        noam.step()
        return loss.detach()

    def run(bs):  # no sync until the last loss is read
        return [x.item() for x in [train(b) for b in bs]]
    return model, (lambda b: train(b).item(), run)


def peak_bf16(gpu):
    for fragment, tflops, source in PEAK_BF16:
        if gpu and fragment.lower() in gpu.lower():
            return {"tflops": tflops, "source": source}
    return None


# -- device facts ---------------------------------------------------------

def device_info(modules):
    """Host, GPU (None on CPU), nvidia-smi's name/driver/memory, versions."""
    import importlib

    info = {"platform": platform.platform(), "python": platform.python_version(), "gpu": None,
            "versions": {m: importlib.import_module(m).__version__ for m in ["numpy", *modules]}}
    if shutil.which("nvidia-smi"):
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    if "jax" in modules:
        import jax
        dev = jax.devices()[0]
        info["gpu"] = dev.device_kind if dev.platform == "gpu" else None
    else:
        import torch
        info["versions"]["torch_cuda"] = torch.version.cuda
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return info


def matmul_ceiling(framework, gpu):
    """TFLOP/s of a large square matmul (bf16 on GPU, float32 on CPU): the
    best of 3 timings of ``k`` back-to-back products and one sync."""
    n, k = (8192, 20) if gpu else (1024, 3)
    if framework == "jax":
        import jax
        import jax.numpy as jnp
        a = jnp.ones((n, n), jnp.bfloat16 if gpu else jnp.float32)
        mm = jax.jit(lambda x: x @ x)
        run = lambda: [mm(a) for _ in range(k)][-1].block_until_ready()  # noqa: E731
    else:
        import torch
        a = torch.ones(n, n, dtype=torch.bfloat16 if gpu else torch.float32,
                       device="cuda" if gpu else "cpu")
        run = lambda: ([a @ a for _ in range(k)], gpu and torch.cuda.synchronize())  # noqa: E731
    run()
    best = min(_seconds(run) for _ in range(3))
    return {"framework": framework, "tflops": round(2 * n ** 3 * k / best / 1e12, 2), "n": n,
            "dtype": "bfloat16" if gpu else "float32"}


GEMM_NAMES = ("gemm", "cutlass", "cublas", "xmma", "nvjet", "matmul", "dot", "sgemm", "wgmma")


def summarize_kernels(durations_us, wall_s, steps, top=30):
    """{kernel name: total µs} of ``steps`` traced steps -> ms per step in
    all, in matmul kernels (names with ``GEMM_NAMES``), the busy fraction
    of the traced wall time, and the ``top`` kernels by time."""
    total = sum(durations_us.values())
    gemm = sum(t for k, t in durations_us.items() if any(g in k.lower() for g in GEMM_NAMES))
    ranked = sorted(durations_us.items(), key=lambda kv: -kv[1])[:top]
    return dict(steps=steps, wall_ms_per_step=round(1e3 * wall_s / steps, 2),
                kernel_ms_per_step=round(total / 1e3 / steps, 2),
                matmul_kernel_ms_per_step=round(gemm / 1e3 / steps, 2),
                busy_fraction=round(total / 1e6 / wall_s, 3) if wall_s else None,
                kernels=len(durations_us),
                top=[[name[:120], round(t / 1e3 / steps, 3)] for name, t in ranked])


def profile_steps(framework, run, batches, out_dir, hlo_files=()):
    """Device time of ``run(batches)`` by kernel: JAX through
    ``jax.profiler`` (its Perfetto JSON, read with the standard library by
    ``step_parts.device_times``: on a GPU the kernels on the device's CUDA
    streams; on a CPU the runtime's nested thunks, so only a smoke test),
    torch through ``torch.profiler``. Returns summarize_kernels and
    ``counted``; under JAX also ``by_part`` (``step_parts.by_part``: time
    by part of the model) from whichever of ``hlo_files`` (the step's
    optimized HLO, dumped by XLA) names the most of the traced ops, and
    ``hlo_file``, its path."""
    import collections
    import glob

    durations, other_lines, ops, where = collections.Counter(), {}, {}, None
    if framework == "jax":
        import jax

        jax.profiler.start_trace(str(out_dir), create_perfetto_trace=True)
        wall = _seconds(lambda: run(batches))
        jax.profiler.stop_trace()
        path = sorted(glob.glob(str(pathlib.Path(out_dir) / "**" / "perfetto_trace.json.gz"),
                                recursive=True))[-1]
        with gzip.open(path, "rt") as f:
            events = json.load(f)["traceEvents"]
        durations, ops, other_lines, where = step_parts.device_times(events)
    else:
        import torch
        from torch.profiler import ProfilerActivity, profile

        cuda = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            wall = _seconds(lambda: run(batches))
        for e in prof.events():
            if cuda and e.device_type == torch.autograd.DeviceType.CUDA:
                durations[e.name] += e.device_time
            elif not cuda and e.cpu_parent is None:
                durations[e.name] += e.cpu_time
        where = "device" if cuda else "host (top-level ops)"
    summary = summarize_kernels(durations, wall, len(batches))
    summary["counted"] = where
    if other_lines:  # the device's derived lines ("XLA Ops", ...), for the record
        summary["other_device_lines_ms_per_step"] = {
            k: round(v / 1e3 / len(batches), 3) for k, v in other_lines.items()}
    hlo = {}
    for candidate in hlo_files:
        rows = step_parts.read_hlo(pathlib.Path(candidate).read_text())
        if sum(k in rows for k in ops) > sum(k in hlo for k in ops):
            hlo, summary["hlo_file"] = rows, str(candidate)
    if hlo:
        summary["by_part"] = step_parts.by_part(ops, hlo, len(batches))
    return summary


def hlo_dump(tmp):
    """Asks XLA (before JAX starts) to dump each train step's optimized HLO
    into ``tmp`` for ``by_part``; returns a function listing the dumps."""
    flags = (f"--xla_dump_to={tmp} --xla_dump_hlo_as_text "
             "--xla_dump_hlo_module_re=.*train_step.*")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    return lambda: set(pathlib.Path(tmp).glob("*train_step*after_optimizations.txt"))


def peak_memory_gib(framework):
    """Peak device memory since the last reset (jax: since start); None on CPU."""
    if framework == "jax":
        import jax
        dev = jax.devices()[0]
        stats = dev.memory_stats() if dev.platform == "gpu" else None
        return round(stats["peak_bytes_in_use"] / 2 ** 30, 3) if stats else None
    import torch
    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / 2 ** 30, 3)


# -- main -----------------------------------------------------------------

def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("jax", "torch"), default="jax", help="Keras backend")
    p.add_argument("--models", default="transformer_base,transformer_big")
    p.add_argument("--tiny", action="store_true", help="tiny model, Multi30k lengths: CPU smoke run")
    p.add_argument("--lengths", help=".npz of source/target subword lengths")
    p.add_argument("--corpus", choices=tuple(CORPORA), help="default: wmt (multi30k with --tiny)")
    p.add_argument("--prepare-lengths", choices=tuple(CORPORA), help="write lengths_<corpus>.npz (TF)")
    p.add_argument("--data-dir", default=os.environ.get("KERAS_TRM_DATA_DIR", "/work/shared/data"))
    p.add_argument("--tokens-per-batch", type=int, help="padded tokens per side (25000; tiny 512)")
    p.add_argument("--steps", type=int, help="timed steps per model and framework (20; tiny 3)")
    p.add_argument("--warmup", type=int, help="untimed steps after the compile steps (2; tiny 1)")
    p.add_argument("--max-shapes", type=int, help="batch widths, i.e. compiles, per model (2; tiny 1)")
    p.add_argument("--precision", choices=("auto", "bf16", "float32"), default="auto",
                   help="auto: mixed bf16 on GPU, float32 on CPU")
    p.add_argument("--keras-jit", choices=("auto", "on", "off"), default="auto",
                   help="compile(jit_compile=); auto: on for jax, off for torch (torch.compile "
                        "of the Keras train step failed in a dynamo guard, torch 2.13)")
    p.add_argument("--torch-compile", choices=("auto", "on", "off"), default="auto",
                   help="auto: on, except --tiny on CPU (inductor took 94 s there)")
    p.add_argument("--no-torch-compile", dest="torch_compile", action="store_const", const="off")
    p.add_argument("--synced-steps", type=int,
                   help="steps also timed one by one, each waited for (ours: train_on_batch, "
                        "which copies every variable back per call, first model only); "
                        "default: --steps")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after timing, trace this many steps and report device time by kernel")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--dropout-rate", type=float,
                   help="overrides the presets' dropout in both frameworks (a lever to time)")
    p.add_argument("--no-padding", action="store_true",
                   help="every pair fills its bucket width (no padding; masks still built)")
    p.add_argument("--no-fused-attention", action="store_true",
                   help="attention through keras_trm's einsums at every key length, not "
                        "keras.ops.dot_product_attention (cuDNN under JAX); the default "
                        "since 2026-11-28 under JAX below 512 keys (MultiHeadAttention."
                        "fused_min_key_length)")
    p.add_argument("--fuse-projections", action="store_true",
                   help="ours: query, key and value of one tensor through one matmul "
                        "(MultiHeadAttention.fuse_projections; off by default, 0.92-0.94x "
                        "on CPU; a lever to time)")
    p.add_argument("--loss", choices=("keras_trm", "log_softmax"), default="keras_trm",
                   help="ours: keras_trm's LabelSmoothedCrossEntropy, or its old form (log_softmax_loss)")
    p.add_argument("--dropout-mask", choices=("keras", "rbg", "bits16"), default="keras",
                   help="ours under JAX: keras (Keras' threefry uniform per element), rbg (the "
                        "same from XLA's RngBitGenerator, keyed by Keras' seed), bits16 (threefry, "
                        "one 16-bit uniform per element: half the random bits; a lever to time)")
    p.add_argument("--steps-per-execution", type=int, default=1,
                   help="ours: compile(steps_per_execution=) (fewer trips through fit's loop)")
    p.add_argument("--logits", choices=("float32", "compute"), default="float32",
                   help="ours: the output projection's logits as keras_trm returns them "
                        "(float32), or in the compute dtype (bf16), cast inside the loss")
    p.add_argument("--trace-dir", help="keep --profile-steps' trace files here")
    p.add_argument("--time-limit", type=float, default=450.0, help="s; later phases are skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out")
    p.add_argument("--baseline-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    global FUSED_ATTENTION, FUSE_PROJECTIONS, LOSS, DROPOUT_MASK, STEPS_PER_EXECUTION, LOGITS
    FUSED_ATTENTION, LOSS, LOGITS = not args.no_fused_attention, args.loss, args.logits
    FUSE_PROJECTIONS = args.fuse_projections
    DROPOUT_MASK, STEPS_PER_EXECUTION = args.dropout_mask, args.steps_per_execution
    if args.dropout_mask != "keras" and args.backend != "jax":
        p.error(f"--dropout-mask {args.dropout_mask} needs --backend jax")
    t = args.tiny
    args.corpus = args.corpus or ("multi30k" if t else "wmt")
    args.lengths = args.lengths or str(RESULTS / f"lengths_{args.corpus}.npz")
    args.vocab = 500 if t else 37000
    args.tokens_per_batch = args.tokens_per_batch or (512 if t else 25000)
    args.steps = args.steps or (3 if t else 20)
    args.synced_steps = args.steps if args.synced_steps is None else args.synced_steps
    args.warmup = args.warmup if args.warmup is not None else (1 if t else 2)
    args.max_shapes = args.max_shapes or (1 if t else 2)
    args.names = ["tiny"] if t else args.models.split(",")
    if args.keras_jit == "auto":
        args.keras_jit = "on" if args.backend == "jax" else "off"
    return args


def model_config(name, args):
    """The preset's hyper-parameters, with ``--dropout-rate`` applied."""
    cfg = dict(MODELS[name])
    if args.dropout_rate is not None:
        cfg["dropout_rate"] = args.dropout_rate
    return cfg


def run_framework(args, label, framework, info, batches, names, deadline, save=None,
                  hlo_dumps=None):
    """Times ``label`` ("ours": keras_trm on the Keras backend; "torch":
    the baseline) on each model of ``names``; returns {model: summary},
    also passed to ``save`` after each model. A model is skipped where the
    previous one's time would run past ``deadline``. ``hlo_dumps`` lists
    the HLO files XLA has dumped (``hlo_dump``), for the profile's
    ``by_part``."""
    gpu = info["gpu"]
    bf16 = args.precision == "bf16" or (args.precision == "auto" and gpu is not None)
    peak = peak_bf16(gpu)
    compiled = args.torch_compile == "on" or (args.torch_compile == "auto"
                                              and not (args.tiny and gpu is None))
    ceiling = matmul_ceiling(framework, gpu is not None)
    out = {"matmul_ceiling": ceiling, "precision": "mixed_bfloat16" if bf16 else "float32",
           "compiled": args.keras_jit == "on" if label == "ours" else compiled}
    last = 0.0
    for name in names:
        if time.monotonic() + last > deadline:
            out[name] = {"skipped": f"time limit {args.time_limit:.0f} s"}
            continue
        started, cfg = time.monotonic(), model_config(name, args)
        dumped_before = hlo_dumps() if hlo_dumps else set()
        warmup_steps = 10 if args.tiny else 4000
        if framework == "torch":
            import torch
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
        if label == "ours":
            model, runner = keras_runner(name, cfg, args.vocab, bf16, args.keras_jit == "on",
                                         warmup_steps)
            params = model.count_params()
        else:
            model, runner = torch_baseline(cfg, args.vocab, bf16, compiled, warmup_steps)
            params = sum(x.numel() for x in model.parameters())
        # Ours' synced steps go through train_on_batch, a second compile:
        # the first model only (the check of the old timing against fit).
        synced_steps = args.synced_steps if label != "ours" or name == args.names[0] else 0
        total, done, losses, synced, compile_s = measure(runner, batches, args.warmup, deadline,
                                                         synced_steps)
        out[name] = summarize(total, done, losses, synced, compile_s, cfg, args.vocab,
                              peak and peak["tflops"], ceiling["tflops"], peak_memory_gib(framework))
        if args.profile_steps:
            import tempfile
            with tempfile.TemporaryDirectory() as tmp:
                hlo_files = sorted(hlo_dumps() - dumped_before) if hlo_dumps else ()
                profile = profile_steps(framework, runner[1], batches[:args.profile_steps], tmp,
                                        hlo_files)
                out[name]["profile"] = profile
                traces = sorted(pathlib.Path(tmp).glob("**/perfetto_trace.json.gz"))
                if args.trace_dir and traces:  # ours under JAX: the Perfetto trace, its HLO
                    keep = pathlib.Path(args.trace_dir)
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(traces[-1], keep / f"trace_{label}_{name}.json.gz")
                    if "hlo_file" in profile:
                        with open(profile["hlo_file"], "rb") as src, \
                                gzip.open(keep / f"hlo_{label}_{name}.txt.gz", "wb") as dst:
                            shutil.copyfileobj(src, dst)
        last = time.monotonic() - started
        out[name].update(params=int(params), phase_seconds=round(last, 1))
        del model, runner
        gc.collect()
        if save:
            save(out)
    if save:
        save(out)
    return out


def baseline_in_child(argv, name, deadline):
    """The torch baseline in its own process (same arguments, so the same
    batches): its own GPU memory and peak figure, and no thread pools beside
    JAX's (next to them torch's tiny CPU steps ran up to 50x slower)."""
    import tempfile

    remaining = deadline - time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "torch.json"
        cmd = [sys.executable, __file__, *argv, "--baseline-only", "--models", name,
               "--out", str(out), "--time-limit", str(max(remaining, 1.0))]
        try:
            subprocess.run(cmd, check=True, timeout=remaining + 60)
            error = None
        except (subprocess.SubprocessError, OSError) as e:
            error = f"{type(e).__name__}: {e}"[:500]
        result = json.loads(out.read_text()) if out.is_file() else {}
    if error and name not in result:
        result[name] = {"error": error}
    return result


def write(result, out, t0):
    result["tensorflow_imported"] = ("tensorflow" in sys.modules
                                     or bool(result["torch"].get("tensorflow_imported")))
    result["wall_seconds"] = round(time.monotonic() - t0, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    data_dir = pathlib.Path(args.data_dir)
    if args.prepare_lengths:
        out = args.out or RESULTS / f"lengths_{args.prepare_lengths}.npz"
        return prepare_lengths(args.prepare_lengths, data_dir, out)
    t0 = time.monotonic()
    deadline = t0 + args.time_limit
    os.environ["KERAS_BACKEND"] = args.backend
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the GPU is shared
    # Torch's OpenMP threads spin at barriers: on a busy 2-core host the
    # tiny CPU steps took 0.1-3 s instead of 0.03-0.06 s. (Set before torch loads.)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    src, tgt, origin = load_lengths(args.lengths, args.corpus, data_dir)
    plan, dropped = plan_batches(src, tgt, args.tokens_per_batch, BOUNDARIES, args.seed)
    picked, shapes, coverage = pick_steps(plan, tgt, args.steps, args.max_shapes)
    rng = np.random.default_rng(args.seed)
    if args.no_padding:  # source and target + END fill the width
        src, tgt = src.copy(), tgt.copy()
        for L, idx in picked:
            src[idx] = tgt[idx] = L - 1
    batches = [make_batch(rng, L, src[idx], tgt[idx], args.vocab) for L, idx in picked]
    if args.baseline_only:
        info = device_info(["torch"])

        def save(result):
            result.update(device=info, tensorflow_imported="tensorflow" in sys.modules)
            pathlib.Path(args.out).write_text(json.dumps(result))
        return run_framework(args, "torch", "torch", info, batches, args.names, deadline, save)

    env = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "XLA_PYTHON_CLIENT_PREALLOCATE",
                                          "JAX_DEFAULT_PRNG_IMPL", "XLA_FLAGS")}
    hlo_dumps = None
    if args.backend == "jax" and args.profile_steps:  # before JAX starts
        import tempfile
        hlo_tmp = tempfile.TemporaryDirectory(prefix="gpu_train_hlo_")  # removed at exit
        hlo_dumps = hlo_dump(hlo_tmp.name)
    info = device_info(["keras", args.backend])
    gpu = info["gpu"]
    out = pathlib.Path(args.out or RESULTS / "gpu_train_{}{}.json".format(
        (gpu or "cpu").replace(" ", "_"), "_tiny" if args.tiny else ""))
    result = dict(
        benchmark="training steps: keras_trm against torch.nn.Transformer + torch.compile",
        command="python " + " ".join([os.path.relpath(__file__, ROOT)] + argv),
        date=datetime.date.today().isoformat(), backend=args.backend, device=info,
        levers=dict(dropout_rate=args.dropout_rate, no_padding=args.no_padding,
                    fused_attention=not args.no_fused_attention,
                    fuse_projections=args.fuse_projections, loss=args.loss,
                    dropout_mask=args.dropout_mask,
                    steps_per_execution=args.steps_per_execution, logits=args.logits),
        peak_bf16=peak_bf16(gpu),
        lengths={**origin, "pairs": int(len(src)), "dropped_longer_than_256": dropped,
                 "mean_source": round(float(src.mean()), 2), "mean_target": round(float(tgt.mean()), 2)},
        env=env, hlo_dumped_for_by_part=hlo_dumps is not None,
        batching=dict(tokens_per_batch=args.tokens_per_batch, boundaries=BOUNDARIES, widths_timed=shapes,
                      coverage_of_target_tokens=round(coverage, 4), steps=args.steps, warmup=args.warmup))
    result.update(torch={}, ours={}, ratio_tokens_per_s={})
    spent = 0.0
    for name in args.names:
        # Model by model: the baseline (its process frees its GPU memory as it
        # exits), then ours. Both are skipped where the previous model's time
        # would run past the limit.
        if time.monotonic() + 1.2 * spent > deadline:
            result["torch"][name] = result["ours"][name] = {"skipped": f"--time-limit {args.time_limit}"}
            continue
        started = time.monotonic()
        if not args.no_baseline:
            result["torch"].update(baseline_in_child(
                argv, name, started + 0.6 * (deadline - started)))
        result["ours"].update(run_framework(args, "ours", args.backend, info, batches, [name], deadline,
                                            hlo_dumps=hlo_dumps))
        spent = time.monotonic() - started
        ours, theirs = result["ours"][name], result["torch"].get(name, {})
        if "target_tokens_per_s" in ours and "target_tokens_per_s" in theirs:
            result["ratio_tokens_per_s"][name] = round(
                ours["target_tokens_per_s"] / theirs["target_tokens_per_s"], 3)
        write(result, out, t0)
    write(result, out, t0)
    print(json.dumps({n: {k: {f: result[k].get(n, {}).get(f) for f in (
        "ms_per_step_mean", "ms_per_step_median_synced", "target_tokens_per_s", "fraction_of_peak", "compile_seconds")}
        for k in ("ours", "torch")} | {"ratio": result["ratio_tokens_per_s"].get(n)}
        for n in args.names}, indent=1))
    print(f"wrote {out}; wall {result['wall_seconds']} s; tensorflow imported: "
          f"{result['tensorflow_imported']}")
    return result


if __name__ == "__main__":
    main()
