"""The agreement check: every rank must pass the same length, dtype and op (and root).

A rank whose buffer is longer than its partner's would otherwise fail with a truncation
error on one rank while the others wait for it forever; a rank with another dtype would
silently mix bytes. So before an algorithm runs, every public collective calls `agree`,
which compares a few integers across ranks and raises `MismatchError` on every rank at once.

How: the integers v (length, dtype code, op code, root) and -v, plus a "this rank found a
local problem" flag, are maxed over all ranks by recursive doubling (MPICH fold-in for
non-powers of two), written with point-to-point calls like the algorithms themselves: no
MPI collective. After it every rank knows max(v) and min(v) = -max(-v) and raises the same
error if they differ.

Cost: ceil(lg p) + 1 messages on the critical path (lg pof2 exchanges, plus the fold-in and
fold-out pair when p is not a power of two), each of 8 * 10 = 80 bytes: about
(lg p + 2) alpha, a few microseconds on one node. That is noticeable for 4 KiB vectors and
nothing for 1 MiB. Turn it off with `check=False` (the benchmark does); then a mismatch is
undefined behaviour: a truncation error, a hang or a wrong answer.
"""
import numpy as np

from .fold import fold_in, fold_out, largest_power_of_two, world_rank
from .ops import OPS
from .tags import CHECK

# dtypes are compared by their index here (the same on every rank, and decodable for the message)
DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")


class MismatchError(ValueError):
    """Raised on every rank when the ranks passed different lengths, dtypes, ops or roots."""


def dtype_code(dtype):
    name = np.dtype(dtype).name
    return DTYPES.index(name) if name in DTYPES else len(DTYPES)


def _describe(key, value):
    if key == "dtype":
        return DTYPES[value] if value < len(DTYPES) else "unsupported dtype"
    if key == "op":
        return repr(OPS[value]) if 0 <= value < len(OPS) else "unknown op"
    return str(value)


def max_over_ranks(comm, vector):
    """vector <- element-wise max over all ranks, in place (recursive doubling, tag CHECK)."""
    size = comm.Get_size()
    pof2 = largest_power_of_two(size)
    newrank = fold_in(comm, vector, "max", tag=CHECK)
    if newrank is not None:
        incoming = np.empty_like(vector)
        distance = 1
        while distance < pof2:
            partner = world_rank(newrank ^ distance, size - pof2)
            comm.Sendrecv(vector, partner, CHECK, incoming, partner, CHECK)
            np.maximum(vector, incoming, out=vector)
            distance *= 2
    fold_out(comm, vector, tag=CHECK)


def agree(comm, name, values, problem=None):
    """Raise MismatchError on every rank unless all ranks pass equal `values` and no `problem`.

    values: dict such as {"length": n, "dtype": dtype_code(d), "op": 0}; problem: a string
    describing what is wrong with this rank's own arguments (or None).
    """
    rank = comm.Get_rank()
    keys = list(values)
    mine = np.array([values[key] for key in keys], dtype=np.int64)
    flag = [rank if problem else -1]
    vector = np.concatenate([mine, -mine, flag]).astype(np.int64)
    max_over_ranks(comm, vector)
    highs, lows, bad_rank = vector[:len(keys)], -vector[len(keys):2 * len(keys)], int(vector[-1])
    if problem:
        raise MismatchError(f"{name} on rank {rank}: {problem}")
    if bad_rank >= 0:
        raise MismatchError(f"{name}: rank {bad_rank} passed bad arguments (its error says which); "
                            f"rank {rank} stops too")
    for key, low, high, value in zip(keys, lows, highs, mine):
        if low != high:
            raise MismatchError(
                f"{name}: the {key} differs across ranks (from {_describe(key, int(low))} to "
                f"{_describe(key, int(high))}; rank {rank} has {_describe(key, int(value))}). "
                f"Every rank must pass the same {key}.")
