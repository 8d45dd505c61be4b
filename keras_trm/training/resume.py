"""Resume after preemption: a killed run continues when run again.

Keras 3's ``BackupAndRestore`` (3.15) restarts an interrupted epoch from its
first batch, writes its files in place (a kill leaves a torn file) and does
not save the dropout RNG state. ``TrainingBackup`` closes those gaps:
weights + optimizer, dropout seed states, epoch, batches done and other
callbacks' states are saved every ``save_freq`` steps and at every epoch
end, each file written atomically and the weights before the
``state.json`` that names them; on restore the run re-enters the
interrupted epoch at the next unseen batch through a ``DataPosition`` the
data pipeline reads, so it trains on the same batches in the same order as
an uninterrupted run.
"""

import json
import numbers
import pathlib
import warnings

import keras
import numpy as np

from keras_trm.training.checkpoints import save_weights_atomic
from keras_trm.utils import checks as v
from keras_trm.utils.files import atomic_write


class DataPosition:
    """Where the next epoch's data starts: epoch ``epoch`` (0-based), with
    its first ``skip`` batches left out. ``TrainingBackup`` sets it at every
    epoch start; a data pipeline built with ``position=`` reads it.

    Raises:
        TypeError / ValueError: ``epoch`` or ``skip`` not an int >= 0.

    Example:
        >>> p = DataPosition()
        >>> (p.epoch, p.skip)
        (0, 0)
    """

    def __init__(self, epoch=0, skip=0):
        self.epoch = v.non_negative_int("epoch", epoch)
        self.skip = v.non_negative_int("skip", skip)

    def __repr__(self):
        return f"DataPosition(epoch={self.epoch}, skip={self.skip})"


def _seed_states(model):
    return [v for v in model.variables if "seed_generator_state" in v.path]


def _optimizer_name(model):
    optimizer = getattr(model, "optimizer", None)
    return None if optimizer is None else type(optimizer).__name__


def _fix(directory):
    return (f"delete {str(directory)!r} to train from scratch, or give this "
            "run another work directory")


def _damaged(path, reason):
    return ValueError(
        f"TrainingBackup: the backup file {str(path)!r} is damaged ({reason}); "
        f"{_fix(pathlib.Path(path).parent)}")


def _mismatch(directory, differences):
    return ValueError(
        f"TrainingBackup: the backup in {str(directory)!r} was written by a "
        f"different run ({'; '.join(differences)}), so this run cannot "
        f"resume from it; {_fix(directory)}")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_state(state, path):
    """Types and ranges of a ``state.json`` dict; raises ``_damaged``."""
    if not isinstance(state, dict):
        raise _damaged(path, f"a JSON {type(state).__name__}, not an object")
    for key in ("epoch", "batch", "step", "weights", "seed_states",
                "callbacks"):
        if key not in state:
            raise _damaged(path, f"no {key!r}")
    for key in ("epoch", "batch", "step"):
        if not _is_int(state[key]) or state[key] < 0:
            raise _damaged(path, f"{key}={state[key]!r} is not an int >= 0")
    name = state["weights"]
    if not (isinstance(name, str) and name.endswith(".weights.h5")
            and "/" not in name and "\\" not in name):
        raise _damaged(path, f"weights={name!r} is not a *.weights.h5 file "
                             "name inside the backup folder")
    try:
        if not isinstance(state["seed_states"], list):
            raise ValueError("not a list")
        for value in state["seed_states"]:
            np.asarray(value, np.float64)
    except (TypeError, ValueError, OverflowError) as e:
        raise _damaged(path, f"seed_states is not a list of number arrays: {e}") from None
    if not isinstance(state["callbacks"], dict):
        raise _damaged(path, "callbacks is not an object")
    if not isinstance(state.get("fingerprint"), (dict, type(None))):
        raise _damaged(path, "fingerprint is not an object")
    spe = state.get("steps_per_epoch")
    if spe is not None:
        if not _is_int(spe) or spe < 1:
            raise _damaged(path, f"steps_per_epoch={spe!r} is not an int >= 1")
        if state["batch"] > spe or (
                state["step"] != state["epoch"] * spe + state["batch"]):
            raise _damaged(
                path, f"epoch={state['epoch']}, batch={state['batch']} and "
                      f"step={state['step']} disagree with "
                      f"steps_per_epoch={spe}")


class TrainingBackup(keras.callbacks.BackupAndRestore):
    """``BackupAndRestore`` with mid-epoch resume, atomic writes, dropout
    RNG and callback states (see the module docstring). Put it FIRST in the
    callback list: it restores before the others start, and writes an
    epoch's backup once every callback has finished that epoch.

    The data must be one continuous stream (``repeat=True``) fed to
    ``fit(..., steps_per_epoch=steps_per_epoch)``: global step t (from 0)
    trains on stream batches ``t * num_workers + worker``, so on restore at
    step t the stream restarts at batch ``t * num_workers`` and the
    interrupted epoch ends after its remaining steps. Files in
    ``backup_dir``: ``state.json`` and the weights file it names
    (``step_{t}.weights.h5``), kept when fit ends (running the finished
    command again trains no further).

    Same run only: a backup whose recorded optimizer class,
    ``steps_per_epoch``, ``batches_per_epoch``, ``num_workers`` or
    ``fingerprint`` differ from this run's is refused before anything is
    loaded or written. A backup without them (older) resumes; one without
    a fingerprint, when this run passes one, resumes with a ``UserWarning``.

    Args:
        backup_dir: directory (created); used by this run only.
        save_freq: int >= 1 (training steps between backups) or
            ``"epoch"``. A backup is also written after every epoch.
        position: the ``DataPosition`` the data pipeline reads, or None
            (an interrupted epoch restarts from its first batch, and
            ``steps_per_epoch`` may be None).
        steps_per_epoch: int >= 1 or None, the ``steps_per_epoch`` of fit.
        batches_per_epoch: int >= 1 or None, batches in one epoch of the
            data stream (default ``steps_per_epoch * num_workers``).
        num_workers: int >= 1, workers sharing the stream.
        stateful: dict ``{name: callback}``; each has ``get_state() ->
            dict`` (JSON-able) and ``set_state(dict)``.
        fingerprint: None, or a JSON-serialisable dict describing the run,
            compared key by key (as JSON gives it back) on restore.

    Attributes:
        restored: None, or the ``state.json`` dict restored at the start.

    Raises:
        TypeError: ``steps_per_epoch``, ``batches_per_epoch`` or
            ``num_workers`` not an int; a ``stateful`` value without
            ``get_state``/``set_state``; ``fingerprint`` not a
            JSON-serialisable dict.
        ValueError: ``save_freq`` neither ``"epoch"`` nor an int >= 1;
            ``steps_per_epoch``, ``batches_per_epoch`` or ``num_workers``
            < 1; ``position`` without ``steps_per_epoch``; ``backup_dir``
            (or a folder above it) is a file. Out of ``fit``, before a step
            is trained: a backup of another run, naming the folder, what
            differs (``key: old -> new``) and the fix (delete the folder,
            or use another work directory); a damaged backup (bad JSON or
            values, a missing or damaged weights file, a callback state
            ``set_state`` refuses), naming the file.
        OSError: ``errno.ENOSPC`` out of ``fit`` when ``backup_dir``'s file
            system is full (see ``save_weights_atomic``); the previous
            backup stays complete.

    Example:
        >>> import tempfile, numpy as np, keras
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> m.compile("sgd", "mse")
        >>> cb = TrainingBackup(tempfile.mkdtemp(), save_freq=2)
        >>> _ = m.fit(np.ones((8, 2)), np.ones((8, 1)), batch_size=2,
        ...           epochs=2, callbacks=[cb], verbose=0)
        >>> json.loads((cb.directory / "state.json").read_text())["epoch"]
        2
    """

    def __init__(self, backup_dir, save_freq="epoch", position=None,
                 steps_per_epoch=None, batches_per_epoch=None, num_workers=1,
                 stateful=None, fingerprint=None):
        if save_freq != "epoch" and not (_is_int(save_freq) and save_freq >= 1):
            raise ValueError(
                "`save_freq` must be 'epoch' or an int >= 1 (steps), got "
                f"save_freq={save_freq!r}")
        if steps_per_epoch is not None:
            steps_per_epoch = v.positive_int("steps_per_epoch", steps_per_epoch)
        if batches_per_epoch is not None:
            batches_per_epoch = v.positive_int("batches_per_epoch",
                                               batches_per_epoch)
        num_workers = v.positive_int("num_workers", num_workers)
        if position is not None and not steps_per_epoch:
            raise ValueError(
                "`steps_per_epoch` is needed with a `position`, got "
                f"steps_per_epoch={steps_per_epoch!r}")
        stateful = dict(stateful or {})
        for name, cb in stateful.items():
            if not (callable(getattr(cb, "get_state", None))
                    and callable(getattr(cb, "set_state", None))):
                raise TypeError(
                    f"`stateful[{name!r}]` needs get_state() and set_state(), "
                    f"got {cb!r}")
        if fingerprint is not None:
            if not isinstance(fingerprint, dict):
                raise TypeError("`fingerprint` must be a dict or None, got "
                                f"fingerprint={fingerprint!r}")
            try:  # compared with the stored one as JSON gives it back
                fingerprint = json.loads(json.dumps(fingerprint))
            except (TypeError, ValueError) as e:
                raise TypeError(f"`fingerprint` must be JSON-serialisable "
                                f"({e}), got fingerprint={fingerprint!r}") from None
        if not backup_dir:
            raise ValueError(f"`backup_dir` is empty: backup_dir={backup_dir!r}")
        directory = pathlib.Path(backup_dir)
        folder = next((f for f in (directory, *directory.parents) if f.exists()),
                      None)
        if folder is not None and not folder.is_dir():
            raise ValueError(
                f"`backup_dir` must be a directory, but {str(folder)!r} "
                f"is a file: backup_dir={str(backup_dir)!r}")
        super().__init__(str(backup_dir), save_freq=save_freq,
                         delete_checkpoint=False)
        self.directory = directory
        self.position = position
        self.steps_per_epoch = steps_per_epoch
        self.num_workers = num_workers
        self.batches_per_epoch = (
            batches_per_epoch or (steps_per_epoch or 0) * num_workers)
        self.stateful = stateful
        self.fingerprint = fingerprint
        self.restored = None
        self._resume_epoch, self._resume_batch = None, 0
        self._epoch, self._batch_in_epoch, self._since_save = 0, 0, 0
        self._pending, self._forced_stop = None, False

    # -- restore -----------------------------------------------------------
    def on_train_begin(self, logs=None):
        state_path = self.directory / "state.json"
        if not state_path.exists():
            return
        try:
            state = json.loads(state_path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise _damaged(state_path, f"{type(e).__name__}: {e}") from None
        _check_state(state, state_path)
        weights = self.directory / state["weights"]
        if not weights.is_file():
            raise _damaged(state_path, f"the weights file it names, "
                                       f"{state['weights']!r}, is missing")
        if not self.model.built:
            raise ValueError("TrainingBackup: build the model before fit() "
                             "so that a backup can be restored into it")
        self._check_same_run(state)
        seeds = _seed_states(self.model)
        if len(seeds) != len(state["seed_states"]):
            raise _mismatch(self.directory, [
                f"it has {len(state['seed_states'])} dropout RNG states, this model "
                f"{len(seeds)}"])
        seed_values = []
        for var, value in zip(seeds, state["seed_states"]):
            try:
                value = np.asarray(value, var.dtype)
            except (TypeError, ValueError, OverflowError) as e:
                raise _damaged(state_path, f"a seed state is not numbers: {e}") from None
            if tuple(value.shape) != tuple(var.shape):
                raise _damaged(state_path, f"a seed state of shape {value.shape}, "
                                           f"the model's is {tuple(var.shape)}")
            seed_values.append(value)
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        self._load_weights(weights)
        for var, value in zip(seeds, seed_values):
            var.assign(value)
        for name, cb in self.stateful.items():
            if name in state["callbacks"]:
                try:
                    cb.set_state(state["callbacks"][name])
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    raise _damaged(
                        state_path, f"the state of callback {name!r}: "
                                    f"{type(e).__name__}: {e}") from None
        self.model._initial_epoch = state["epoch"]
        self._resume_epoch, self._resume_batch = state["epoch"], state["batch"]
        self.restored = state
        print(f"resumed from {state_path}: epoch {state['epoch'] + 1}, "
              f"{state['batch']} of its steps done, global step "
              f"{state['step']}", flush=True)

    def _check_same_run(self, state):
        """Refuses a backup of another run before anything is loaded."""
        run = {"optimizer": _optimizer_name(self.model),
               **{key: getattr(self, key) or None for key in (
                   "steps_per_epoch", "batches_per_epoch", "num_workers")}}
        differences = [f"{key}: {state[key]!r} -> {new!r}"
                       for key, new in run.items()
                       if key in state and state[key] != new]
        stored = state.get("fingerprint")
        if self.fingerprint is not None and stored is None:
            warnings.warn(
                f"TrainingBackup: the backup in {str(self.directory)!r} "
                "has no fingerprint (written before fingerprints, or "
                "without one), so it cannot be checked against this "
                "run's; resuming from it, and its next save records this "
                "run's fingerprint", stacklevel=2)
        elif self.fingerprint is not None:
            for key in sorted(set(stored) | set(self.fingerprint), key=str):
                old = stored.get(key, "(absent)")
                new = self.fingerprint.get(key, "(absent)")
                if old != new:
                    differences.append(f"{key}: {old!r} -> {new!r}")
        if differences:
            raise _mismatch(self.directory, differences)

    def _load_weights(self, path):
        """``model.load_weights``: a file that does not open is damaged;
        weights of other shapes, or optimizer variables Keras would skip
        (another optimizer, in a backup that did not record its class), are
        another run's."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                self.model.load_weights(str(path))
            except ValueError as e:
                raise _mismatch(self.directory, [
                    f"its weights do not fit this model: {str(e)[:400]}"]) from None
            except Exception as e:  # h5py's errors: OSError, KeyError, ...
                raise _damaged(path, f"{type(e).__name__}: {e}") from None
        for w in caught:
            if str(w.message).startswith("Skipping variable loading for optimizer"):
                raise _mismatch(self.directory, [str(w.message).strip()])
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def on_epoch_begin(self, epoch, logs=None):
        self._flush_pending()
        skip = self._resume_batch if epoch == self._resume_epoch else 0
        if self.position is not None:
            start = (epoch * self.steps_per_epoch + skip) * self.num_workers
            self.position.epoch, self.position.skip = divmod(
                start, self.batches_per_epoch)
        else:
            skip = 0  # the data restarts the epoch from its first batch
        self._epoch, self._batch_in_epoch = epoch, skip

    # -- save --------------------------------------------------------------
    def on_train_batch_end(self, batch, logs=None):
        self._batch_in_epoch += 1
        self._since_save += 1
        if self.position is not None and (
                self._batch_in_epoch >= self.steps_per_epoch):
            if self._epoch == self._resume_epoch and self._resume_batch:
                # The resumed epoch is short: end it where the
                # uninterrupted run ends it (fit would run a full one).
                self.model.stop_training = True
                self._forced_stop = True
            return  # the epoch-end backup follows
        if self.save_freq != "epoch" and self._since_save >= self.save_freq:
            self._save(self._epoch, self._batch_in_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if self._forced_stop:
            self.model.stop_training = False
            self._forced_stop = False
        # Written once the other callbacks are done with this epoch.
        self._pending = epoch + 1

    def on_train_end(self, logs=None):
        self._flush_pending()
        super().on_train_end(logs)

    def _flush_pending(self):
        if self._pending is not None:
            self._save(self._pending, 0)
            self._pending = None

    def _save(self, epoch, batch):
        self._since_save = 0
        self.directory.mkdir(parents=True, exist_ok=True)
        step = epoch * (self.steps_per_epoch or 0) + batch
        name = f"step_{step:09d}.weights.h5"
        save_weights_atomic(self.model, self.directory / name)
        state = {
            "epoch": epoch, "batch": batch, "step": step, "weights": name,
            "fingerprint": self.fingerprint,
            "optimizer": _optimizer_name(self.model),
            "steps_per_epoch": self.steps_per_epoch,
            "batches_per_epoch": self.batches_per_epoch or None,
            "num_workers": self.num_workers,
            "seed_states": [np.asarray(v.numpy()).tolist()
                            for v in _seed_states(self.model)],
            "callbacks": {n: cb.get_state() for n, cb in self.stateful.items()},
        }
        try:
            atomic_write(self.directory / "state.json", json.dumps(state))
        except BaseException:
            # state.json still names the previous backup: drop the new
            # weights file (its space is what the next try needs).
            try:
                current = json.loads(
                    (self.directory / "state.json").read_text())["weights"]
            except (OSError, ValueError, KeyError):
                current = None
            if name != current:
                (self.directory / name).unlink(missing_ok=True)
            raise
        for old in self.directory.glob("step_*.weights.h5"):
            if old.name != name:
                old.unlink()
