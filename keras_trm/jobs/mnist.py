"""MNIST: the LeNet CNN without / with BatchNorm / with LayerNorm, at two
batch sizes, the same number of examples seen.

Used by ``recipes/mnist.py``. For every batch size in ``batch_sizes`` and
``norm`` in ``norms`` the job trains ``lenet_cnn(norm)`` for ``epochs``
epochs on the 54,000 training digits left after a seeded 10% validation
split, scores the 10,000 test digits once with the best validation epoch,
writes ``<workdir>/<run>.json`` (``run`` = ``lenet_<norm>_b<batch>``) and
the report, and exports ``<export_dir>/mnist_<run>/<v>/``, whose
``serving_default`` takes ``uint8 (batch, 28, 28)`` images and returns
``{"probabilities": float32 (batch, 10)}``.

This is the normalization comparison of Ba, Kiros and Hinton (2016, "Layer
Normalization", §6.7 and Fig. 6 discuss small mini-batches), with the LeNet
of LeCun et al. (1998): batch normalization's statistics come from the
mini-batch, so they get noisy at batch 8; layer normalization's do not.
"""

import dataclasses
import json
import pathlib
from typing import Literal, get_args

import keras
import numpy as np

from keras_trm.data import check_labels, load_mnist, validation_split
from keras_trm.export import DigitClassifier
from keras_trm.jobs._setup import check_choices
from keras_trm.jobs.imdb import (ClassifierJob, first_and_last_epoch, fit_and_test,
                                 markdown_table, plot_curves)
from keras_trm.models import check_images, lenet_cnn
from keras_trm.training import BatchLoss, StepLog, describe_fit
from keras_trm.training.plots import binned
from keras_trm.utils import atomic_write, checks as v, write_json

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
    """Batch sizes to train each normalization at (comma-separated list of images per batch)."""
    epochs: int = 8
    """Training epochs per run (the same examples seen at every batch size)."""
    learning_rate: float = 1e-3
    """Peak learning rate (Adam), cosine decay to 0 over the run."""
    validation_fraction: float = 0.1
    """Share of the 60,000 training digits held out for validation (fraction, seeded)."""
    seed: int = 0
    """Random seed (split, initialization, data order)."""
    jit_compile: bool = True
    """XLA for the training step."""
    bin_examples: int = 1024
    """The reported per-step loss is averaged over windows of this many examples (examples)."""
    download: bool = True
    """Fetch data missing from the data folder (online)."""

    # The sections of the command line and YAML (``--training.epochs``);
    # the flat ``--epochs`` works too.
    SECTIONS = {
        "data": ("validation_fraction", "download"),
        "model": ("norms",),
        "training": ("batch_sizes", "epochs", "learning_rate", "jit_compile"),
        "report": ("bin_examples",),
    }

    def validate(self):
        """Raises ``ValueError``/``TypeError`` naming a bad field and its
        value (``keras-trm train-mnist`` makes it a usage error, exit 2):
        also empty ``norms`` / ``batch_sizes`` or ones that are not a tuple
        or list, and ``jit_compile`` / ``download`` that are not bools."""
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
    return images, check_labels(labels, NUM_CLASSES, labels_name,
                                count=images.shape[0])


def run_name(norm, batch_size):
    return f"lenet_{norm}_b{batch_size}"


def train_one(norm, batch_size, config, train, validation, test, verbose=2):
    """Trains ``lenet_cnn(norm)`` on ``train``, keeps the epoch with the best
    accuracy on ``validation`` and scores ``test`` once with it; returns
    ``(model, result dict)``. Each split: ``(uint8 images (N, 28, 28), labels
    (N,))``, checked with ``check_dataset``."""
    v.one_of("norm", norm, set(NORMS))
    v.positive_int("batch_size", batch_size)
    train, validation, test = (
        check_dataset(*data, f"{name}_images", f"{name}_labels") for name, data in
        (("train", train), ("validation", validation), ("test", test)))
    keras.utils.set_random_seed(config.seed)
    model = lenet_cnn(norm, name=run_name(norm, batch_size))
    schedule = keras.optimizers.schedules.CosineDecay(
        config.learning_rate, decay_steps=config.epochs * -(-len(train[1]) // batch_size))
    model.compile(optimizer=keras.optimizers.Adam(schedule),
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=["accuracy", BatchLoss()], jit_compile=config.jit_compile)
    summary, seconds, _ = fit_and_test(
        model, *[(images.astype(np.float32), labels)
                 for images, labels in (train, validation, test)],
        config.epochs, StepLog(), verbose,
        fit_options=dict(batch_size=batch_size, shuffle=True,
                         validation_batch_size=500),
        test_options=dict(batch_size=500))
    result = {
        "run": run_name(norm, batch_size), "norm": norm, "label": NORM_LABELS[norm],
        "batch_size": batch_size, "epochs": config.epochs,
        "examples_seen": config.epochs * len(train[1]),
        "parameters": int(model.count_params()), "train_minutes": round(seconds / 60, 2),
        "train_examples": int(len(train[1])), "validation_examples": int(len(validation[1])),
        "test_examples": int(len(test[1])), **summary}
    print(describe_fit(result["run"], result, config.epochs)
          + f" ({result['train_minutes']:.1f} min)", flush=True)
    return model, result


def _comparison(results, batch_size):
    lines = []
    for r in _runs_of(results, batch_size):
        first, last = first_and_last_epoch(r)
        lines.append(
            f"- {r['label']}: mean training loss in epoch 1 "
            f"{first.mean():.4f}, in the last epoch "
            f"{last.mean():.4f}; validation accuracy by epoch "
            + ", ".join(f"{100 * e['val_accuracy']:.2f}%" for e in r["epoch_log"])
            + f" (epoch {r['best_epoch']} kept)"
        )
    return lines


def _findings(results):
    """Plain statements computed from the runs, set against the commonly
    stated result (BN >= LN at batch 128; BN hurts at batch 8, LN helps a
    little). Only pairs that were both run are stated."""
    def get(norm, b):
        return results.get(run_name(norm, b))

    def loss(r):
        return float(first_and_last_epoch(r)[1].mean())

    def acc(r):
        return 100 * r["test_accuracy"]

    def verdict(holds):
        return "matches" if holds else "does not match"

    lines = []
    bn, ln = get("batch", 128), get("layer", 128)
    if bn and ln:
        lines.append(
            f"- Batch 128, BatchNorm vs LayerNorm: last-epoch training loss "
            f"{loss(bn):.4f} vs {loss(ln):.4f}, test accuracy {acc(bn):.2f}% "
            f"vs {acc(ln):.2f}%. On training loss this "
            f"{verdict(loss(bn) <= loss(ln))} \"BN >= LN at batch 128\"; on "
            f"test accuracy it {verdict(acc(bn) >= acc(ln))} it.")
    for norm, expected in (("batch", "hurts"), ("layer", "helps a little")):
        small, base = get(norm, 8), get("none", 8)
        if small and base:
            # LN should lower the last-epoch loss; BN should not.
            holds = (loss(small) < loss(base)) == (norm == "layer")
            lines.append(
                f"- Batch 8, {small['label']} vs no norm: last-epoch training "
                f"loss {loss(small):.4f} vs {loss(base):.4f}, test accuracy "
                f"{acc(small):.2f}% vs {acc(base):.2f}%. On training loss this "
                f"{verdict(holds)} \"{small['label']} {expected} at batch 8\".")
    if lines:
        spread = [acc(r) for r in results.values()]
        lines.append(
            f"- All test accuracies lie within {max(spread) - min(spread):.2f} "
            "points of each other, from one seed per configuration: the "
            "accuracy ranking is not evidence either way; the training-loss "
            "curves are where the normalizations differ.")
    return lines


def _runs_of(results, b):
    """The runs at batch size ``b``, in ``NORMS`` order."""
    return [r for r in (results.get(run_name(norm, b)) for norm in NORMS) if r]


def _results_table(results, batch_sizes):
    """The report's table: one row per run, by batch size then norm."""
    return markdown_table(
        ["batch size", "normalization", "epochs", "steps", "train min",
         "best validation accuracy [epoch]", "test accuracy (10,000)", "test loss"],
        [[b, r["label"], r["epochs"], f"{r['steps']:,}", f"{r['train_minutes']:.1f}",
          f"{100 * r['validation_accuracy']:.2f}% [{r['best_epoch']}]",
          f"**{100 * r['test_accuracy']:.2f}%**", f"{r['test_loss']:.4f}"]
         for b in batch_sizes for r in _runs_of(results, b)])


def _batch_section(results, results_dir, b):
    """The report's section for batch size ``b``: its plot (one curve per
    norm, written to ``results_dir`` if matplotlib is installed) and the
    per-norm comparison."""
    window = max(2560 // b, 1)
    figure = []
    if plot_curves(results_dir / f"mnist_batch_{b}.png", _runs_of(results, b),
                   f"MNIST LeNet, batch size {b}", "training examples seen",
                   window, examples_per_step=b):
        figure = [f"![batch {b}](mnist_batch_{b}.png)", ""]
    return [f"## Batch size {b}", "", *figure,
            f"(Loss curves: moving average over {window} steps = "
            f"{window * b:,} examples.)", "",
            *_comparison(results, b), ""]


def write_report(workdir, results_dir, config, extra=None):
    """Writes the compact JSON files (the per-step loss averaged over
    ``config.bin_examples``), one plot per batch size and ``report.md`` to
    ``results_dir`` from the runs found in ``workdir``; returns the path of
    ``report.md``."""
    results_dir = pathlib.Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for path in sorted(pathlib.Path(workdir).glob("lenet_*_b*.json")):
        r = results[path.stem] = json.loads(path.read_text())
        steps = max(config.bin_examples // r["batch_size"], 1)
        compact = {k: value for k, value in r.items() if k != "step_loss"}
        write_json(results_dir / path.name, {
            **compact, "loss_bin_steps": steps,
            "binned_step_loss": binned(r["step_loss"], steps)})
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
             "accuracy `epoch_log`, the kept epoch `best_epoch`; training loss "
             f"averaged over windows of {config.bin_examples:,} examples "
             "`binned_step_loss` -- the "
             "per-step values are in `runs/mnist/`), configuration.", ""]
    atomic_write(results_dir / "report.md", "\n".join(text))
    return results_dir / "report.md"


def run(config=None, data_dir=None, workdir="runs/mnist", export_dir="export",
        results_dir=None, verbose=None):
    """Runs the whole job; returns ``{run name: result dict}`` plus
    ``"stage_seconds"`` (wall seconds per stage of ``MnistRun``). The report
    goes to ``results_dir`` (None: ``<workdir>/results``; ``""``: none)."""
    return MnistRun(config, data_dir, workdir, export_dir, results_dir, verbose).run()


class MnistRun(ClassifierJob):
    """The MNIST job's stages (``keras_trm.jobs.stages``): ``prepare_data``
    (load, validation split) -> ``fit_evaluate_export`` (each batch size and
    norm in turn: ``train_one``, its SavedModel, ``<run>.json``) ->
    ``report``."""

    STAGES = ("prepare_data", "fit_evaluate_export", "report")
    CONFIG, NAME, RECIPE = MnistConfig, "MNIST", "mnist"
    write_report = staticmethod(write_report)

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
        (``train_one``), exported as a uint8-image SavedModel
        (``DigitClassifier``) and written to ``<workdir>/<run>.json`` before
        the next one starts."""
        for b in self.config.batch_sizes:
            for norm in self.config.norms:
                model, result = train_one(norm, b, self.config, self.train,
                                          self.validation, self.test,
                                          self.verbose)
                self._keep(result["run"], result, DigitClassifier(model),
                           f"mnist_{model.name}")

    def report(self):
        """The best run, then ``ClassifierJob.report``."""
        if self.results:
            best = max(self.results.values(), key=lambda r: r["test_accuracy"])
            print(f"best: {best['run']} {100 * best['test_accuracy']:.2f}%",
                  flush=True)
        super().report()
