"""Callbacks that watch a training run: a validation score log (any
``score(model)``, e.g. ``keras_trm.decoding.GreedyBleu``) and TensorBoard
scalars. TensorFlow is imported only when a TensorBoard writer is asked
for. What a callback carries across a restart is in its ``get_state()`` /
``set_state()`` (``TrainingBackup``).
"""

import json
import pathlib
import time

import keras
from keras import ops

from keras_trm.training.progress import TimeBudget, TokenCount
from keras_trm._optional import require_tensorflow
from keras_trm.utils import checks as v
from keras_trm.utils.files import atomic_write

# TimeBudget and TokenCount (TF-free, in progress.py) are re-exported here.
__all__ = ["BleuLog", "TensorBoardScalars", "TimeBudget", "TokenCount",
           "tensorboard_writer"]


class BleuLog(keras.callbacks.Callback):
    """After every ``every`` epochs: ``score(model)`` with the training time
    so far, appended to a JSON log written atomically.

    Args:
        score: callable ``score(model) -> float``, on validation data; None:
            the losses only (a worker that does not decode).
        path: the JSON log (a list of per-epoch dicts).
        every: int >= 1: score every ``every``-th epoch.
        clock: callable -> training seconds so far (e.g.
            ``TimeBudget.elapsed``); default: seconds since fit started.
        writer: None, or a ``tf.summary`` writer that gets the score too.
        write: False on non-chief workers (no file written).

    Raises:
        TypeError: ``score`` (not None) or ``clock`` not callable; ``every``
            not an int.
        ValueError: ``every`` < 1; ``set_state`` given a state without a
            ``history`` list of dicts (a damaged backup).

    Example:
        >>> import tempfile, pathlib
        >>> log = BleuLog(lambda m: 12.5, pathlib.Path(tempfile.mkdtemp()) / "e.json")
        >>> log.on_train_begin(); log.on_epoch_end(0, {"loss": 2.0})
        epoch 1: val_greedy_bleu 12.50 at 0.0 min of training
        >>> log.history[0]["val_greedy_bleu"]
        12.5
    """

    def __init__(self, score, path, every=1, clock=None, writer=None, write=True):
        super().__init__()
        if score is not None and not callable(score):
            raise TypeError(f"`score` must be callable or None, got score={score!r}")
        if clock is not None and not callable(clock):
            raise TypeError(f"`clock` must be callable or None, got clock={clock!r}")
        every = v.positive_int("every", every)
        self.score, self.path, self.every = score, pathlib.Path(path), every
        self.clock, self.writer, self.write = clock, writer, write
        self.key = "val_greedy_bleu"
        self.history = []
        self._start = time.time()

    def on_train_begin(self, logs=None):
        self._start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        seconds = self.clock() if self.clock else time.time() - self._start
        entry = {"epoch": epoch + 1, "train_seconds": round(seconds, 1),
                 **{k: float(v) for k, v in (logs or {}).items()}}
        if self.score is not None and (epoch + 1) % self.every == 0:
            value = float(self.score(self.model))
            entry[self.key] = round(value, 2)
            print(f"epoch {epoch + 1}: {self.key} {value:.2f} at "
                  f"{seconds / 60:.1f} min of training", flush=True)
            if self.writer is not None:
                with self.writer.as_default():
                    _scalar(self.key, value, step=epoch + 1)
                self.writer.flush()
        self.history.append(entry)
        if self.write:
            atomic_write(self.path, json.dumps(self.history, indent=1))

    def get_state(self):
        return {"history": self.history}

    def set_state(self, state):
        history = state.get("history") if isinstance(state, dict) else None
        if not (isinstance(history, list)
                and all(isinstance(e, dict) for e in history)):
            raise ValueError(
                f"BleuLog state needs 'history', a list of dicts; got state={state!r}")
        self.history = list(history)


class TensorBoardScalars(keras.callbacks.Callback):
    """Every ``every`` steps: training loss, learning rate and tokens/s
    (with the ``TokenCount`` metric) as TensorBoard scalars ``loss``,
    ``learning_rate``, ``tokens_per_second`` at the optimizer's micro-step
    count, which a resumed run restores (Keras' ``TensorBoard`` restarts
    at 0).

    Args:
        writer: a ``tf.summary`` file writer (``tensorboard_writer``).
        every: int >= 1 steps between points.

    Example:
        >>> import tempfile
        >>> cb = TensorBoardScalars(tensorboard_writer(tempfile.mkdtemp()), 10)
        >>> cb.every
        10
    """

    def __init__(self, writer, every=50):
        super().__init__()
        self.writer, self.every = writer, max(1, int(every))
        self._last_tokens, self._last_time, self._count = 0.0, None, 0

    def on_epoch_begin(self, epoch, logs=None):
        self._last_tokens, self._last_time, self._count = 0.0, time.time(), 0

    def on_train_batch_end(self, batch, logs=None):
        self._count += 1
        if self._count % self.every:
            return
        logs = logs or {}
        optimizer = self.model.optimizer
        step = int(ops.convert_to_numpy(optimizer._iterations))  # micro-steps
        now = time.time()
        with self.writer.as_default():
            if "loss" in logs:
                _scalar("loss", float(logs["loss"]), step=step)
            _scalar("learning_rate", float(ops.convert_to_numpy(
                optimizer.learning_rate)), step=step)
            if "tokens" in logs and self._last_time is not None:
                tokens = float(logs["tokens"])
                rate = (tokens - self._last_tokens) / max(now - self._last_time, 1e-9)
                _scalar("tokens_per_second", rate, step=step)
                self._last_tokens = tokens
        self._last_time = now

    def on_epoch_end(self, epoch, logs=None):
        self.writer.flush()

    def on_train_end(self, logs=None):
        self.writer.flush()


def _scalar(tag, value, step):
    """``tf.summary.scalar`` without the tensorboard package: the same
    event, written with the core ``tf.summary.write`` op."""
    import tensorflow as tf

    metadata = tf.compat.v1.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step,
                     metadata=metadata)


def tensorboard_writer(log_dir):
    """A ``tf.summary`` file writer for ``log_dir`` (created).

    Raises:
        ImportError: TensorFlow is not installed (saying what to install).

    Example:
    >>> import tempfile, pathlib
    >>> log_dir = pathlib.Path(tempfile.mkdtemp()) / "tensorboard"
    >>> writer = tensorboard_writer(log_dir)
    >>> log_dir.is_dir()
    True
    """
    tf = require_tensorflow("TensorBoard logging (tensorboard_writer)")
    pathlib.Path(log_dir).mkdir(parents=True, exist_ok=True)
    return tf.summary.create_file_writer(str(log_dir))
