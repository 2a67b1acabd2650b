"""DistBelief's spatial split: feature maps in row tiles with halo exchange equal the whole model, P = 2..4.

Run: python tests/run.py --max-ranks 4 -- tests/test_spatial_parallel.py

The float64 CNN (N, 1, 8, 8) -conv 5x5 pad 2-> (3, 8, 8) -pool-> (3, 4, 4) -conv 3x3 pad 1-> (4, 4, 4)
-> 64 -> 10 tiles its 4-row maps as 2+2, 2+1+1 and 1+1+1+1 rows (8 image rows: 4+4, 4+2+2, 2+2+2+2):
uneven at P = 3. The second convolution is "same" 3x3, so each of the P - 1 tile boundaries carries
one row each way, forward and (the gradient) backward: the halo bytes below are written from that,
not from the module's formula. A second CNN with a 3x3 "valid" convolution (a one-sided halo) is
checked for the loss and gradients (8 rows of the first map, 6 of the second: uneven tiles at P = 3, 4).
"""
import functools

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import spatial_parallel
from algorithms.core import run, tags
from algorithms.core.cli import SettingError
from algorithms.core.objective import NetworkObjective
from algorithms.shards.tiling import Tiling
from collectives.trace import TracedComm
from minidl.nn import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
from tests.helpers import (
    EQUAL_UP_TO_ROUNDING,
    assert_stopped,
    launch,
    parallel_assert_close,
    serial_reference,
    tiny_digits,
)

ROWS = np.arange(12)


def same_cnn():
    rng = np.random.default_rng(6)
    return Sequential(Conv2d(1, 3, 5, padding=2, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      Conv2d(3, 4, 3, padding=1, rng=rng, dtype="float64"), ReLU(),
                      Flatten(), Linear(64, 10, rng=rng, init="glorot", dtype="float64"))


def valid_cnn():
    """(N, 1, 8, 8) -conv 3x3 pad 1-> (3, 8, 8) -conv 3x3, no padding-> (2, 6, 6) -> 72 -> 10: the second
    convolution's output row i reads rows i..i+2, so its 6 output rows need halos on one side only."""
    rng = np.random.default_rng(2)
    return Sequential(Conv2d(1, 3, 3, padding=1, rng=rng, dtype="float64"), ReLU(),
                      Conv2d(3, 2, 3, rng=rng, dtype="float64"), ReLU(),
                      Flatten(), Linear(72, 10, rng=rng, init="glorot", dtype="float64"))


def one_step(model, data, comm):
    """(serial loss, serial gradient, spatial loss, spatial gradient, the traced communicator)."""
    whole = NetworkObjective(model(), data)
    loss = whole.loss_and_grad(ROWS)
    mine = NetworkObjective(model(), data)
    tiling = Tiling.of(mine.net, 8, 8, comm.size)
    traced, allreduce = TracedComm(comm), run.allreduce_function("ring")
    conv_gradient = mine.grad[:tiling.conv_parameters()]
    mine.flat.zero_grad()
    spatial = spatial_parallel.spatial_gradient(traced, tiling, data.x_train[ROWS], data.y_train[ROWS],
                                                functools.partial(allreduce, traced, conv_gradient))
    return loss, whole.grad, spatial, mine.grad, traced


def bytes_with_tag(comm, traced, tag):
    return comm.allreduce(sum(m.nbytes for m in traced.messages if m.direction == "send" and m.tag == tag))


@pytest.mark.task("6.5")
@pytest.mark.parallel(nprocs=[2, 3, 4])
def test_spatial_split_forward_backward_and_ten_steps_equal_serial_and_halo_bytes_match():
    comm, data = MPI.COMM_WORLD, tiny_digits(n_test=20)
    p, n = comm.size, len(ROWS)
    for model in (same_cnn, valid_cnn):
        loss, serial_grad, spatial, grad, traced = one_step(model, data, comm)
        parallel_assert(abs(spatial - loss) <= 1e-12 * abs(loss), f"{model.__name__} P={p}: loss {spatial} != {loss}")
        parallel_assert_close(grad, serial_grad, EQUAL_UP_TO_ROUNDING, f"{model.__name__} P={p}: gradient")
    # same_cnn's last traced step: one row of (N, 3 channels, 4 columns) per boundary, each way, forward and back
    loss, _, _, _, traced = one_step(same_cnn, data, comm)
    halo = bytes_with_tag(comm, traced, tags.SPATIAL_HALO)
    parallel_assert(halo == 2 * 2 * (p - 1) * n * 3 * 4 * 8, f"P={p}: {halo} halo bytes")
    gathered = bytes_with_tag(comm, traced, tags.SPATIAL_GATHER)     # (N, 4, 4, 4) to the P - 1 others
    parallel_assert(gathered == (p - 1) * n * 4 * 4 * 4 * 8, f"P={p}: {gathered} bytes gathered")
    # ten SGD steps (one epoch of 50 rows at batch 5) from the same weights
    params, _ = spatial_parallel.train(comm, model=same_cnn, data=data, epochs=1, lr=0.1, momentum=0.9,
                                       batch_size=5, quiet=True)
    expected = serial_reference(data, epochs=1, lr=0.1, momentum=0.9, batch_size=5, model=same_cnn)
    parallel_assert_close(params, expected, EQUAL_UP_TO_ROUNDING, f"P={p}: 10 SGD steps")


@pytest.mark.parallel(nprocs=[4])
def test_a_halo_wider_than_a_neighbours_tile_is_refused_on_every_rank():
    def wide():                               # conv 5x5 on the 4-row map: 2 halo rows, tiles of 1 row
        rng = np.random.default_rng(0)
        return Sequential(Conv2d(1, 2, 3, padding=1, rng=rng, dtype="float64"), MaxPool2d(2),
                          Conv2d(2, 2, 5, padding=2, rng=rng, dtype="float64"),
                          Flatten(), Linear(32, 10, rng=rng, dtype="float64"))
    with pytest.raises(SettingError, match="beyond its neighbours' tiles") as caught:
        spatial_parallel.train(MPI.COMM_WORLD, model=wide, data=tiny_digits(), quiet=True)
    parallel_assert(caught.value.every_rank, "not raised together on every rank")


def test_more_ranks_than_rows_and_an_mlp_stop_every_rank_with_an_error():
    done = launch("spatial_parallel", "--model", "cnn", "--epochs", "1", ranks=3)
    assert_stopped(done, "3 ranks but conv layer 1's output has only 2 rows", ranks=3)
    with pytest.raises(SettingError, match="must start with a Conv2d"):
        spatial_parallel.train(MPI.COMM_SELF, model="mlp", quiet=True)
