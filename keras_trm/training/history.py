"""Per-step training records for ``model.fit``: the last batch's loss as a
metric (Keras' ``loss`` is the epoch's running mean; the recipes plot every
step's), a callback that logs it, and best-epoch selection.
"""

import time

import keras
import numpy as np
from keras import ops


@keras.saving.register_keras_serializable(package="keras_trm")
class BatchLoss(keras.metrics.Metric):
    """Sparse categorical cross-entropy of the last batch seen.

    ``y_pred``: probabilities ``(batch, num_classes)``; ``y_true``: class
    ids ``(batch,)``. In ``fit``, the loss of the step just taken.

    Example:
    >>> import numpy as np
    >>> metric = BatchLoss()
    >>> metric.update_state(np.array([0, 1]), np.full((2, 2), 0.5))
    >>> round(float(metric.result()), 4)
    0.6931
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
    """Collects the per-step loss (``steps``, from the ``BatchLoss``
    metric) and per-epoch logs (``epochs``: dicts ``{"epoch", "step",
    "train_seconds", ...}`` with every epoch-end log, rounded) of ``fit``.

    Args:
        print_every: print the mean loss of the last ``print_every`` steps
            every ``print_every`` steps (0: never).
        total: optional number of steps, shown in those lines.

    Example:
    >>> log = StepLog()
    >>> log.on_train_begin()
    >>> log.on_train_batch_end(0, {"batch_loss": 0.5})
    >>> log.on_epoch_end(0, {"loss": 0.5, "batch_loss": 0.5})
    >>> log.steps, log.epochs[0]["loss"]
    ([0.5], 0.5)
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
        self.epochs.append({
            "epoch": epoch + 1, "step": len(self.steps),
            "train_seconds": round(time.time() - self._start, 1),
            **{k: round(float(x), 5) for k, x in (logs or {}).items()
               if k != "batch_loss"}})


def restore_best_epoch(monitor="val_accuracy", mode="max"):
    """Restores the weights of the epoch with the best ``monitor`` value
    when ``fit`` ends (never stops early); ``best_epoch`` (0-based) and
    ``best`` tell which won.

    Example:
    >>> restore_best_epoch().monitor
    'val_accuracy'
    """
    return keras.callbacks.EarlyStopping(
        monitor=monitor, mode=mode, patience=1 << 30,
        restore_best_weights=True, verbose=0)


def fit_summary(log, best, scores):
    """The figures of one ``fit`` + test ``evaluate`` as a JSON-ready dict.

    Args:
        log: the ``StepLog`` of the run.
        best: the ``restore_best_epoch()`` callback of the run.
        scores: ``model.evaluate(..., return_dict=True)`` on the test set
            (with ``accuracy`` and ``loss``).

    Returns:
        dict with ``steps``, ``best_epoch`` (1-based), ``validation_accuracy``,
        ``test_accuracy``, ``test_loss``, ``epoch_log`` and ``step_loss``.

    Example:
    >>> class Best:
    ...     best_epoch, best = 0, 0.9
    >>> log = StepLog()
    >>> log.steps = [0.7, 0.5]
    >>> fit_summary(log, Best(), {"accuracy": 0.88, "loss": 0.3})["best_epoch"]
    1
    """
    return {
        "steps": len(log.steps),
        "best_epoch": int(best.best_epoch) + 1,
        "validation_accuracy": round(float(best.best), 5),
        "test_accuracy": round(float(scores["accuracy"]), 5),
        "test_loss": round(float(scores["loss"]), 5),
        "epoch_log": [{k: x for k, x in e.items() if k != "val_batch_loss"}
                      for e in log.epochs],
        "step_loss": log.steps,
    }


def describe_fit(name, result, epochs):
    """One console line of a ``fit_summary`` ``result``.

    Example:
    >>> describe_fit("lstm", {"validation_accuracy": 0.9, "best_epoch": 2,
    ...                       "test_accuracy": 0.88}, 3)
    'lstm: best validation accuracy 90.00% at epoch 2/3; test accuracy 88.00%'
    """
    return (f"{name}: best validation accuracy "
            f"{100 * result['validation_accuracy']:.2f}% at epoch "
            f"{result['best_epoch']}/{epochs}; test accuracy "
            f"{100 * result['test_accuracy']:.2f}%")
