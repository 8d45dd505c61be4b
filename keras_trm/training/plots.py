"""Plots of training runs (matplotlib, Agg backend) and the curve
summaries written beside them; the package's only importer of matplotlib,
inside the functions that draw.
"""

import importlib
import math
import pathlib

import numpy as np


def available():
    """True when matplotlib (the ``plots`` extra) is installed."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return False
    return True


def _pyplot():
    from keras_trm._optional import require_extra

    require_extra("plots", ["matplotlib"], "keras_trm.training.plots")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def binned(values, size):
    """Means of consecutive windows of ``size`` values (the last may be
    shorter): ``[{"step": last step of the window, "loss": mean}]``.

    Example:
    >>> binned([1.0, 3.0, 5.0], 2)
    [{'step': 2, 'loss': 2.0}, {'step': 3, 'loss': 5.0}]
    """
    return [{"step": min(start + size, len(values)),
             "loss": round(float(np.mean(values[start:start + size])), 5)}
            for start in range(0, len(values), size)]


def smooth(values, window):
    """Trailing moving average (same length; early points average fewer).

    Example:
    >>> smooth([1.0, 3.0, 5.0], 2).tolist()
    [1.0, 2.0, 4.0]
    """
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
    plt = _pyplot()
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
    ax_acc.set_xlabel("epoch")
    ax_acc.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax_acc.set_ylabel(accuracy_label)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_lm_curves(path, result):
    """Writes to ``path`` (returned) the training and validation bits per
    token against the step of the LM job's models (``result``: its dict)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    unit = math.log(2)
    for key, label in (("transformer_xl", "Transformer-XL"),
                       ("vanilla", "vanilla Transformer")):
        if result.get(key) is None:  # the baseline not trained
            continue
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
