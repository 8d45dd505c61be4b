"""Progress callbacks and metrics that need no TensorFlow: the training
time budget, the count of real target tokens (tokens/s) and ``StepTimes``
(compile time apart from training time). What a callback carries across a
restart is in its ``get_state()`` / ``set_state()`` (``TrainingBackup``).
"""

import math
import numbers
import time

import keras
from keras import ops

from keras_trm.utils import checks as v


@keras.saving.register_keras_serializable(package="keras_trm")
class TokenCount(keras.metrics.Sum):
    """Number of non-padding labels seen in the epoch (a ``Sum``), for
    tokens/s.

    Example:
        >>> import numpy as np
        >>> m = TokenCount()
        >>> m.update_state(np.array([[3, 4, 0]]), np.zeros((1, 3, 5)))
        >>> float(m.result())
        2.0
    """

    def __init__(self, pad_id=0, name="tokens", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = int(pad_id)

    def update_state(self, y_true, y_pred, sample_weight=None):
        mask = ops.cast(ops.not_equal(ops.cast(y_true, "int32"), self.pad_id),
                        "float32")
        return super().update_state(ops.sum(mask))

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


class TimeBudget(keras.callbacks.Callback):
    """Stops training so that it ends within ``seconds`` of training time:
    after an epoch, when one more epoch as long as the longest so far would
    cross the budget (stopping only after crossing it overshot by most of
    an epoch on slow CPUs). The first epoch of each ``fit`` also compiles
    the step (98 s for a Multi30k epoch under XLA on a GPU, later ones
    seconds), so it is the estimate only until a later epoch has run.

    With ``schedule`` (a ``BudgetDecay`` in the optimizer's learning rate),
    when the epochs the budget still holds end before ``epochs``, the
    schedule is fitted to decay linearly to 0 at the end of the last epoch
    that fits (refitted when the estimate moves that end), the train
    function is made again, and training stops there.

    Training time is wall time inside ``fit``, summed over restarts through
    ``get_state()`` (with the longest epoch and the fitted decay).

    Args:
        seconds: float > 0, the training-time budget (s); ``inf``: none.
        schedule: None, or the ``BudgetDecay`` to fit.
        steps_per_epoch: int > 0 (fit steps); needed with ``schedule``.
        epochs: int > 0, the planned epochs; needed with ``schedule``
            (given, the first epoch prints how long the rest would take).

    Raises:
        TypeError: ``seconds`` not a number; ``schedule`` not a
            ``BudgetDecay``; ``steps_per_epoch`` or ``epochs`` not an int.
        ValueError: ``seconds`` <= 0 or NaN; ``steps_per_epoch`` or
            ``epochs`` < 1; ``set_state`` given a state without finite
            ``elapsed_seconds`` and ``longest_epoch`` >= 0.

    Example:
        >>> b = TimeBudget(60.0)
        >>> b.set_state({"elapsed_seconds": 50.0, "longest_epoch": 20.0})
        >>> round(b.get_state()["elapsed_seconds"])
        50
    """

    def __init__(self, seconds, schedule=None, steps_per_epoch=None, epochs=None):
        super().__init__()
        if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
            raise TypeError(f"`seconds` must be a number > 0, got seconds={seconds!r}")
        if not float(seconds) > 0:
            raise ValueError(f"`seconds` must be > 0, got seconds={seconds!r}")
        self.seconds = float(seconds)
        self.schedule = schedule
        if schedule is not None:
            from keras_trm.training.schedules import BudgetDecay

            if not isinstance(schedule, BudgetDecay):
                raise TypeError("`schedule` must be a keras_trm.training.BudgetDecay "
                                f"or None, got schedule={schedule!r}")
        self.steps_per_epoch, self.epochs = steps_per_epoch, epochs
        if schedule is not None or steps_per_epoch is not None:
            self.steps_per_epoch = v.positive_int("steps_per_epoch", steps_per_epoch)
        if schedule is not None or epochs is not None:
            self.epochs = v.positive_int("epochs", epochs)
        self._offset, self._longest = 0.0, 0.0  # longest epoch after a first
        self._first = None  # the first epoch of this fit (compiles included)
        self._start = self._epoch_start = time.time()

    def elapsed(self):
        """Training seconds so far, earlier runs included."""
        return self._offset + time.time() - self._start

    def on_train_begin(self, logs=None):
        self._start = self._epoch_start = time.time()
        self._first = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        now = time.time()
        first = self._first is None
        if first:
            self._first = now - self._epoch_start
        else:
            self._longest = max(self._longest, now - self._epoch_start)
        elapsed = self._offset + now - self._start
        estimate = self._longest or self._first
        if first and self.epochs and self.epochs > epoch + 1:  # the plan, measured
            print(f"epoch {epoch + 1} took {self._first / 60:.1f} min (compiling "
                  f"included): the {self.epochs - epoch - 1} epochs left would take "
                  f"about {(self.epochs - epoch - 1) * self._first / 60:.0f} min at "
                  f"that pace; the budget leaves "
                  f"{max(0.0, self.seconds - elapsed) / 60:.0f} min", flush=True)
        if self.schedule is not None:
            self._fit(epoch + 1, int((self.seconds - elapsed) // estimate))
            if self.schedule.end and (epoch + 1) * self.steps_per_epoch >= self.schedule.end:
                print(f"time budget of {self.seconds / 60:.1f} min: the fitted "
                      f"schedule ends after epoch {epoch + 1} ({elapsed / 60:.1f} min)",
                      flush=True)
                self.model.stop_training = True
                return
        if elapsed + estimate > self.seconds:
            print(f"time budget of {self.seconds / 60:.1f} min: stopping "
                  f"after epoch {epoch + 1} ({elapsed / 60:.1f} min), "
                  "another epoch would cross it", flush=True)
            self.model.stop_training = True

    def _fit(self, done, more):
        """Fits the schedule to end after ``done + more`` epochs when that is
        before ``epochs`` (and after ``done``)."""
        last = min(self.epochs, done + more)
        if last <= done or (not self.schedule.end and last >= self.epochs):
            return
        start = self.schedule.start if self.schedule.end else done * self.steps_per_epoch
        end = last * self.steps_per_epoch
        if end != self.schedule.end:
            self.schedule.fit(start, end)
            self.model.make_train_function(force=True)
            print(f"time budget of {self.seconds / 60:.1f} min: it holds {last} of "
                  f"{self.epochs} epochs, so the learning rate now decays linearly "
                  f"from step {start} to 0 at step {end}", flush=True)

    def get_state(self):
        state = {"elapsed_seconds": self.elapsed(), "longest_epoch": self._longest}
        if self.schedule is not None:
            state.update(decay_start=self.schedule.start, decay_end=self.schedule.end)
        return state

    def set_state(self, state):
        values = []
        for key in ("elapsed_seconds", "longest_epoch"):
            value = state.get(key) if isinstance(state, dict) else None
            if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                    or not 0 <= value < math.inf:
                raise ValueError(
                    f"TimeBudget state needs {key!r}, a finite float >= 0; "
                    f"got state={state!r}")
            values.append(float(value))
        self._offset, self._longest = values
        self._start = self._epoch_start = time.time()
        if self.schedule is not None and state.get("decay_end"):
            try:
                self.schedule.fit(state.get("decay_start"), state["decay_end"])
            except (TypeError, ValueError) as error:
                raise ValueError(f"TimeBudget state has a bad fitted decay ({error}); "
                                 f"got state={state!r}") from None
            if self.model is not None:  # restored after fit made its function
                self.model.make_train_function(force=True)


class StepTimes(keras.callbacks.Callback):
    """Training time apart from compile time: the first step of each step
    shape (which compiles the step for that shape) counts as compile time
    beyond that shape's median step.

    Args:
        shape_at: callable, the training step's index (counted from the
            start of ``fit``) -> a hashable shape, e.g.
            ``keras_trm.data.TokenBatches.shape_at``.

    Attributes (after training): ``compile_seconds``, ``shapes`` (how
    many were compiled), ``steps``.

    Example:
    >>> times = StepTimes(lambda i: i % 2)
    >>> times.record([(0, 5.0), (1, 3.0), (0, 1.0), (1, 1.0), (0, 1.0)])
    >>> times.compile_seconds, times.shapes
    (6.0, 2)
    """

    def __init__(self, shape_at):
        super().__init__()
        self.shape_at = shape_at
        self._times, self._step, self._start = [], 0, None
        self.compile_seconds, self.shapes, self.steps = 0.0, 0, 0

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._start is not None:
            self._times.append((self.shape_at(self._step),
                                time.perf_counter() - self._start))
        self._step += 1

    def on_train_end(self, logs=None):
        self.record(self._times)
        self.shape_at = None  # it may hold the training data: freed with it

    def record(self, times):
        by_shape = {}
        for shape, seconds in times:
            by_shape.setdefault(shape, []).append(seconds)
        self.compile_seconds = round(sum(
            max(0.0, t[0] - sorted(t[1:] or [0.0])[len(t[1:]) // 2])
            for t in by_shape.values()), 2)
        self.shapes, self.steps = len(by_shape), len(times)
