"""Atomic weight checkpoints and checkpoint averaging (Vaswani et al. §6.1)."""

import os
import pathlib
import tempfile

import keras
import numpy as np


def save_weights_atomic(model, path):
    """Saves ``model`` weights to ``path`` (``*.weights.h5``) atomically.

    The file is written under a temporary name in the same directory and
    renamed into place, so a crash never leaves a half-written checkpoint.
    """
    path = pathlib.Path(path)
    if not path.name.endswith(".weights.h5"):
        raise ValueError(f"`path` must end with '.weights.h5', got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.weights.h5")
    os.close(fd)
    try:
        model.save_weights(tmp, overwrite=True)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def average_checkpoints(model, paths):
    """Sets ``model``'s weights to the element-wise mean of checkpoints.

    §6.1: "we used a single model obtained by averaging the last 5
    checkpoints". Every variable (trainable or not) is averaged.

    Args:
        model: a built model whose architecture matches the checkpoints.
        paths: non-empty list of ``*.weights.h5`` files.

    Returns:
        ``model``, with averaged weights.

    Raises:
        ValueError: empty ``paths``. FileNotFoundError: a missing file.
    """
    paths = [pathlib.Path(p) for p in paths]
    if not paths:
        raise ValueError("`paths` is empty: no checkpoint to average")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"checkpoint {str(p)!r} does not exist")
    total = None
    for p in paths:
        model.load_weights(str(p))
        weights = [np.asarray(w, np.float64) for w in model.get_weights()]
        total = weights if total is None else [a + b for a, b in zip(total, weights)]
    model.set_weights([t / len(paths) for t in total])
    return model


class EpochCheckpoints(keras.callbacks.Callback):
    """Saves ``epoch_{n:03d}.weights.h5`` atomically after every epoch and
    keeps the newest ``keep`` files (the ones ``average_checkpoints`` uses)."""

    def __init__(self, directory, keep=5):
        super().__init__()
        self.directory = pathlib.Path(directory)
        self.keep = int(keep)
        self.paths = []

    def on_epoch_end(self, epoch, logs=None):
        path = self.directory / f"epoch_{epoch + 1:03d}.weights.h5"
        self.paths.append(save_weights_atomic(self.model, path))
        while len(self.paths) > self.keep:
            old = self.paths.pop(0)
            if old.exists():
                old.unlink()
