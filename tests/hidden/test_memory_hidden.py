"""Hidden: the memory methods' hearts beyond the visible tests (tasks 4.7, 6.4-6.8, 11.1).

4.7  ZeRO-2's step at p = 3 and 4, layer by layer: after one step the rank's block of every layer's
     summed gradient (what its momentum SGD keeps as v after the first step, v = g) is its block of
     the global batch's mean gradient, computed here by one serial backward over all the batch's
     rows, and the gathered weights are w - lr g on every rank.
6.4  Megatron's block called alone on 3 ranks (7 columns: 3 + 2 + 2): its output and the gradients
     of x and of this rank's columns and rows against the block's gradients written out by hand.
6.5  spatial_gradient on a three-stage CNN on 16 x 16 maps at P = 4, one row per rank at the end.
6.6  the halo exchange with a 5 x 5 convolution (two halo rows each side) at P = 4: the window, only
     neighbours spoken to, the bytes, and the adjoint identity with return_halo_gradient.
6.7, 6.8  f and g on real ranks with an in-place ring allreduce as the sum: distinct values per rank,
     and neither the forward's input nor the backward's incoming gradient overwritten.
11.1 recomputation's backward with an input that needs no gradient (the data), a convolutional
     segment, and a checkpoint inside a checkpoint, all bit for bit.
"""
import functools

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import spatial_parallel, tensor_parallel, zero
from algorithms.core import run
from algorithms.core.objective import NetworkObjective
from algorithms.shards.tiling import Tiling
from collectives.trace import TracedComm
from minidl import functional as F
from minidl.data import shard
from minidl.flat import flatten
from minidl.nn import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidl.recompute import Checkpoint, checkpoint
from minidl.tensor import Parameter, Tensor
from tests.handed import in_place_total
from tests.helpers import EQUAL_UP_TO_ROUNDING, parallel_assert_close, tiny_digits, uneven_mlp
from tests.test_memory_tasks import known_map
from tests.test_zero import zero_job

# ---- 4.7: ZeRO-2's gradient shard ---------------------------------------------------------------------

@pytest.mark.task("4.7")
@pytest.mark.parallel(nprocs=[3, 4])
def test_zero2_keeps_its_block_of_the_global_mean_gradient_and_gathers_w_minus_lr_g():
    comm = MPI.COMM_WORLD
    job, shard_ = zero_job(comm, 2, "sgd")
    batch = job.batches(0)[0]
    everyone = np.concatenate(comm.allgather(np.asarray(batch.index)))
    serial = NetworkObjective(uneven_mlp(), tiny_digits())
    serial.loss_and_grad(everyone)                           # the mean over the global batch
    before = serial.params.copy()
    zero.zero_step(comm, job.objective, shard_, batch, 2)
    for index, unit in enumerate(shard_.units):          # v = g after the first step: my block of each layer's
        mine = serial.grad[unit.offset + unit.start:unit.offset + unit.stop]
        parallel_assert_close(shard_.optimizer.state[index]["momentum"], mine, EQUAL_UP_TO_ROUNDING,
                              f"p={comm.size}: layer {index}'s gradient block")
    # momentum SGD's first step: v = g, w = w - lr v (lr 0.05, SMALL in tests/test_zero.py)
    parallel_assert_close(job.objective.params, before - 0.05 * serial.grad, EQUAL_UP_TO_ROUNDING,
                          f"p={comm.size}: the gathered weights")


# ---- 6.4: the block, alone ---------------------------------------------------------------------------

@pytest.mark.task("6.4")
@pytest.mark.parallel(nprocs=[3])
def test_the_block_alone_gives_the_hand_written_output_and_gradients():
    comm, rank = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank()
    rng = np.random.default_rng(11)
    X, A, a, B, b, R = (rng.standard_normal(shape) for shape in ((6, 5), (5, 7), (7,), (7, 4), (4,), (6, 4)))
    cols = shard(7, rank, 3)                             # 3, 2, 2 columns
    lo, hi = int(cols[0]), int(cols[-1]) + 1
    column = Linear(5, hi - lo, rng=rng, dtype="float64")
    column.weight.data[...], column.bias.data[...] = A[:, lo:hi], a[lo:hi]
    row_weight, row_bias = Parameter(B[lo:hi].copy()), Parameter(b.copy())
    x = Tensor(X.copy(), requires_grad=True)
    z = tensor_parallel.tensor_parallel_block(x, column, row_weight, row_bias, in_place_total(comm))
    (z * Tensor(R)).sum().backward()
    pre = X @ A + a
    Y = np.maximum(pre, 0)
    dY = (R @ B.T) * (pre > 0)
    parallel_assert_close(z.data, Y @ B + b, EQUAL_UP_TO_ROUNDING, "the block's output")
    parallel_assert_close(x.grad, dY @ A.T, EQUAL_UP_TO_ROUNDING, "dX (f's backward sum)")
    parallel_assert_close(column.weight.grad, (X.T @ dY)[:, lo:hi], EQUAL_UP_TO_ROUNDING, "my columns of dA")
    parallel_assert_close(row_weight.grad, (Y.T @ R)[lo:hi], EQUAL_UP_TO_ROUNDING, "my rows of dB")
    parallel_assert_close(row_bias.grad, R.sum(axis=0), EQUAL_UP_TO_ROUNDING, "db")


# ---- 6.5 and 6.6: the spatial split --------------------------------------------------------------------

def three_stage_cnn():
    """(N, 1, 16, 16) -conv 3, pool-> (2, 8, 8) -conv 3, pool-> (3, 4, 4) -conv 3-> (2, 4, 4) -> 32 -> 10."""
    rng = np.random.default_rng(5)
    return Sequential(Conv2d(1, 2, 3, padding=1, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      Conv2d(2, 3, 3, padding=1, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      Conv2d(3, 2, 3, padding=1, rng=rng, dtype="float64"), ReLU(),
                      Flatten(), Linear(32, 10, rng=rng, init="glorot", dtype="float64"))


def wide_halo_cnn():
    """(N, 1, 16, 16) -conv 3, pool-> (2, 8, 8) -conv 5 pad 2-> (3, 8, 8) -> 192 -> 10: two halo rows."""
    rng = np.random.default_rng(6)
    return Sequential(Conv2d(1, 2, 3, padding=1, rng=rng, dtype="float64"), MaxPool2d(2),
                      Conv2d(2, 3, 5, padding=2, rng=rng, dtype="float64"), ReLU(),
                      Flatten(), Linear(192, 10, rng=rng, init="glorot", dtype="float64"))


@pytest.mark.task("6.5")
@pytest.mark.parallel(nprocs=[4])
def test_spatial_gradient_of_a_three_stage_cnn_equals_serial_at_p4():
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(7)
    x, labels = rng.standard_normal((3, 1, 16, 16)), np.array([1, 4, 9])
    whole = three_stage_cnn()
    flat = flatten(whole)
    flat.zero_grad()
    loss = F.softmax_cross_entropy(whole(Tensor(x)), labels)
    loss.backward()
    mine = three_stage_cnn()
    mine_flat = flatten(mine)
    mine_flat.zero_grad()
    tiling = Tiling.of(mine, 16, 16, comm.size)
    summing = run.allreduce_function("ring")
    got = spatial_parallel.spatial_gradient(comm, tiling, x, labels,
                                            functools.partial(summing, comm, mine_flat.grad[:tiling.conv_parameters()]))
    parallel_assert(abs(got - float(loss.item())) <= 1e-12 * abs(float(loss.item())), f"loss {got}")
    parallel_assert_close(mine_flat.grad, flat.grad, EQUAL_UP_TO_ROUNDING, "the gradient")


@pytest.mark.task("6.6")
@pytest.mark.parallel(nprocs=[4])
def test_a_two_row_halo_window_neighbours_bytes_and_the_adjoint():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    stage = Tiling.of(wide_halo_cnn(), 16, 16, size).stages[1]            # 8 rows, 2 each, halo 2
    whole = known_map(2, 2, stage.rows, stage.width)
    (own_lo, own_hi), (need_lo, need_hi) = stage.owned[rank], stage.needed[rank]
    traced = TracedComm(comm)
    tile = whole[:, :, own_lo:own_hi].copy()
    window = spatial_parallel.halo_exchange(traced, tile, stage)
    parallel_assert(window.shape == (2, 2, need_hi - need_lo, 8) and
                    bool(np.array_equal(window, whole[:, :, need_lo:need_hi])), f"rank {rank}: the window")
    parallel_assert(bool(np.array_equal(tile, whole[:, :, own_lo:own_hi])), f"rank {rank}: the tile was changed")
    sent = [m for m in traced.messages if m.direction == "send"]
    parallel_assert(all(abs(m.peer - rank) == 1 for m in sent), f"rank {rank} sent to {[m.peer for m in sent]}")
    halo_rows = 2 * 2 * (size - 1)                  # two rows each way across each of the P - 1 boundaries
    total = comm.allreduce(sum(m.nbytes for m in sent))
    parallel_assert(total == halo_rows * 2 * 2 * 8 * 8, f"{total} bytes sent")
    # the adjoint: sum_r <exchange(t)_r, w_r> = sum_r <t_r, return(w)_r>
    w = np.random.default_rng(rank).standard_normal(window.shape)
    back = spatial_parallel.return_halo_gradient(comm, w, stage)
    left = comm.allreduce(float(np.sum(window * w)))
    right = comm.allreduce(float(np.sum(tile * back)))
    parallel_assert(abs(left - right) <= 1e-9 * abs(left), f"not adjoint: {left} != {right}")


# ---- 6.7 and 6.8: f and g on real ranks -----------------------------------------------------------------

@pytest.mark.task("6.8")
@pytest.mark.parallel(nprocs=[3])
def test_g_sums_distinct_ranks_values_without_overwriting_its_input():
    comm, rank = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank()
    mine = np.arange(8.0).reshape(2, 4) + 100 * rank
    z_in = Tensor(mine.copy(), requires_grad=True)
    z = F.reduce_from_parallel(z_in, in_place_total(comm))
    parallel_assert(bool(np.array_equal(z.data, 3 * np.arange(8.0).reshape(2, 4) + 300)), "g: the sum over ranks")
    parallel_assert(bool(np.array_equal(z_in.data, mine)), "g's forward overwrote its input")
    z.backward(np.full((2, 4), 1.0 + rank))
    parallel_assert(bool(np.array_equal(z_in.grad, np.full((2, 4), 1.0 + rank))), "g's backward is the identity")


@pytest.mark.task("6.7")
@pytest.mark.parallel(nprocs=[3])
def test_f_sums_distinct_ranks_gradients_without_overwriting_the_incoming_one():
    comm, rank = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank()
    x = Tensor(np.ones((2, 4)) * (rank + 1), requires_grad=True)
    y = F.copy_to_parallel(x, in_place_total(comm))
    parallel_assert(bool(np.array_equal(y.data, np.ones((2, 4)) * (rank + 1))), "f's forward is the identity")
    upstream = np.full((2, 4), 2.0 + rank)
    y.backward(upstream)
    parallel_assert(bool(np.array_equal(x.grad, np.full((2, 4), 9.0))), "f's backward: 2 + 3 + 4 summed")
    parallel_assert(bool(np.array_equal(upstream, np.full((2, 4), 2.0 + rank))),
                    "f's backward overwrote the incoming gradient")


# ---- 11.1: recomputation's backward ---------------------------------------------------------------------

def small_cnn():
    rng = np.random.default_rng(9)
    return Sequential(Conv2d(1, 2, 3, padding=1, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      Conv2d(2, 3, 3, padding=1, rng=rng, dtype="float64"), ReLU(), Flatten(),
                      Linear(48, 5, rng=rng, dtype="float64"))


def grads(net, x, labels, run_net):
    flat = flatten(net)
    flat.zero_grad()
    F.softmax_cross_entropy(run_net(net, Tensor(x)), labels).backward()     # the data needs no gradient
    return flat.grad.copy()


@pytest.mark.task("11.1")
def test_recomputation_with_data_input_conv_segments_and_nesting_is_bitwise():
    rng = np.random.default_rng(2)
    x, labels = rng.standard_normal((4, 1, 8, 8)), np.array([0, 3, 1, 4])
    plain = grads(small_cnn(), x, labels, lambda net, h: net(h))
    layers = lambda net: list(net)                                        # noqa: E731

    def first_segment(net, h):                          # the first segment reads the data itself
        return Sequential(*layers(net)[3:])(checkpoint(Sequential(*layers(net)[:3]), h))

    def nested(net, h):                                 # a checkpoint inside a checkpoint
        inner = Sequential(Checkpoint(Sequential(*layers(net)[:3])), *layers(net)[3:5])
        return Sequential(*layers(net)[5:])(checkpoint(inner, h))
    for name, run_net in (("data-input segment", first_segment), ("nested", nested)):
        got = grads(small_cnn(), x, labels, run_net)
        assert np.array_equal(got, plain), f"{name}: gradients differ by {np.max(np.abs(got - plain)):.2e}"
