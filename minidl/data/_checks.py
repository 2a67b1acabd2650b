"""Argument checks shared by the data modules: each error names the argument and its value."""
import numbers

import numpy as np


def check_int(name, value, minimum=None):
    """Return ``value`` as a Python int, or raise naming ``name`` and the value.

    Booleans are refused although Python counts them as ints: ``shard(10, True, 4)`` is a bug.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_generator(name, rng, allow_none=False):
    """Refuse anything but a ``numpy.random.Generator`` (the legacy global RandomState included)."""
    if rng is None and allow_none:
        return None
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"{name} must be a numpy.random.Generator "
                        f"(e.g. numpy.random.default_rng(seed)), got {rng!r}")
    return rng
