"""Tensor parallelism (Megatron-LM): the split blocks train as serial SGD, with two allreduces per block.

Run: python tests/run.py --max-ranks 4 -- tests/test_tensor_parallel.py

Models (float64): the MLP 64 -> 7 -> 5 -> 10 (one block 64 -> 7 -> 5, whose 7 columns split
unevenly over 2, 3 and 4 ranks; the output layer replicated) and a LeNet-shaped CNN whose head
48 -> 6 -> 5 is the block (the convolution and the output layer replicated), so the block's input
needs a gradient and f's backward allreduce runs. Tolerance against serial SGD:
``EQUAL_UP_TO_ROUNDING`` (tests/helpers.py): the split changes only how X A's columns and Y B's
h <= 7 products are grouped into sums, a few ulps per step.
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import tensor_parallel
from algorithms.core.cli import SettingError
from collectives.trace import TracedComm
from minidl.data import rank_batches
from minidl.nn import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
from tests.helpers import (
    EQUAL_UP_TO_ROUNDING,
    assert_stopped,
    float64_mlp_of,
    launch,
    parallel_assert_close,
    same_on_every_rank,
    serial_reference,
    tiny_digits,
    uneven_mlp,
)

SETTINGS = dict(epochs=1, lr=0.1, momentum=0.9, batch_size=5, quiet=True)      # 10 steps of 5 rows


def lenet_head():
    """(N, 1, 8, 8) -conv 3-> (N, 3, 8, 8) -pool-> 48 -> 6 -> 5 -> 10: LeNet-5's shape in small."""
    rng = np.random.default_rng(4)
    return Sequential(Conv2d(1, 3, 3, padding=1, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2), Flatten(),
                      Linear(48, 6, rng=rng, dtype="float64"), ReLU(), Linear(6, 5, rng=rng, dtype="float64"), ReLU(),
                      Linear(5, 10, rng=rng, init="glorot", dtype="float64"))


def two_block_mlp():
    """64 -> 7 -> 5 -> 6 -> 10: blocks 64 -> 7 -> 5 and 5 -> 6 -> 10."""
    return float64_mlp_of([64, 7, 5, 6, 10], seed=8)


@pytest.mark.task("6.4")
@pytest.mark.parallel(nprocs=[2, 3, 4])
@pytest.mark.parametrize("model", [uneven_mlp, lenet_head], ids=["mlp", "lenet_head"])
def test_tensor_parallel_sgd_equals_serial_sgd(model):
    comm, data = MPI.COMM_WORLD, tiny_digits()
    params, _ = tensor_parallel.train(comm, model=model, data=data, **SETTINGS)
    serial = serial_reference(data, epochs=1, lr=0.1, momentum=0.9, batch_size=5, model=model)
    parallel_assert_close(params, serial, EQUAL_UP_TO_ROUNDING, f"{model.__name__}, p={comm.size}")
    parallel_assert(same_on_every_rank(comm, params), "ranks assembled different models")


@pytest.mark.parallel(nprocs=[2, 3, 4])
@pytest.mark.parametrize("model, blocks, reads_data, widths",
                         [(lenet_head, 1, False, [(48, 5)]), (two_block_mlp, 2, True, [(64, 5), (5, 10)])],
                         ids=["lenet_head", "two_blocks"])
def test_each_block_allreduces_twice_per_step(model, blocks, reads_data, widths):
    """g's allreduce of Z (N o values) in forward and f's of dX (N i values) in backward, per block and
    step; the block that reads the data has no dX to sum. Counted by the tracer: a ring allreduce sends
    p - 1 reduce-scatter messages per rank, and (p - 1) n values over all ranks."""
    comm = MPI.COMM_WORLD
    traced = TracedComm(comm)
    tensor_parallel.train(traced, model=model, data=tiny_digits(), **SETTINGS)
    sent = [message for message in traced.messages if message.direction == "send" and message.phase == "reduce-scatter"]
    rows = [len(batch.index) for batch in rank_batches(50, 5, 0, 1, 0, 0, "global")]
    per_step = 2 * blocks - reads_data
    parallel_assert(len(sent) == (comm.size - 1) * per_step * len(rows),
                    f"{model.__name__}: {len(sent) / (comm.size - 1)} allreduces in {len(rows)} steps, expected "
                    f"{per_step} per step")
    values = comm.allreduce(sum(message.nbytes for message in sent)) // 8
    outputs, inputs = sum(o for _, o in widths), sum(i for i, _ in widths[1 if reads_data else 0:])
    expected = (comm.size - 1) * sum(rows) * (outputs + inputs)
    parallel_assert(values == expected, f"{model.__name__}: {values} values reduce-scattered, expected {expected}")


@pytest.mark.parallel(nprocs=[4])
def test_more_tensor_parallel_ranks_than_columns_is_refused_on_every_rank():
    def narrow():
        return float64_mlp_of([64, 3, 10], seed=0)
    with pytest.raises(SettingError, match=r"4 tensor-parallel ranks cannot split block 0 \(64 -> 3 -> 10\): it has "
                                           r"only 3 columns") as refused:
        tensor_parallel.train(MPI.COMM_WORLD, model=narrow, data=tiny_digits(), **SETTINGS)
    parallel_assert(refused.value.every_rank, "refused on one rank only")


def test_a_network_without_a_block_to_split_stops_every_rank_with_an_error():
    done = launch("tensor_parallel", "--model", "cnn", "--epochs", "1", ranks=2)
    assert_stopped(done, "--model cnn: tensor parallelism splits Linear -> ReLU -> Linear blocks", ranks=2)
