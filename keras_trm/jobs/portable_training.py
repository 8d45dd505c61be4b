"""Training on a GPU machine without TensorFlow: the trainer
(``keras-trm train-portable``, or ``python -m
keras_trm.jobs.portable_training``).

The usual JAX or PyTorch GPU machine has no TensorFlow, and the data
pipeline (tf.data shards), the tokenizers (tf-text) and the SavedModel
export need it. So a translation run is split in three:

1. ``keras-trm prepare-translation`` (TensorFlow; ``keras_trm.jobs.
   portable_tensorflow.prepare_translation``) tokenizes the corpus with the
   translation job's vocabulary and filters, and writes a *prepared
   folder*: ``train-NNNNN.npz`` and ``val-NNNNN.npz`` (token ids),
   ``val.source.txt`` / ``val.target.txt`` (and the test split's) raw
   text, the vocabulary file and ``manifest.json``.
2. ``keras-trm train-portable`` (this module; numpy and Keras only, no
   TensorFlow imported) trains the manifest's model with the paper's
   recipe and writes the averaged weights as ``weights-NNNNN.npz`` +
   ``weights.json`` + ``result.json``, every file at most
   ``max_file_mib`` (16 MiB) so that they are easy to move.
3. ``keras-trm export-portable`` (TensorFlow) loads the tokenizer and the
   weights into a float32 model, writes the usual raw-text SavedModel and
   reports sacreBLEU on val (and test).

The file formats and the numpy readers and writers are in
``keras_trm.jobs.portable_files``.

The checkpoint average is chosen by the label-smoothed cross-entropy over
the val target tokens, not by greedy BLEU as in ``keras-trm
train-translation``: BLEU needs the detokenizer, which is a TensorFlow
graph (tf-text). ``export-portable`` reports the BLEU afterwards.

Everything here runs on any Keras backend; under ``KERAS_BACKEND=jax`` the
training step is compiled with ``jax.jit`` (``jit_compile``).
"""

import dataclasses
import json
import os
import pathlib
import platform
import sys
import time
from typing import Literal, Optional

import keras

from keras_trm.jobs.portable_files import (  # noqa: F401  (re-exported)
    DEFAULT_MAX_FILE_MIB,
    MANIFEST,
    MIB,
    WEIGHT_DTYPES,
    Pairs,
    PairWriter,
    TokenBatches,
    bucket_boundaries,
    build_model,
    load_pairs,
    load_portable_model,
    load_weights,
    max_file_bytes,
    parse_boundaries,
    prefetch,
    read_prepared,
    read_weights,
    sha256_file,
    write_weights,
)
from keras_trm.jobs.stages import StagedJob
from keras_trm.training import (
    DataPosition,
    EpochCheckpoints,
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    NoamSchedule,
    PerUpdateSchedule,
    TimeBudget,
    TrainingBackup,
    accumulation_steps,
    paper_adam,
    select_checkpoint_average,
)
from keras_trm.training.precision import CHOICES as PRECISIONS
from keras_trm.training.precision import resolve_precision
from keras_trm.utils import checks as v
from keras_trm.utils.files import atomic_write, write_json
from keras_trm.utils.ids import PAD_ID


# -- data, metrics and logs ---------------------------------------------------------


class _BatchList(keras.utils.PyDataset):
    """A fixed list of batches as a ``PyDataset`` (validation data that
    ``fit`` iterates once per epoch)."""

    def __init__(self, batches):
        super().__init__()
        self.batches = list(batches)

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        return self.batches[index]


@keras.saving.register_keras_serializable(package="keras_trm")
class TokenLoss(keras.metrics.Mean):
    """The label-smoothed cross-entropy (``LabelSmoothedCrossEntropy``)
    averaged over every real target token seen, not over batches: each
    batch's token mean weighs by its token count (nats per token). With it
    the val loss of an epoch, and of a checkpoint average, is the loss of
    the whole val split.

    Example:

    >>> import numpy as np
    >>> m = TokenLoss(label_smoothing=0.0)
    >>> logits = np.zeros((1, 2, 4), "float32")   # uniform: log 4 per token
    >>> _ = m.update_state(np.array([[1, 0]]), logits)   # 1 token
    >>> _ = m.update_state(np.array([[1, 2]]), logits + np.eye(4)[[1, 2]] * 50)
    >>> round(float(m.result()), 4)   # (log 4 + 0 + 0) / 3 tokens
    0.4621
    """

    def __init__(self, label_smoothing=0.1, pad_id=PAD_ID, name="token_loss",
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = float(label_smoothing)
        self.pad_id = int(pad_id)
        self._loss = LabelSmoothedCrossEntropy(label_smoothing, pad_id=pad_id)

    def update_state(self, y_true, y_pred, sample_weight=None):
        count = keras.ops.sum(keras.ops.cast(
            keras.ops.not_equal(keras.ops.cast(y_true, "int32"), self.pad_id),
            "float32"))
        return super().update_state(self._loss.call(y_true, y_pred),
                                    sample_weight=count)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing,
                "pad_id": self.pad_id}


class EpochLog(keras.callbacks.Callback):
    """One record per epoch, appended to ``path`` (JSON, written
    atomically): ``epoch``, the epoch's ``loss`` (mean of the batch
    losses), ``token_loss`` and ``val_token_loss`` (nats per target
    token), ``accuracy`` / ``val_accuracy``, ``steps`` (trained in this
    process: fewer in an epoch a resumed run finishes), ``target_tokens``
    (``tokens_per_epoch`` x the share of the epoch's steps trained),
    ``seconds`` and ``tokens_per_second`` (per second of the epoch's wall
    time, validation included), ``train_minutes`` (``clock()``: training
    time so far, restarts included). Its history is part of
    ``get_state()`` (``TrainingBackup``).

    Args:
        path: the JSON file.
        tokens_per_epoch: int, real target tokens (labels) in one epoch.
        steps_per_epoch: int, batches in one epoch.
        clock: optional callable -> training seconds so far.
    """

    KEYS = ("loss", "token_loss", "accuracy", "val_token_loss", "val_accuracy")

    def __init__(self, path, tokens_per_epoch, steps_per_epoch, clock=None):
        super().__init__()
        self.path = pathlib.Path(path)
        self.tokens_per_epoch = int(tokens_per_epoch)
        self.steps_per_epoch = v.positive_int("steps_per_epoch", steps_per_epoch)
        self.clock = clock
        self.history = []
        self._start, self._steps = time.time(), 0

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._steps = time.time(), 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        seconds = time.time() - self._start
        record = {"epoch": epoch + 1}
        record.update({k: round(float(logs[k]), 5) for k in self.KEYS if k in logs})
        tokens = self.tokens_per_epoch * min(self._steps, self.steps_per_epoch) \
            / self.steps_per_epoch
        record.update(steps=self._steps, target_tokens=int(round(tokens)),
                      seconds=round(seconds, 2),
                      tokens_per_second=round(tokens / max(seconds, 1e-9), 1))
        if self.clock is not None:
            record["train_minutes"] = round(self.clock() / 60, 3)
        self.history = [h for h in self.history if h["epoch"] <= epoch] + [record]
        write_json(self.path, self.history)

    def get_state(self):
        return {"history": self.history}

    def set_state(self, state):
        self.history = list(state["history"])


# -- the trainer --------------------------------------------------------------------


Precision = Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"]
OnOffAuto = Literal["auto", "on", "off"]
WeightsDtype = Literal["float32", "bfloat16"]
# Trainer fields that default to the prepared folder's TranslationConfig.
RECIPE_FIELDS = ("epochs", "tokens_per_batch", "tokens_per_step",
                 "warmup_steps", "lr_scale", "label_smoothing", "weight_decay",
                 "average_last", "time_budget_minutes", "seed")
# Their values in folders prepared before the field existed.
_RECIPE_FIELDS_ADDED = {"weight_decay": 0.0}


@dataclasses.dataclass
class PortableTrainingConfig:
    """What ``keras-trm train-portable`` trains, and how. The model comes
    from the prepared folder's manifest; the recipe fields left at None
    take the prepared config's value (the ``keras-trm
    train-translation`` flags given to ``prepare-translation``)."""

    prepared: str = "runs/multi30k/portable"
    """The folder ``keras-trm prepare-translation`` wrote (manifest.json,
    train-*.npz, val-*.npz, the vocabulary)."""
    epochs: Optional[int] = None
    """The most training epochs (null: the prepared config's)."""
    tokens_per_batch: Optional[int] = None
    """Batch size in padded tokens per side (tokens; null: the prepared
    config's)."""
    tokens_per_step: Optional[int] = None
    """> 0: accumulate batches up to this many tokens per update (the
    paper's ~25,000; tokens; null: the prepared config's)."""
    warmup_steps: Optional[int] = None
    """Noam schedule warm-up (updates; null: the prepared config's)."""
    lr_scale: Optional[float] = None
    """Factor on the Noam learning rate (null: the prepared config's)."""
    label_smoothing: Optional[float] = None
    """Label smoothing epsilon_ls (fraction; null: the prepared config's)."""
    weight_decay: Optional[float] = None
    """Decoupled weight decay, ``paper_adam(weight_decay=)`` (fraction of
    the learning rate per update; null: the prepared config's, 0 in folders
    prepared before it existed)."""
    average_last: Optional[int] = None
    """The most epoch checkpoints averaged; the number is chosen by val
    loss (null: the prepared config's)."""
    time_budget_minutes: Optional[float] = None
    """Training time budget: stops after the epoch that another epoch would
    overrun (minutes; null: the prepared config's)."""
    seed: Optional[int] = None
    """Random seed: initialization, batch order, dropout (null: the
    prepared config's)."""
    boundaries: str = ""
    """Bucket lengths, comma-separated (tokens; empty: the translation
    job's 8,12,...,128 below the longest training pair). Fewer buckets,
    fewer jax.jit compilations."""
    precision: Precision = "auto"
    """Dtype policy: auto is float32 under JAX and PyTorch (GPUs: as
    train-translation; CPUs: the bfloat16 rule was measured under
    TensorFlow, and a JAX step on a bfloat16 CPU was slower in bfloat16)
    and resolve_precision's choice under TensorFlow; mixed_bfloat16 is the
    explicit choice for A100/H100-class GPUs."""
    jit_compile: OnOffAuto = "auto"
    """Compile the training step: auto is on under JAX (jax.jit), off
    under PyTorch (torch.compile is on)."""
    weights_dtype: WeightsDtype = "float32"
    """dtype of the written weights: float32 (exact) or bfloat16 (half the
    bytes, rounded)."""
    max_file_mib: float = DEFAULT_MAX_FILE_MIB
    """The largest file written to <workdir>/weights (MiB)."""
    save_freq: int = 1000
    """Training steps between resume backups in <workdir>/backup (steps;
    one is also written after every epoch)."""

    def validate(self):
        """Raises ``ValueError``/``TypeError`` naming a bad field and its
        value."""
        for name in ("epochs", "tokens_per_batch", "warmup_steps", "average_last"):
            if getattr(self, name) is not None:
                v.positive_int(name, getattr(self, name))
        for name in ("tokens_per_step", "seed"):
            if getattr(self, name) is not None:
                v.non_negative_int(name, getattr(self, name))
        for name in ("lr_scale", "time_budget_minutes"):
            if getattr(self, name) is not None:
                v.positive_float(name, getattr(self, name))
        if self.label_smoothing is not None:
            v.rate("label_smoothing", self.label_smoothing)
        if self.weight_decay is not None:
            v.non_negative_float("weight_decay", self.weight_decay)
        v.one_of("precision", self.precision, PRECISIONS)
        v.one_of("jit_compile", self.jit_compile, ("auto", "on", "off"))
        v.one_of("weights_dtype", self.weights_dtype, WEIGHT_DTYPES)
        max_file_bytes(self.max_file_mib)
        v.positive_int("save_freq", self.save_freq)
        parse_boundaries(self.boundaries)
        if not str(self.prepared).strip():
            raise ValueError("`prepared` must name the prepared folder, got "
                             f"prepared={self.prepared!r}")


def recipe(config, manifest):
    """The recipe a run uses: each of ``RECIPE_FIELDS`` from ``config``,
    or where it is None from the prepared config (``manifest["config"]``).

    Example:

    >>> recipe(PortableTrainingConfig(epochs=3),
    ...        {"config": {k: 1 for k in RECIPE_FIELDS}})["epochs"]
    3
    """
    prepared = {**_RECIPE_FIELDS_ADDED, **manifest["config"]}
    return {name: (getattr(config, name) if getattr(config, name) is not None
                   else prepared[name]) for name in RECIPE_FIELDS}


def device_description():
    """The accelerator the backend computes on, in words (e.g. ``"1 x
    NVIDIA H100 80GB HBM3 (gpu)"``, ``"1 x cpu (cpu), 2 cores"``)."""
    backend = keras.backend.backend()
    cores = f"{os.cpu_count()} cores"
    if backend == "jax":
        import jax

        devices = jax.devices()
        return (f"{len(devices)} x {devices[0].device_kind} "
                f"({devices[0].platform}), {cores}")
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            return (f"{torch.cuda.device_count()} x "
                    f"{torch.cuda.get_device_name(0)} (cuda), {cores}")
        return f"cpu (torch), {cores}"
    return f"{backend}, {cores}"


def _backup_step(backup_dir):
    """The global step a backup in ``backup_dir`` resumes at (0: none)."""
    try:
        return int(json.loads((pathlib.Path(backup_dir) / "state.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0  # none, or damaged: TrainingBackup names the damage


def evaluate_token_loss(model, batches):
    """The model's label-smoothed cross-entropy over every real target
    token of ``batches`` (a ``_BatchList``; nats per token), with
    ``model``'s compiled ``TokenLoss`` metric."""
    return float(model.evaluate(batches, verbose=0, return_dict=True)["token_loss"])


def train(config=None, workdir="runs/portable", verify=True):
    """Trains the prepared folder's model with the paper's recipe; needs
    no TensorFlow. Returns the dict also written to ``result.json``.

    The recipe (Vaswani et al. 2017 §5): token-count batches with length
    buckets (``TokenBatches``), Adam(0.9, 0.98, 1e-9) with the Noam
    schedule (``paper_adam``, ``NoamSchedule``; ``tokens_per_step``
    accumulates batches per update), label-smoothed cross-entropy
    (``LabelSmoothedCrossEntropy``), a checkpoint per epoch of which the
    last ``average_last`` are kept, and at the end the average of the
    last k for the k with the lowest val loss (label-smoothed
    cross-entropy over the val target tokens, ``TokenLoss``).

    Files in ``workdir``: ``config.yaml`` (from the command line),
    ``epochs.json`` (one record per epoch, see ``EpochLog``),
    ``checkpoints/`` (the kept epoch checkpoints), ``backup/`` (resume),
    ``result.json``, and ``weights/``: ``weights.json``,
    ``weights-NNNNN.npz`` and a copy of ``result.json``, each at most
    ``max_file_mib``: the folder to copy to a TensorFlow machine for
    ``keras-trm export-portable``.

    Resume: a killed run continues when run again with the same
    ``workdir`` (``TrainingBackup``: every ``save_freq`` steps and every
    epoch; the same batches in the same order as an uninterrupted run,
    at most ``save_freq`` steps repeated). A finished run run again trains
    no further and averages and writes the weights again. Delete
    ``workdir/backup`` to train from scratch.

    Args:
        config: ``PortableTrainingConfig``.
        workdir: the run folder (created).
        verify: check the prepared files' sizes and SHA-256 first (False:
            the caller has, as ``main`` does).

    Returns:
        dict: ``backend``, ``device``, ``precision``, ``epochs``,
        ``train_minutes``, ``job_minutes``, ``val_token_loss_by_epoch``,
        ``averaged_checkpoints`` (the chosen k),
        ``val_token_loss_by_average`` ({k: loss}), ``weights`` (folder,
        dtype, files, bytes), ``recipe``, ``epochs_log``,
        ``stage_seconds`` (``PortableTrainingRun``'s stages before the
        report: wall seconds each), ...

    Raises:
        FileNotFoundError / ValueError: a missing or damaged prepared
            folder (``read_prepared``), a bad config value.

    Example (a prepared folder from ``keras-trm prepare-translation``)::

        KERAS_BACKEND=jax keras-trm train-portable \\
            --prepared runs/multi30k/portable --workdir runs/portable
    """
    config = config or PortableTrainingConfig()
    config.validate()
    previous_policy = keras.config.dtype_policy()
    try:
        return PortableTrainingRun(config, pathlib.Path(workdir), verify).run()
    finally:
        keras.config.set_dtype_policy(previous_policy)


def _precision(choice):
    """The dtype policy of a run and why: ``(policy, reason)``. ``auto``
    (unless ``KERAS_TRM_PRECISION`` names one, as ``apply_precision``
    reads it) is ``resolve_precision``'s: float32 off TensorFlow."""
    if choice == "auto" and os.environ.get("KERAS_TRM_PRECISION"):
        choice = os.environ["KERAS_TRM_PRECISION"]  # as apply_precision
    return resolve_precision(choice)


class PortableTrainingRun(StagedJob):
    """The stages of ``train`` (``keras_trm.jobs.stages``): each reads
    what the earlier ones set on ``self``. ``run()`` returns the dict
    ``train`` documents (written to ``<workdir>/result.json``), with
    ``stage_seconds``.

    Args:
        config: a validated ``PortableTrainingConfig``.
        workdir: the run folder (``pathlib.Path``).
        verify: check the prepared files' sizes and SHA-256 first.
    """

    STAGES = ("setup", "prepare_data", "build", "fit", "select_average",
              "export", "report")

    def __init__(self, config, workdir, verify):
        self.config, self.workdir, self.verify = config, pathlib.Path(workdir), verify
        self.prepared = pathlib.Path(config.prepared)
        self.job_start = time.time()

    def setup(self):
        """The prepared folder's manifest (checked), the recipe, the seed
        and the dtype policy."""
        self.manifest = read_prepared(self.prepared, verify=self.verify)
        self.recipe = recipe(self.config, self.manifest)
        keras.utils.set_random_seed(self.recipe["seed"])
        self.precision, reason = _precision(self.config.precision)
        keras.mixed_precision.set_global_policy(self.precision)
        self.device = device_description()
        print(f"backend: {keras.backend.backend()}; device: {self.device}; "
              f"precision: {self.precision} ({reason})", flush=True)

    def prepare_data(self):
        """The train and val pairs as token-count batches in length
        buckets (val: one fixed list, every pair once)."""
        prepared, manifest, run = self.prepared, self.manifest, self.recipe
        self.train_pairs = load_pairs(prepared, "train", manifest)
        self.val_pairs = val_pairs = load_pairs(prepared, "validation", manifest)
        self.boundaries = boundaries = bucket_boundaries(
            manifest["max_train_length"], parse_boundaries(self.config.boundaries))
        val_boundaries = bucket_boundaries(
            max(boundaries[-1], int(val_pairs.pair_lengths().max())), boundaries)
        self.tokens_per_batch = tokens = max(run["tokens_per_batch"], val_boundaries[-1])
        if tokens != run["tokens_per_batch"]:
            print(f"tokens_per_batch {run['tokens_per_batch']} raised to "
                  f"{tokens}, the longest bucket", flush=True)
        self.batches = TokenBatches(self.train_pairs, tokens, boundaries,
                                    seed=run["seed"])
        self.val_data = _BatchList(TokenBatches(val_pairs, tokens, val_boundaries,
                                                shuffle=False).epoch(0))
        self.steps = self.batches.batches_per_epoch
        print(f"train: {len(self.train_pairs):,} pairs, {self.steps} batches per "
              f"epoch, shapes {self.batches.shapes}; val: {len(val_pairs):,} pairs, "
              f"{len(self.val_data)} batches", flush=True)

    def build(self):
        """The manifest's model, compiled with the paper's optimizer,
        schedule and loss (``tokens_per_step`` accumulates batches)."""
        run, model_config = self.recipe, self.manifest["model"]
        self.model = model = build_model(model_config)
        accumulate = accumulation_steps(run["tokens_per_step"], self.tokens_per_batch, 1)
        schedule = NoamSchedule(model_config["d_model"], run["warmup_steps"],
                                run["lr_scale"])
        if accumulate > 1:  # the schedule counts updates, not micro-batches
            schedule = PerUpdateSchedule(schedule, accumulate)
        self.jit = jit = {"on": True, "off": False}.get(
            self.config.jit_compile, keras.backend.backend() == "jax")
        model.compile(
            optimizer=paper_adam(
                schedule, weight_decay=run["weight_decay"],
                gradient_accumulation_steps=accumulate if accumulate > 1 else None),
            loss=LabelSmoothedCrossEntropy(run["label_smoothing"]),
            metrics=[TokenLoss(run["label_smoothing"]), MaskedAccuracy()],
            jit_compile=jit)
        print(f"model: {model.count_params():,} parameters; jit_compile={jit}"
              + (f"; {accumulate} batches per update" if accumulate > 1 else ""),
              flush=True)

    def fit(self):
        """``fit`` within the time budget, resumed from ``<workdir>/backup``
        where a run left one; a checkpoint per epoch kept for the average."""
        workdir, run, steps = self.workdir, self.recipe, self.steps
        workdir.mkdir(parents=True, exist_ok=True)
        self.start_step = start_step = _backup_step(workdir / "backup")
        budget = TimeBudget(run["time_budget_minutes"] * 60)
        self.checkpoints = checkpoints = EpochCheckpoints(workdir / "checkpoints",
                                                          keep=run["average_last"])
        self.log = log = EpochLog(
            workdir / "epochs.json",
            int(self.train_pairs.target_lengths().sum() - len(self.train_pairs)),
            steps, clock=budget.elapsed)
        backup = TrainingBackup(
            workdir / "backup", save_freq=self.config.save_freq,
            position=DataPosition(), steps_per_epoch=steps,
            stateful={"time_budget": budget, "epoch_log": log,
                      "checkpoints": checkpoints},
            # Another prepared folder, model or recipe: refused, not resumed
            # (the epochs and the time budget may change on resume).
            fingerprint={"prepared_manifest_sha256": sha256_file(self.prepared / MANIFEST),
                         "model": self.manifest["model"],
                         **{k: v for k, v in run.items()
                            if k not in ("epochs", "time_budget_minutes")}})
        # The stream starts where the backup left off (TrainingBackup restores
        # the weights, the optimizer and the step in on_train_begin).
        stream = prefetch(self.batches.stream(start_step // steps, start_step % steps))
        try:
            self.model.fit(stream, epochs=run["epochs"], steps_per_epoch=steps,
                           validation_data=self.val_data, shuffle=False,
                           callbacks=[backup, checkpoints, log, budget],
                           verbose=1 if sys.stdout.isatty() else 2)
        finally:
            stream.close()
        self.train_seconds = budget.elapsed()

    def select_average(self):
        """The average of the last k checkpoints for the k with the lowest
        val loss (``TokenLoss``), loaded into the model."""
        self.losses = losses = {}

        def score(candidate):  # higher is better: minus the val loss
            loss = evaluate_token_loss(candidate, self.val_data)
            losses[len(losses) + 1] = round(loss, 5)
            return -loss

        self.averaged, _ = select_checkpoint_average(
            self.model, self.checkpoints.paths, score, self.recipe["average_last"])
        print("val loss of the average of the last k checkpoints: "
              + ", ".join(f"k={k}: {x:.4f}" for k, x in losses.items())
              + f" -> averaging the last {self.averaged}", flush=True)

    def export(self):
        """The averaged weights as ``<workdir>/weights`` (files of at most
        ``max_file_mib``)."""
        self.max_bytes = max_file_bytes(self.config.max_file_mib)
        self.weights_dir = self.workdir / "weights"
        files = write_weights(
            self.model, self.weights_dir, self.config.weights_dtype, self.max_bytes,
            extra={"model": self.manifest["model"],
                   "prepared_manifest_sha256": sha256_file(self.prepared / MANIFEST),
                   "averaged_checkpoints": self.averaged})["files"].values()
        self.weights = {
            "folder": str(self.weights_dir), "dtype": self.config.weights_dtype,
            "files": len(files), "bytes": sum(f["bytes"] for f in files),
            "largest_file_bytes": max(f["bytes"] for f in files),
            "max_file_bytes": self.max_bytes}

    def report(self):
        """``result.json`` in the workdir and beside the weights."""
        config, history, losses = self.config, self.log.history, self.losses
        self.result = result = {
            "backend": keras.backend.backend(),
            "device": self.device,
            "precision": self.precision,
            "host": platform.node(),
            "prepared": str(self.prepared),
            "parameters": int(self.model.count_params()),
            "epochs": len(history),
            "steps_per_epoch": self.steps,
            "train_pairs": len(self.train_pairs),
            "validation_pairs": len(self.val_pairs),
            "resumed_from_step": self.start_step,
            "train_minutes": round(self.train_seconds / 60, 2),
            "job_minutes": round((time.time() - self.job_start) / 60, 2),
            "tokens_per_second_last_epoch": (history[-1].get("tokens_per_second")
                                             if history else None),
            "val_token_loss_by_epoch": [h.get("val_token_loss") for h in history],
            "averaged_checkpoints": self.averaged,
            "val_token_loss_by_average": losses,
            "val_token_loss": losses[self.averaged],
            "weights": self.weights,
            "recipe": {**self.recipe, "tokens_per_batch": self.tokens_per_batch,
                       "boundaries": list(self.boundaries), "jit_compile": self.jit},
            "epochs_log": history,
            "config": dataclasses.asdict(config),
            "stage_seconds": dict(self.stage_seconds),  # the stages before this one
        }
        write_json(self.weights_dir / "result.json", result)
        write_json(self.workdir / "result.json", result)
        print(f"weights: {self.weights_dir} ({self.weights['files']} files, "
              f"{self.weights['bytes'] / MIB:.1f} MiB, {config.weights_dtype})",
              flush=True)


# -- command line -------------------------------------------------------------------


def main(argv=None, prog="python -m keras_trm.jobs.portable_training"):
    """``keras-trm train-portable``: parses the flags (one per field of
    ``PortableTrainingConfig``, plus ``--workdir`` and ``--config
    FILE.yaml``), writes ``<workdir>/config.yaml`` and runs ``train``.
    Returns the exit status; a bad flag or a missing or damaged prepared
    folder (a file missing, cut short or changed) exits with status 2 and
    one line naming it."""
    from jsonargparse import ActionConfigFile, ArgumentParser, set_parsing_settings

    argv = list(sys.argv[1:] if argv is None else argv)
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(
        prog=prog,
        description="Train the model of a folder written by `keras-trm "
        "prepare-translation` with the paper's recipe, on JAX or PyTorch "
        "without TensorFlow; write the averaged weights as files of at most "
        "--max_file_mib for `keras-trm export-portable`. Dashes and "
        "underscores are the same in flag names; --config FILE.yaml (e.g. a "
        "run's <workdir>/config.yaml) reads the same keys.")
    parser.add_argument("--config", action=ActionConfigFile,
                        help="YAML file of these flags (put it first: later "
                        "flags override it)")
    parser.add_argument("--workdir", type=str, default="runs/portable",
                        help="run folder: checkpoints, backup, epochs.json, "
                        "result.json and weights/ (the files to copy)")
    parser.add_class_arguments(PortableTrainingConfig, nested_key=None, as_group=True)
    argv = [("--" + a[2:].split("=", 1)[0].replace("-", "_")
             + (("=" + a.split("=", 1)[1]) if "=" in a else ""))
            if a.startswith("--") else a for a in argv]
    args = parser.parse_args(argv)
    fields = [f.name for f in dataclasses.fields(PortableTrainingConfig)]
    config = PortableTrainingConfig(**{name: args[name] for name in fields})
    try:
        config.validate()
        read_prepared(config.prepared)  # every file's size and SHA-256
    except (ValueError, TypeError, FileNotFoundError) as err:
        parser.error(str(err))
    workdir = pathlib.Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    saved = args.clone()
    saved.pop("config", None)
    atomic_write(workdir / "config.yaml", parser.dump(saved))
    result = train(config, workdir, verify=False)
    summary = {k: result[k] for k in (
        "backend", "device", "epochs", "train_minutes", "val_token_loss_by_epoch",
        "averaged_checkpoints", "val_token_loss")}
    summary["weights"] = result["weights"]["folder"]
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
