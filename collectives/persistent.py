"""Persistent allreduce: the arguments checked once, the same call started again and again.

MPI 4.0's persistent collective operations give a repeated collective its own calls:
MPI_Allreduce_init binds the buffers, the count, the datatype and the op once and returns a
persistent request; every repetition is then MPI_Start + MPI_Wait, with nothing to look up again.
A data-parallel training loop is that pattern: the same flat gradient, into the same buffer, summed
every step (PyTorch DDP's buckets are bound once in the same way). Here:

    reduce = allreduce_init(comm, MPI.IN_PLACE, flat_grad, op="mean")    # steps 1-2, once
    for batch in batches:
        ...backward fills flat_grad...
        reduce.start()                                                    # steps 3-6, each step

``allreduce_init`` does what every public allreduce does first (``buffers.py``, steps 1-2: this
rank's arguments, then with check=True the agreement across ranks) and picks the heart once (for
"auto", the algorithm its table names for this vector's size and p). ``start()`` then runs only
steps 3-6: the copy of sendbuf into recvbuf (none for numpy buffers: the hearts read sendbuf),
the heart, the op's finish and the CuPy staging.
Like MPI, it trusts the buffers to stay what they were at init: the same arrays, neither resized nor
made read-only (both are held here, so they are not freed). ``start()`` is blocking: it returns
when the allreduce is complete, so it is MPI_Start and MPI_Wait in one.

Why: a small allreduce is mostly Python, and with more ranks than cores that Python is paid on a
shared core. At p = 4 on 2 cores the per-call argument check of a 4 KiB allreduce (a few hundred
nanoseconds alone) adds several microseconds to each call (``python -m collectives.bench`` times
both forms, beside MPI's own Allreduce and its persistent Allreduce_init).

    mpiexec -n 4 python -m collectives.persistent
"""
import numpy as np
from mpi4py import MPI

from .auto import choose_name
from .buffers import allreduce_arguments, from_mpi, to_mpi
from .ops import array_module, finish
from .table import HEARTS, algorithm_module


class PersistentAllreduce:
    """An allreduce bound to (comm, sendbuf, recvbuf, op, algorithm); ``start()`` runs it."""

    def __init__(self, comm, sendbuf, recvbuf, op, algorithm, check):
        name = f"{algorithm} allreduce_init"
        algorithm_module(algorithm)                  # an unknown name: ValueError, before any message
        if recvbuf is None and hasattr(sendbuf, "dtype"):
            recvbuf = array_module(sendbuf).empty_like(sendbuf)
        self.in_place = allreduce_arguments(comm, name, sendbuf, recvbuf, op, check)    # steps 1-2
        self.comm, self.sendbuf, self.recvbuf, self.op = comm, sendbuf, recvbuf, op
        self.size = comm.Get_size()
        self.base, self.mean = ("sum" if op == "mean" else op), op == "mean"
        self.algorithm = choose_name(recvbuf.nbytes, self.size) if algorithm == "auto" else algorithm
        self.heart = HEARTS[self.algorithm] if self.size > 1 and recvbuf.size > 0 else None
        self.host = type(recvbuf) is np.ndarray      # numpy: MPI reads recvbuf itself, no staging
        # every heart reads an out-of-place input in sendbuf itself (buffers.py: no copy-in)
        self.source = (sendbuf if not self.in_place and self.heart is not None
                       and self.host and type(sendbuf) is np.ndarray else None)

    def start(self):
        """Run the bound allreduce once (steps 3-6 of buffers.py); returns recvbuf."""
        recvbuf = self.recvbuf
        if not self.in_place and self.source is None:
            recvbuf[...] = self.sendbuf
        data = recvbuf if self.host else to_mpi(recvbuf)
        if self.source is not None:
            self.heart(self.comm, data, self.base, source=self.source)
        elif self.heart is not None:
            self.heart(self.comm, data, self.base)
        if self.mean:                                # divide the sum by p
            finish(data, self.op, self.size)
        if data is not recvbuf:
            from_mpi(data, recvbuf)
        return recvbuf


def allreduce_init(comm, sendbuf, recvbuf=None, op="sum", algorithm="auto", check=True):
    """A persistent allreduce of sendbuf into recvbuf (MPI_Allreduce_init); call ``.start()`` to run it.

    The arguments are those of ``collectives.allreduce`` and are checked here, once (check=True:
    across ranks as well); every rank must call it, and later ``start()``, in the same order.
    """
    return PersistentAllreduce(comm, sendbuf, recvbuf, op, algorithm, check)


if __name__ == "__main__":
    comm = MPI.COMM_WORLD
    grad = np.arange(8, dtype=np.float32) + comm.Get_rank()
    reduce = allreduce_init(comm, MPI.IN_PLACE, grad, op="mean")
    for step in range(3):
        grad[...] = np.arange(8, dtype=np.float32) + comm.Get_rank() + step
        reduce.start()
        expected = np.arange(8, dtype=np.float32) + (comm.Get_size() - 1) / 2 + step
        if comm.Get_rank() == 0:
            print(f"step {step}: {reduce.algorithm}, mean over {comm.Get_size()} ranks = {grad.tolist()}"
                  f" ({'as expected' if np.array_equal(grad, expected) else 'WRONG'})")
