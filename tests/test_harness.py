"""The MPI test harness itself: real ranks, collective failure, timeouts."""
import numpy as np
import pytest
from hypothesis import given
from mpi4py import MPI
from pytest_mpi import parallel_assert

from tests import strategies


@pytest.mark.parallel(nprocs=[1, 2, 3, 4])
def test_flat_gradient_buffer_summed_across_ranks_equals_closed_form():
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    grad = np.arange(10, dtype=np.float64) + rank       # rank-dependent fill
    total = np.empty_like(grad)
    comm.Allreduce(grad, total, op=MPI.SUM)
    expected = size * np.arange(10) + size * (size - 1) / 2
    parallel_assert(bool(np.array_equal(total, expected)), f"rank {rank}: {total} != {expected}")


@pytest.mark.parallel(nprocs=[2, 3])
@given(seed=strategies.seeds, length=strategies.lengths)
def test_hypothesis_draws_the_same_example_on_every_rank(seed, length):
    comm = MPI.COMM_WORLD
    mine = np.array([seed, length], dtype=np.int64)
    first = mine.copy()
    comm.Bcast(first, root=0)
    parallel_assert(bool(np.array_equal(mine, first)), f"rank {comm.rank} drew {mine}, rank 0 drew {first}")
