"""collectives: allreduce built from MPI point-to-point messages, with tested cost models.

The algorithms, one module each, readable top to bottom, with its paper, schedule and cost in its
header and its heart in one function (`<name>_allreduce_in_place`):

    naive.py         gather to rank 0, reduce, send back          (the baseline; root traffic ~ p)
    tree.py          binomial reduce + broadcast                  (+ public reduce, broadcast)
    butterfly.py     recursive doubling                           (small vectors)
    ring.py          reduce-scatter ring + allgather ring         (+ public reduce_scatter, allgather)
    rabenseifner.py  recursive halving + recursive doubling       (large vectors)
    hierarchical.py  reduce-scatter in each node, c allreduces across nodes at once, allgather in each node
    hierarchical_tree.py  reduce in each node, allreduce across the nodes' leaders, broadcast in each node
    auto.py          the algorithm measured fastest here for the size and p (selection.json)
    persistent.py    allreduce_init: arguments checked once, start() per call (MPI 4.0's persistent collectives)
    nonblocking.py   a nonblocking butterfly per bucket, started as backward fills it (overlap)

what every call uses:

    buffers.py  in-place use, CuPy staging, block layout       ops.py      sum, max, min, mean
    nodes.py    ranks on nodes: the node size, a heart on some ranks (the hierarchies')
    tags.py     one MPI tag per phase                          fold.py     MPICH's fold-in for p not a power of two
    check.py    ranks agree on arguments                       table.py    the algorithms by name
    trace.py    message tracer and byte counter

and what every algorithm's command uses (`mpiexec -n 4 python -m collectives.ring`):

    demo.py     one allreduce, traced and checked against MPI's own
    spacetime.py  space-time diagrams of traced messages
    cli.py      the commands' flags and error contract (`error: ...`, exit status 2)
    simulate.py   `python -m collectives.simulate`: the name on the command line of sim/'s simulator

The rooms, each with its own map (its `__init__.py`):

    model/        the cost model the algorithms and the bench read: cost.py, calibration.py
    bench/        measured against MPI and the model: `python -m collectives.bench`, the calibration's
                  fitting, MPICH's own algorithms (`python -m collectives.bench.mpich_choice`)
    sim/          the hearts on a simulated LogGP network, p up to 16,384: `python -m collectives.simulate`
    cluster/      emulated hosts (network namespaces): `python -m collectives.cluster`
    compression/  gradient compressors, quantizers, the sparse allreduce

Every algorithm is `allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True)` on
contiguous 1-D numpy (or CuPy) buffers, uses only Send, Recv and Sendrecv, works for any
p >= 1 and any length, and returns recvbuf. `collectives.allreduce(..., algorithm=name)`
picks one by name (`table.py` holds the table).

    mpiexec -n 4 python -m collectives.ring          # one allreduce, traced and checked
    mpiexec -n 4 python -m collectives.bench         # every algorithm against MPI_Allreduce
"""
import warnings

# The package imports ring, tree, ... below (and through them model.cost), so `python -m collectives.ring`
# finds collectives.ring already imported when it runs the file as __main__, and runpy warns about it. The modules have
# no import-time state that a second copy could split, so the warning says nothing here.
warnings.filterwarnings("ignore", message=r"'collectives(\.\w+)+' found in sys\.modules after import of package "
                        r"'collectives(\.\w+)*'", category=RuntimeWarning)

from .buffers import block_counts  # noqa: E402
from .check import MismatchError  # noqa: E402
from .persistent import allreduce_init  # noqa: E402
from .ring import allgather, reduce_scatter  # noqa: E402
from .table import ALGORITHMS, algorithm_module  # noqa: E402
from .trace import CountingComm, TracedComm  # noqa: E402
from .tree import broadcast, reduce  # noqa: E402

__all__ = ["ALGORITHMS", "allreduce", "algorithm_module", "broadcast", "reduce", "reduce_scatter", "allgather",
           "allreduce_init", "MismatchError", "TracedComm", "CountingComm", "block_counts"]


def allreduce(comm, sendbuf, recvbuf=None, op="sum", algorithm="auto", check=True):
    """recvbuf <- op over ranks of sendbuf with the named algorithm (one of ALGORITHMS).

    check=True agrees on lengths, dtypes and ops across ranks first (collectives.check);
    check=False trusts the caller to pass the same on every rank.
    """
    return algorithm_module(algorithm).allreduce(comm, sendbuf, recvbuf, op=op, check=check)
