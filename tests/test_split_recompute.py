"""--recompute on the split models: tensor_parallel (each block one checkpointed segment, g outside it)
and spatial_parallel (each conv stage recomputed in the backward, its halo exchanged again).

Run: python tests/run.py --max-ranks 3 -- tests/test_split_recompute.py

Messages. A tensor-parallel block's recomputed forward is f (the identity), the column Linear, the
ReLU and the row product: no message, so a step still holds g's allreduce and f's (none for the
block that reads the data). The spatial split's recomputed stage needs its halo again: the CNN
``same_cnn`` (tests/test_spatial_parallel.py) has one halo row of (N, 3 channels, 4 columns) per
tile boundary each way, sent in the forward, again in the backward's recompute, and as a gradient
back: 3 x 2 (P - 1) N 3 4 values of 8 bytes a step.

Hand counts of the saving (float32, 4 bytes a value, p = 2).
Tensor: Flatten, 64 -> 256 -> 16, 16 -> 256 -> 16 (two blocks: Megatron's wide hidden layer, narrow
output), ReLUs between, 16 -> 10. A rank's block keeps its (N, 128) column output and its ReLU's,
1024 bytes a row, 2048 for both blocks; recomputed, neither, and the backward records one block's
segment again: the column output, the ReLU and the (N, 16) row product, 1088 bytes a row. Saved:
960 bytes a row, 240 KiB at 256 rows. (A single block, as the MLP and LeNet-5 have, saves nothing:
the segment recorded again is the one that was dropped, plus its row product.)
Spatial, LeNet-5 at 64 rows: rank 0 owns pooled rows 0..7 of conv 1 (conv rows 0..14, its padded
window 18 x 32 of 1 channel) and 0..3 of conv 2 (conv rows 0..6 of 10, its input rows 0..10 of 14
in 6 channels). Per example, in values, stage 1 keeps its window 576, the conv output and the ReLU's
6 x 14 x 28 = 2352 each, the pooling's 4 window offsets and output 5 x 588: 8220; stage 2 keeps
840 + 960 + 960 + 5 x 240 = 3960. Recomputed: the two output tiles 588 + 240 and the larger
stage, 8220, against 12180: 3132 values, 783 KiB. Rank 1 (conv 2's rows 6..10, input rows 6..14):
stage 2 keeps 672 + 640 + 640 + 5 x 160 = 2752, saved 8220 + 2752 - (588 + 160 + 8220) = 2004
values, 501 KiB. The conv workspaces stay pooled either way.
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import spatial_parallel, tensor_parallel
from algorithms.core import tags
from algorithms.memory import measured
from collectives.trace import TracedComm
from minidl.data import rank_batches
from minidl.nn import Flatten, Linear, ReLU, Sequential
from tests.helpers import tiny_digits
from tests.test_spatial_parallel import same_cnn
from tests.test_tensor_parallel import SETTINGS, lenet_head, two_block_mlp

KIB = 1024


@pytest.mark.parallel(nprocs=[2, 3])
@pytest.mark.parametrize("model, allreduces_per_step", [(lenet_head, 2), (two_block_mlp, 3)],
                         ids=["lenet_head", "two_blocks"])
def test_tensor_parallel_recompute_gives_the_same_bits_with_the_same_allreduces(model, allreduces_per_step):
    comm = MPI.COMM_WORLD
    plain, _ = tensor_parallel.train(comm, model=model, data=tiny_digits(), **SETTINGS)
    traced = TracedComm(comm)
    recomputed, _ = tensor_parallel.train(traced, model=model, data=tiny_digits(), recompute=True, **SETTINGS)
    parallel_assert(np.array_equal(plain, recomputed), f"{model.__name__}: --recompute changed the parameters")
    steps = len(rank_batches(50, 5, 0, 1, 0, 0, "global"))
    sent = [m for m in traced.messages if m.direction == "send" and m.phase == "reduce-scatter"]
    parallel_assert(len(sent) == (comm.size - 1) * allreduces_per_step * steps,
                    f"{model.__name__}: {len(sent) / (comm.size - 1) / steps} allreduces a step with --recompute")


def wide_two_blocks():
    rng = np.random.default_rng(1)
    return Sequential(Flatten(), Linear(64, 256, rng=rng), ReLU(), Linear(256, 16, rng=rng), ReLU(),
                      Linear(16, 256, rng=rng), ReLU(), Linear(256, 16, rng=rng), ReLU(), Linear(16, 10, rng=rng))


def test_tensor_parallel_recompute_keeps_what_the_blocks_predict_less():
    plain, recomputed = (measured.tensor(MPI.COMM_SELF, "mlp", 2, 256, flag, net=wide_two_blocks())["activations"]
                         for flag in (False, True))
    assert abs(plain - recomputed - 240 * KIB) <= 0.1 * 240 * KIB, f"saved {(plain - recomputed) / KIB:.1f} KiB"


@pytest.mark.parallel(nprocs=[2, 3])
def test_spatial_recompute_gives_the_same_bits_and_sends_the_forward_halo_twice():
    comm, data = MPI.COMM_WORLD, tiny_digits(n_test=20)
    settings = dict(model=same_cnn, data=data, epochs=1, lr=0.1, momentum=0.9, batch_size=5, quiet=True)
    plain, _ = spatial_parallel.train(comm, **settings)
    traced = TracedComm(comm)
    recomputed, _ = spatial_parallel.train(traced, recompute=True, **settings)
    parallel_assert(np.array_equal(plain, recomputed), "--recompute changed the spatial split's parameters")
    sent = [m for m in traced.messages if m.direction == "send"]
    halo = comm.allreduce(sum(m.nbytes for m in sent if m.tag == tags.SPATIAL_HALO))
    parallel_assert(halo == 3 * 2 * (comm.size - 1) * 50 * 3 * 4 * 8, f"{halo} halo bytes in an epoch of 50 rows")
    tiling = spatial_parallel.Tiling.of(same_cnn(), 8, 8, comm.size)
    every = comm.allreduce(sum(m.nbytes for m in sent))
    formula = sum(spatial_parallel.bytes_per_step(tiling, 5, 8, recompute=True) for _ in range(10))
    parallel_assert(every == formula, f"{every} bytes sent, bytes_per_step says {formula}")


@pytest.mark.parallel(nprocs=[2])
def test_spatial_recompute_keeps_what_the_stages_predict_less():
    comm = MPI.COMM_WORLD
    plain, recomputed = (measured.spatial(comm, "lenet5", 64, flag)["activations"] for flag in (False, True))
    expected = (783, 501)[comm.rank] * KIB
    parallel_assert(abs(plain - recomputed - expected) <= 0.1 * expected,
                    f"rank {comm.rank}: saved {(plain - recomputed) / KIB:.1f} KiB, expected {expected / KIB:.0f}")
