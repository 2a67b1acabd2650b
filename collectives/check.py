"""The agreement check: every rank must pass the same length, dtype and op (and root), and usable buffers.

A rank whose buffer is longer than its partner's would otherwise fail with a truncation
error on one rank while the others wait for it forever; a rank with another dtype would
silently mix bytes; a rank whose result buffer is read-only would fail at its first write,
after the others have already sent to it. So before an algorithm runs (check=True), every
public collective calls `agree`, which compares a few integers across ranks and raises
`MismatchError` on every rank at once, before any data message is sent.

What is compared: the integers v (length, dtype code, op code, root) and -v, plus one code
for "this rank found a problem with its own arguments" (what kind, PROBLEMS, and which
rank; -1 if none), are maxed over all ranks by MPI's own Allreduce (MPI_MAX on 9 int64).
The check is no algorithm of this package and no course task, so it uses the library's
collective: it never runs through a student's fold-in or butterfly, and a stubbed task
cannot stop the others from checking their arguments. After it every rank knows max(v) and
min(v) = -max(-v), and raises the same error if they differ or if any rank found a problem.
A rank's own problems (buffers.describe_problem): not a 1-D contiguous array, a dtype outside
DTYPES, a read-only buffer that the call writes into (recvbuf, which is the input too when in
place), overlapping buffers, an unknown op.

Cost: one allreduce of 4 + 4 + 1 = 9 int64 (72 bytes), a few microseconds on one node: MPI
picks a latency-bound algorithm for so few bytes, about lg p alpha. That is noticeable for
4 KiB vectors and nothing for 1 MiB. A tracer sees no message of it (trace.TracedComm records
point-to-point calls only); trace.CountingComm estimates its bytes as for any Allreduce.

`check=False` skips the agreement (the benchmark and the training loops do): it trusts the
caller to pass the same length, dtype and op on every rank. A rank still refuses its own bad
arguments (ValueError, before it sends anything), but only that rank raises, so the others
may then wait for it forever; and a mismatch between ranks is undefined behaviour: a
truncation error, a hang or a wrong answer.
"""
from collections import namedtuple

import numpy as np
from mpi4py import MPI

from .ops import OPS

# The supported dtypes: each has an MPI datatype mapping in mpi4py, a fixed size and layout on
# every platform, and numpy element-wise add/maximum/minimum that give the same bits for the
# same operands in the same order. Compared across ranks by their index here.
# Not supported: numpy's longdouble and clongdouble (float128 and complex256 on x86-64 Linux):
# their size and meaning differ between platforms and compilers (x87 80-bit numbers padded to
# 16 bytes here, IEEE quad or plain double elsewhere) and their padding bytes are undefined, so
# identical bits on every rank cannot be promised. Nor bool, object, strings or dates.
DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")

# What can be wrong with one rank's own arguments; the index travels with the check, so
# every rank's error says what kind of problem which rank had.
PROBLEMS = ("a buffer that is not an array", "a buffer that is not 1-D",
            "a non-contiguous buffer", "an unsupported dtype", "buffers of different dtypes",
            "a buffer of the wrong length", "a read-only buffer to write the result into",
            "overlapping buffers", "an unknown op",
            # the sparse collectives' (index, value) pairs (collectives/compression/sparse.py)
            "an invalid vector length n", "indices that are not integers", "an index out of range",
            "duplicate indices")

# kind: one of PROBLEMS; text: the full sentence, raised on the rank that has the problem
Problem = namedtuple("Problem", "kind text")


class MismatchError(ValueError):
    """Raised on every rank when the ranks passed different lengths, dtypes, ops or roots,
    or when any rank passed arguments it cannot use (the error names the rank and the kind)."""


def dtype_problem(dtype):
    """Why `dtype` cannot be reduced here (a phrase after "has"), or None if it is in DTYPES."""
    dtype = np.dtype(dtype)
    if dtype.name in DTYPES and dtype.isnative:
        return None
    if dtype.name in DTYPES:
        return f"dtype {dtype.str}, not in this machine's byte order; use .astype({dtype.name!r})"
    if dtype.type in (np.longdouble, np.clongdouble):
        return (f"dtype {dtype.name} (numpy {dtype.type.__name__}), which is not supported: its size "
                f"and layout depend on the platform and its padding bytes are undefined, so ranks "
                f"could not be promised identical bits; use float64 or complex128")
    return f"dtype {dtype}, which is not supported; use one of {', '.join(DTYPES)}"


def dtype_code(dtype):
    """The index of a supported dtype in DTYPES (callers check dtype_problem first)."""
    return DTYPES.index(np.dtype(dtype).name)


def _describe(key, value):
    if key == "dtype":
        return DTYPES[value] if 0 <= value < len(DTYPES) else "unsupported dtype"
    if key == "op":
        return repr(OPS[value]) if 0 <= value < len(OPS) else "unknown op"
    return str(value)


def max_over_ranks(comm, vector):
    """vector <- element-wise max over all ranks, in place (MPI's own Allreduce: no task runs)."""
    comm.Allreduce(MPI.IN_PLACE, vector, op=MPI.MAX)


def agree(comm, name, values, problem=None):
    """Raise MismatchError on every rank unless all ranks pass equal `values` and no `problem`.

    values: dict such as {"length": n, "dtype": dtype_code(d), "op": 0}; problem: a Problem
    (kind from PROBLEMS, text) describing what is wrong with this rank's own arguments, or None.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    keys = list(values)
    mine = np.array([values[key] for key in keys], dtype=np.int64)
    # kind * size + rank: the max names the highest kind of problem, and the highest rank with it
    flag = [PROBLEMS.index(problem.kind) * size + rank if problem else -1]
    vector = np.concatenate([mine, -mine, flag]).astype(np.int64)
    max_over_ranks(comm, vector)
    highs, lows = vector[:len(keys)], -vector[len(keys):2 * len(keys)]
    if problem:
        raise MismatchError(f"{name} on rank {rank}: {problem.text}")
    if vector[-1] >= 0:
        kind, bad_rank = divmod(int(vector[-1]), size)
        raise MismatchError(f"{name}: rank {bad_rank} passed {PROBLEMS[kind]} (its own error says "
                            f"more); rank {rank} stops too, before any data was sent")
    for key, low, high, value in zip(keys, lows, highs, mine):
        if low != high:
            raise MismatchError(
                f"{name}: the {key} differs across ranks (from {_describe(key, int(low))} to "
                f"{_describe(key, int(high))}; rank {rank} has {_describe(key, int(value))}). "
                f"Every rank must pass the same {key}.")
