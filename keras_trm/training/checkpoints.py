"""Atomic weight checkpoints and checkpoint averaging (Vaswani et al. §6.1)."""

import contextlib
import contextvars
import io
import math
import os
import pathlib
import time

import keras
import numpy as np

from keras_trm.utils import checks as v
from keras_trm.utils.files import atomic_write
from keras_trm.training.processes import no_distribution


def save_weights_atomic(model, path):
    """Saves ``model``'s weights (and its optimizer's) to ``path``
    (``*.weights.h5``, the file ``model.load_weights`` reads) atomically.

    The HDF5 file is built in memory (one extra copy of it) with Keras'
    own code, written under a temporary name and renamed into place: a
    crash never leaves a half-written checkpoint, and a full disk is an
    ordinary ``OSError`` (HDF5 writing a file on a full disk leaves it
    open, and the process segfaults at exit; h5py 3.14 / HDF5 1.14.6).

    Args:
        model: a built Keras model.
        path: str or ``pathlib.Path`` ending in ``.weights.h5``.

    Returns:
        ``path`` as a ``pathlib.Path``.

    Raises:
        ValueError: ``path`` not ending in ``.weights.h5``; an unbuilt model.
        OSError: ``errno.ENOSPC`` when the file system is full, naming
            ``path``, the file's size and the space free (e.g. ``no space
            left on device writing run/backup/step_000000400.weights.h5:
            needed ~2.1 MB, 1.0 MB free``); ``path``, if it existed, is
            unchanged and no temporary file remains.

    Example:
        >>> import pathlib, tempfile, numpy as np, keras
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.weights.h5"
        >>> save_weights_atomic(m, path).name
        'a.weights.h5'
        >>> m2 = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> m2.load_weights(path)
        >>> bool(np.array_equal(m2.get_weights()[0], m.get_weights()[0]))
        True
    """
    from keras.src.saving import saving_lib

    path = pathlib.Path(path)
    if not path.name.endswith(".weights.h5"):
        raise ValueError(f"`path` must end with '.weights.h5', got {str(path)!r}")
    if not model.built:
        raise ValueError("You are saving a model that has not yet been built. "
                         "Try building the model first by calling it on some "
                         "data or by using `build()`.")
    buffer = io.BytesIO()
    store = saving_lib.H5IOStore(buffer, mode="w")
    # Saving makes a throwaway optimizer variable: under a distribution
    # over several JAX processes that would be a collective, which a
    # chief saving alone would wait on for ever.
    try:
        with no_distribution():
            saving_lib._save_state(model, store, None, "", set())
    finally:
        store.close()
    image = buffer.getbuffer()
    try:
        atomic_write(path, image)
    finally:
        image.release()
    return path


def average_checkpoints(model, paths):
    """Sets ``model``'s weights to the element-wise mean of checkpoints.

    §6.1: "we used a single model obtained by averaging the last 5
    checkpoints". Every variable (trainable or not) is averaged.

    Args:
        model: a built model whose architecture matches the checkpoints.
        paths: non-empty sequence of ``*.weights.h5`` files.

    Returns:
        ``model``, with averaged weights.

    Raises:
        TypeError: ``paths`` a single str, bytes or path.
        ValueError: empty ``paths``; a checkpoint that does not load into
            ``model`` (another architecture, a truncated or corrupt file),
            naming it, e.g. "`paths[1]`: checkpoint 'run/wider.weights.h5'
            could not be loaded into the model (ValueError: ...)".
        FileNotFoundError: a missing file, before anything is loaded.
        OSError: an error reading a file (permissions), naming it.

    On any error ``model`` (and its optimizer's variables) keep the
    weights they had before the call.
    """
    paths = [pathlib.Path(p) for p in _checkpoint_list(
        paths, " (pass [paths] to use a single checkpoint)")]
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"checkpoint {str(p)!r} does not exist")
    with _restored_on_error(model):
        # One float64 sum, added to in place: the sum and one checkpoint's
        # weights are all that is held, whatever the number of checkpoints.
        _load_checkpoint(model, paths[0], "paths[0]")
        total = [np.array(w, np.float64) for w in model.get_weights()]
        for i, p in enumerate(paths[1:], 1):
            _load_checkpoint(model, p, f"paths[{i}]")
            for t, w in zip(total, model.get_weights()):
                t += w
        for t in total:
            t /= len(paths)
        model.set_weights(total)
    return model


def _checkpoint_list(paths, hint=""):
    """``paths`` as a non-empty list; a single path is refused."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError("`paths` must be a list of checkpoint files, got one "
                        f"path: paths={paths!r}{hint}")
    paths = list(paths)
    if not paths:
        raise ValueError("`paths` is empty: no checkpoint to average")
    return paths


def _load_checkpoint(model, path, name):
    """``model.load_weights(path)``, its errors naming ``name`` and ``path``
    (Keras' and h5py's name neither)."""
    try:
        model.load_weights(str(path))
    except OSError as error:
        if error.errno is not None:  # a real I/O error (permissions, ...)
            raise type(error)(error.errno, f"`{name}`: reading checkpoint "
                              f"{str(path)!r}: {error.strerror}") from error
        raise ValueError(  # h5py: not an HDF5 file (empty, truncated, other)
            f"`{name}`: checkpoint {str(path)!r} could not be read as a "
            f".weights.h5 file ({type(error).__name__}: {error})") from error
    except Exception as error:
        raise ValueError(
            f"`{name}`: checkpoint {str(path)!r} could not be loaded into the "
            f"model (not the model's architecture?) ({type(error).__name__}: "
            f"{str(error)[:500]})") from error


# Set while a _restored_on_error block holds its copy: a nested one (each
# average select_checkpoint_average tries) needs none of its own.
_HOLDING_COPY = contextvars.ContextVar("keras_trm_holding_copy", default=False)


@contextlib.contextmanager
def _restored_on_error(model):
    """Puts back ``model``'s and its optimizer's variables (``load_weights``
    sets both) when the block raises; the outermost block holds one host
    copy of them (about 3x the float32 weights with Adam)."""
    if _HOLDING_COPY.get():
        yield
        return
    optimizer = getattr(model, "optimizer", None)
    variables = list(optimizer.variables) if optimizer is not None else []
    weights = model.get_weights()
    values = [keras.ops.convert_to_numpy(v) for v in variables]
    token = _HOLDING_COPY.set(True)
    try:
        yield
    except BaseException:
        model.set_weights(weights)
        for variable, value in zip(variables, values):
            variable.assign(value)
        raise
    finally:
        _HOLDING_COPY.reset(token)


def select_checkpoint_average(model, paths, score, max_count=5):
    """Averages the last k checkpoints for the k that scores best.

    §6.1 averages a fixed number (5 for base, 20 for big); with few epochs
    the early ones can hurt, so this tries k = 1, ..., ``max_count`` (the
    newest k of ``paths``) and keeps the best by ``score``, computed on
    validation data, never the test set. Ties go to the smaller k; a NaN
    score is recorded in ``scores`` but never chosen.

    Args:
        model: a built model matching the checkpoints.
        paths: ``*.weights.h5`` files, oldest first.
        score: callable ``score(model) -> float``, higher is better (e.g.
            greedy BLEU on the validation split).
        max_count: int >= 1, the largest k tried.

    Returns:
        ``(k, scores)``: the chosen k and ``{k: score}`` for every k tried;
        ``model`` holds the chosen average.

    Raises:
        TypeError: ``max_count`` not an int, ``paths`` a single path,
            ``score`` returning something that is not a number.
        ValueError: empty ``paths``, ``max_count < 1``, every score NaN,
            or a checkpoint that does not load (``average_checkpoints``).

    On any error ``model`` keeps the weights it had before the call.
    """
    paths = _checkpoint_list(paths)
    max_count = v.positive_int("max_count", max_count)
    scores = {}
    with _restored_on_error(model):
        for k in range(1, min(max_count, len(paths)) + 1):
            average_checkpoints(model, paths[-k:])
            value = score(model)
            try:
                scores[k] = float(value)
            except (TypeError, ValueError):
                raise TypeError(
                    f"`score` must return a number, got {value!r} for the "
                    f"average of the last {k} checkpoint(s)") from None
        finite = [k for k in scores if not math.isnan(scores[k])]
        if not finite:
            raise ValueError(
                f"`score` gave NaN for every average tried: scores={scores}")
        best = max(finite, key=lambda k: (scores[k], -k))
        average_checkpoints(model, paths[-best:])
    return best, scores


class EpochCheckpoints(keras.callbacks.Callback):
    """Saves weight checkpoints atomically and keeps the newest ``keep``
    (the ones ``average_checkpoints`` uses).

    When: after every epoch (``epoch_{n:03d}.weights.h5``, the default),
    every ``every_steps`` training steps or every ``every_minutes`` of wall
    time (checked after each step; both ``step_{t:09d}.weights.h5``, t =
    global step; §6.1 writes one every 10 minutes). The kept list is part
    of ``get_state()`` for ``TrainingBackup``; files from after a restored
    backup are deleted then (they will be written again).

    Args:
        directory: where the files go (created).
        keep: int >= 1, how many newest files are kept.
        every_steps: int >= 0; 0 = not by steps.
        every_minutes: finite float >= 0; 0 = not by time.
        write: False on non-chief workers (nothing is written).

    Raises:
        TypeError: ``keep`` or ``every_steps`` not an int (bool refused),
            ``every_minutes`` not a number.
        ValueError: ``keep`` < 1, negative ``every_steps``, ``every_minutes``
            negative, NaN or inf, or both set.
        OSError: ``errno.ENOSPC`` out of ``fit`` when the file system is
            full (``save_weights_atomic``); the files kept are unchanged.

    Example:
        >>> import tempfile, numpy as np, keras
        >>> m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> m.compile("sgd", "mse")
        >>> ck = EpochCheckpoints(tempfile.mkdtemp(), keep=2, every_steps=3)
        >>> _ = m.fit(np.ones((16, 2)), np.ones((16, 1)), batch_size=2,
        ...           callbacks=[ck], verbose=0)
        >>> [p.name for p in ck.paths]
        ['step_000000003.weights.h5', 'step_000000006.weights.h5']
    """

    def __init__(self, directory, keep=5, every_steps=0, every_minutes=0.0,
                 write=True):
        super().__init__()
        keep = v.positive_int("keep", keep)
        every_steps = v.non_negative_int("every_steps", every_steps)
        # NaN or inf would never be due.
        every_minutes = v.non_negative_float("every_minutes", every_minutes)
        if every_steps and every_minutes:
            raise ValueError(
                "set one of `every_steps` and `every_minutes`, got "
                f"every_steps={every_steps!r}, every_minutes={every_minutes!r}")
        self.directory = pathlib.Path(directory)
        self.keep = keep
        self.every_steps = every_steps
        self.every_seconds = every_minutes * 60.0
        self.write = bool(write)
        self.paths = []
        self._step, self._last_time = 0, None

    def on_train_begin(self, logs=None):
        self._last_time = time.time()

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        due = (self.every_steps and self._step % self.every_steps == 0) or (
            self.every_seconds
            and time.time() - self._last_time >= self.every_seconds)
        if due:
            self._save(f"step_{self._step:09d}.weights.h5")

    def on_epoch_end(self, epoch, logs=None):
        if not (self.every_steps or self.every_seconds):
            self._save(f"epoch_{epoch + 1:03d}.weights.h5")

    def _save(self, name):
        self._last_time = time.time()
        if not self.write:
            return
        path = save_weights_atomic(self.model, self.directory / name)
        if path not in self.paths:
            self.paths.append(path)
        while len(self.paths) > self.keep:
            self.paths.pop(0).unlink(missing_ok=True)

    def get_state(self):
        return {"paths": [p.name for p in self.paths], "step": self._step}

    def set_state(self, state):
        self.paths = [self.directory / name for name in state["paths"]]
        self._step = int(state["step"])
        if self.write and self.directory.is_dir():
            for p in self.directory.glob("*.weights.h5"):
                if p not in self.paths:  # written after the backup
                    p.unlink()
