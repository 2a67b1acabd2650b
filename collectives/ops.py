"""Reduction operators: sum, max, min, and mean (a sum, divided by p at the end).

Every algorithm reduces with `combine(into, incoming, op)`, which updates `into` in place.
All three base operators are commutative and associative on integers; on floats `+` is
commutative but not associative, so different algorithms may round differently. Each one
still gives every rank the same bits: in naive, tree, ring and Rabenseifner each element of
the result is computed by one rank and copied to the others; in the butterfly both partners
make the same call, lower <- f(lower rank's vector, higher rank's vector), because the operand
order (and which operand is also the output) decides the sign of a zero maximum or minimum
(numpy.maximum(+0.0, -0.0) is -0.0, numpy.maximum(-0.0, +0.0) is +0.0) and which NaN payload
survives. So for every op and every algorithm, every rank ends with identical bytes, NaN
payloads included (given the same numpy on the same kind of processor on every rank). Between
algorithms the bits may differ: float sums round differently, a max or min of +0.0 and -0.0
may be either zero, and a NaN result may carry another NaN's payload (it is NaN under every
algorithm and op as soon as one input is NaN).

Mean means "sum over ranks, then divide by p" on every rank. On integer buffers the division
is numpy's floor division (`//`): over 2 ranks holding 1 and 2 the mean is 3 // 2 = 1, and for
-1 and -2 it is -3 // 2 = -2 (rounded towards minus infinity, like Python's `//`). That keeps an
integer result in an integer buffer instead of silently changing the dtype.
"""
import numpy as np

OPS = ("sum", "max", "min", "mean")


def base_op(op):
    """The operator the algorithm runs with: mean is a sum followed by `finish`."""
    if op not in OPS:
        raise ValueError(f"unknown reduction op {op!r}; choose one of {OPS}")
    return "sum" if op == "mean" else op


_KINDS = {}           # type -> "cupy", "namespace" or "numpy": what array_module answers for its arrays


def array_module(array):
    """numpy, or cupy for a CuPy array (imported only when one is seen), or the namespace another
    array names itself (the array API's `__array_namespace__`: collectives.sim.Sized's, whose
    functions compute nothing); numpy for anything else."""
    kind = type(array)
    if kind is np.ndarray:                   # the common case first: every small allreduce asks
        return np
    which = _KINDS.get(kind)
    if which is None:
        which = _KINDS[kind] = ("cupy" if kind.__module__.split(".")[0] == "cupy" else
                                "namespace" if hasattr(kind, "__array_namespace__") and not issubclass(kind, np.ndarray)
                                else "numpy")
    if which == "cupy":
        import cupy
        return cupy
    return array.__array_namespace__() if which == "namespace" else np


def combine(into, incoming, op, source=None):
    """into <- into (op) incoming, element-wise and in place.

    source: read the left operand from here instead of `into` (the same shape): into <- source
    (op) incoming, the same bits as copying source into `into` first, one memory pass fewer.
    """
    xp = np if type(into) is np.ndarray else array_module(into)
    first = into if source is None else source
    if op == "sum":
        xp.add(first, incoming, out=into)
    elif op == "max":
        xp.maximum(first, incoming, out=into)
    elif op == "min":
        xp.minimum(first, incoming, out=into)
    else:
        raise ValueError(f"combine: unknown base op {op!r}")
    if xp is not np and hasattr(xp, "cuda"):
        # CUDA-aware MPI reads device memory directly: the kernel that wrote `into` must have
        # finished before the next MPI call hands `into` to the network.
        xp.cuda.get_current_stream().synchronize()


def finish(data, op, size):
    """Apply the last step of `op` once the sum (or max, min) is complete: mean divides by p."""
    if op != "mean":
        return
    if data.dtype.kind in "iu":
        data //= size
    else:
        data /= size
