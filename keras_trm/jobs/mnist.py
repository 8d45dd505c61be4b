"""MNIST: the LeNet CNN without / with BatchNorm / with LayerNorm, at two
batch sizes, the same number of examples seen.

Used by ``recipes/mnist.py``. For every batch size in ``batch_sizes`` and
every ``norm`` in ``norms`` the job trains ``lenet_cnn(norm)`` for
``epochs`` epochs over the 54,000 training digits left after holding out a
seeded 10% validation split of the 60,000 (so every run sees the same
number of examples, in the same order for a given batch size), scores the
validation split after every epoch, keeps the weights of the epoch with the
best validation accuracy, scores the full 10,000-digit test set once with
them, and writes

* ``<workdir>/<run>.json`` (``run`` = ``lenet_<norm>_b<batch>``): the loss
  of every training step, per-epoch validation accuracy, the chosen epoch,
  the test accuracy, wall time;
* to ``results_dir``: the same JSON with the per-step loss averaged over
  windows of 1,024 examples (small files), one plot per batch size
  (``mnist_batch_<b>.png``, one curve per normalization) and ``report.md``;
* one SavedModel per run, ``<export_dir>/mnist_lenet_<norm>_b<batch>/<v>/``,
  whose ``serving_default`` takes ``uint8 (batch, 28, 28)`` images and
  returns ``{"probabilities": float32 (batch, 10)}``.

This is the classic normalization comparison of Ba, Kiros and Hinton (2016,
"Layer Normalization", §6.7 and Fig. 6 discuss small mini-batches), with the
LeNet of LeCun et al. (1998): batch normalization's statistics come from the
mini-batch, so they get noisy at batch 8; layer normalization's do not
depend on the batch.
"""

import dataclasses
import json
import os
import pathlib
import time
from typing import Literal, get_args

import keras
import numpy as np

from keras_trm.data import check_labels, load_mnist, validation_split
from keras_trm.export import DigitClassifier, export_module
from keras_trm.jobs._setup import check_choices, start_classifier_job
from keras_trm.jobs.stages import StagedJob
from keras_trm.utils import checks as v
from keras_trm.models import check_images, lenet_cnn
from keras_trm.training import (
    BatchLoss,
    StepLog,
    describe_fit,
    fit_summary,
    restore_best_epoch,
)
from keras_trm.training import plots
from keras_trm.training.plots import binned, plot_runs
from keras_trm.utils import atomic_write, write_json

Norm = Literal["none", "batch", "layer"]
NORMS = get_args(Norm)
NORM_LABELS = {"none": "no norm", "batch": "BatchNorm", "layer": "LayerNorm"}
NUM_CLASSES = 10


@dataclasses.dataclass
class MnistConfig:
    """Hyper-parameters of the MNIST recipe (defaults: the CPU run that
    ``docs/results/mnist/report.md`` reports)."""

    norms: tuple[Norm, ...] = NORMS
    """Normalizations to compare (comma-separated list): ``none``,
    ``batch`` (BatchNorm), ``layer`` (LayerNorm)."""
    batch_sizes: tuple[int, ...] = (128, 8)
    """Batch sizes to train each normalization at (comma-separated list of
    images per batch)."""
    epochs: int = 8
    """Training epochs per run (the same examples seen at every batch
    size)."""
    learning_rate: float = 1e-3
    """Peak learning rate (Adam), cosine decay to 0 over the run."""
    validation_fraction: float = 0.1
    """Share of the 60,000 training digits held out for validation
    (fraction, seeded)."""
    seed: int = 0
    """Random seed (split, initialization, data order)."""
    jit_compile: bool = True
    """XLA for the training step."""
    bin_examples: int = 1024
    """The reported per-step loss is averaged over windows of this many
    examples (examples)."""
    download: bool = True
    """Fetch data missing from the data folder (online)."""

    # The sections of the command line and YAML (``--training.epochs``;
    # ``keras_trm.cli.config_keys``); the flat ``--epochs`` works too.
    SECTIONS = {
        "data": ("validation_fraction", "download"),
        "model": ("norms",),
        "training": ("batch_sizes", "epochs", "learning_rate", "jit_compile"),
        "report": ("bin_examples",),
    }

    def validate(self):
        """Raises ``ValueError``/``TypeError`` naming a bad field and its
        value (``keras-trm train-mnist`` turns it into a usage error, exit
        2, before anything is read or written; the job checks too): also
        ``norms`` / ``batch_sizes`` that are empty or not a tuple or list
        (``norms="batch"`` is ``("batch",)``), and ``jit_compile`` /
        ``download`` that are not bools (``"off"`` is truthy)."""
        check_choices("norms", self.norms, set(NORMS))
        check_choices("batch_sizes", self.batch_sizes, (), check=v.positive_int)
        v.boolean("jit_compile", self.jit_compile)
        v.boolean("download", self.download)
        v.positive_int("epochs", self.epochs)
        v.positive_int("bin_examples", self.bin_examples)
        v.non_negative_int("seed", self.seed)
        v.positive_float("learning_rate", self.learning_rate)
        v.fraction("validation_fraction", self.validation_fraction)
        return self


def check_dataset(images, labels, images_name="images", labels_name="labels"):
    """``check_images`` and ``check_labels`` (digits 0-9, one per image)."""
    images = check_images(images, images_name)
    labels = check_labels(labels, NUM_CLASSES, labels_name,
                          count=images.shape[0])
    return images, labels


def run_name(norm, batch_size):
    return f"lenet_{norm}_b{batch_size}"


def train_one(norm, batch_size, config, train, validation, test, verbose=2):
    """Trains ``lenet_cnn(norm)`` on ``train``, keeps the epoch with the best
    accuracy on ``validation`` and scores ``test`` once with it; returns
    ``(model, result dict)``.

    ``train`` / ``validation`` / ``test``: ``(uint8 images (N, 28, 28),
    labels (N,))``, checked with ``check_dataset``.
    """
    v.one_of("norm", norm, set(NORMS))
    v.positive_int("batch_size", batch_size)
    train_images, train_labels = check_dataset(*train, "train_images",
                                               "train_labels")
    val_images, val_labels = check_dataset(*validation, "validation_images",
                                           "validation_labels")
    test_images, test_labels = check_dataset(*test, "test_images",
                                             "test_labels")
    keras.utils.set_random_seed(config.seed)
    model = lenet_cnn(norm, name=run_name(norm, batch_size))
    total_steps = config.epochs * -(-len(train_labels) // batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(
        config.learning_rate, decay_steps=total_steps)
    model.compile(
        optimizer=keras.optimizers.Adam(schedule),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=["accuracy", BatchLoss()],
        jit_compile=config.jit_compile,
    )
    log, best = StepLog(), restore_best_epoch()
    start = time.time()
    model.fit(
        train_images.astype(np.float32), train_labels, batch_size=batch_size,
        epochs=config.epochs, shuffle=True,
        validation_data=(val_images.astype(np.float32), val_labels),
        validation_batch_size=500, callbacks=[log, best], verbose=verbose,
    )
    seconds = time.time() - start
    # The test set, once, with the weights of the best validation epoch.
    scores = model.evaluate(test_images.astype(np.float32), test_labels,
                            batch_size=500, return_dict=True, verbose=0)
    result = {
        "run": run_name(norm, batch_size),
        "norm": norm,
        "label": NORM_LABELS[norm],
        "batch_size": batch_size,
        "epochs": config.epochs,
        "examples_seen": config.epochs * len(train_labels),
        "parameters": int(model.count_params()),
        "train_minutes": round(seconds / 60, 2),
        "train_examples": int(len(train_labels)),
        "validation_examples": int(len(val_labels)),
        "test_examples": int(len(test_labels)),
        **fit_summary(log, best, scores),
    }
    print(describe_fit(result["run"], result, config.epochs)
          + f" ({result['train_minutes']:.1f} min)", flush=True)
    return model, result


def _compact(result, bin_examples):
    """The result with the per-step loss averaged over ``bin_examples``."""
    out = dict(result)
    steps = max(bin_examples // result["batch_size"], 1)
    out.pop("step_loss")
    out["loss_bin_steps"] = steps
    out["binned_step_loss"] = binned(result["step_loss"], steps)
    return out


def _comparison(results, batch_size):
    rows = [r for r in results.values() if r["batch_size"] == batch_size]
    if not rows:
        return []
    lines = []
    for r in sorted(rows, key=lambda r: NORMS.index(r["norm"])):
        loss = np.asarray(r["step_loss"])
        per_epoch = len(loss) // r["epochs"]
        lines.append(
            f"- {r['label']}: mean training loss in epoch 1 "
            f"{loss[:per_epoch].mean():.4f}, in the last epoch "
            f"{loss[-per_epoch:].mean():.4f}; validation accuracy by epoch "
            + ", ".join(f"{100 * e['val_accuracy']:.2f}%" for e in r["epoch_log"])
            + f" (epoch {r['best_epoch']} kept)"
        )
    return lines


def _last_epoch_loss(r):
    loss = np.asarray(r["step_loss"])
    return float(loss[-(len(loss) // r["epochs"]):].mean())


def _findings(results):
    """Plain statements computed from the runs, set against the commonly
    stated result (BN >= LN at batch 128; BN hurts at batch 8, LN helps a
    little). Only pairs that were both run are stated."""
    def get(norm, b):
        return results.get(run_name(norm, b))

    def acc(r):
        return 100 * r["test_accuracy"]

    def verdict(holds):
        return "matches" if holds else "does not match"

    lines = []
    bn, ln = get("batch", 128), get("layer", 128)
    if bn and ln:
        lines.append(
            f"- Batch 128, BatchNorm vs LayerNorm: last-epoch training loss "
            f"{_last_epoch_loss(bn):.4f} vs {_last_epoch_loss(ln):.4f}, test "
            f"accuracy {acc(bn):.2f}% vs {acc(ln):.2f}%. On training loss this "
            f"{verdict(_last_epoch_loss(bn) <= _last_epoch_loss(ln))} "
            "\"BN >= LN at batch 128\"; on test accuracy it "
            f"{verdict(acc(bn) >= acc(ln))} it.")
    for norm in ("batch", "layer"):
        small, base = get(norm, 8), get("none", 8)
        if small and base:
            better = _last_epoch_loss(small) < _last_epoch_loss(base)
            expected = "helps a little" if norm == "layer" else "hurts"
            holds = better if norm == "layer" else not better
            lines.append(
                f"- Batch 8, {small['label']} vs no norm: last-epoch training "
                f"loss {_last_epoch_loss(small):.4f} vs "
                f"{_last_epoch_loss(base):.4f}, test accuracy {acc(small):.2f}% "
                f"vs {acc(base):.2f}%. On training loss this {verdict(holds)} "
                f"\"{small['label']} {expected} at batch 8\".")
    if lines:
        spread = [acc(r) for r in results.values()]
        lines.append(
            f"- All test accuracies lie within {max(spread) - min(spread):.2f} "
            "points of each other, from one seed per configuration: the "
            "accuracy ranking is not evidence either way; the training-loss "
            "curves are where the normalizations differ.")
    return lines


def _load_compact(workdir, results_dir, bin_examples):
    """The runs in ``workdir`` by name; each also written to
    ``results_dir`` with its loss averaged (``_compact``)."""
    results = {}
    for path in sorted(pathlib.Path(workdir).glob("lenet_*_b*.json")):
        r = json.loads(path.read_text())
        results[r["run"]] = r
        write_json(results_dir / path.name, _compact(r, bin_examples))
    return results


def _results_table(results, batch_sizes):
    """The report's table: one row per run, by batch size then norm."""
    rows = [
        "| batch size | normalization | epochs | steps | train min | "
        "best validation accuracy [epoch] | test accuracy (10,000) | "
        "test loss |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in batch_sizes:
        for norm in NORMS:
            r = results.get(run_name(norm, b))
            if r:
                rows.append(
                    f"| {b} | {r['label']} | {r['epochs']} | {r['steps']:,} | "
                    f"{r['train_minutes']:.1f} | "
                    f"{100 * r['validation_accuracy']:.2f}% [{r['best_epoch']}] | "
                    f"**{100 * r['test_accuracy']:.2f}%** | {r['test_loss']:.4f} |")
    return rows


def _batch_section(results, results_dir, b):
    """The report's section for batch size ``b``: its plot (one curve per
    norm, written to ``results_dir`` if matplotlib is installed) and the
    per-norm comparison."""
    runs = []
    for norm in NORMS:
        r = results.get(run_name(norm, b))
        if r:
            runs.append({"label": r["label"], "loss": r["step_loss"],
                         "loss_x": np.arange(1, len(r["step_loss"]) + 1) * b,
                         "epochs": r["epoch_log"]})
    window = max(2560 // b, 1)
    figure = []
    if plots.available():
        plot_runs(results_dir / f"mnist_batch_{b}.png", runs,
                  f"MNIST LeNet, batch size {b}", "training examples seen",
                  "val_accuracy", "validation accuracy (%)",
                  smooth_window=window)
        figure = [f"![batch {b}](mnist_batch_{b}.png)", ""]
    else:
        print('no plot: matplotlib is not installed '
              '(pip install "keras_trm[plots]")')
    return [f"## Batch size {b}", "", *figure,
            f"(Loss curves: moving average over {window} steps = "
            f"{window * b:,} examples.)", "",
            *_comparison(results, b), ""]


def write_report(workdir, results_dir, config, extra=None):
    """Writes the compact JSON files, one plot per batch size and
    ``report.md`` to ``results_dir`` from the runs found in ``workdir``."""
    results_dir = pathlib.Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    results = _load_compact(workdir, results_dir, config.bin_examples)
    batch_sizes = sorted({r["batch_size"] for r in results.values()},
                         reverse=True)
    text = [
        "# MNIST: LeNet without / with BatchNorm / with LayerNorm",
        "",
        "Produced by `python recipes/mnist.py` (`keras_trm.jobs.mnist`). "
        "Every run sees the same number of training examples (epochs x "
        "54,000: the 60,000 training digits less a seeded 10% validation "
        "split). After every epoch the run is scored on the validation "
        "split; the weights of the best validation epoch are kept and "
        "scored once on the full 10,000-digit test set, which is used for "
        "nothing else.",
        "",
        *_results_table(results, batch_sizes),
        "",
        f"Setup: Adam, learning rate {config.learning_rate} decayed to 0 "
        "by a cosine over the run (the same for every run), shuffled every "
        "epoch, tanh LeNet (conv 6@5x5 "
        "-> pool -> conv 16@5x5 -> pool -> dense 120 -> [norm] -> dense 84 "
        "-> [norm] -> dense 10).",
        "",
        f"Training time of the {len(results)} runs together: "
        f"{sum(r['train_minutes'] for r in results.values()):.1f} min.",
        "",
    ]
    findings = _findings(results)
    if findings:
        text += ["## What the runs show", "", *findings, ""]
    if extra:
        text += [extra, ""]
    for b in batch_sizes:
        text += _batch_section(results, results_dir, b)
    text += ["Files: `lenet_<norm>_b<batch>.json` (per-epoch validation "
             "accuracy `epoch_log`, the kept epoch `best_epoch`; training loss averaged over windows of "
             f"{config.bin_examples:,} examples `binned_step_loss` -- the "
             "per-step values are in `runs/mnist/`), configuration.", ""]
    atomic_write(results_dir / "report.md", "\n".join(text))
    return results_dir / "report.md"


def run(config=None, data_dir=None, workdir="runs/mnist", export_dir="export",
        results_dir=None, verbose=None):
    """Runs the whole job; returns ``{run name: result dict}`` plus
    ``"stage_seconds"`` (wall seconds per stage of ``MnistRun``). The report
    goes to ``results_dir`` (None: ``<workdir>/results``; ``""``: none)."""
    return MnistRun(config, data_dir, workdir, export_dir, results_dir,
                    verbose).run()


class MnistRun(StagedJob):
    """The MNIST job's stages (``keras_trm.jobs.stages``): ``prepare_data``
    (load, validation split) -> ``fit_evaluate_export`` (each batch size and
    norm in turn: ``train_one``, its SavedModel, ``<run>.json``) ->
    ``report``."""

    STAGES = ("prepare_data", "fit_evaluate_export", "report")

    def __init__(self, config, data_dir, workdir, export_dir, results_dir,
                 verbose):
        self.config = config = (config or MnistConfig()).validate()
        start_classifier_job(self, workdir, data_dir, export_dir, results_dir,
                             verbose, config.download)

    def prepare_data(self):
        """The training digits less a seeded validation split, and the
        test digits."""
        config = self.config
        images, labels = load_mnist("train", self.data_dir,
                                    download=config.download)
        train_index, val_index = validation_split(
            len(labels), config.validation_fraction, config.seed)
        self.train = (images[train_index], labels[train_index])
        self.validation = (images[val_index], labels[val_index])
        self.test = load_mnist("test", self.data_dir, download=config.download)
        print(f"{len(train_index):,} training / {len(val_index):,} validation "
              f"digits (seeded split of the 60,000), {len(self.test[1]):,} test "
              "digits (scored once per run, after training)", flush=True)

    def fit_evaluate_export(self):
        """Every batch size, every norm in turn: trained, scored
        (``train_one``), exported and written to ``<workdir>/<run>.json``
        before the next one starts."""
        self.results = {}
        for b in self.config.batch_sizes:
            for norm in self.config.norms:
                model, result = train_one(norm, b, self.config, self.train,
                                          self.validation, self.test,
                                          self.verbose)
                result["config"] = dataclasses.asdict(self.config)
                result["export"] = str(self._export(model, result["config"]))
                write_json(self.workdir / f"{result['run']}.json", result)
                self.results[result["run"]] = result

    def _export(self, model, config_dict):
        """``model`` as a uint8-image SavedModel (``DigitClassifier``)."""
        classifier = DigitClassifier(model)
        path = export_module(
            classifier, self.export_dir, f"mnist_{model.name}",
            signatures={"serving_default": classifier.classify},
            assets={"config.json": json.dumps(config_dict, indent=1)},
        )
        print(f"exported SavedModel to {path}", flush=True)
        return path

    def report(self):
        """The job's wall time and best run; the compact JSON files, plots
        and ``report.md`` in ``results_dir`` (unless it is ``""``)."""
        job_minutes = (time.time() - self.job_start) / 60
        print(f"MNIST job: {job_minutes:.1f} min", flush=True)
        if self.results:
            best = max(self.results.values(), key=lambda r: r["test_accuracy"])
            print(f"best: {best['run']} {100 * best['test_accuracy']:.2f}%",
                  flush=True)
        if self.results_dir:
            report = write_report(
                self.workdir, self.results_dir, self.config,
                extra=f"Wall time of the last `recipes/mnist.py` call: "
                      f"{job_minutes:.1f} min on {len(os.sched_getaffinity(0))} CPU "
                      "core(s) available to the process.")
            print(f"report: {report}", flush=True)
        self.result = dict(self.results)
