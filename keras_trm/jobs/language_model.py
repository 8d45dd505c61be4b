"""The language-model job: Transformer-XL against a vanilla Transformer LM.

Used by ``recipes/language_model.py``. On one corpus (char-level Tiny
Shakespeare by default, word-level PTB with ``--corpus ptb``) it

1. cuts the training split into ``batch_size`` contiguous streams
   (``batchify``) walked ``seg_len`` tokens at a time, as the reference
   ``LMOrderedIterator`` of Dai et al. (2019);
2. trains a ``TransformerXLLM`` for ``steps`` segments, carrying each
   segment's memories into the next (Dai et al. 2019 §3.2; reset when a
   pass over the streams ends);
3. trains ``vanilla_transformer_lm`` (absolute sinusoids, no memory) on the
   same segments in the same order with the same optimizer and schedule,
   its FFN width raised to match Transformer-XL's parameter count;
4. scores the test split: Transformer-XL with memory; the vanilla model on
   disjoint segments (as trained) and with a sliding window of ``seg_len``
   tokens (its best evaluation, Dai et al. §3.1);
5. exports Transformer-XL as a SavedModel (``export/<model_name>/<version>/``:
   token ids and memories in, log-probabilities and new memories out);
6. writes ``result.json``, ``report.md`` and ``curves.png`` into
   ``results_dir``.

Figures are mean negative log-likelihoods per token in nats, reported as
bits per token (``nll / ln 2``: bits per character on Tiny Shakespeare) and
perplexity (``exp(nll)``: the PTB figure).
"""

import dataclasses
import math
import os
import pathlib
import shutil
import time
import warnings

import keras

from keras_trm.data import language_modeling as lm
from keras_trm.decoding import (
    evaluate_disjoint_segments,
    evaluate_sliding_window,
    evaluate_with_memory,
)
from keras_trm.jobs import export_elsewhere
from keras_trm.jobs._setup import export_from_request, start_job
from keras_trm.jobs.language_model_config import CORPUS_RECIPES, LanguageModelConfig
from keras_trm.jobs.stages import StagedJob
from keras_trm.models import TransformerXLLM, vanilla_transformer_lm
from keras_trm.training import make_train_step, plots, train_segments, warmup_cosine_decay
from keras_trm.training.language_model import SegmentCheckpoint
from keras_trm.training.precision import apply_precision, float32_copy
from keras_trm.training.schedules import NO_WEIGHT_DECAY_NAMES
from keras_trm.utils import atomic_write, write_json
from keras_trm.utils.files import atomic_file

__all__ = ["CORPUS_RECIPES", "LanguageModelConfig", "LanguageModelRun", "cosine_warmup_schedule",
           "export_main", "fit_schedule", "float32_lm", "run"]


def cosine_warmup_schedule(config, steps=None):
    """Linear warmup to ``learning_rate`` over ``warmup_steps``, then cosine
    decay to ``min_learning_rate_ratio * learning_rate`` at ``steps``
    (default ``config.steps``; the reference code's ``scheduler='cosine'``).
    Evaluated on the host before each step, so ``fit_schedule`` can move
    the decay's end while training."""
    return warmup_cosine_decay(config.learning_rate, steps or config.steps,
                               config.warmup_steps,
                               alpha=config.min_learning_rate_ratio)


def fit_schedule(schedule, total_steps):
    """Ends ``cosine_warmup_schedule``'s decay at ``total_steps``; a
    ``UserWarning`` (once per schedule) when that leaves no decay, the
    warm-up taking every step: the rate never reaches its peak."""
    if total_steps <= schedule.warmup_steps and not getattr(
            schedule, "warned_short", False):
        schedule.warned_short = True
        warnings.warn(
            f"the run holds {total_steps} steps, no more than warmup_steps="
            f"{schedule.warmup_steps}: the learning rate never reaches its "
            "peak; lower --training.warmup_steps or give the run more time "
            "(--training.time_budget_minutes)", stacklevel=2)
    schedule.decay_steps = max(total_steps - schedule.warmup_steps, 1)


def _optimizer(config):
    """Adam whose rate ``make_train_step`` sets before each step; AdamW-style
    decoupled decay with ``weight_decay``."""
    optimizer = keras.optimizers.Adam(0.0, weight_decay=config.weight_decay or None)
    if config.weight_decay:
        optimizer.exclude_from_weight_decay(var_names=list(NO_WEIGHT_DECAY_NAMES))
    return optimizer


def float32_lm(model):
    """``model`` computing in float32 with the same weights (itself if it
    already does): the test split and the export use it."""
    if model.dtype_policy.name == "float32":
        return model
    if not isinstance(model, TransformerXLLM):
        return float32_copy(model)
    copy = TransformerXLLM.from_config({**model.get_config(), "dtype": "float32"})
    copy.set_weights(model.get_weights())
    return copy


def _figures(nll):
    return {"nll_nats": round(nll, 5), "bits_per_token": round(nll / math.log(2), 4),
            "perplexity": round(math.exp(nll), 3)}


def _matched_d_ff(config, vocabulary_size, target):
    """The vanilla FFN width whose parameter count is closest to ``target``
    (the count is linear in d_ff: num_layers * (2 d_model + 1) per unit)."""
    base = vanilla_transformer_lm(
        vocabulary_size, num_layers=config.num_layers, d_model=config.d_model,
        num_heads=config.num_heads, d_ff=config.d_ff,
        max_sequence_length=config.seg_len).count_params()
    per_unit = config.num_layers * (2 * config.d_model + 1)
    return max(1, config.d_ff + int(round((target - base) / per_unit)))


def _report_markdown(result):
    c, x, b = result["config"], result["transformer_xl"], result["vanilla"]
    unit = "bpc" if result["level"] == "char" else "bits/word"
    rows = [  # (row, Transformer-XL, vanilla: a function of b, or None)
        ("parameters", f"{x['parameters']:,}", lambda: f"{b['parameters']:,}"),
        ("layers / d_model / heads / d_ff",
         f"{c['num_layers']} / {c['d_model']} / {c['num_heads']} / {c['d_ff']}",
         lambda: f"{c['num_layers']} / {c['d_model']} / {c['num_heads']} / {b['d_ff']}"),
        ("positions", "relative (sinusoid R, u, v)", lambda: "absolute sinusoids"),
        ("segment length (train)", c["seg_len"], lambda: c["seg_len"]),
        ("memory (train / test)", f"{c['mem_len']} / {x['eval_mem_len']}", lambda: "none"),
        ("training", f"{result['steps']} steps x {c['batch_size']} x {c['seg_len']} "
         f"tokens = {result['train_tokens_seen']:,} tokens",
         lambda: "same segments, same order"),
        ("training wall time", f"{x['train_seconds'] / 60:.1f} min",
         lambda: f"{b['train_seconds'] / 60:.1f} min"),
        (f"**test {unit}**", f"**{x['test']['bits_per_token']}** (with memory)",
         lambda: f"**{b['test_sliding_window']['bits_per_token']}** (sliding window "
                 f"of {c['seg_len']}), {b['test_disjoint']['bits_per_token']} "
                 "(disjoint segments)"),
        ("test perplexity", x["test"]["perplexity"],
         lambda: f"{b['test_sliding_window']['perplexity']} (sliding), "
                 f"{b['test_disjoint']['perplexity']} (disjoint)"),
        ("evaluation wall time (test)", f"{x['test_seconds']:.1f} s",
         lambda: f"{b['test_sliding_window_seconds']:.1f} s (sliding), "
                 f"{b['test_disjoint_seconds']:.1f} s (disjoint)"),
    ]
    title = "Transformer-XL vs vanilla Transformer" if b else "Transformer-XL"
    lines = [f"# Language model: {title} on {c['corpus']}", "",
             f"Written by `{result['command']}` on {result['date']} "
             f"({result['machine']}).", "",
             "| | Transformer-XL |" + (" vanilla Transformer |" if b else ""),
             "| --- | --- |" + (" --- |" if b else "")]
    lines += [f"| {name} | {xl} |" + (f" {vanilla()} |" if b else "")
              for name, xl, vanilla in rows]
    lines += [
        "",
        f"Test split: {result['test_tokens']:,} tokens in "
        f"{c['eval_batch_size']} contiguous streams. Schedule: linear warmup "
        f"to {c['learning_rate']} over {c['warmup_steps']} steps, cosine decay "
        f"to {c['min_learning_rate_ratio']:g}x the peak at step {result['steps']}"
        + (f" (the steps {c['time_budget_minutes']:g} min held)"
           if c["time_budget_minutes"] else "")
        + "; Adam" + (f"W (weight decay {c['weight_decay']})" if c["weight_decay"] else "")
        + f", gradients clipped to global norm {c['clip_norm']}, dropout "
        f"{c['dropout_rate']}, attention dropout {c['attention_dropout_rate']}; "
        f"trained in {result['precision']}, tested in float32.",
        "",
        f"Job wall time {result['job_minutes']} min. Export: "
        + (f"none here (`{result['export_command']}` writes it)"
           if result["export"] is None else
           f"`<export_dir>/{'/'.join(pathlib.Path(result['export']).parts[-2:])}`")
        + " (signature `serving_default`: `token_ids` int32 (batch, seg_len), "
        "`memories` float32 (num_layers, batch, M, d_model) -> `log_probs`, "
        "`new_memories`; vocabulary in `assets.extra/vocab.json`).",
        "",
        "Validation bits per token during training:",
        "",
        "| step | " + " | ".join(str(s) for s in x["history"]["step"]) + " |",
        "| --- | " + " | ".join("---" for _ in x["history"]["step"]) + " |",
        "| Transformer-XL | " + " | ".join(
            f"{n / math.log(2):.3f}" for n in x["history"]["valid_nll"]) + " |",
    ]
    if b:
        lines.append("| vanilla (disjoint) | " + " | ".join(
            f"{n / math.log(2):.3f}" for n in b["history"]["valid_nll"]) + " |")
    lines.append("")
    if result.get("plot"):
        lines += [f"![curves]({pathlib.Path(result['plot']).name})", ""]
    return "\n".join(lines)


def _machine():
    cores = len(os.sched_getaffinity(0)) if hasattr(
        os, "sched_getaffinity") else os.cpu_count()
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        gpus = torch.cuda.device_count()
    else:
        gpus = sum(d.startswith("gpu") for d in keras.distribution.list_devices())
    return (f"{gpus} GPU(s)" if gpus else "CPU only") + (
        f", {cores} core(s) usable by the process; {backend}")


def _export(model, request):
    """``export_language_model`` of ``model`` as ``request`` (the fields of
    ``export_request.json``) says (TensorFlow only)."""
    from keras_trm.export import export_language_model

    return export_language_model(
        model, lm.Vocabulary(request["vocabulary"]), request["export_dir"],
        request["model_name"], extra_config=request["extra_config"])


def export_main(workdir):
    """``keras-trm export-lm --workdir DIR``: the SavedModel of a run
    trained under JAX or PyTorch, from its ``transformer_xl.keras`` and
    ``export_request.json``; writes ``export_request.done.json``."""
    return export_from_request(workdir, _export)


def run(config=None, data_dir=None, workdir="runs/language_model",
        export_dir="export", results_dir=None,
        verbose=None, command=None):
    """Trains both models, scores the test split, exports Transformer-XL and
    writes the result files. Returns the result dict (also written to
    ``<results_dir>/result.json``; ``results_dir`` None is
    ``<workdir>/results``)."""
    return LanguageModelRun(config, data_dir, workdir, export_dir, results_dir,
                            verbose, command).run()


class LanguageModelRun(StagedJob):
    """The language-model job's stages (``keras_trm.jobs.stages``)."""

    STAGES = ("prepare_data", "build", "fit", "evaluate", "export", "report")

    def __init__(self, config, data_dir, workdir, export_dir, results_dir,
                 verbose, command):
        self.config = config = (config or LanguageModelConfig()).validate()
        self.job_start, self.workdir, self.data_dir, self.verbose = start_job(
            workdir, data_dir, verbose, note=f"; corpus: {config.corpus}",
            download=config.download)
        self.results_dir = pathlib.Path(results_dir or self.workdir / "results")
        self.results_dir.mkdir(parents=True, exist_ok=True)
        self.export_dir, self.command = export_dir, command

    def prepare_data(self):
        """The training and validation splits as id streams, one row per
        batch element (the test split is read by ``evaluate`` only)."""
        config = self.config
        if config.corpus == "file":
            splits, vocab = lm.load_text_file(config.text_file, config.level)
            train_ids, valid_ids = splits["train"], splits["valid"]
            self._test_ids = lambda: splits["test"]
        else:
            def load(split, vocab=None):
                return lm.load_lm_corpus(config.corpus, split, vocab, self.data_dir,
                                         download=config.download)

            train_ids, vocab = load("train")
            valid_ids = load("valid", vocab)[0]
            self._test_ids = lambda: load("test", vocab)[0]
        self.vocab = vocab
        self.train = train = lm.batchify(train_ids[:config.train_tokens or None],
                                         config.batch_size)
        self.valid = valid = lm.batchify(valid_ids[:config.eval_tokens or None],
                                         config.eval_batch_size)
        if train.shape[1] <= config.seg_len:
            raise ValueError(
                f"training streams of {train.shape[1]} tokens are too short for "
                f"seg_len={config.seg_len} (train_tokens={config.train_tokens}, "
                f"batch_size={config.batch_size})")
        print(f"vocabulary {len(vocab)}; train streams {train.shape}, valid "
              f"{valid.shape}", flush=True)
        self.eval_mem_len = config.eval_mem_len or config.mem_len

    def build(self):
        """Transformer-XL and the vanilla Transformer it is compared with
        (its d_ff matched to the same parameter count if asked), in
        ``precision`` (the global dtype policy is restored after)."""
        previous = keras.config.dtype_policy()
        try:
            self.policy = apply_precision(self.config.precision)
            self._build_models()
        finally:
            keras.config.set_dtype_policy(previous)

    def _build_models(self):
        config, vocab = self.config, self.vocab
        shared = dict(num_layers=config.num_layers, d_model=config.d_model,
                      num_heads=config.num_heads, dropout_rate=config.dropout_rate,
                      attention_dropout_rate=config.attention_dropout_rate)
        keras.utils.set_random_seed(config.seed)
        self.xl = TransformerXLLM(len(vocab), d_ff=config.d_ff, mem_len=config.mem_len,
                                  max_segment_len=config.seg_len, name=config.name, **shared)
        self.xl_params = int(self.xl.count_params())
        self.vanilla = None
        if not config.baseline:
            print(f"Transformer-XL: {self.xl_params:,} parameters (no vanilla "
                  "baseline: --training.baseline false)", flush=True)
            return
        self.vanilla_d_ff = (_matched_d_ff(config, len(vocab), self.xl_params)
                             if config.match_parameters else config.d_ff)
        keras.utils.set_random_seed(config.seed)
        self.vanilla = vanilla_transformer_lm(
            len(vocab), d_ff=self.vanilla_d_ff, max_sequence_length=config.seg_len,
            name=f"vanilla_{config.corpus}", **shared)
        self.vanilla_params = int(self.vanilla.count_params())
        print(f"Transformer-XL: {self.xl_params:,} parameters; vanilla: "
              f"{self.vanilla_params:,} (d_ff {self.vanilla_d_ff})", flush=True)

    def fit(self):
        """Transformer-XL for ``steps`` (or the steps its time budget
        holds), then the vanilla model for the same steps with the same
        schedule; valid perplexity every ``eval_every`` steps
        (Transformer-XL with its memory)."""
        config, xl, vanilla, valid = self.config, self.xl, self.vanilla, self.valid

        def xl_valid():
            xl.set_mem_len(self.eval_mem_len)
            try:
                return evaluate_with_memory(xl, valid, config.seg_len)
            finally:
                xl.set_mem_len(config.mem_len)

        budget = config.time_budget_minutes * 60
        print(f"training Transformer-XL for {config.steps} steps"
              + (f" or {config.time_budget_minutes:g} min, whichever ends first"
                 if budget else ""), flush=True)
        schedule = cosine_warmup_schedule(config)
        optimizer = _optimizer(config)
        step = make_train_step(xl, optimizer, clip_norm=config.clip_norm,
                               schedule=schedule)
        self.xl_history, self.xl_train_s, self.xl_eval_s = train_segments(
            "Transformer-XL", step, xl, self.train, config.seg_len, config.steps,
            config.eval_every, xl_valid, self.verbose, budget_seconds=budget,
            on_fit=lambda steps: fit_schedule(schedule, steps),
            checkpoint=self._checkpoint("transformer_xl", xl, optimizer))
        self.steps = self.xl_history["step"][-1]
        if vanilla is None:
            return
        print(f"training the vanilla Transformer for {self.steps} steps",
              flush=True)
        optimizer = _optimizer(config)
        vstep = make_train_step(vanilla, optimizer, clip_norm=config.clip_norm,
                                schedule=cosine_warmup_schedule(config, self.steps))
        self.van_history, self.van_train_s, self.van_eval_s = train_segments(
            "vanilla", vstep, vanilla, self.train, config.seg_len, self.steps,
            config.eval_every,
            lambda: evaluate_disjoint_segments(vanilla, valid, config.seg_len),
            self.verbose,
            checkpoint=self._checkpoint("vanilla", vanilla, optimizer))

    def _checkpoint(self, name, model, optimizer):
        """``<workdir>/checkpoints/<name>``: a run killed in training goes
        on from its last validation when started again with the same
        config (``report`` removes them once the job is done)."""
        return SegmentCheckpoint(self.workdir / "checkpoints" / name, model,
                                 optimizer, dataclasses.asdict(self.config))

    def evaluate(self):
        """The test split, once, in float32: Transformer-XL with memory,
        the vanilla model on disjoint segments and with a sliding window."""
        config = self.config
        self.test = test = lm.batchify(self._test_ids()[:config.eval_tokens or None],
                                       config.eval_batch_size)
        print(f"scoring the test split {test.shape}", flush=True)
        self.xl = float32_lm(self.xl)
        self.xl.set_mem_len(self.eval_mem_len)
        evaluations = {"xl": (evaluate_with_memory, self.xl)}
        if self.vanilla is not None:
            self.vanilla = float32_lm(self.vanilla)
            evaluations.update(disjoint=(evaluate_disjoint_segments, self.vanilla),
                               sliding=(evaluate_sliding_window, self.vanilla))
        nll, self.test_seconds = {}, {}
        for name, (evaluate, model) in evaluations.items():
            t0 = time.time()
            nll[name] = evaluate(model, test, config.seg_len)
            self.test_seconds[name] = time.time() - t0
        self.xl_test = nll["xl"]
        line = f"test bits/token: Transformer-XL {self.xl_test / math.log(2):.4f}"
        if self.vanilla is not None:
            self.van_disjoint, self.van_sliding = nll["disjoint"], nll["sliding"]
            line += (f"; vanilla sliding window {self.van_sliding / math.log(2):.4f}, "
                     f"disjoint {self.van_disjoint / math.log(2):.4f}")
        print(line, flush=True)

    def export(self):
        """Both models as ``.keras``; Transformer-XL as a SavedModel, here
        under TensorFlow, else through ``export_elsewhere``."""
        config = self.config
        self.export_command = None
        xl_path = self.workdir / "transformer_xl.keras"
        with atomic_file(xl_path, suffix=".keras") as tmp:
            self.xl.save(tmp)
        if self.vanilla is not None:
            with atomic_file(self.workdir / "vanilla.keras", suffix=".keras") as tmp:
                self.vanilla.save(tmp)
        request = {"model": xl_path.name, "vocabulary": list(self.vocab.tokens),
                   "export_dir": str(self.export_dir), "model_name": config.name,
                   "extra_config": {
                       "corpus": config.corpus, "level": config.token_level,
                       "test_bits_per_token": round(self.xl_test / math.log(2), 4)}}
        if keras.backend.backend() == "tensorflow":
            self.export_path = _export(self.xl, request)
        else:
            write_json(self.workdir / "export_request.json", request)
            self.export_path, self.export_command = export_elsewhere(
                f"keras-trm export-lm --workdir {self.workdir}")
        if self.export_path is not None:
            print(f"exported SavedModel to {self.export_path}", flush=True)

    def report(self):
        """``result.json``, ``report.md`` and the curves' plot."""
        config, test, seconds = self.config, self.test, self.test_seconds
        self.result = result = {
            "command": self.command or "keras_trm.jobs.language_model.run",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": _machine(),
            "backend": keras.backend.backend(),
            "corpus": config.corpus,
            "level": config.token_level,
            "vocabulary_size": len(self.vocab),
            "steps": self.steps, "precision": self.policy,
            "train_tokens_seen": self.steps * config.batch_size * config.seg_len,
            "test_tokens": int(test.shape[0] * (test.shape[1] - 1)),
            "transformer_xl": {
                "parameters": self.xl_params, "eval_mem_len": self.eval_mem_len,
                "test": _figures(self.xl_test), "test_seconds": round(seconds["xl"], 1),
                "train_seconds": round(self.xl_train_s, 1),
                "valid_eval_seconds": round(self.xl_eval_s, 1),
                "history": self.xl_history,
            },
            "vanilla": None if self.vanilla is None else {
                "parameters": self.vanilla_params, "d_ff": self.vanilla_d_ff,
                "test_sliding_window": _figures(self.van_sliding),
                "test_sliding_window_seconds": round(seconds["sliding"], 1),
                "test_disjoint": _figures(self.van_disjoint),
                "test_disjoint_seconds": round(seconds["disjoint"], 1),
                "train_seconds": round(self.van_train_s, 1),
                "valid_eval_seconds": round(self.van_eval_s, 1),
                "history": self.van_history,
            },
            "transformer_xl_better": None if self.vanilla is None else bool(
                self.xl_test < min(self.van_sliding, self.van_disjoint)),
            "export": self.export_path and str(self.export_path),
            "export_command": self.export_command,
            "config": dataclasses.asdict(config),
            "stage_seconds": dict(self.stage_seconds),  # the stages before this one
        }
        result["plot"] = None
        if plots.available():
            result["plot"] = str(plots.plot_lm_curves(self.results_dir / "curves.png", result))
        else:
            print('no plot: matplotlib is not installed (pip install "keras_trm[plots]")')
        result["job_minutes"] = round((time.time() - self.job_start) / 60, 1)
        write_json(self.results_dir / "result.json", result)
        atomic_write(self.results_dir / "report.md", _report_markdown(result))
        # Done: a new run in this workdir trains afresh.
        shutil.rmtree(self.workdir / "checkpoints", ignore_errors=True)
