"""The sharded parameter server: its ranges, its optimizer, its protocol on real MPI ranks."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms.core import run
from algorithms.ps import server as parameter_server, wire as ps_wire
from algorithms.ps.server import ShardServer
from algorithms.ps.wire import Layout, ServerShards, Stopped
from minidl import backend
from minidl.optim import SGD, Adagrad
from minidl.tensor import Parameter


@given(n=st.integers(1, 2000), data=st.data())
def test_server_ranges_cover_the_whole_vector_with_no_overlap(n, data):
    servers = data.draw(st.integers(1, min(n, 64)))
    ranges = ps_wire.shard_ranges(n, servers)
    covered = np.zeros(n, dtype=np.int64)
    for start, stop in ranges:
        covered[start:stop] += 1
    assert (covered == 1).all()                                         # union is everything, once
    assert [start for start, _ in ranges] == [0] + [stop for _, stop in ranges[:-1]]   # contiguous, in order
    lengths = [stop - start for start, stop in ranges]
    assert len(ranges) == servers and min(lengths) >= 1 and max(lengths) - min(lengths) <= 1


def test_impossible_layouts_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="cannot hold 2 server"):
        Layout.make(size=2, servers=2, n_params=10)
    with pytest.raises(ValueError, match="more than the 10 parameters"):
        Layout.make(size=20, servers=11, n_params=10)
    with pytest.raises(ValueError, match="--servers must be an integer >= 1"):
        Layout.make(size=4, servers=0, n_params=10)


@pytest.mark.task("5.2")
@pytest.mark.parametrize("clock, clocks, staleness, expected", [
    (3, [3, 0], 2, False),           # 3 clocks ahead of the slowest: one too many for s = 2
    (2, [2, 0], 2, True),            # exactly s ahead: may proceed
    (99, [99, 0], None, True),       # no bound: asynchronous
    (0, [0, 0, 0], 0, True),         # s = 0: everyone at the same clock proceeds ...
    (1, [1, 0, 1], 0, False),        # ... and nobody runs ahead of the slowest
    (0, [0, 5, 7], 0, True),         # the slowest worker itself always may
    (4, [4], 0, True),               # the only worker left
    (6, [2, 6, 3], 3, False),        # the minimum, not the asking worker's neighbour, counts
    (5, [2, 5, 3], 3, True),
])
def test_may_proceed_is_the_stale_synchronous_condition(clock, clocks, staleness, expected):
    assert parameter_server.may_proceed(clock=clock, clocks=clocks, staleness=staleness) is expected


def gradient(seed, worker, push, n):
    """The gradient worker ``worker`` pushes the ``push``-th time: rank-dependent, reproducible."""
    return np.random.default_rng([seed, worker, push]).standard_normal(n).astype(np.float32)


@pytest.mark.task("5.1")
@pytest.mark.parallel(nprocs=[2, 3, 4])
@settings(max_examples=6)
@given(seed=st.integers(0, 10**6), n=st.integers(3, 40), pushes=st.integers(1, 6),
       optimizer=st.sampled_from(["adagrad", "sgd"]), two_servers=st.booleans(), fetch=st.booleans())
def test_server_side_optimizer_equals_minidl_optimizer_on_the_same_gradient_sequence(seed, n, pushes, optimizer,
                                                                                    two_servers, fetch):
    comm = MPI.COMM_WORLD
    servers = 2 if two_servers and comm.size >= 3 else 1
    layout = Layout.make(comm.size, servers, n)
    initial = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    lr = 0.1
    if layout.is_server(comm.rank):
        # a seeded schedule, so the order of the pushes is known from the log on every rank
        server = ShardServer(comm, layout, initial, optimizer, lr, schedule_seed=seed)
        server.serve()
        mine = (backend.to_numpy(server.param.data), server.log, server.failure)
    else:
        worker = comm.rank - layout.servers
        client = ServerShards(comm, layout, np.float32)
        params = np.empty(n, dtype=np.float32)
        try:
            for push in range(pushes):
                client.push(gradient(seed, worker, push, n), 1, fetch_into=params if fetch else None)
        except Stopped:              # the server's update raised (server.failure): finish the protocol
            pass
        client.goodbye()
        run.wait_together(comm)
        mine = None
    parts = comm.allgather(mine)[:servers]
    gathered = [(shard, log) for shard, log, _ in parts]
    failures = [failure for *_, failure in parts if failure is not None]
    if failures:                     # every rank fails the same example (hypothesis stays in step)
        raise failures[0]
    result = np.concatenate([shard for shard, _ in gathered])
    # the same gradients, in server 0's order, through minidl's optimizer on the whole vector
    whole = Parameter(initial.copy())
    whole.grad = np.zeros(n, dtype=np.float32)
    reference = Adagrad([whole], lr=lr) if optimizer == "adagrad" else SGD([whole], lr=lr)
    count = {}
    for event in gathered[0][1]:
        if event[0] == "push":
            worker = event[1].worker
            whole.grad[...] = gradient(seed, worker, count.setdefault(worker, 0), n)
            count[worker] += 1
            reference.step()
    parallel_assert(sum(count.values()) == pushes * layout.workers, f"{count} pushes applied")
    parallel_assert(bool(np.array_equal(result, whole.data)),
                    f"max difference {np.abs(result - whole.data).max()} from minidl's {optimizer}")
    orders = [[(e[1].worker, e[1].version) for e in log if e[0] == "push"] for _, log in gathered]
    parallel_assert(all(order == orders[0] for order in orders), "servers applied pushes in different orders")
    # each logged update: the shard's versions count the pushes, each worker's clocks its own pushes
    for _, log in gathered:
        updates = [e[1] for e in log if e[0] == "push"]
        parallel_assert([u.version for u in updates] == list(range(len(updates))), "versions are not 0, 1, 2, ...")
        clocks = {}
        for update in updates:
            parallel_assert(update.clock == clocks.get(update.worker, 0), f"worker {update.worker}'s clock")
            clocks[update.worker] = update.clock + 1
            parallel_assert(0 <= update.version_read <= update.version and update.staleness >= 0,
                            f"read at version {update.version_read}, applied at {update.version}")
