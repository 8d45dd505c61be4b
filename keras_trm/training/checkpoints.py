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
from keras_trm.utils.files import atomic_file, atomic_write, check_free_space


def _weights_image(model):
    """The ``.weights.h5`` file of ``model`` as bytes (a memoryview), built
    in memory with the same Keras code ``model.save_weights`` uses; None
    where this Keras has no such internals (then the caller writes a file).
    """
    try:
        from keras.src.saving import saving_lib
        store_class, save_state = saving_lib.H5IOStore, saving_lib._save_state
    except (ImportError, AttributeError):
        return None
    if not model.built:
        raise ValueError("You are saving a model that has not yet been built. "
                         "Try building the model first by calling it on some "
                         "data or by using `build()`.")
    buffer = io.BytesIO()
    store = store_class(buffer, mode="w")
    try:
        save_state(model, store, None, "", set())
    finally:
        store.close()
    return buffer.getbuffer()


def _weights_bytes_estimate(model):
    """Expected ``.weights.h5`` size: the bytes of every variable (the
    optimizer's too) plus HDF5's overhead (~1 kB a variable, 1 MB)."""
    variables = list(model.variables)
    if getattr(model, "optimizer", None) is not None:
        variables += list(model.optimizer.variables)
    data = sum(int(np.prod(v.shape)) * np.dtype(keras.backend.standardize_dtype(
        v.dtype)).itemsize for v in variables)
    return int(data * 1.01) + 1024 * len(variables) + 10**6


def save_weights_atomic(model, path):
    """Saves ``model``'s weights (and its optimizer's) to ``path``
    (``*.weights.h5``, the file ``model.load_weights`` reads) atomically.

    The HDF5 file is built in memory (the same Keras code as
    ``model.save_weights``) and then written under a temporary name in the
    same folder and renamed into place: a crash never leaves a half-written
    checkpoint, and a full file system is an ordinary ``OSError`` -- HDF5
    never sees it. (HDF5 writing a file itself on a full disk, as
    ``model.save_weights`` does, raises, leaves the file open, and the
    process dies with a segmentation fault when it exits; h5py 3.14 /
    HDF5 1.14.6.) Memory: one extra copy of the file while it is written.

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
    path = pathlib.Path(path)
    if not path.name.endswith(".weights.h5"):
        raise ValueError(f"`path` must end with '.weights.h5', got {str(path)!r}")
    image = _weights_image(model)
    if image is not None:
        try:
            atomic_write(path, image)
        finally:
            image.release()
        return path
    # Fallback (a Keras without the internals): HDF5 writes the file, so
    # refuse early when the expected size does not fit.
    path.parent.mkdir(parents=True, exist_ok=True)
    expected = _weights_bytes_estimate(model)
    check_free_space(path, expected)
    with atomic_file(path, suffix=".weights.h5", expected_size=expected) as tmp:
        model.save_weights(tmp, overwrite=True)
    return path


def average_checkpoints(model, paths):
    """Sets ``model``'s weights to the element-wise mean of checkpoints.

    §6.1: "we used a single model obtained by averaging the last 5
    checkpoints". Every variable (trainable or not) is averaged.

    Args:
        model: a built model whose architecture matches the checkpoints.
        paths: non-empty list (or other sequence) of ``*.weights.h5``
            files; a single path is refused, not read as its characters.

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
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError(
            "`paths` must be a list of checkpoint files, got one path: "
            f"paths={paths!r} (pass [paths] to use a single checkpoint)")
    paths = [pathlib.Path(p) for p in paths]
    if not paths:
        raise ValueError("`paths` is empty: no checkpoint to average")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"checkpoint {str(p)!r} does not exist")
    with _restored_on_error(model):
        # One float64 sum, added to in place: the sum and one checkpoint's
        # weights are all that is held, whatever the number of checkpoints.
        total = None
        for i, p in enumerate(paths):
            _load_checkpoint(model, p, f"paths[{i}]")
            if total is None:
                total = [np.array(w, np.float64) for w in model.get_weights()]
                continue
            for t, w in zip(total, model.get_weights()):
                t += w
        for t in total:
            t /= len(paths)
        model.set_weights(total)
    return model


def _load_checkpoint(model, path, name):
    """``model.load_weights(path)``; an error names ``name`` and ``path``
    (Keras' "A total of 1 objects could not be loaded" and h5py's "file
    signature not found" name neither)."""
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
    """Puts back ``model``'s weights (and its optimizer's variables, which
    ``load_weights`` also sets) when the block raises. One host copy of
    them is held meanwhile (about 3x the float32 weights with Adam's two
    slots), by the outermost block only."""
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

    §6.1 averages a fixed number of checkpoints (5 for base, 20 for big);
    with few epochs the early ones can hurt, so this tries k = 1, ...,
    ``max_count`` (the newest k of ``paths``) and keeps the best by
    ``score`` -- which must be computed on validation data, never on the
    test set. Ties go to the smaller k. A NaN score (a diverged average,
    or a metric of no tokens) is recorded in ``scores`` but never chosen:
    the best of the other k is.

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
        TypeError: ``max_count`` not an int (bool refused), ``paths`` a
            single path, ``score`` returning something that is not a
            number.
        ValueError: empty ``paths``, ``max_count < 1``, every score NaN
            (naming the scores), or a checkpoint that does not load (see
            ``average_checkpoints``).

    On any error ``model`` keeps the weights it had before the call.
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError(
            "`paths` must be a list of checkpoint files, got one path: "
            f"paths={paths!r}")
    paths = list(paths)
    if not paths:
        raise ValueError("`paths` is empty: no checkpoint to average")
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

    When: after every epoch (``epoch_{n:03d}.weights.h5``, the default), or
    every ``every_steps`` training steps, or every ``every_minutes`` of
    wall time (checked after each step; both give
    ``step_{t:09d}.weights.h5``, t = global step). §6.1 of the paper writes
    one every 10 minutes and averages the last 5 (base) or 20 (big).

    The list of kept files is part of ``get_state()``, so that
    ``TrainingBackup`` restores it after a restart; files from after the
    restored backup are deleted then (they will be written again).

    Args:
        directory: where the files go (created).
        keep: int >= 1, how many newest files are kept.
        every_steps: int >= 0; 0 = not by steps.
        every_minutes: finite float >= 0; 0 = not by time.
        write: False on non-chief workers (nothing is written).

    Raises:
        TypeError: ``keep`` or ``every_steps`` not an int (2.5 is not
            rounded; bool refused), ``every_minutes`` not a number.
        ValueError: ``keep`` < 1, negative ``every_steps``, ``every_minutes``
            negative, NaN or inf (no checkpoint would ever be written), or
            both set.
        OSError: ``errno.ENOSPC`` out of ``fit`` when ``directory``'s file
            system is full (see ``save_weights_atomic``); the files kept so
            far are complete and unchanged.

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
        # NaN would compare False with every elapsed time (no checkpoint,
        # ever), and so would inf.
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
            old = self.paths.pop(0)
            if old.exists():
                old.unlink()

    def get_state(self):
        return {"paths": [p.name for p in self.paths], "step": self._step}

    def set_state(self, state):
        self.paths = [self.directory / name for name in state["paths"]]
        self._step = int(state["step"])
        if self.write and self.directory.is_dir():
            for p in self.directory.glob("*.weights.h5"):
                if p not in self.paths:  # written after the backup
                    p.unlink()
