"""The MPI test harness and what every MPI test stands on: real ranks, one allreduce of a flat buffer."""
import numpy as np
import pytest
from hypothesis import given
from mpi4py import MPI
from pytest_mpi import parallel_assert

from collectives import ring
from minidl import flatten, models
from tests import strategies


@pytest.mark.parallel(nprocs=[1, 2, 3, 4])
def test_flat_gradient_buffer_summed_by_ring_allreduce_equals_closed_form_in_every_layer():
    """One ring allreduce of ``flat.grad`` sums every layer's gradient: the flat buffer's purpose.

    Rank r writes, through each layer's own ``grad`` view, g_i = i + r at flat position i; the sum
    over ranks is sum_r (i + r) = p i + p (p - 1) / 2, exact in float32 at these sizes.
    """
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    model = models.mlp(np.random.default_rng(0), in_features=4, hidden=(3,), classes=2)   # 23 parameters
    flat = flatten(model)
    start = 0
    for param in model.parameters():                   # through the layers, not the flat vector
        param.grad[...] = (np.arange(start, start + param.size) + rank).reshape(param.shape)
        start += param.size
    ring.allreduce(comm, MPI.IN_PLACE, flat.grad)
    index = np.arange(start, dtype=np.float64)
    expected = size * index + size * (size - 1) / 2
    problems = [] if np.array_equal(flat.grad, expected) else [f"flat.grad {flat.grad} != {expected}"]
    start = 0
    for name, param in model.named_parameters():
        want = expected[start:start + param.size].reshape(param.shape)
        if not np.array_equal(param.grad, want):
            problems.append(f"{name}.grad {param.grad.ravel()} != {want.ravel()}")
        start += param.size
    parallel_assert(not problems and flat.in_sync(), f"rank {rank}: " + "; ".join(problems))


@pytest.mark.parallel(nprocs=[2, 3])
@given(seed=strategies.seeds, length=strategies.lengths)
def test_hypothesis_draws_the_same_example_on_every_rank(seed, length):
    comm = MPI.COMM_WORLD
    mine = np.array([seed, length], dtype=np.int64)
    first = mine.copy()
    comm.Bcast(first, root=0)
    parallel_assert(bool(np.array_equal(mine, first)), f"rank {comm.rank} drew {mine}, rank 0 drew {first}")
