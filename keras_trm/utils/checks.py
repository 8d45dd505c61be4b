"""Argument checks shared by the library (layers, models, training, data,
decoding, jobs): each error names the argument and the value it got."""

import numbers


def _number(name, value, kind, what, ok):
    """``value`` if a ``kind`` (not bool) with ``ok(value)``, else raises."""
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"`{name}` must be {what}, got {name}={value!r}")
    if not ok(value):
        raise ValueError(f"`{name}` must be {what}, got {name}={value!r}")
    return value


def at_most_when_run(value, limit, message):
    """A context whose ops run after a check that ``value <= limit``, where
    ``value`` (a scalar, e.g. a sequence length) is only known when a
    TensorFlow graph runs: there a slice past a table's end would be cut
    short, not refused. Elsewhere (a Python or NumPy int; JAX and PyTorch,
    whose shapes are concrete and checked by the caller) it checks nothing.

    Raises (when the graph runs):
        tensorflow.errors.InvalidArgumentError: ``value > limit``, with
            ``message``.

    Example:

    >>> with at_most_when_run(3, 5, "too long"):
    ...     pass
    """
    import contextlib

    import keras

    if isinstance(value, numbers.Integral) or keras.backend.backend() != "tensorflow":
        return contextlib.nullcontext()
    import tensorflow as tf

    return tf.control_dependencies(
        [tf.debugging.assert_less_equal(value, limit, message=message)])


def positive_int(name, value):
    """Returns ``value`` as int if it is an integer > 0, else raises."""
    return int(_number(name, value, numbers.Integral, "a positive int", lambda x: x > 0))


def boolean(name, value):
    """Returns ``value`` if it is a bool, else raises ``TypeError``: a
    string such as ``"off"`` is truthy and would switch the setting on."""
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be True or False, got {name}={value!r}")
    return value


def non_negative_int(name, value):
    return int(_number(name, value, numbers.Integral, "an int >= 0", lambda x: x >= 0))


def positive_float(name, value):
    """Returns ``value`` as float if it is a finite real number > 0, else
    raises (NaN and inf included: a learning rate of inf trains to NaN)."""
    return float(_number(name, value, numbers.Real, "a finite float > 0",
                         lambda x: 0.0 < float(x) < float("inf")))


def non_negative_float(name, value):
    """Returns ``value`` as float if it is a finite real number >= 0, else
    raises."""
    return float(_number(name, value, numbers.Real, "a finite float >= 0",
                         lambda x: 0.0 <= float(x) < float("inf")))


def rate(name, value):
    """Returns ``value`` as float if it is in [0, 1), else raises."""
    return float(_number(name, value, numbers.Real, "a float in [0, 1)",
                         lambda x: 0.0 <= float(x) < 1.0))


def fraction(name, value):
    """Returns ``value`` as float if it is in (0, 1) (a share held out,
    both parts non-empty), else raises."""
    return float(_number(name, value, numbers.Real, "a float in (0, 1)",
                         lambda x: 0.0 < float(x) < 1.0))


def one_of(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"`{name}` must be one of {sorted(allowed)}, got {name}={value!r}")
    return value


def divisible(name_a, a, name_b, b):
    if a % b:
        raise ValueError(f"`{name_a}` must be divisible by `{name_b}`, got "
                         f"{name_a}={a} and {name_b}={b}")


def host_ids_in_range(name, value, size, what="the model's vocabulary"):
    """Checks that host ids (a NumPy array, list or tuple; tensors pass
    unchecked) are in ``[0, size)``: under JAX an id past an embedding
    table reads a row of NaN, and a negative id reads from the end.

    Raises:
        ValueError: naming the first id out of range, its position, the
            range and the count out of range.
    """
    import numpy as np

    if not isinstance(value, (np.ndarray, list, tuple)):
        return
    ids = np.asarray(value)
    if not ids.size or ids.dtype.kind not in "iu":
        return  # empty, or not ids: integer_ids names the dtype
    bad = np.flatnonzero((ids < 0) | (ids >= size))
    if bad.size:
        where = np.unravel_index(bad[0], ids.shape)
        raise ValueError(
            f"`{name}` must be ids in [0, {size}) ({what}), got "
            f"{name}{list(map(int, where))}={int(ids[where])} ({bad.size} out of range)")


def host_index(name, value, length=None, size=None, what=None):
    """Checks a host position (a Python or NumPy integer) where ``length``
    positions start in something of ``size`` (a key/value cache, a
    position table): in ``[0, size - length]``, or ``>= 0`` where either
    is unknown. Tensors (the searches' loop counters) pass unchecked. Out
    of range the backends disagree (clamped, dropped or wrapped).

    Raises:
        TypeError: a float or bool.
        ValueError: out of range, naming the value and the range.

    Example:

    >>> host_index("cache_update_index", 3, length=1, size=4)
    >>> host_index("cache_update_index", 4, length=1, size=4, what="the cache")
    Traceback (most recent call last):
    ...
    ValueError: `cache_update_index` must be in [0, 3] (the cache holds 4 positions, and 1 start at `cache_update_index`), got cache_update_index=4
    """
    import numpy as np

    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_, float, np.floating)):
        raise TypeError(f"`{name}` must be an integer position, got {name}={value!r}")
    if not isinstance(value, numbers.Integral):
        return
    value = int(value)
    if isinstance(length, int) and isinstance(size, int):
        if not 0 <= value <= size - length:
            where = (f" ({what} holds {size} positions, and {length} start at "
                     f"`{name}`)" if what else "")
            raise ValueError(f"`{name}` must be in [0, {size - length}]{where}, "
                             f"got {name}={value}")
    elif value < 0:
        raise ValueError(f"`{name}` must be a position >= 0, got {name}={value}")


def mask_shape(name, mask, expected, what="its input's shape without the last axis"):
    """Checks a mask's static shape against ``expected`` (``None``: unknown,
    on either side); a wrong one was broadcast silently or failed deep in
    the backend. ``mask`` None passes.

    Raises:
        ValueError: naming the mask, both shapes and ``what`` they mean.
    """
    if mask is None:
        return
    shape, expected = tuple(mask.shape), tuple(expected)
    if len(shape) != len(expected) or any(
            a is not None and b is not None and a != b for a, b in zip(shape, expected)):
        raise ValueError(f"`{name}` must have shape {expected} ({what}), got "
                         f"{name}.shape={shape}")


def attention_mask_shape(mask, t_q, t_k, ranks=None):
    """Checks that an ``attention_mask`` broadcasts to ``(batch, T_q, T_k)``:
    its last two static dimensions are 1 or those lengths (unknown ones
    pass), its rank one of ``ranks`` (default: at least 2). None passes.

    Raises:
        ValueError: naming both shapes.
    """
    if mask is None:
        return
    rank = len(mask.shape)
    if (rank < 2 if ranks is None else rank not in ranks) or not all(
            d is None or w is None or d in (1, w)
            for d, w in zip(mask.shape[-2:], (t_q, t_k))):
        raise ValueError(
            "`attention_mask` must be broadcastable to (batch, T_q, T_k) = "
            f"(batch, {t_q}, {t_k}), got attention_mask.shape={tuple(mask.shape)}")


def same_batch(**tensors):
    """Checks that the named tensors' known batch sizes (axis 0) agree:
    under JAX and PyTorch a batch of 1 was broadcast silently.

    Raises:
        ValueError: naming each tensor and its shape.
    """
    known = {name: x.shape[0] for name, x in tensors.items()
             if x is not None and len(x.shape) and isinstance(x.shape[0], int)}
    if len(set(known.values())) > 1:
        shapes = ", ".join(f"{name}.shape={tuple(tensors[name].shape)}" for name in known)
        raise ValueError(f"The inputs' batch sizes (axis 0) must agree, got {shapes}")


def integer_ids(name, value, what="integer token ids"):
    """Checks that ``value`` (a tensor, NumPy array or ``KerasTensor``)
    holds integers (signed or unsigned); returns its standardized dtype.
    The package's one integer-id check, so every refusal reads the same.

    Raises:
        TypeError: a float, bool or string dtype, naming the argument, the
            dtype and the shape.
    """
    import keras

    dtype = keras.backend.standardize_dtype(value.dtype)
    if "int" not in dtype:
        raise TypeError(f"`{name}` must be {what}, got dtype {dtype} (shape "
                        f"{tuple(value.shape)}); cast ids to int32")
    return dtype


def integer_inputs(inputs, specs):
    """Checks that every value given for a functional model's integer
    inputs (``specs``: ``model.inputs``) has an integer dtype: Keras
    silently casts float ids to int32 (1.7 -> 1). Values without a dtype
    (lists) are left to Keras; a dict is matched by input name.

    Raises:
        TypeError: a float, bool or string value for an integer input,
            naming the input (``integer_ids``).
    """
    import keras

    if in_symbolic_scope():
        return
    if isinstance(inputs, dict):
        pairs = [(inputs.get(spec.name), spec) for spec in specs]
    else:
        flat = keras.tree.flatten(inputs)
        pairs = zip(flat, specs) if len(flat) == len(specs) else ()
    for value, spec in pairs:
        if hasattr(value, "dtype") and "int" in keras.backend.standardize_dtype(spec.dtype):
            integer_ids(spec.name, value)


def in_symbolic_scope():
    """Whether Keras is only inferring shapes, so a dtype check must wait
    for the real call (under ``tf.distribute``, ``fit`` builds on the mean
    of the replicas' first batch: float ids never computed with)."""
    try:
        from keras.src.backend.common.symbolic_scope import in_symbolic_scope as inside
    except ImportError:  # a Keras without it: check every call
        return False
    return inside()


def renamed(old_name, old_value, new_name, new_value):
    """A renamed keyword argument: ``new_value``, or ``old_value`` with a
    ``DeprecationWarning`` when the caller still used ``old_name``.

    Example:

    >>> import warnings
    >>> renamed("length_penalty_alpha", None, "length_penalty", 0.6)
    0.6
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     renamed("length_penalty_alpha", 1.0, "length_penalty", 0.6)
    1.0
    >>> str(caught[0].message)
    '`length_penalty_alpha` is now `length_penalty`; the old name will go'
    """
    if old_value is None:
        return new_value
    _warn_renamed(old_name, new_name)
    return old_value


def _warn_renamed(old_name, new_name):
    import warnings

    warnings.warn(f"`{old_name}` is now `{new_name}`; the old name will go",
                  DeprecationWarning, stacklevel=caller_stacklevel())


def caller_stacklevel():
    """The ``stacklevel`` for the caller's ``warnings.warn`` that points at
    the first frame outside keras_trm (also through builders): Python
    shows a ``DeprecationWarning`` only where that code is ``__main__``.

    Example:

    >>> def warn():   # a doctest's frames are keras_trm's module's
    ...     return caller_stacklevel()
    >>> warn() >= 2
    True
    """
    import sys

    frame, level = sys._getframe(2), 2  # the warning function's caller
    while frame is not None and frame.f_back is not None and (
            frame.f_globals.get("__name__") or "").partition(".")[0] == "keras_trm":
        frame, level = frame.f_back, level + 1
    return level


def renamed_key(config, old_name, new_name):
    """A copy of ``config`` (e.g. a layer's saved config) with ``old_name``
    moved to ``new_name``, silently: a saved file is not code to fix.

    Example:

    >>> renamed_key({"max_length": 8, "d_model": 4}, "max_length",
    ...             "max_sequence_length")
    {'d_model': 4, 'max_sequence_length': 8}
    """
    config = dict(config)
    if old_name in config:
        config.setdefault(new_name, config.pop(old_name))
    return config


class RenamedAttributes:
    """Mixin: an attribute read by its old name (``RENAMED_ATTRIBUTES``,
    old name -> new name) gives the new one's value with a
    ``DeprecationWarning``; through ``__getattr__``, so ``dir()`` and
    Keras' saving never see the old names.

    Example:

    >>> import warnings
    >>> class Table(RenamedAttributes):
    ...     RENAMED_ATTRIBUTES = {"max_length": "max_sequence_length"}
    ...     max_sequence_length = 8
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     Table().max_length
    8
    >>> str(caught[0].message)
    '`max_length` is now `max_sequence_length`; the old name will go'
    """

    RENAMED_ATTRIBUTES = {}

    def __getattr__(self, name):
        new_name = type(self).RENAMED_ATTRIBUTES.get(name)
        if new_name is not None:
            _warn_renamed(name, new_name)
            return getattr(self, new_name)
        parent = getattr(super(), "__getattr__", None)  # torch's Module has one
        if parent is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return parent(name)
