"""collectives: allreduce built from MPI point-to-point messages, with tested cost models.

One module per algorithm, each readable top to bottom, with its paper, schedule and cost in
its header and its heart in one function (`<name>_allreduce_in_place`):

    naive.py         gather to rank 0, reduce, send back          (the baseline; root traffic ~ p)
    tree.py          binomial reduce + broadcast                  (+ public reduce, broadcast)
    butterfly.py     recursive doubling                           (small vectors)
    ring.py          reduce-scatter ring + allgather ring         (+ public reduce_scatter, allgather)
    rabenseifner.py  recursive halving + recursive doubling       (large vectors)
    auto.py          butterfly below a measured size, Rabenseifner from it (any p)
    persistent.py    allreduce_init: arguments checked once, start() per call (MPI 4.0's persistent collectives)

and around them:

    fold.py     MPICH's fold-in for p not a power of two       check.py    ranks agree on arguments
    buffers.py  in-place use, CuPy staging, block layout       ops.py      sum, max, min, mean
    tags.py     one MPI tag per phase                          cost.py     alpha-beta-gamma model
    trace.py    message tracer and byte counter, space-time    bench.py    measured vs MPI and model
    demo.py     what `python -m collectives.<name>` runs: one allreduce, traced and checked

Every algorithm is `allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True)` on
contiguous 1-D numpy (or CuPy) buffers, uses only Send, Recv and Sendrecv, works for any
p >= 1 and any length, and returns recvbuf. `collectives.allreduce(..., algorithm=name)`
picks one by name (`algorithm_module` holds the table).

    mpiexec -n 4 python -m collectives.ring          # one allreduce, traced and checked
    mpiexec -n 4 python -m collectives.bench         # every algorithm against MPI_Allreduce

Submodules load on first use (the algorithm table in `algorithm_module`, and PEP 562
`__getattr__` for the other names), so `python -m collectives.bench` can pin the BLAS thread
count before numpy is imported.
"""
import functools
import importlib

ALGORITHMS = ("naive", "tree", "butterfly", "ring", "rabenseifner", "auto")

# public name -> the module that defines it
_EXPORTS = {"broadcast": "tree", "reduce": "tree", "reduce_scatter": "ring", "allgather": "ring",
            "MismatchError": "check", "TracedComm": "trace", "CountingComm": "trace",
            "block_counts": "buffers", "allreduce_init": "persistent"}


@functools.cache                           # each name is looked up once
def algorithm_module(name):
    """The module of the named algorithm (one of ALGORITHMS); each has `allreduce` and a heart."""
    from . import auto, butterfly, naive, rabenseifner, ring, tree   # here, not on top: see above
    modules = {"naive": naive, "tree": tree, "butterfly": butterfly, "ring": ring,
               "rabenseifner": rabenseifner, "auto": auto}
    if name not in modules:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {ALGORITHMS}")
    return modules[name]


def allreduce(comm, sendbuf, recvbuf=None, op="sum", algorithm="auto", check=True):
    """recvbuf <- op over ranks of sendbuf with the named algorithm (one of ALGORITHMS).

    check=True agrees on lengths, dtypes and ops across ranks first (collectives.check);
    check=False trusts the caller to pass the same on every rank.
    """
    return algorithm_module(algorithm).allreduce(comm, sendbuf, recvbuf, op=op, check=check)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
