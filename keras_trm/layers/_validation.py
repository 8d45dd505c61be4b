"""Argument checks shared by the layers: each error names the argument."""

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
