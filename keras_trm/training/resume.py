"""Resume after preemption: a killed run continues when run again.

Keras 3's ``keras.callbacks.BackupAndRestore`` (3.15) saves the weights, the
optimizer's variables and the epoch, but on restore it restarts the
interrupted epoch from its first batch (the ``batch`` it records is never
read back), it writes its files in place (a kill during the write leaves a
torn file), and it does not save the dropout RNG state (Keras'
``SeedGenerator`` state variables are not part of ``save_weights``).
``TrainingBackup`` builds on it and closes those gaps:

- weights + optimizer (``model.save_weights``), the dropout seed states, the
  epoch, the batches done in that epoch and the states of other callbacks
  (time budget, BLEU log, checkpoint list, ...) are saved every
  ``save_freq`` training steps and at every epoch end;
- every write goes to a temporary file renamed into place, and the weights
  file named in ``state.json`` is written before ``state.json`` itself, so
  a kill at any moment leaves the previous complete backup;
- on restore the run re-enters the interrupted epoch at the next unseen
  batch through a ``DataPosition`` that the data pipeline reads
  (``keras_trm.data.TokenBatches(position=...)``), so a resumed run
  trains on the same batches
  in the same order as an uninterrupted one and repeats at most
  ``save_freq`` steps.
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
    """The one error of a backup that cannot be read back."""
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
            and pathlib.PurePath(name).name == name and "/" not in name
            and "\\" not in name):
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


def _differences(stored, new):
    """``["key: old -> new", ...]`` for the keys whose values differ."""
    out = []
    for key in sorted(set(stored) | set(new), key=str):
        old_value = stored.get(key, "(absent)")
        new_value = new.get(key, "(absent)")
        if old_value != new_value:
            out.append(f"{key}: {old_value!r} -> {new_value!r}")
    return out


class TrainingBackup(keras.callbacks.BackupAndRestore):
    """``BackupAndRestore`` with mid-epoch resume, atomic writes, dropout
    RNG and callback states (see the module docstring).

    Put it FIRST in the callback list: it restores before the others start,
    and it writes an epoch's backup at the next epoch's start (or when fit
    ends), after every callback has finished that epoch (BLEU log,
    checkpoints, time budget).

    The data must be one continuous stream (``repeat=True``) fed to
    ``fit(..., steps_per_epoch=steps_per_epoch)``: global step t (from 0)
    trains on stream batches ``t * num_workers + worker`` (each worker of a
    multi-worker run takes every ``num_workers``-th batch). On restore at
    step t the stream restarts at batch ``t * num_workers`` (epoch
    ``// batches_per_epoch``, skip ``% batches_per_epoch``) and the
    interrupted epoch ends after its remaining steps, so the resumed run
    trains on exactly the batches the uninterrupted run would have.

    Files in ``backup_dir``: ``state.json`` and the one weights file it
    names (``step_{t}.weights.h5``).

    Same run only: ``state.json`` records the optimizer's class name,
    ``steps_per_epoch``, ``batches_per_epoch``, ``num_workers`` and the
    caller's ``fingerprint``; a backup whose recorded values differ from
    this run's is refused (``ValueError``) before anything is loaded or
    written, so a run with other settings never resumes from, nor
    overwrites, another run's backup. A backup written before these were
    recorded resumes as before; if this run passes a ``fingerprint`` and
    the backup has none, it resumes with a ``UserWarning`` and its next
    save records the fingerprint. A run that passes no ``fingerprint``
    does not compare one.

    Args:
        backup_dir: directory (created); used by this run only.
        save_freq: int >= 1 (training steps between backups) or
            ``"epoch"``. A backup is also written after every epoch.
        position: the ``DataPosition`` the data pipeline reads, or None
            (then an interrupted epoch restarts from its first batch, as
            with plain Keras, and ``steps_per_epoch`` may be None).
        steps_per_epoch: int >= 1 or None, the ``steps_per_epoch`` given
            to fit.
        batches_per_epoch: int >= 1 or None, batches in one epoch of the
            data stream (default ``steps_per_epoch * num_workers``).
        num_workers: int >= 1, workers sharing the stream (1).
        stateful: dict ``{name: callback}``; each has ``get_state() ->
            dict`` (JSON-able) and ``set_state(dict)``.
        delete_checkpoint: remove ``backup_dir`` when fit ends normally
            (default False: running the finished command again trains no
            further and goes straight to what follows fit).
        write: False on workers that must not write here (non-chief).
        fingerprint: None, or a JSON-serialisable dict describing the run
            (e.g. its model and data settings: languages, dataset, vocabulary,
            model size, optimizer settings). Stored in ``state.json``; on
            restore every key is compared (as JSON gives it back: tuples
            are lists) with the stored one.

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
            is trained: a backup of another run (a different fingerprint,
            optimizer, epoch length, RNG states or weight shapes), naming
            the folder, what differs (``key: old -> new``) and the fix
            (delete the folder, or use another work directory); a damaged
            backup (``state.json`` that is not JSON, lacks a key, has a
            value of the wrong type or range, names a weights file outside
            the folder or one that is missing, damaged or truncated, or a
            callback state that ``set_state`` refuses), naming the file.
        OSError: ``errno.ENOSPC`` out of ``fit`` when ``backup_dir``'s file
            system is full, naming the file and the space needed and free
            (see ``save_weights_atomic``). The previous backup stays
            complete and no temporary or orphan file remains: run again
            once there is space and training resumes from it.

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
                 stateful=None, delete_checkpoint=False, write=True,
                 fingerprint=None):
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
        for folder in (directory, *directory.parents):
            if folder.exists():
                if not folder.is_dir():
                    raise ValueError(
                        f"`backup_dir` must be a directory, but {str(folder)!r} "
                        f"is a file: backup_dir={str(backup_dir)!r}")
                break
        super().__init__(str(backup_dir), save_freq=save_freq,
                         delete_checkpoint=delete_checkpoint)
        self.directory = directory
        self.position = position
        self.steps_per_epoch = steps_per_epoch
        self.num_workers = num_workers
        self.batches_per_epoch = (
            batches_per_epoch or (steps_per_epoch or 0) * self.num_workers)
        self.stateful = stateful
        self.write = bool(write)
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
        state = self._read_state(state_path)
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

    def _read_state(self, state_path):
        """``state.json`` parsed and checked, or ``_damaged``."""
        try:
            state = json.loads(state_path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise _damaged(state_path, f"{type(e).__name__}: {e}") from None
        _check_state(state, state_path)
        return state

    def _check_same_run(self, state):
        """Refuses a backup of another run before anything is loaded."""
        differences = []
        optimizer = _optimizer_name(self.model)
        if "optimizer" in state and state["optimizer"] != optimizer:
            differences.append(f"optimizer: {state['optimizer']!r} -> {optimizer!r}")
        for key in ("steps_per_epoch", "batches_per_epoch", "num_workers"):
            new = getattr(self, key) or None
            if key in state and state[key] != new:
                differences.append(f"{key}: {state[key]!r} -> {new!r}")
        stored = state.get("fingerprint")
        if self.fingerprint is not None:
            if stored is None:
                warnings.warn(
                    f"TrainingBackup: the backup in {str(self.directory)!r} "
                    "has no fingerprint (written before fingerprints, or "
                    "without one), so it cannot be checked against this "
                    "run's; resuming from it, and its next save records this "
                    "run's fingerprint", stacklevel=2)
            else:
                differences += _differences(stored, self.fingerprint)
        if differences:
            raise _mismatch(self.directory, differences)

    def _load_weights(self, path):
        """``model.load_weights``, its errors named: a file that does not
        open is damaged; weights of other shapes, or an optimizer's
        variables that Keras would skip (another optimizer, in a backup that
        did not record its class), are another run's."""
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
            self.position.epoch = start // self.batches_per_epoch
            self.position.skip = start % self.batches_per_epoch
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
        if not self.write:
            return
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
            if name != self._backup_weights_name():
                (self.directory / name).unlink(missing_ok=True)
            raise
        for old in self.directory.glob("step_*.weights.h5"):
            if old.name != name:
                old.unlink()

    def _backup_weights_name(self):
        """The weights file the current ``state.json`` names, or None."""
        try:
            return json.loads((self.directory / "state.json").read_text())["weights"]
        except (OSError, ValueError, KeyError):
            return None
