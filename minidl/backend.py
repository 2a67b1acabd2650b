"""The array backend: NumPy by default, CuPy when asked.

Library code never imports numpy for array math directly. It asks for the array module:

    xp = backend.xp()                 # the module of the active backend
    xp = backend.get_array_module(a)  # the module that owns array ``a`` (Chainer's idiom)

so one code path runs on both. Choose the backend with ``set_backend("cupy")`` or with the
environment variable ``MINIDL_BACKEND=cupy`` before the first import of minidl.
"""
import os

import numpy

_BACKENDS = ("numpy", "cupy")
_active = None


def _import(name):
    if name == "numpy":
        return numpy
    if name == "cupy":
        try:
            import cupy
        except ImportError as error:
            raise RuntimeError("backend 'cupy' needs the CuPy package and a CUDA GPU "
                               "(pip install -e '.[gpu]')") from error
        return cupy
    raise ValueError(f"unknown backend {name!r}; choose one of {_BACKENDS}")


def set_backend(name):
    """Make ``name`` ('numpy' or 'cupy') the active backend and return its array module."""
    global _active
    module = _import(name)
    _active = name
    return module


def get_backend():
    """Name of the active backend: 'numpy' or 'cupy'."""
    global _active
    if _active is None:
        set_backend(os.environ.get("MINIDL_BACKEND", "numpy"))
    return _active


def xp():
    """The array module of the active backend (``numpy`` or ``cupy``)."""
    return _import(get_backend())


def cupy_available():
    """True if CuPy imports and sees at least one GPU (used by tests to skip with a reason)."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def get_array_module(array):
    """numpy or cupy, whichever owns ``array``."""
    if type(array).__module__.startswith("cupy"):
        import cupy
        return cupy
    return numpy


def asarray(data, dtype=None):
    """``data`` as an array of the active backend."""
    return xp().asarray(data, dtype=dtype)


def to_numpy(array):
    """A NumPy copy (or the array itself) of a NumPy or CuPy array."""
    if type(array).__module__.startswith("cupy"):
        return array.get()
    return numpy.asarray(array)
