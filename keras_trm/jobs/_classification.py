"""Pieces shared by the IMDB and MNIST classification jobs.

* ``check_labels``: class ids of the right shape, integer dtype and range.
* ``BatchLoss``: a metric whose value is the loss of the *last* training
  batch (Keras' own ``loss`` log is the running mean over the epoch), so a
  callback can record the per-step training loss exactly.
* ``StepLog``: records that per-step loss and the per-epoch figures.
* ``plot_runs``: convergence plots (matplotlib, Agg backend).
* ``binned``: a per-step curve averaged over windows (small JSON files).
"""

import dataclasses
import json
import os
import pathlib
import tempfile
import time

import keras
import numpy as np
from keras import ops


def check_labels(labels, num_classes, name="labels", count=None):
    """Validates class ids; returns them as an ``int32`` array ``(N,)``.

    Args:
        labels: array-like ``(N,)`` of integer class ids.
        num_classes: ids must lie in ``[0, num_classes)``.
        name: the argument name used in error messages.
        count: if given, ``N`` must equal it (e.g. the number of images).

    Raises:
        TypeError: a non-integer dtype (floats are refused, not rounded).
        ValueError: wrong rank, wrong count, or an id outside the range
            (the message gives the first bad value and its index).
    """
    array = np.asarray(labels)
    if array.dtype.kind not in "iu":
        raise TypeError(
            f"`{name}` must hold integer class ids, got dtype {array.dtype}"
        )
    if array.ndim != 1:
        raise ValueError(
            f"`{name}` must have shape (N,), got {name}.shape={array.shape}"
        )
    if count is not None and array.shape[0] != count:
        raise ValueError(
            f"`{name}` has {array.shape[0]} entries, expected {count} (one per "
            "example)"
        )
    bad = np.flatnonzero((array < 0) | (array >= num_classes))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"`{name}` must be class ids in [0, {num_classes}), got "
            f"{name}[{i}]={array[i]} ({bad.size} out of range)"
        )
    return array.astype(np.int32)


@keras.saving.register_keras_serializable(package="keras_trm")
class BatchLoss(keras.metrics.Metric):
    """Sparse categorical cross-entropy of the last batch seen.

    ``y_pred``: probabilities ``(batch, num_classes)``; ``y_true``: class
    ids ``(batch,)``. In ``fit`` the value is the training loss of the step
    just taken (computed on the same forward pass, dropout included).
    """

    def __init__(self, name="batch_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.value = self.add_variable((), initializer="zeros", name="value")

    def update_state(self, y_true, y_pred, sample_weight=None):
        loss = keras.losses.sparse_categorical_crossentropy(y_true, y_pred)
        self.value.assign(ops.cast(ops.mean(loss), self.value.dtype))

    def result(self):
        return ops.convert_to_tensor(self.value)

    def reset_state(self):
        self.value.assign(0.0)


class StepLog(keras.callbacks.Callback):
    """Collects the per-step training loss and per-epoch logs of ``fit``.

    ``steps``: list of float, the ``batch_loss`` of every training step.
    ``epochs``: list of dicts ``{"epoch", "step", "train_seconds", ...}``
    with every epoch-end log (e.g. ``val_accuracy``), rounded.
    """

    def __init__(self, print_every=0, total=None):
        super().__init__()
        self.steps, self.epochs = [], []
        self.print_every, self.total = print_every, total
        self._start = None

    def on_train_begin(self, logs=None):
        self._start = time.time()

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(round(float(logs["batch_loss"]), 5))
        n = len(self.steps)
        if self.print_every and n % self.print_every == 0:
            recent = np.mean(self.steps[-self.print_every:])
            print(f"  step {n}" + (f"/{self.total}" if self.total else "")
                  + f": loss {recent:.4f} (mean of the last {self.print_every})"
                  f", {time.time() - self._start:.0f} s", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        entry = {"epoch": epoch + 1, "step": len(self.steps),
                 "train_seconds": round(time.time() - self._start, 1)}
        for key, value in (logs or {}).items():
            if key != "batch_loss":
                entry[key] = round(float(value), 5)
        self.epochs.append(entry)


def validation_split(count, fraction, seed):
    """A seeded hold-out: ``(train_index, validation_index)``, sorted int
    arrays that partition ``range(count)``, ``round(fraction * count)``
    examples in the validation part.

    The validation part is for monitoring and model selection; the test set
    is scored once, after training. Raises ``ValueError`` if ``fraction`` is
    not in (0, 1) or leaves either part empty.
    """
    if isinstance(fraction, bool) or not 0.0 < float(fraction) < 1.0:
        raise ValueError("`validation_fraction` must be in (0, 1), got "
                         f"validation_fraction={fraction!r}")
    size = int(round(float(fraction) * count))
    if not 0 < size < count:
        raise ValueError(
            f"`validation_fraction={fraction}` of {count} examples leaves an "
            "empty training or validation part")
    order = np.random.default_rng(seed).permutation(count)
    return np.sort(order[size:]), np.sort(order[:size])


def restore_best_epoch():
    """Keeps the weights of the epoch with the best ``val_accuracy`` and
    restores them when ``fit`` ends (never stops early); its
    ``best_epoch`` (0-based) and ``best`` tell which epoch won."""
    return keras.callbacks.EarlyStopping(
        monitor="val_accuracy", mode="max", patience=1 << 30,
        restore_best_weights=True, verbose=0)


def binned(values, size):
    """Means of consecutive windows of ``size`` values (the last may be
    shorter): ``[{"step": last step of the window, "loss": mean}]``."""
    out = []
    for start in range(0, len(values), size):
        window = values[start:start + size]
        out.append({"step": start + len(window),
                    "loss": round(float(np.mean(window)), 5)})
    return out


def write_json(path, data):
    """Writes ``data`` as indented JSON, atomically (temp file + rename)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def smooth(values, window):
    """Trailing moving average (same length; early points average fewer)."""
    values = np.asarray(values, dtype=np.float64)
    if window <= 1 or values.size == 0:
        return values
    cumsum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, values.size + 1)
    lo = np.maximum(idx - window, 0)
    return (cumsum[idx] - cumsum[lo]) / (idx - lo)


def plot_runs(path, runs, title, x_label, accuracy_key, accuracy_label,
              smooth_window=50):
    """Two-panel convergence plot: smoothed per-step training loss (left)
    and per-epoch accuracy (right), one curve per run.

    Args:
        path: PNG file to write.
        runs: list of dicts with ``label``, ``loss_x`` (x value of each
            step, e.g. examples seen), ``loss`` (per-step training loss),
            ``epochs`` (the ``StepLog.epochs`` list).
        accuracy_key: key of the accuracy in each epoch entry.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=90)
    for run in runs:
        (line,) = ax_loss.plot(run["loss_x"], smooth(run["loss"], smooth_window),
                               label=run["label"], linewidth=1.2, zorder=3)
        ax_loss.plot(run["loss_x"], run["loss"], color=line.get_color(),
                     alpha=0.12, linewidth=0.5, zorder=1)
        epochs = [e["epoch"] for e in run["epochs"]]
        acc = [100.0 * e[accuracy_key] for e in run["epochs"]]
        ax_acc.plot(epochs, acc, marker="o", label=run["label"])
    ax_loss.set_xlabel(x_label)
    ax_loss.set_ylabel(f"training loss (faint: per step;\nbold: mean of "
                       f"{smooth_window} steps)")
    ax_loss.set_yscale("log")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend()
    ax_acc.set_xlabel("epoch")
    ax_acc.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax_acc.set_ylabel(accuracy_label)
    ax_acc.grid(alpha=0.3)
    ax_acc.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _parse_bool(text):
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def add_config_flags(parser, config_cls):
    """One ``--flag`` per dataclass field (tuples as comma-separated lists,
    bools as true/false)."""
    for field in dataclasses.fields(config_cls):
        flag = "--" + field.name.replace("_", "-")
        default = field.default
        if isinstance(default, tuple):
            item = type(default[0]) if default else str
            kind = (lambda text, item=item:
                    tuple(item(x) for x in text.split(",") if x.strip()))
            shown = ",".join(str(x) for x in default)
        elif isinstance(default, bool):
            kind, shown = _parse_bool, str(default).lower()
        else:
            kind, shown = type(default), default
        parser.add_argument(flag, type=kind, default=default,
                            help=f"(default: {shown})")


def config_from_args(config_cls, args):
    return config_cls(**{f.name: getattr(args, f.name)
                         for f in dataclasses.fields(config_cls)})


def recipe_main(argv, job, config_cls, name, description):
    """The command line of the IMDB and MNIST recipes (``recipes/<name>.py``).

    Common flags (``--data-dir``, ``--workdir`` = ``runs/<name>``,
    ``--export-dir``, ``--results-dir`` = ``docs/results/<name>``,
    ``--report-only``) plus one flag per field of ``config_cls``; runs
    ``job.run`` or, with ``--report-only``, ``job.write_report``.
    """
    import argparse

    parser = argparse.ArgumentParser(prog=f"recipes/{name}.py",
                                     description=description)
    parser.add_argument("--data-dir", default=None,
                        help="data folder (default: KERAS_TRM_DATA_DIR, then "
                             "../shared/data beside the checkout)")
    parser.add_argument("--workdir", default=f"runs/{name}")
    parser.add_argument("--export-dir", default="export")
    parser.add_argument("--results-dir", default=f"docs/results/{name}")
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite the report and plots from the "
                             "results already in --workdir")
    add_config_flags(parser, config_cls)
    args = parser.parse_args(argv)
    config = config_from_args(config_cls, args)
    if args.report_only:
        job.write_report(args.workdir, args.results_dir, config)
        return
    job.run(config, data_dir=args.data_dir, workdir=args.workdir,
            export_dir=args.export_dir, results_dir=args.results_dir)
