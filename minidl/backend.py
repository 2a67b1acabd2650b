"""The array backend: NumPy by default, CuPy when asked.

Library code never imports numpy for array math directly. It asks for the array module:

    xp = backend.xp()                 # the module of the active backend
    xp = backend.get_array_module(a)  # the module that owns array ``a`` (Chainer's idiom)

so one code path runs on both. Choose the backend with ``set_backend("cupy")`` or with the
environment variable ``MINIDL_BACKEND=cupy`` before the first import of minidl.
"""
import ctypes
import os
import platform

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


# ---- max(array, 0) at the speed of NumPy's vector loop -----------------------------------------
ZERO_ROW = 512         # the shortest row compared with a row of zeros (shorter: NumPy's per-row cost shows)


def maximum_with_zero(array):
    """``xp.maximum(array, 0)``, the same bits (NaN stays NaN, -0.0 becomes 0.0), faster on NumPy.

    Why: NumPy's ``maximum`` against a scalar runs an element-at-a-time loop, against an array of
    the same length its vector loop: on LeNet-5's first ReLU (128 x 6 x 28 x 28 floats, one core)
    0.18 ms against 0.07. So a C-contiguous array is seen as rows of at least ZERO_ROW numbers (its
    trailing axes), each compared with one row of zeros. Other arrays, and CuPy's (one kernel
    either way), take ``maximum(array, 0)`` itself, which the tests compare this with.
    """
    xp = get_array_module(array)
    row = 1
    for extent in reversed(array.shape):
        row *= extent
        if row >= ZERO_ROW:
            break
    if xp is not numpy or not array.flags.c_contiguous or row < 2:
        return xp.maximum(array, 0)
    zeros = xp.zeros(row, dtype=array.dtype)
    return xp.maximum(array.reshape(-1, row), zeros).reshape(array.shape)


# ---- the heap: keep freed arrays' memory for the next step (glibc) ------------------------------
MMAP_THRESHOLD = 32 << 20      # glibc's largest allowed value (its DEFAULT_MMAP_THRESHOLD_MAX on 64 bits)
TRIM_THRESHOLD = 64 << 20
_MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def keep_freed_memory():
    """Ask glibc's malloc to keep freed memory for reuse instead of returning it to the kernel.

    Why: a training step allocates and frees the same few large arrays (a conv layer's output, its
    ReLU, their gradients: MBs each) every step. By default glibc maps an array above a threshold
    with mmap and unmaps it when it is freed, and gives the top of its heap back to the kernel when
    more than twice that threshold lies free there. So every step touches fresh pages, and each
    4 KiB page costs a page fault (the kernel zeroes it): a LeNet-5 step at batch 64 on one core
    faulted about 1200 times and took 7.9 ms instead of 6.6 (chapter 2, ``figures/out/02_allocator.md``). glibc
    raises the threshold by itself after it frees a large mapped block, so a process that once ran
    a bigger layer is fast and one that did not is slow. Fixing both thresholds (arrays up to 32 MiB
    come from the heap, up to 64 MiB of free heap is kept) makes every process the fast one; what
    is kept is reused by the next step, so the peak memory does not grow.

    Called once when minidl is imported. Leaves malloc alone where the user set glibc's own
    variables (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_) or
    MINIDL_KEEP_FREED_MEMORY=0, or where the C library is not glibc. Returns True if it changed
    the settings. (``tutorials/figures/make_02_figures.py --only allocator`` measures both ways.)
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if os.environ.get("MINIDL_KEEP_FREED_MEMORY", "1") == "0" or any(name in os.environ for name in _MALLOC_VARIABLES):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3         # glibc's <malloc.h>
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD)) and bool(mallopt(m_trim_threshold, TRIM_THRESHOLD))
