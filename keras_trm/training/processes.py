"""Data parallel over several JAX processes: the translation job's
``--training.strategy multi_worker`` under ``KERAS_BACKEND=jax``.

Every process runs the same command; Keras' own variables name the
cluster (``keras.distribution.initialize``): ``KERAS_DISTRIBUTION_
JOB_ADDRESSES`` (process 0's ``host:port``, the coordinator),
``KERAS_DISTRIBUTION_NUM_PROCESSES`` and ``KERAS_DISTRIBUTION_PROCESS_ID``.
The model's variables are replicated over every device of every process
(``keras.distribution.DataParallel``); each process feeds its own rows of
every global batch (``TokenBatches(process_index=k, num_processes=n)``),
so a step is the update of one device on the global batch.

Process 0, the chief, alone decodes (val BLEU, test) and writes (epoch
log, checkpoints, model, export), on copies of the weights that live on
it alone (``local_copy``), so that none of this waits on the others. Every
process starts from the same step (``SameResumeStep``) and stops after the
epoch where the chief's time budget stops (``ChiefStops``). After ``fit`` the processes leave together
(``JaxProcesses.end``); the others exit, the chief goes on alone.
"""

import contextlib
import functools
import json
import os
import pathlib

import keras
import numpy as np

CLUSTER_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES",
                     "KERAS_DISTRIBUTION_NUM_PROCESSES",
                     "KERAS_DISTRIBUTION_PROCESS_ID")


@contextlib.contextmanager
def no_distribution():
    """Runs its block with no ``keras.distribution`` set: the variables
    made there live on this process alone."""
    current = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(current)


def on_this_process(fn):
    """``fn`` run under ``no_distribution()``."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with no_distribution():
            return fn(*args, **kwargs)
    return wrapped


@on_this_process
def local_copy(model):
    """``model`` rebuilt from its config on this process alone, holding
    its weights (a replicated weight reads from this process's copy; no
    other process takes part)."""
    copy = model.__class__.from_config(model.get_config())
    copy.set_weights(model.get_weights())
    return copy


class SameResumeStep(keras.callbacks.Callback):
    """Refuses to start when the processes would resume from different
    steps (each restores its own backup; one killed between two
    processes' backups is behind): the step each backup's ``state.json``
    names is gathered from every process before any backup is loaded, as
    loading is a collective a process without a backup would not join.
    Place it before the ``TrainingBackup``.

    Args:
        backup_dir: this process's ``TrainingBackup`` folder.

    Raises:
        ValueError: at the start of ``fit``, on every process, naming each
            process's step (-1: no backup, 0 a backup that does not read).
    """

    def __init__(self, backup_dir):
        super().__init__()
        self.state_path = pathlib.Path(backup_dir) / "state.json"

    def on_train_begin(self, logs=None):
        from jax.experimental import multihost_utils

        try:
            step = int(json.loads(self.state_path.read_text())["step"])
        except FileNotFoundError:
            step = -1
        except (OSError, ValueError, KeyError, TypeError):
            step = 0  # TrainingBackup names the damage
        steps = np.asarray(multihost_utils.process_allgather(np.int64(step))).reshape(-1)
        if len(set(steps.tolist())) > 1:
            raise ValueError(
                "the processes would resume from different steps (their backups, "
                f"-1 for none: {steps.tolist()}, by process); this process's is "
                f"{self.state_path.parent}. Start all again from the same backup "
                "(or remove every process's backup folder)")


class ChiefStops(keras.callbacks.Callback):
    """After each epoch every process takes the chief's ``stop_training``
    (its ``TimeBudget``'s decision: each process has its own clock). Place
    it after the callbacks that stop."""

    def on_epoch_end(self, epoch, logs=None):
        from jax.experimental import multihost_utils

        stop = multihost_utils.broadcast_one_to_all(np.int32(bool(self.model.stop_training)))
        self.model.stop_training = bool(stop)


class JaxProcesses:
    """The processes of ``CLUSTER_VARIABLES``, joined (``jax.distributed``
    through ``keras.distribution.initialize``) with a ``DataParallel``
    distribution over all their devices set. Make it before any JAX
    computation.

    Attributes:
        num_workers, worker_index, is_chief: the processes, this one's
            index, whether it is process 0.
        num_replicas_in_sync: the batch shares of a step (one per process,
            ``tokens_per_batch`` each), as ``tf.distribute`` counts replicas.

    Raises:
        ValueError: a variable of ``CLUSTER_VARIABLES`` unset, or a count or
            index that is not an int in range (naming the variable and value);
            a process that sees more than one device (one process per device:
            a process's rows of a batch are not split further).

    Example (two shells; the second with ``KERAS_DISTRIBUTION_PROCESS_ID=1``)::

        export KERAS_BACKEND=jax KERAS_DISTRIBUTION_JOB_ADDRESSES=127.0.0.1:9876
        export KERAS_DISTRIBUTION_NUM_PROCESSES=2 KERAS_DISTRIBUTION_PROCESS_ID=0
        keras-trm train-translation --training.strategy multi_worker --workdir runs/p0
    """

    def __init__(self):
        missing = [name for name in CLUSTER_VARIABLES if not os.environ.get(name)]
        if missing:
            raise ValueError(
                "strategy 'multi_worker' under JAX needs the cluster in "
                f"{', '.join(CLUSTER_VARIABLES)}; not set: {', '.join(missing)}")
        values = {}
        for name in CLUSTER_VARIABLES[1:]:
            try:
                values[name] = int(os.environ[name])
            except ValueError:
                raise ValueError(f"{name} must be an int, got {name}="
                                 f"{os.environ[name]!r}") from None
        count, index = values.values()
        if not 0 <= index < count:
            raise ValueError(f"KERAS_DISTRIBUTION_PROCESS_ID must be in [0, {count}) "
                             f"(KERAS_DISTRIBUTION_NUM_PROCESSES={count}), got {index}")
        import jax

        keras.distribution.initialize()
        if jax.local_device_count() != 1:  # its rows would be split again
            raise ValueError(
                "strategy 'multi_worker' under JAX runs one device per process; "
                f"process {jax.process_index()} sees {jax.local_device_count()} "
                f"({', '.join(map(str, jax.local_devices()))}): start one process "
                "per device (e.g. CUDA_VISIBLE_DEVICES=k for process k)")
        parallel = keras.distribution.DataParallel(devices=jax.devices())
        parallel.auto_shard_dataset = False  # each process reads its own rows
        keras.distribution.set_distribution(parallel)
        self.num_workers, self.worker_index = jax.process_count(), jax.process_index()
        self.is_chief = self.worker_index == 0
        self.num_replicas_in_sync = self.num_workers

    scope = staticmethod(contextlib.nullcontext)

    def end(self, model):
        """After ``fit``, on every process: the chief's ``local_copy`` of
        ``model`` (None elsewhere); then the processes part (a barrier) and
        no distribution is set."""
        import jax

        copy = local_copy(model) if self.is_chief else None
        jax.distributed.shutdown()
        keras.distribution.set_distribution(None)
        return copy
