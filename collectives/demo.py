"""The `python -m collectives.<algorithm>` demo: one allreduce of rank-dependent values, checked.

    mpiexec -n 4 python -m collectives.ring
"""
import numpy as np


def demo(allreduce, comm, length=10):
    """Rank r holds [r, r+1, ..., r+length-1]; the sum over ranks is known in closed form."""
    rank, size = comm.Get_rank(), comm.Get_size()
    grad = np.arange(length, dtype=np.float64) + rank
    total = allreduce(comm, grad, np.empty_like(grad), op="sum")
    expected = size * np.arange(length) + size * (size - 1) / 2
    if rank == 0:
        print(f"{allreduce.__module__}.allreduce on {size} ranks, {length} elements:")
        print(" result  ", total)
        print(" expected", expected, "(p * i + p (p - 1) / 2)")
    if not np.array_equal(total, expected):
        raise SystemExit(f"rank {rank}: wrong result {total}")
