"""Argument checks shared by the library (layers, models, training, data,
decoding, jobs): each error names the argument and the value it got."""

import numbers


def positive_int(name, value):
    """Returns ``value`` as int if it is an integer > 0, else raises."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be a positive int, got {name}={value!r}")
    if value <= 0:
        raise ValueError(f"`{name}` must be a positive int, got {name}={value!r}")
    return int(value)


def non_negative_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an int >= 0, got {name}={value!r}")
    if value < 0:
        raise ValueError(f"`{name}` must be an int >= 0, got {name}={value!r}")
    return int(value)


def positive_float(name, value):
    """Returns ``value`` as float if it is a real number > 0, else raises."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a float > 0, got {name}={value!r}")
    if not float(value) > 0.0:
        raise ValueError(f"`{name}` must be a float > 0, got {name}={value!r}")
    return float(value)


def rate(name, value):
    """Returns ``value`` as float if it is in [0, 1), else raises."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a float in [0, 1), got {name}={value!r}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(
            f"`{name}` must be a float in [0, 1), got {name}={value!r}"
        )
    return float(value)


def one_of(name, value, allowed):
    if value not in allowed:
        raise ValueError(
            f"`{name}` must be one of {sorted(allowed)}, got {name}={value!r}"
        )
    return value


def divisible(name_a, a, name_b, b):
    if a % b:
        raise ValueError(
            f"`{name_a}` must be divisible by `{name_b}`, got "
            f"{name_a}={a} and {name_b}={b}"
        )


def integer_ids(name, value, what="integer token ids"):
    """Checks that ``value`` (a tensor, NumPy array or ``KerasTensor``)
    holds integers (signed or unsigned); returns its standardized dtype.

    The one integer-id check of the package: layers, models, decoding and
    the jobs' label checks call it, so every refusal reads the same.

    Raises:
        TypeError: a float, bool or string dtype; the message names the
            argument, the dtype and the shape, e.g. "`token_ids` must be
            integer token ids, got dtype float32 (shape (2, 5)); cast ids
            to int32".
    """
    import keras

    dtype = keras.backend.standardize_dtype(value.dtype)
    if "int" not in dtype:
        raise TypeError(
            f"`{name}` must be {what}, got dtype {dtype} (shape "
            f"{tuple(value.shape)}); cast ids to int32"
        )
    return dtype
