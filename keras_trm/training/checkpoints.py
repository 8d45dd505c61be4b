"""Atomic weight checkpoints and checkpoint averaging (Vaswani et al. §6.1)."""

import pathlib

import keras
import numpy as np

from keras_trm.utils.files import atomic_file


def save_weights_atomic(model, path):
    """Saves ``model`` weights to ``path`` (``*.weights.h5``) atomically.

    The file is written under a temporary name in the same directory and
    renamed into place, so a crash never leaves a half-written checkpoint.
    """
    path = pathlib.Path(path)
    if not path.name.endswith(".weights.h5"):
        raise ValueError(f"`path` must end with '.weights.h5', got {str(path)!r}")
    with atomic_file(path, suffix=".weights.h5") as tmp:
        model.save_weights(tmp, overwrite=True)
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


def select_checkpoint_average(model, paths, score, max_count=5):
    """Averages the last k checkpoints for the k that scores best.

    §6.1 averages a fixed number of checkpoints (5 for base, 20 for big);
    with few epochs the early ones can hurt, so this tries k = 1, ...,
    ``max_count`` (the newest k of ``paths``) and keeps the best by
    ``score`` -- which must be computed on validation data, never on the
    test set. Ties go to the smaller k.

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
        ValueError: empty ``paths`` or ``max_count < 1``.
    """
    paths = list(paths)
    if not paths:
        raise ValueError("`paths` is empty: no checkpoint to average")
    if int(max_count) < 1:
        raise ValueError(f"`max_count` must be >= 1, got max_count={max_count}")
    scores = {}
    for k in range(1, min(int(max_count), len(paths)) + 1):
        average_checkpoints(model, paths[-k:])
        scores[k] = float(score(model))
    best = max(scores, key=lambda k: (scores[k], -k))
    average_checkpoints(model, paths[-best:])
    return best, scores


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
