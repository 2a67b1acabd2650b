"""What decides the last bits of a training run on this machine, read from the machine itself.

The same command with the same seed gives the same bits on one machine; another machine may round
differently, and still be right. What decides those bits besides the code and the seed:

- the BLAS kernel: OpenBLAS picks one for the CPU when it loads (``OPENBLAS_CORETYPE`` forces
  another), and each kernel orders the additions of a matrix product its own way. Its name is
  OpenBLAS's own answer, ``openblas_get_corename``, asked of the library NumPy loaded;
- the convolution's block of images, twice the L2 cache (``minidl.conv.im2col_blocked.BLOCK_BYTES``),
  and the column budget (``MINIDL_CONV_COLUMN_BYTES``): they decide how a batch's products are cut;
- the NumPy version, which brings its own OpenBLAS build and its own loops.

``fingerprint()`` names all four. Bits pinned as a regression guard are keyed by it, and a test on a
machine with another fingerprint skips, naming this one: such a test checks the code, not the CPU.
"""
import ctypes
import platform

import numpy as np

from minidl.conv import budget, im2col_blocked

# OpenBLAS's symbol under the names NumPy's builds give it: scipy-openblas (NumPy >= 2, 64-bit
# integers "64_" or 32-bit), the older bundled libopenblas64_, and a plain system OpenBLAS
CORENAME_SYMBOLS = ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                    "openblas_get_corename64_", "openblas_get_corename")


def loaded_libraries():
    """Paths of the shared libraries this process has loaded (Linux: /proc/self/maps; elsewhere none)."""
    try:
        with open("/proc/self/maps") as maps:
            return list(dict.fromkeys(line.split(maxsplit=5)[5].strip() for line in maps
                                      if len(line.split(maxsplit=5)) == 6 and "/" in line))
    except OSError:
        return []


def blas_kernel():
    """The kernel OpenBLAS chose (``openblas_get_corename``: "SkylakeX", "Haswell", "Zen", "NeoverseN1", ...),
    or None where NumPy's BLAS is not an OpenBLAS that can be asked (Accelerate, MKL, a non-Linux system)."""
    for path in loaded_libraries():
        if "openblas" not in path.lower():
            continue
        try:
            library = ctypes.CDLL(path)            # already loaded by NumPy: the same handle, nothing new runs
        except OSError:
            continue
        for symbol in CORENAME_SYMBOLS:
            function = getattr(library, symbol, None)
            if function is not None:
                function.restype = ctypes.c_char_p
                name = function()
                return name.decode() if name else None
    return None


def fingerprint():
    """What decides the bits here, as one line: "SkylakeX, L2 1 MiB, columns 64 MiB, NumPy 2.4.6, x86_64"
    (the L2 as the convolution reads it: its blocks are twice that)."""
    return (f"{blas_kernel() or 'BLAS kernel unknown'}, L2 {im2col_blocked.BLOCK_BYTES / 2 ** 21:g} MiB, "
            f"columns {budget.current() / 2 ** 20:g} MiB, NumPy {np.__version__}, {platform.machine()}")


def another_kernel():
    """An OpenBLAS kernel other than the one chosen here, that every CPU of this architecture can run
    (for a run that checks what a machine with another kernel sees), or None if none is known or
    NumPy's BLAS is not an OpenBLAS that says which kernel it runs."""
    machine, kernel = platform.machine().lower(), (blas_kernel() or "").lower()
    if not kernel:                                 # not an OpenBLAS that says which: nothing to force
        return None
    choices = {"x86_64": ("nehalem", "sandybridge"), "amd64": ("nehalem", "sandybridge"),
               "aarch64": ("armv8", "cortexa57"), "arm64": ("armv8", "cortexa57")}.get(machine, ())
    return next((choice for choice in choices if choice != kernel), None)
