"""The course tasks of the memory methods, piece by piece: the halo exchange (6.6) and its adjoint (6.9),
Megatron's f and g (6.7, 6.8) and recomputation's backward (11.1).

Run: python tests/run.py --max-ranks 3 -- tests/test_memory_tasks.py

Oracles written from the definitions, not from the code under test. The halo: every rank holds the
same known map (row i filled with the value i, channel c adding 1000 c, column j adding j / 100), so
the window a rank must receive is that map's rows [lo, hi) of its ``stage.needed``, read off directly;
the halo's gradient, every window's gradient added into one map at its rows, read off at the owner's.
f and g: a stand-in for the sum over ranks (``total``) that multiplies by 3, as three ranks holding
the same array would sum it, and that counts its calls: f's forward and g's backward are the
identity and call nothing; f's backward and g's forward are the sum. Recomputation: the gradients
of a checkpointed segment are those of the plain backward, bit for bit (the recomputed forward
repeats the same operations on the same arrays).
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import spatial_parallel
from algorithms.shards.tiling import Tiling
from collectives.trace import TracedComm
from minidl import functional as F
from minidl.flat import flatten
from minidl.nn import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidl.recompute import checkpoint
from minidl.tensor import Tensor
from tests.handed import Summing
from tests.helpers import float64_mlp_of


def known_map(batch, channels, rows, width):
    """(N, C, H, W) with value i + 1000 c + j / 100 + 10000 n at row i, channel c, column j, example n:
    every entry says where it is."""
    n, c, i, j = np.meshgrid(np.arange(batch), np.arange(channels), np.arange(rows), np.arange(width), indexing="ij")
    return (i + 1000 * c + j / 100 + 10000 * n).astype(np.float64)


def cnn_8x8():
    """(N, 1, 8, 8) -conv 5x5 pad 2, pool 2-> (3, 4, 4) -conv 3x3 pad 1-> (4, 4, 4) -> 10: stage 1's halo
    is one row each side."""
    rng = np.random.default_rng(0)
    return Sequential(Conv2d(1, 3, 5, padding=2, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      Conv2d(3, 4, 3, padding=1, rng=rng, dtype="float64"), ReLU(),
                      Flatten(), Linear(64, 10, rng=rng, dtype="float64"))


@pytest.mark.task("6.6")
@pytest.mark.parallel(nprocs=[2, 3])
def test_halo_exchange_gives_each_rank_its_window_of_the_whole_map():
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    stage = Tiling.of(cnn_8x8(), 8, 8, comm.Get_size()).stages[1]          # the 4-row map, 3 channels
    whole = known_map(2, 3, stage.rows, stage.width)
    own_lo, own_hi = stage.owned[rank]
    need_lo, need_hi = stage.needed[rank]
    window = spatial_parallel.halo_exchange(comm, whole[:, :, own_lo:own_hi].copy(), stage)
    parallel_assert(window.shape == (2, 3, need_hi - need_lo, stage.width),
                    f"rank {rank}: window of shape {window.shape}, expected rows [{need_lo}, {need_hi})")
    parallel_assert(bool(np.array_equal(window, whole[:, :, need_lo:need_hi])),
                    f"rank {rank}: the window is not rows [{need_lo}, {need_hi}) of the map")


@pytest.mark.task("6.9")
@pytest.mark.parallel(nprocs=[2, 3])
def test_the_halo_gradient_returns_to_the_rows_owner_and_adds_up_as_on_the_whole_map():
    """Every rank's window gradient added into one whole map at the window's own rows (the oracle: a sum
    over ranks written with MPI's allgather), then rank r's rows of that map: whole numbers, so exact."""
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    stage = Tiling.of(cnn_8x8(), 8, 8, comm.Get_size()).stages[1]          # the 4-row map, 3 channels
    (own_lo, own_hi), (need_lo, need_hi) = stage.owned[rank], stage.needed[rank]
    rng = np.random.default_rng(rank)
    grad_window = rng.integers(-50, 50, size=(2, 3, need_hi - need_lo, stage.width)).astype(np.float64)
    sent = grad_window.copy()
    traced = TracedComm(comm)
    grad_tile = spatial_parallel.return_halo_gradient(traced, grad_window, stage)
    whole = np.zeros((2, 3, stage.rows, stage.width))
    for r, window in enumerate(comm.allgather(grad_window)):
        lo, hi = stage.needed[r]
        whole[:, :, lo:hi] += window
    parallel_assert(grad_tile.shape == (2, 3, own_hi - own_lo, stage.width),
                    f"rank {rank}: d tile of shape {grad_tile.shape}, expected my rows [{own_lo}, {own_hi})")
    parallel_assert(bool(np.array_equal(grad_tile, whole[:, :, own_lo:own_hi])),
                    f"rank {rank}: not rows [{own_lo}, {own_hi}) of the windows' gradients added on the whole map")
    parallel_assert(bool(np.array_equal(grad_window, sent)), f"rank {rank}: the window's gradient was changed")
    peers = {m.peer for m in traced.messages if m.direction == "send"}
    parallel_assert(peers <= {rank - 1, rank + 1}, f"rank {rank} sent to {sorted(peers)}: only neighbours")


@pytest.mark.task("6.7")
def test_f_is_the_identity_forward_and_the_sum_backward():
    total = Summing()
    x = Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    y = F.copy_to_parallel(x, total)
    assert np.array_equal(y.data, np.arange(6.0).reshape(2, 3)) and total.calls == 0, "f's forward is the identity"
    (y * Tensor(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))).sum().backward()
    assert total.calls == 1, f"f's backward sums once over the ranks, called total {total.calls} times"
    assert np.array_equal(x.grad, 3 * np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])), x.grad


@pytest.mark.task("6.8")
def test_g_is_the_sum_forward_and_the_identity_backward():
    total = Summing()
    x = Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    z = F.reduce_from_parallel(x, total)
    assert total.calls == 1, f"g's forward sums once over the ranks, called total {total.calls} times"
    assert np.array_equal(z.data, 3 * np.arange(6.0).reshape(2, 3)), z.data
    (z * Tensor(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))).sum().backward()
    assert total.calls == 1, "g's backward is the identity: no sum"
    assert np.array_equal(x.grad, np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])), x.grad


def loss_and_gradients(net, x, labels, segments):
    """(loss, flat parameter gradient, input gradient), with ``segments`` a list of layer ranges to
    run through ``checkpoint`` (the rest plainly)."""
    flat = flatten(net)
    flat.zero_grad()
    layers, inputs = list(net), Tensor(x, requires_grad=True)
    h, start = inputs, 0
    for lo, hi in segments + [(len(layers), len(layers))]:
        for layer in layers[start:lo]:
            h = layer(h)
        if hi > lo:
            h = checkpoint(Sequential(*layers[lo:hi]), h)
        start = hi
    loss = F.softmax_cross_entropy(h, labels)
    loss.backward()
    return float(loss.item()), flat.grad.copy(), inputs.grad.copy()


@pytest.mark.task("11.1")
def test_a_checkpointed_segment_gives_the_plain_backwards_gradients_bit_for_bit():
    rng = np.random.default_rng(3)
    x, labels = rng.standard_normal((6, 12)), rng.integers(0, 4, 6)
    plain = loss_and_gradients(float64_mlp_of([12, 9, 7, 4], seed=1), x, labels, [])
    for segments in ([(0, 2)], [(2, 5)], [(0, 3), (3, 5)]):
        got = loss_and_gradients(float64_mlp_of([12, 9, 7, 4], seed=1), x, labels, segments)
        assert got[0] == plain[0], f"{segments}: the loss changed"
        assert np.array_equal(got[1], plain[1]), f"{segments}: the parameters' gradients differ"
        assert np.array_equal(got[2], plain[2]), f"{segments}: the input's gradient differs"
