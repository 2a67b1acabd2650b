"""The convolution kernels by name: the table ``conv2d(..., algorithm=name)`` reads, and the check that one can run.

``auto`` (``auto.py``) is no kernel of its own: it picks one of these per shape, so ``minidl.conv.get``
asks it first and this table second.
"""
from minidl.conv import direct, fft, im2col_blocked, winograd

ALGORITHMS = ("direct", "im2col", "fft", "winograd", "auto")      # every name conv2d accepts
KERNELS = {"direct": direct, "im2col": im2col_blocked, "fft": fft, "winograd": winograd}


def by_name(name):
    """The kernel module called ``name`` (not "auto"); ValueError for a name that is none."""
    if name not in KERNELS:
        raise ValueError(f"conv2d: unknown algorithm {name!r}; choose one of {ALGORITHMS}")
    return KERNELS[name]


def get(name, x_shape, weight_shape, stride, padding):
    """The kernel module for ``name``; raises ValueError naming the limitation if it can't do this case."""
    kernel = by_name(name)
    reason = kernel.supports(x_shape, weight_shape, stride, padding)
    if reason:
        raise ValueError(f"conv2d: algorithm {name!r} cannot compute this case: {reason}")
    return kernel
