"""collectives: allreduce built from MPI point-to-point messages, with tested cost models.

One module per algorithm, each readable top to bottom, with its paper, schedule and cost in
its header and its heart in one function (`<name>_allreduce_in_place`):

    naive.py         gather to rank 0, reduce, send back          (the baseline; root traffic ~ p)
    tree.py          binomial reduce + broadcast                  (+ public reduce, broadcast)
    butterfly.py     recursive doubling                           (small vectors)
    ring.py          reduce-scatter ring + allgather ring         (+ public reduce_scatter, allgather)
    rabenseifner.py  recursive halving + recursive doubling       (large vectors)
    auto.py          butterfly or a bandwidth-optimal one by size, threshold measured here

and around them:

    fold.py     MPICH's fold-in for p not a power of two       check.py    lengths/dtypes agree
    buffers.py  in-place use, CuPy staging, block layout       ops.py      sum, max, min, mean
    tags.py     one MPI tag per phase                          cost.py     alpha-beta-gamma model
    trace.py    message tracer, text and space-time PNG        bench.py    measured vs MPI and model

Every algorithm is `allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True)` on
contiguous 1-D numpy (or CuPy) buffers, uses only Send, Recv and Sendrecv, works for any
p >= 1 and any length, and returns recvbuf. `collectives.allreduce(..., algorithm=name)`
picks one by name.

    mpiexec -n 4 python -m collectives.ring          # a demo of one algorithm
    mpiexec -n 4 python -m collectives.bench         # every algorithm against MPI_Allreduce

Submodules load on first use (PEP 562 `__getattr__` below), so `python -m collectives.bench`
can pin the BLAS thread count before numpy is imported.
"""
import importlib

ALGORITHMS = ("naive", "tree", "butterfly", "ring", "rabenseifner", "auto")

# public name -> the module that defines it
_EXPORTS = {"broadcast": "tree", "reduce": "tree", "reduce_scatter": "ring", "allgather": "ring",
            "MismatchError": "check", "TracedComm": "trace", "block_counts": "buffers"}


def allreduce(comm, sendbuf, recvbuf=None, op="sum", algorithm="auto", check=True):
    """recvbuf <- op over ranks of sendbuf with the named algorithm (one of ALGORITHMS)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    module = importlib.import_module(f"{__name__}.{algorithm}")
    return module.allreduce(comm, sendbuf, recvbuf, op=op, check=check)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
