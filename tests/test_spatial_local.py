"""DistBelief's locally connected split: each rank owns its region's weights and equals the whole network, P = 1..4.

Run: python tests/run.py --max-ranks 4 -- tests/test_spatial_local.py

The float64 network (N, 1, 8, 8) -local 3x3 pad 1-> (3, 8, 8) -pool-> (3, 4, 4) -local 3x3 pad 1-> (4, 4, 4)
-> 64 -> 10 (4,362 parameters) tiles its 4-row maps as 2+2, 2+1+1 and 1+1+1+1 rows. Rank r owns the
weights of the output rows it computes: 8 x 3 x 9 + 8 x 3 values per row of the first layer's 8 (before
pooling), 4 x 4 x 3 x 9 + 4 x 4 per row of the second's 4, and 16 rows of the head's 64 x 10 weights per
row of the last map; the head's 10 biases on rank 0. Tolerance: the order of additions differs from
serial SGD's in the halo rows' input gradients and in the logits (a sum over ranks of partial
products): EQUAL_UP_TO_ROUNDING, float64.
"""
import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import spatial_parallel
from algorithms.core import tags
from algorithms.core.cli import SettingError
from algorithms.core.objective import NetworkObjective
from algorithms.shards.regions import Region
from algorithms.shards.tiling import Tiling
from collectives.tags import ALLGATHER, REDUCE_SCATTER
from collectives.trace import TracedComm
from minidl.nn import Flatten, Linear, LocallyConnected2d, MaxPool2d, ReLU, Sequential
from tests.handed import in_place_total
from tests.helpers import (
    EQUAL_UP_TO_ROUNDING,
    assert_stopped,
    launch,
    parallel_assert_close,
    serial_reference,
    tiny_digits,
)

ROWS = np.arange(12)


def local_net():
    rng = np.random.default_rng(6)
    return Sequential(LocallyConnected2d(1, 3, 3, (8, 8), padding=1, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      LocallyConnected2d(3, 4, 3, (4, 4), padding=1, rng=rng, dtype="float64"), ReLU(),
                      Flatten(), Linear(64, 10, rng=rng, init="glorot", dtype="float64"))


def my_share(p, rank):
    """The parameters rank ``rank`` owns, counted from the network's shapes: its pooled rows of the 4-row
    maps (the first ranks one more), 2 rows of the first layer's output each, 1 of the second's, and
    4 channels x 4 columns of head features each."""
    rows = 4 // p + (rank < 4 % p)
    return 2 * rows * (8 * 3 * 9 + 8 * 3) + rows * (4 * 4 * 3 * 9 + 4 * 4) + 16 * rows * 10 + (10 if rank == 0 else 0)


@pytest.mark.task("11.2")
@pytest.mark.parallel(nprocs=[1, 2, 3, 4])
def test_the_locally_connected_split_equals_the_whole_network_and_owns_only_its_region():
    comm, data = MPI.COMM_WORLD, tiny_digits(n_test=20)
    p, rank = comm.size, comm.rank
    whole = NetworkObjective(local_net(), data)
    loss = whole.loss_and_grad(ROWS)
    serial = local_net()
    tiling = Tiling.of(serial, 8, 8, p, layer=LocallyConnected2d)
    traced = TracedComm(comm)
    split = Region(tiling, serial, rank)
    split.flat.zero_grad()
    got = spatial_parallel.local_gradient(traced, tiling, split, data.x_train[ROWS], data.y_train[ROWS],
                                          in_place_total(traced))
    gradient, = split.gather(comm, [split.flat.grad])
    parallel_assert(abs(got - loss) <= 1e-12 * abs(loss), f"P={p}: loss {got} != {loss}")
    parallel_assert_close(gradient, whole.grad, EQUAL_UP_TO_ROUNDING, f"P={p}: gradient")
    # the region's weights only: 1/P of the 4,362 parameters, up to the tiles' uneven rows
    parallel_assert(split.flat.size == my_share(p, rank) and comm.allreduce(split.flat.size) == whole.params.size,
                    f"P={p} rank {rank}: owns {split.flat.size} parameters, expected {my_share(p, rank)}")
    # on the wire: the halo rows forward and back, and the logits' ring allreduce; no weight, no map
    sent = [m for m in traced.messages if m.direction == "send"]
    by_tag = {tag: comm.allreduce(sum(m.nbytes for m in sent if m.tag == tag))
              for tag in (tags.SPATIAL_HALO, REDUCE_SCATTER, ALLGATHER)}
    parallel_assert({m.tag for m in sent} <= {tags.SPATIAL_HALO, REDUCE_SCATTER, ALLGATHER}, "other messages")
    parallel_assert(by_tag[tags.SPATIAL_HALO] == tiling.halo_bytes(len(ROWS), 8), f"halo bytes {by_tag}")
    parallel_assert(by_tag[REDUCE_SCATTER] == by_tag[ALLGATHER] == (p - 1) * len(ROWS) * 10 * 8,
                    f"P={p}: the logits' allreduce: {by_tag}")
    params, _ = spatial_parallel.train(comm, layer="local", model=local_net, data=data, epochs=1, lr=0.1,
                                       momentum=0.9, batch_size=5, quiet=True)
    expected = serial_reference(data, epochs=1, lr=0.1, momentum=0.9, batch_size=5, model=local_net)
    parallel_assert_close(params, expected, EQUAL_UP_TO_ROUNDING, f"P={p}: 10 SGD steps")


def test_a_network_without_locally_connected_stages_and_recompute_are_refused_on_every_rank():
    done = launch("spatial_parallel", "--layer", "local", "--model", "mlp", "--epochs", "1", ranks=2)
    assert_stopped(done, "--layer local trains a locally connected network", ranks=2)
    done = launch("spatial_parallel", "--layer", "local", "--recompute", "--epochs", "1", ranks=2)
    assert_stopped(done, "--recompute is not offered with --layer local", ranks=2)
    with pytest.raises(SettingError, match="must start with a LocallyConnected2d"):
        spatial_parallel.train(MPI.COMM_SELF, layer="local", model=lambda: Sequential(Flatten(), Linear(
            64, 10, rng=np.random.default_rng(0))), quiet=True)


class Watched(Region):
    """The Region train() makes, remembering what the serial model's optimizer and the run's copy of
    --resume's file held once it took over (``left``), and after each gather of the model (``seen``)."""
    made = []

    def take_over(self, run, optimizer):
        super().take_over(run, optimizer)
        self.run, self.seen = run, []
        large = [key for key, value in run.checkpoint.items() if np.size(value) > 1]
        self.left = sorted(run.optimizer.state[0]) + large
        Watched.made.append(self)

    def saved(self, comm, optimizer, whole, state=False):
        params = super().saved(comm, optimizer, whole, state)
        self.seen.append(sorted(whole.state[0]))
        return params


@pytest.mark.parallel(nprocs=[2])
def test_a_saved_split_resumes_bit_for_bit_and_holds_the_whole_model_only_to_write_it(monkeypatch):
    """2 epochs unbroken, and 1 saved then 1 resumed: the same bits. The end gathers the weights on every
    rank (train()'s return) and the momentum only for --save, onto rank 0, which writes it; a resumed run
    keeps nothing whole of the file once its region has taken over."""
    comm, data = MPI.COMM_WORLD, tiny_digits(n_test=20)
    folder = comm.bcast(tempfile.mkdtemp(prefix="minidl-local-") if comm.rank == 0 else None, root=0)
    ck = os.path.join(folder, "local.npz")
    monkeypatch.setattr(spatial_parallel, "Region", Watched)
    common = dict(layer="local", model=local_net, data=data, lr=0.1, momentum=0.9, batch_size=5, quiet=True)
    results = {}
    for name, flags in (("unbroken", dict(epochs=2)), ("saved", dict(epochs=1, save=ck)),
                        ("resumed", dict(epochs=2, resume=ck))):
        Watched.made.clear()
        results[name], _ = spatial_parallel.train(comm, **common, **flags)
        region = Watched.made[0]
        gathered = ["momentum"] if name == "saved" and comm.rank == 0 else []
        parallel_assert(region.seen == [gathered], f"{name}: the whole momentum held at the end: {region.seen}")
        parallel_assert(not region.left, f"{name}: kept whole after the take-over: {region.left}")
        parallel_assert(not region.run.optimizer.state[0], f"{name}: the whole momentum outlived the run")
    parallel_assert(bool(np.array_equal(results["resumed"], results["unbroken"])), "the resumed run differs")
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(folder)
