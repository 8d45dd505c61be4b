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
  (``keras_trm.data.stream_batches(position=...)``, or ``mix_batches``
  with ``batches_per_epoch``), so a resumed run trains on the same batches
  in the same order as an uninterrupted one and repeats at most
  ``save_freq`` steps.
"""

import json
import pathlib

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

    Args:
        backup_dir: directory (created); used by this run only.
        save_freq: int >= 1 (training steps between backups) or
            ``"epoch"``. A backup is also written after every epoch.
        position: the ``DataPosition`` the data pipeline reads, or None
            (then an interrupted epoch restarts from its first batch, as
            with plain Keras, and ``steps_per_epoch`` may be None).
        steps_per_epoch: int, the ``steps_per_epoch`` given to fit.
        batches_per_epoch: int, batches in one epoch of the data stream
            (default ``steps_per_epoch * num_workers``).
        num_workers: int, workers sharing the stream (1).
        stateful: dict ``{name: callback}``; each has ``get_state() ->
            dict`` (JSON-able) and ``set_state(dict)``.
        delete_checkpoint: remove ``backup_dir`` when fit ends normally
            (default False: running the finished command again trains no
            further and goes straight to what follows fit).
        write: False on workers that must not write here (non-chief).

    Attributes:
        restored: None, or the ``state.json`` dict restored at the start.

    Raises:
        ValueError: ``save_freq`` neither ``"epoch"`` nor an int >= 1;
            ``position`` without ``steps_per_epoch``; a backup whose model
            differs.
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
                 stateful=None, delete_checkpoint=False, write=True):
        if save_freq != "epoch" and not (
                isinstance(save_freq, int) and save_freq >= 1):
            raise ValueError(
                "`save_freq` must be 'epoch' or an int >= 1 (steps), got "
                f"save_freq={save_freq!r}")
        if position is not None and not steps_per_epoch:
            raise ValueError(
                "`steps_per_epoch` is needed with a `position`, got "
                f"steps_per_epoch={steps_per_epoch!r}")
        super().__init__(str(backup_dir), save_freq=save_freq,
                         delete_checkpoint=delete_checkpoint)
        self.directory = pathlib.Path(backup_dir)
        self.position = position
        self.steps_per_epoch = steps_per_epoch
        self.num_workers = int(num_workers)
        self.batches_per_epoch = int(
            batches_per_epoch or (steps_per_epoch or 0) * self.num_workers)
        self.stateful = dict(stateful or {})
        self.write = bool(write)
        self.restored = None
        self._resume_epoch, self._resume_batch = None, 0
        self._epoch, self._batch_in_epoch, self._since_save = 0, 0, 0
        self._pending, self._forced_stop = None, False

    # -- restore -----------------------------------------------------------
    def on_train_begin(self, logs=None):
        state_path = self.directory / "state.json"
        if not state_path.is_file():
            return
        state = json.loads(state_path.read_text())
        if not self.model.built:
            raise ValueError("TrainingBackup: build the model before fit() "
                             "so that a backup can be restored into it")
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        self.model.load_weights(str(self.directory / state["weights"]))
        seeds = _seed_states(self.model)
        if len(seeds) != len(state["seed_states"]):
            raise ValueError(
                f"TrainingBackup: the backup in {str(self.directory)!r} has "
                f"{len(state['seed_states'])} RNG states, the model "
                f"{len(seeds)}: not the same model")
        for var, value in zip(seeds, state["seed_states"]):
            var.assign(np.asarray(value, var.dtype))
        for name, cb in self.stateful.items():
            if name in state["callbacks"]:
                cb.set_state(state["callbacks"][name])
        self.model._initial_epoch = state["epoch"]
        self._resume_epoch, self._resume_batch = state["epoch"], state["batch"]
        self.restored = state
        print(f"resumed from {state_path}: epoch {state['epoch'] + 1}, "
              f"{state['batch']} of its steps done, global step "
              f"{state['step']}", flush=True)

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
