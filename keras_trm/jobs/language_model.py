"""The language-model job: Transformer-XL against a vanilla Transformer LM.

Used by ``recipes/language_model.py``. On one corpus (char-level Tiny
Shakespeare by default, word-level PTB with ``--corpus ptb``) it

1. cuts the training split into ``batch_size`` contiguous streams
   (``batchify``) and walks them ``seg_len`` tokens at a time, as the
   reference ``LMOrderedIterator`` of Dai et al. (2019);
2. trains a ``TransformerXLLM`` for ``steps`` segments, carrying each
   segment's memories into the next segment of the same streams (Dai et al.
   2019 §3.2; memories are reset when a pass over the streams ends);
3. trains ``vanilla_transformer_lm`` (absolute sinusoids, no memory) on the
   same segments, in the same order, for the same number of steps, with the
   same optimizer and schedule; its FFN width is raised so that both models
   have the same number of parameters (Transformer-XL's extra W_{k,R}, u, v
   per layer and output bias, against the attention-projection biases of
   the Keras attention);
4. scores the test split: Transformer-XL segment by segment with memory
   (``evaluate_with_memory``); the vanilla model both on disjoint segments
   (as it was trained) and with a sliding window of ``seg_len`` tokens (one
   new token per step, its best evaluation, Dai et al. §3.1);
5. exports the Transformer-XL LM as a SavedModel
   (``export/<model_name>/<version>/``) whose signature takes token ids and
   memories and returns log-probabilities and new memories, with the
   vocabulary and config in ``assets.extra/``;
6. writes ``result.json``, ``report.md`` and ``curves.png`` into
   ``results_dir``.

Figures are mean negative log-likelihoods per token in nats, reported as
bits per token (``nll / ln 2``: bits per character on Tiny Shakespeare) and
perplexity (``exp(nll)``: the PTB figure).
"""

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_trm.data import language_modeling as lm
from keras_trm.data import resolve_data_dir
from keras_trm.export.saved_model import export_module
from keras_trm.layers import _validation as v
from keras_trm.models.transformer_xl import (
    TransformerXLLM,
    evaluate_sliding_window,
    evaluate_with_memory,
    lm_loss,
    make_train_step,
    vanilla_transformer_lm,
)

CORPORA = ("tinyshakespeare", "ptb")


@dataclasses.dataclass
class LanguageModelConfig:
    """Hyper-parameters of the language-model recipe.

    Defaults: the CPU run the README reports (char-level Tiny Shakespeare,
    4 layers, d_model 128, segments of 64 characters, 64 of memory).
    ``train_tokens`` / ``eval_tokens`` cut the splits (None = whole split;
    the tests use them for a tiny run).
    """

    corpus: str = "tinyshakespeare"
    num_layers: int = 4
    d_model: int = 128
    num_heads: int = 4
    d_ff: int = 512
    dropout_rate: float = 0.1
    seg_len: int = 64
    mem_len: int = 64
    eval_mem_len: int = 0  # 0 = mem_len
    batch_size: int = 32
    steps: int = 1500
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    min_learning_rate_ratio: float = 0.0
    clip_norm: float = 0.25
    eval_every: int = 250
    eval_batch_size: int = 16
    match_parameters: bool = True
    train_tokens: int = 0  # 0 = whole split
    eval_tokens: int = 0  # 0 = whole split
    seed: int = 0
    model_name: str = ""  # "" = transformer_xl_<corpus>

    def validate(self):
        """Raises ``ValueError``/``TypeError`` naming a bad field."""
        v.one_of("corpus", self.corpus, CORPORA)
        for name in ("num_layers", "d_model", "num_heads", "d_ff", "seg_len",
                     "batch_size", "steps", "warmup_steps", "eval_every",
                     "eval_batch_size"):
            v.positive_int(name, getattr(self, name))
        for name in ("mem_len", "eval_mem_len", "train_tokens",
                     "eval_tokens", "seed"):
            v.non_negative_int(name, getattr(self, name))
        v.rate("dropout_rate", self.dropout_rate)
        v.positive_float("learning_rate", self.learning_rate)
        v.positive_float("clip_norm", self.clip_norm)
        if not 0.0 <= self.min_learning_rate_ratio <= 1.0:
            raise ValueError(
                "`min_learning_rate_ratio` must be in [0, 1], got "
                f"min_learning_rate_ratio={self.min_learning_rate_ratio!r}"
            )
        if self.warmup_steps >= self.steps:
            raise ValueError(
                f"`warmup_steps`={self.warmup_steps} must be smaller than "
                f"steps={self.steps}"
            )
        return self

    @property
    def name(self):
        return self.model_name or f"transformer_xl_{self.corpus}"


# -- schedule, steps, evaluation ----------------------------------------------
def cosine_warmup_schedule(config):
    """Linear warmup to ``learning_rate`` over ``warmup_steps``, then cosine
    decay to ``min_learning_rate_ratio * learning_rate`` at ``steps`` (the
    reference code's ``scheduler='cosine'`` with ``warmup_step``)."""
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=config.steps - config.warmup_steps,
        alpha=config.min_learning_rate_ratio,
        warmup_target=config.learning_rate,
        warmup_steps=config.warmup_steps,
    )


def _make_vanilla_train_step(model, optimizer, clip_norm):
    """``step(inputs, targets) -> loss``, as ``make_train_step`` without
    memories."""
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(inputs, targets):
        with tf.GradientTape() as tape:
            loss = lm_loss(targets, model(inputs, training=True))
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        grads, _ = tf.clip_by_global_norm(grads, clip_norm)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    return step


def evaluate_disjoint_segments(model, streams, seg_len):
    """Mean NLL per token (nats) of a memory-less model on consecutive
    disjoint segments of ``seg_len`` (each segment starts without context),
    the vanilla model's training-time view of the data."""

    @tf.function(reduce_retracing=True)
    def forward(inputs, targets):
        logits = model(inputs, training=False)
        return ops.sum(ops.sparse_categorical_crossentropy(
            targets, logits, from_logits=True))

    total, count = 0.0, 0
    for inputs, targets in lm.segments(streams, seg_len):
        total += float(forward(inputs, targets))
        count += targets.size
    return total / count


def _figures(nll):
    return {"nll_nats": round(nll, 5), "bits_per_token": round(nll / math.log(2), 4),
            "perplexity": round(math.exp(nll), 3)}


def _train_batches(streams, seg_len):
    """Endless ``(inputs, targets, new_pass)`` over full-length segments."""
    while True:
        for k, (inputs, targets) in enumerate(
            lm.segments(streams, seg_len, drop_remainder=True)
        ):
            yield inputs, targets, k == 0


def _train(name, step_fn, uses_memory, model, streams, config, evaluate,
           verbose):
    """Runs ``config.steps`` steps; returns (history, train_seconds,
    eval_seconds)."""
    history = {"step": [], "train_loss": [], "valid_nll": [], "seconds": []}
    progbar = keras.utils.Progbar(config.steps, verbose=verbose,
                                  stateful_metrics=["valid_bits"])
    batches = _train_batches(streams, config.seg_len)
    memories, window = None, []
    train_seconds = eval_seconds = 0.0
    for step in range(1, config.steps + 1):
        inputs, targets, new_pass = next(batches)
        t0 = time.time()
        if uses_memory:
            if new_pass:
                memories = model.init_memories(inputs.shape[0])
            loss, memories = step_fn(inputs, targets, memories)
        else:
            loss = step_fn(inputs, targets)
        loss = float(loss)
        train_seconds += time.time() - t0
        if not math.isfinite(loss):
            raise FloatingPointError(
                f"{name}: training loss is {loss} at step {step}")
        window.append(loss)
        values = [("loss", loss)]
        if step % config.eval_every == 0 or step == config.steps:
            t0 = time.time()
            valid = evaluate()
            eval_seconds += time.time() - t0
            history["step"].append(step)
            history["train_loss"].append(round(float(np.mean(window)), 5))
            history["valid_nll"].append(round(valid, 5))
            history["seconds"].append(round(train_seconds, 1))
            window = []
            values.append(("valid_bits", valid / math.log(2)))
            if verbose != 1:
                print(f"{name} step {step}: train loss "
                      f"{history['train_loss'][-1]:.4f} nats, valid "
                      f"{valid / math.log(2):.4f} bits/token, "
                      f"{train_seconds / 60:.1f} min of training",
                      flush=True)
        progbar.update(step, values)
    return history, train_seconds, eval_seconds


# -- export ----------------------------------------------------------------------
class TransformerXLServing(tf.Module):
    """The exported Transformer-XL LM: score or generate segment by segment.

    ``serve(token_ids, memories)``:

    * ``token_ids``: int32 ``(batch, seg_len)``, ``1 <= seg_len <=
      max_segment_len``;
    * ``memories``: float32 ``(num_layers, batch, M, d_model)``, the
      ``new_memories`` of the previous segment of the same streams, or
      ``zeros((num_layers, batch, 0, d_model))`` at the start of a stream
      (any M >= 0);

    returns ``{"log_probs": float32 (batch, seg_len, vocabulary_size)``
    (natural-log next-token probabilities: row t predicts token t + 1),
    ``"new_memories": float32 (num_layers, batch, min(mem_len, M +
    seg_len), d_model)}``.

    Bad input raises ``tf.errors.InvalidArgumentError`` whose message names
    the argument and both shapes, checked in the graph before the model
    runs (a loaded signature does not enforce its static shapes): a
    segment longer than ``max_segment_len`` or empty, ``token_ids`` not of
    rank 2, ``memories`` not of rank 4, or with another ``num_layers``,
    ``d_model`` or batch size than ``token_ids``.
    """

    def __init__(self, model):
        super().__init__(name="transformer_xl_serving")
        if not isinstance(model, TransformerXLLM):
            raise TypeError(
                "`model` must be a TransformerXLLM, got "
                f"{type(model).__name__}")
        self.model = model
        self.serve = tf.function(self._serve, input_signature=[
            tf.TensorSpec([None, None], tf.int32, name="token_ids"),
            tf.TensorSpec([model.num_layers, None, None, model.d_model],
                          tf.float32, name="memories"),
        ])

    def _serve(self, token_ids, memories):
        model = self.model
        # Shapes padded with -1 so that a wrong rank fails the check below
        # instead of an index error.
        t_shape = tf.shape(token_ids)
        m_shape = tf.shape(memories)
        t = tf.concat([t_shape, [-1, -1]], 0)
        m = tf.concat([m_shape, [-1, -1, -1, -1]], 0)
        token_ok = tf.logical_and(
            tf.equal(tf.size(t_shape), 2),
            tf.logical_and(t[1] >= 1, t[1] <= model.max_segment_len))
        memory_ok = tf.reduce_all(tf.stack([
            tf.equal(tf.size(m_shape), 4),
            tf.equal(m[0], model.num_layers),
            tf.equal(m[1], t[0]),
            m[2] >= 0,
            tf.equal(m[3], model.d_model),
        ]))
        token_check = tf.debugging.Assert(token_ok, [
            "`token_ids` must have shape (batch, seg_len) with 1 <= seg_len "
            f"<= max_segment_len={model.max_segment_len}; got "
            "token_ids.shape=", t_shape], summarize=8)
        with tf.control_dependencies([token_check]):
            memory_check = tf.debugging.Assert(memory_ok, [
                f"`memories` must have shape (num_layers={model.num_layers}, "
                f"batch, M, d_model={model.d_model}) with the batch size of "
                "token_ids; got memories.shape=", m_shape,
                "and token_ids.shape=", t_shape], summarize=8)
        with tf.control_dependencies([token_check, memory_check]):
            token_ids = tf.identity(token_ids)
            memories = tf.identity(memories)
        logits, new_memories = model(
            token_ids, tf.unstack(memories, num=model.num_layers),
            training=False)
        return {"log_probs": tf.nn.log_softmax(logits),
                "new_memories": tf.stack(new_memories)}


def export_language_model(model, vocabulary, export_dir, model_name,
                          extra_config=None, version=None):
    """Exports ``model`` (a ``TransformerXLLM``) with ``TransformerXLServing``.

    The signature ``serving_default`` is ``TransformerXLServing.serve``; the
    new memories keep ``model.mem_len`` positions. ``assets.extra/`` holds
    ``vocab.json`` (the id -> token list; JSON so that newline and space
    characters survive) and ``config.json`` (model sizes, ``mem_len``,
    ``max_segment_len`` and ``extra_config``).

    Returns:
        ``pathlib.Path`` of ``<export_dir>/<model_name>/<version>``.
    """
    serving = TransformerXLServing(model)
    config = {
        "num_layers": model.num_layers, "d_model": model.d_model,
        "vocabulary_size": model.vocabulary_size, "mem_len": model.mem_len,
        "max_segment_len": model.max_segment_len,
        "signature": {
            "inputs": {"token_ids": "int32 (batch, seg_len)",
                       "memories": "float32 (num_layers, batch, M, d_model)"},
            "outputs": {"log_probs": "float32 (batch, seg_len, vocabulary_size)",
                        "new_memories": "float32 (num_layers, batch, "
                                        "min(mem_len, M + seg_len), d_model)"},
        },
        **(extra_config or {}),
    }
    return export_module(
        serving, export_dir, model_name,
        signatures={"serving_default": serving.serve}, version=version,
        assets={"vocab.json": json.dumps(vocabulary.tokens, ensure_ascii=False),
                "config.json": json.dumps(config, indent=1)},
    )


# -- report ------------------------------------------------------------------------
def _matched_d_ff(config, vocabulary_size, target):
    """The vanilla FFN width whose parameter count is closest to ``target``
    (the count is linear in d_ff: num_layers * (2 d_model + 1) per unit)."""
    def count(d_ff):
        return vanilla_transformer_lm(
            vocabulary_size, num_layers=config.num_layers,
            d_model=config.d_model, num_heads=config.num_heads, d_ff=d_ff,
            max_length=config.seg_len).count_params()

    base = count(config.d_ff)
    per_unit = config.num_layers * (2 * config.d_model + 1)
    return max(1, config.d_ff + int(round((target - base) / per_unit)))


def _write_plot(path, result):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the figure is optional
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    unit = math.log(2)
    for key, label in (("transformer_xl", "Transformer-XL"),
                       ("vanilla", "vanilla Transformer")):
        h = result[key]["history"]
        ax.plot(h["step"], np.array(h["train_loss"]) / unit, "--",
                label=f"{label}, train (segment mean)")
        ax.plot(h["step"], np.array(h["valid_nll"]) / unit, "o-",
                label=f"{label}, valid")
    ax.set_xlabel("training step (segments of "
                  f"{result['config']['batch_size']}x{result['config']['seg_len']} tokens)")
    ax.set_ylabel("bits per token")
    ax.set_title(f"{result['config']['corpus']}: Transformer-XL vs vanilla")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _report_markdown(result):
    c, x, b = result["config"], result["transformer_xl"], result["vanilla"]
    unit = "bpc" if c["corpus"] == "tinyshakespeare" else "bits/word"
    lines = [
        f"# Language model: Transformer-XL vs vanilla Transformer on {c['corpus']}",
        "",
        f"Written by `{result['command']}` on {result['date']} "
        f"({result['machine']}).",
        "",
        "| | Transformer-XL | vanilla Transformer |",
        "| --- | --- | --- |",
        f"| parameters | {x['parameters']:,} | {b['parameters']:,} |",
        f"| layers / d_model / heads / d_ff | {c['num_layers']} / {c['d_model']} / "
        f"{c['num_heads']} / {c['d_ff']} | {c['num_layers']} / {c['d_model']} / "
        f"{c['num_heads']} / {b['d_ff']} |",
        f"| positions | relative (sinusoid R, u, v) | absolute sinusoids |",
        f"| segment length (train) | {c['seg_len']} | {c['seg_len']} |",
        f"| memory (train / test) | {c['mem_len']} / {x['eval_mem_len']} | none |",
        f"| training | {c['steps']} steps x {c['batch_size']} x {c['seg_len']} "
        f"tokens = {result['train_tokens_seen']:,} tokens | same segments, same order |",
        f"| training wall time | {x['train_seconds'] / 60:.1f} min | "
        f"{b['train_seconds'] / 60:.1f} min |",
        f"| **test {unit}** | **{x['test']['bits_per_token']}** (with memory) | "
        f"**{b['test_sliding_window']['bits_per_token']}** (sliding window of "
        f"{c['seg_len']}), {b['test_disjoint']['bits_per_token']} (disjoint "
        "segments) |",
        f"| test perplexity | {x['test']['perplexity']} | "
        f"{b['test_sliding_window']['perplexity']} (sliding), "
        f"{b['test_disjoint']['perplexity']} (disjoint) |",
        f"| evaluation wall time (test) | {x['test_seconds']:.1f} s | "
        f"{b['test_sliding_window_seconds']:.1f} s (sliding), "
        f"{b['test_disjoint_seconds']:.1f} s (disjoint) |",
        "",
        f"Test split: {result['test_tokens']:,} tokens in "
        f"{c['eval_batch_size']} contiguous streams. Schedule: linear warmup "
        f"to {c['learning_rate']} over {c['warmup_steps']} steps, cosine decay "
        f"to {c['min_learning_rate_ratio']}x at step {c['steps']}; Adam, "
        f"gradients clipped to global norm {c['clip_norm']}, dropout "
        f"{c['dropout_rate']}.",
        "",
        f"Job wall time {result['job_minutes']} min. Export: `{result['export']}`"
        " (signature `serving_default`: `token_ids` int32 (batch, seg_len), "
        "`memories` float32 (num_layers, batch, M, d_model) -> `log_probs`, "
        "`new_memories`; vocabulary in `assets.extra/vocab.json`).",
        "",
        "Validation bits per token during training:",
        "",
        "| step | " + " | ".join(str(s) for s in x["history"]["step"]) + " |",
        "| --- | " + " | ".join("---" for _ in x["history"]["step"]) + " |",
        "| Transformer-XL | " + " | ".join(
            f"{n / math.log(2):.3f}" for n in x["history"]["valid_nll"]) + " |",
        "| vanilla (disjoint) | " + " | ".join(
            f"{n / math.log(2):.3f}" for n in b["history"]["valid_nll"]) + " |",
        "",
    ]
    if result.get("plot"):
        lines += [f"![curves]({pathlib.Path(result['plot']).name})", ""]
    return "\n".join(lines)


def _machine():
    cores = len(os.sched_getaffinity(0)) if hasattr(
        os, "sched_getaffinity") else os.cpu_count()
    gpus = len(tf.config.list_physical_devices("GPU"))
    return (f"{gpus} GPU(s)" if gpus else "CPU only") + (
        f", {cores} core(s) usable by the process")


# -- the job ---------------------------------------------------------------------
def run(config=None, data_dir=None, workdir="runs/language_model",
        export_dir="export", results_dir="docs/results/language_model",
        verbose=None, command=None):
    """Trains both models, scores the test split, exports Transformer-XL and
    writes the result files. Returns the result dict (also written to
    ``<results_dir>/result.json``)."""
    config = (config or LanguageModelConfig()).validate()
    verbose = (1 if sys.stdout.isatty() else 2) if verbose is None else verbose
    job_start = time.time()
    workdir, results_dir = pathlib.Path(workdir), pathlib.Path(results_dir)
    workdir.mkdir(parents=True, exist_ok=True)
    results_dir.mkdir(parents=True, exist_ok=True)
    data_dir = resolve_data_dir(data_dir)
    print(f"data: {data_dir}; corpus: {config.corpus}", flush=True)

    train_ids, vocab = lm.load_lm_corpus(config.corpus, "train",
                                         data_dir=data_dir)
    valid_ids, _ = lm.load_lm_corpus(config.corpus, "valid", vocab, data_dir)
    test_ids, _ = lm.load_lm_corpus(config.corpus, "test", vocab, data_dir)
    if config.train_tokens:
        train_ids = train_ids[:config.train_tokens]
    if config.eval_tokens:
        valid_ids = valid_ids[:config.eval_tokens]
        test_ids = test_ids[:config.eval_tokens]
    train = lm.batchify(train_ids, config.batch_size)
    valid = lm.batchify(valid_ids, config.eval_batch_size)
    test = lm.batchify(test_ids, config.eval_batch_size)
    if train.shape[1] <= config.seg_len:
        raise ValueError(
            f"training streams of {train.shape[1]} tokens are too short for "
            f"seg_len={config.seg_len} (train_tokens={config.train_tokens}, "
            f"batch_size={config.batch_size})")
    print(f"vocabulary {len(vocab)}; train streams {train.shape}, valid "
          f"{valid.shape}, test {test.shape}", flush=True)
    eval_mem_len = config.eval_mem_len or config.mem_len

    # -- Transformer-XL ----------------------------------------------------------
    keras.utils.set_random_seed(config.seed)
    xl = TransformerXLLM(
        len(vocab), num_layers=config.num_layers, d_model=config.d_model,
        num_heads=config.num_heads, d_ff=config.d_ff, mem_len=config.mem_len,
        max_segment_len=config.seg_len, dropout_rate=config.dropout_rate,
        name=config.name,
    )
    xl_params = int(xl.count_params())
    vanilla_d_ff = (_matched_d_ff(config, len(vocab), xl_params)
                    if config.match_parameters else config.d_ff)
    keras.utils.set_random_seed(config.seed)
    vanilla = vanilla_transformer_lm(
        len(vocab), num_layers=config.num_layers, d_model=config.d_model,
        num_heads=config.num_heads, d_ff=vanilla_d_ff,
        max_length=config.seg_len, dropout_rate=config.dropout_rate,
        name=f"vanilla_{config.corpus}",
    )
    vanilla_params = int(vanilla.count_params())
    print(f"Transformer-XL: {xl_params:,} parameters; vanilla: "
          f"{vanilla_params:,} (d_ff {vanilla_d_ff})", flush=True)

    def xl_valid():
        xl.set_mem_len(eval_mem_len)
        try:
            return evaluate_with_memory(xl, valid, config.seg_len)
        finally:
            xl.set_mem_len(config.mem_len)

    print(f"training Transformer-XL for {config.steps} steps", flush=True)
    step = make_train_step(
        xl, keras.optimizers.Adam(cosine_warmup_schedule(config)),
        clip_norm=config.clip_norm)
    xl_history, xl_train_s, xl_eval_s = _train(
        "Transformer-XL", step, True, xl, train, config, xl_valid, verbose)

    print(f"training the vanilla Transformer for {config.steps} steps",
          flush=True)
    vstep = _make_vanilla_train_step(
        vanilla, keras.optimizers.Adam(cosine_warmup_schedule(config)),
        config.clip_norm)
    van_history, van_train_s, van_eval_s = _train(
        "vanilla", vstep, False, vanilla, train, config,
        lambda: evaluate_disjoint_segments(vanilla, valid, config.seg_len),
        verbose)

    # -- test -----------------------------------------------------------------------
    print("scoring the test split", flush=True)
    xl.set_mem_len(eval_mem_len)
    t0 = time.time()
    xl_test = evaluate_with_memory(xl, test, config.seg_len)
    xl_test_s = time.time() - t0
    t0 = time.time()
    van_disjoint = evaluate_disjoint_segments(vanilla, test, config.seg_len)
    van_disjoint_s = time.time() - t0
    t0 = time.time()
    van_sliding = evaluate_sliding_window(vanilla, test, config.seg_len)
    van_sliding_s = time.time() - t0
    print(f"test bits/token: Transformer-XL {xl_test / math.log(2):.4f}; "
          f"vanilla sliding window {van_sliding / math.log(2):.4f}, disjoint "
          f"{van_disjoint / math.log(2):.4f}", flush=True)
    xl.save(workdir / "transformer_xl.keras")
    vanilla.save(workdir / "vanilla.keras")

    path = export_language_model(
        xl, vocab, export_dir, config.name,
        extra_config={"corpus": config.corpus,
                      "level": "char" if config.corpus == "tinyshakespeare"
                      else "word",
                      "test_bits_per_token": round(xl_test / math.log(2), 4)})
    print(f"exported SavedModel to {path}", flush=True)

    result = {
        "command": command or "keras_trm.jobs.language_model.run",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
        "corpus": config.corpus,
        "vocabulary_size": len(vocab),
        "train_tokens_seen": config.steps * config.batch_size * config.seg_len,
        "test_tokens": int(test.shape[0] * (test.shape[1] - 1)),
        "transformer_xl": {
            "parameters": xl_params, "eval_mem_len": eval_mem_len,
            "test": _figures(xl_test), "test_seconds": round(xl_test_s, 1),
            "train_seconds": round(xl_train_s, 1),
            "valid_eval_seconds": round(xl_eval_s, 1),
            "history": xl_history,
        },
        "vanilla": {
            "parameters": vanilla_params, "d_ff": vanilla_d_ff,
            "test_sliding_window": _figures(van_sliding),
            "test_sliding_window_seconds": round(van_sliding_s, 1),
            "test_disjoint": _figures(van_disjoint),
            "test_disjoint_seconds": round(van_disjoint_s, 1),
            "train_seconds": round(van_train_s, 1),
            "valid_eval_seconds": round(van_eval_s, 1),
            "history": van_history,
        },
        "transformer_xl_better": bool(xl_test < min(van_sliding, van_disjoint)),
        "export": str(path),
        "config": dataclasses.asdict(config),
    }
    result["plot"] = str(_write_plot(results_dir / "curves.png", result) or "")
    result["job_minutes"] = round((time.time() - job_start) / 60, 1)
    (results_dir / "result.json").write_text(json.dumps(result, indent=1))
    (results_dir / "report.md").write_text(_report_markdown(result))
    return result


def main(argv=None):
    """Command line of ``recipes/language_model.py``: one flag per
    ``LanguageModelConfig`` field plus ``--data-dir``, ``--workdir``,
    ``--export-dir``, ``--results-dir``."""
    parser = argparse.ArgumentParser(
        prog="recipes/language_model.py",
        description="Train Transformer-XL and a vanilla Transformer LM on the "
        "same segments, report test bpc/perplexity, export Transformer-XL.")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--workdir", default="runs/language_model")
    parser.add_argument("--export-dir", default="export")
    parser.add_argument("--results-dir", default="docs/results/language_model")
    for field in dataclasses.fields(LanguageModelConfig):
        flag = "--" + field.name.replace("_", "-")
        if field.type is bool or isinstance(field.default, bool):
            parser.add_argument(flag, type=lambda s: s.lower() in (
                "1", "true", "yes", "on"), default=field.default,
                help=f"(default: {field.default})")
        else:
            parser.add_argument(flag, type=type(field.default),
                                default=field.default,
                                help=f"(default: {field.default!r})")
    args = parser.parse_args(argv)
    config = LanguageModelConfig(**{
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(LanguageModelConfig)})
    command = "python recipes/language_model.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    result = run(config, args.data_dir, args.workdir, args.export_dir,
                 args.results_dir, command=command.strip())
    summary = {
        "transformer_xl_test": result["transformer_xl"]["test"],
        "vanilla_test_sliding_window": result["vanilla"]["test_sliding_window"],
        "vanilla_test_disjoint": result["vanilla"]["test_disjoint"],
        "parameters": [result["transformer_xl"]["parameters"],
                       result["vanilla"]["parameters"]],
        "job_minutes": result["job_minutes"], "export": result["export"],
    }
    print(json.dumps(summary, indent=1))
    return result
