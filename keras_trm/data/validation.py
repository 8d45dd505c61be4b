"""Checks of in-memory examples (labels, images) and the seeded hold-out
split that the classification recipes use for model selection."""

import numpy as np

from keras_trm.utils import checks as v


def check_labels(labels, num_classes, name="labels", count=None):
    """Validates class ids; returns them as an ``int32`` array ``(N,)``.

    Args:
        labels: array-like ``(N,)`` of integer class ids.
        num_classes: ids must lie in ``[0, num_classes)``.
        name: the argument name used in error messages.
        count: if given, ``N`` must equal it (e.g. the number of images).

    Raises:
        TypeError: a non-integer dtype (floats are refused, not rounded).
        ValueError: wrong rank, wrong count, or an id outside the range
            (the message gives the first bad value and its index).

    Example:

    >>> check_labels([0, 1, 1], 2)
    array([0, 1, 1], dtype=int32)
    """
    array = np.asarray(labels)
    v.integer_ids(name, array, what="integer class ids")
    if array.ndim != 1:
        raise ValueError(f"`{name}` must have shape (N,), got {name}.shape={array.shape}")
    if count is not None and array.shape[0] != count:
        raise ValueError(f"`{name}` has {array.shape[0]} entries, expected {count} "
                         "(one per example)")
    bad = np.flatnonzero((array < 0) | (array >= num_classes))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"`{name}` must be class ids in [0, {num_classes}), got "
                         f"{name}[{i}]={array[i]} ({bad.size} out of range)")
    return array.astype(np.int32)


def validation_split(count, fraction, seed):
    """A seeded hold-out: ``(train_index, validation_index)``, sorted int
    arrays that partition ``range(count)``, ``round(fraction * count)``
    examples in the validation part (for model selection; the test set is
    scored once, after training).

    Raises:
        ValueError: ``fraction`` not in (0, 1), or a split that leaves
            either part empty.

    Example:

    >>> train, validation = validation_split(10, 0.2, seed=0)
    >>> len(train), len(validation)
    (8, 2)
    """
    fraction = v.fraction("validation_fraction", fraction)
    size = int(round(fraction * count))
    if not 0 < size < count:
        raise ValueError(f"`validation_fraction={fraction}` of {count} examples "
                         "leaves an empty training or validation part")
    order = np.random.default_rng(seed).permutation(count)
    return np.sort(order[size:]), np.sort(order[:size])
