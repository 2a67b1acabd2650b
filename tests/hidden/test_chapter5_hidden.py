"""Hidden: chapter 5's parameter server on 3, 5, 6 and 7 ranks, and its rules at their edges (tasks 5.1-5.6).

The visible tests run the servers on 2 to 4 ranks. Here: the server's update replayed from its
log with 2 to 3 servers, momentum and multi-step pushes (5.1); the stale-synchronous rule exactly
at s and one past it (5.2); Downpour and SSP replayed from their logs on 5 to 7 ranks (5.3, 5.4,
with tests/hidden/ps_replay.py); Hogwild!'s update on hand-made samples (5.5); and which workers
server 0 drops, one of each kind, with the drops told to the other servers (5.6).
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import downpour_sgd, hogwild, ssp_sgd
from algorithms.core import objective, run
from algorithms.ps import server as parameter_server
from algorithms.ps.server import ShardServer
from algorithms.ps.wire import Layout, ServerShards, Stopped
from minidl.flat import flatten
from minidl.optim import SGD, Adagrad
from minidl.tensor import Parameter
from tests.handed import HandProblem
from tests.helpers import drop_silent_scenario, small_data
from tests.hidden import ps_replay

# ---- 5.1: the server's update ------------------------------------------------------------------------

def pushed(worker, push, n):
    return np.random.default_rng([17, worker, push]).standard_normal(n)


@pytest.mark.task("5.1")
@pytest.mark.parallel(nprocs=[5, 6, 7])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_several_servers_apply_multi_step_pushes_as_one_optimizer_and_log_what_each_read(optimizer):
    comm = MPI.COMM_WORLD
    servers = 2 if comm.size == 5 else 3
    n, pushes, lr, momentum = 23, 3, 0.1, (0.5 if optimizer == "sgd" else 0.0)
    layout = Layout.make(comm.size, servers, n)
    initial = np.random.default_rng(2).standard_normal(n)
    if layout.is_server(comm.rank):
        server = ShardServer(comm, layout, initial, optimizer, lr, momentum=momentum, schedule_seed=5)
        server.serve()
        mine = (server.param.data.copy(), server.log, dict(server.steps), dict(server.clock), server.failure)
    else:
        worker = comm.rank - servers
        client = ServerShards(comm, layout, np.float64)
        params = np.empty(n)
        try:
            for push in range(pushes):          # worker w's push k sums w + k + 1 steps; odd workers fetch
                client.push(pushed(worker, push, n), worker + push + 1, fetch_into=params if worker % 2 else None)
        except Stopped:                         # a server's update raised (server.failure, said below on every
            pass                                # rank): finish the protocol, so no rank waits for the timeout
        client.goodbye()
        run.wait_together(comm)
        mine = None
    parts = comm.allgather(mine)[:servers]
    failures = [part[-1] for part in parts if part[-1] is not None]
    parallel_assert(not failures, f"a server failed: {failures[:1]}")
    whole = Parameter(initial.copy())
    whole.grad = np.zeros(n)
    reference = Adagrad([whole], lr=lr) if optimizer == "adagrad" else SGD([whole], lr=lr, momentum=momentum)
    count = {}
    for event in parts[0][1]:
        if event[0] == "push":
            worker = event[1].worker
            whole.grad[...] = pushed(worker, count.setdefault(worker, 0), n)
            count[worker] += 1
            reference.step()
    result = np.concatenate([part[0] for part in parts])
    parallel_assert(float(np.max(np.abs(result - whole.data))) <= 1e-13,
                    f"{optimizer}: the shards differ from one optimizer over the log's pushes")
    workers = layout.workers
    for index, (_, log, steps, clock, _) in enumerate(parts):
        expected_steps = {w: sum(w + k + 1 for k in range(pushes)) for w in range(workers)}
        parallel_assert(steps == expected_steps, f"server {index}: steps {steps}, expected {expected_steps}")
        parallel_assert(clock == {w: pushes for w in range(workers)}, f"server {index}: clocks {clock}")
        # replay the log: what each worker last read (version, min clock of the live workers)
        clocks, finished, read, version = {w: 0 for w in range(workers)}, set(), {}, 0
        for event in log:
            if event[0] == "fetch":
                live = [clocks[w] for w in clocks if w not in finished]
                read[event[1]] = (event[2], min(live))
            elif event[0] == "goodbye":
                finished.add(event[1])
            elif event[0] == "push":
                update = event[1]
                want = (update.worker, read.get(update.worker, (0, 0))[0], version, clocks[update.worker],
                        clocks[update.worker] - read.get(update.worker, (0, 0))[1])
                got = (update.worker, update.version_read, update.version, update.clock, update.clock_staleness)
                parallel_assert(got == want, f"server {index}: logged {got}, expected {want}")
                clocks[update.worker] += 1
                version += 1


# ---- 5.2: the stale-synchronous rule -----------------------------------------------------------------

@pytest.mark.task("5.2")
@pytest.mark.parametrize("clock, clocks, staleness, expected", [
    (5, [5, 2, 4], 3, True),             # exactly s = 3 ahead of the slowest
    (6, [6, 2, 4], 3, False),            # s + 1 ahead
    (7, [3, 7, 9, 3, 5], 4, True),       # five workers, the slowest twice, exactly s
    (8, [3, 8, 9, 3, 5], 4, False),
    (2, [9, 2, 4], 0, True),             # the slowest asks (another is far ahead): always allowed
    (10**6, [10**6, 0], None, True),     # no bound at any gap
    (1, [1, 0], 1, True),                # s = 1 at a gap of 1
    (0, [0], 0, True),                   # one worker at clock 0
])
def test_may_proceed_at_exactly_s_and_one_past_it(clock, clocks, staleness, expected):
    assert parameter_server.may_proceed(clock, clocks, staleness) is expected


@pytest.mark.task("5.2")
def test_may_proceed_reads_the_clocks_of_a_dict_view_of_the_live_workers():
    clocks = {0: 4, 1: 1, 2: 3}
    assert parameter_server.may_proceed(4, clocks.values(), 3) is True
    assert parameter_server.may_proceed(4, clocks.values(), 2) is False


# ---- 5.3 and 5.4: Downpour and SSP replayed on 5 to 7 ranks ------------------------------------------

def replayed(comm, report, data, seed, epochs, batch, lr, servers, n_fetch, n_push, optimizer="sgd"):
    workers = comm.size - servers
    programs = [ps_replay.worker_program(w, workers, data, "mlp", seed, epochs, batch, lr, n_fetch, n_push)
                for w in range(workers)]
    initial = flatten(objective.build_model("mlp", seed)).data.copy()
    return ps_replay.replay(report["logs"], report["layout"].ranges, initial, programs, optimizer, lr)


@pytest.mark.task("5.3")
@pytest.mark.parallel(nprocs=[5, 6, 7])
@pytest.mark.parametrize("n_fetch,n_push", [(1, 2), (3, 1)])
def test_downpour_on_p_ranks_with_two_servers_is_its_log_replayed(n_fetch, n_push):
    # 40 rows over 3 to 5 workers at batch 4: shards of 8 to 14 rows, last batches of 2 to 4 rows
    comm = MPI.COMM_WORLD
    data, lr, epochs, batch, seed = small_data(n_train=40, n_test=10), 0.05, 1, 4, 3
    report = {}
    params, _ = downpour_sgd.train(comm, model="mlp", epochs=epochs, lr=lr, batch_size=batch, seed=seed, servers=2,
                                   n_fetch=n_fetch, n_push=n_push, server_optimizer="sgd", deterministic=True,
                                   quiet=True, data=data, report=report)
    try:
        expected = replayed(comm, report, data, seed, epochs, batch, lr, 2, n_fetch, n_push)
        message = f"max difference {np.abs(params - expected).max()} from the replay"
        equal = bool(np.array_equal(params, expected))
    except AssertionError as error:
        equal, message = False, f"the log cannot be replayed: {error}"
    parallel_assert(equal, f"p={comm.size}, n_fetch={n_fetch}, n_push={n_push}: {message}")


@pytest.mark.task("5.4")
@pytest.mark.parallel(nprocs=[5, 6, 7])
@pytest.mark.parametrize("staleness", [0, 2])
def test_ssp_on_p_ranks_is_its_log_replayed_and_no_read_is_more_than_s_behind(staleness):
    comm = MPI.COMM_WORLD
    data, lr, epochs, batch, seed = small_data(n_train=40, n_test=10), 0.05, 1, 4, 4
    servers = 1 if comm.size == 5 else 2
    report = {}
    params, _ = ssp_sgd.train(comm, model="mlp", epochs=epochs, lr=lr, batch_size=batch, seed=seed,
                              staleness=staleness, servers=servers, deterministic=True, quiet=True, data=data,
                              report=report)
    try:
        expected = replayed(comm, report, data, seed, epochs, batch, lr, servers, 1, 1)
        message = f"max difference {np.abs(params - expected).max()} from the replay"
        equal = bool(np.array_equal(params, expected))
    except AssertionError as error:
        equal, message = False, f"the log cannot be replayed: {error}"
    parallel_assert(equal, f"p={comm.size}, s={staleness}: {message}")
    worst = max((e[1].clock_staleness for log in report["logs"] for e in log if e[0] == "push"), default=0)
    parallel_assert(worst <= staleness, f"a gradient was computed {worst} clocks ahead of the slowest (s={staleness})")


# ---- 5.5: one Hogwild! update ----------------------------------------------------------------------

@pytest.mark.task("5.5")
@pytest.mark.parametrize("e,dtype", [(0, np.float64), (1, np.float64), (2, np.float32)])
def test_hogwild_step_moves_only_the_samples_coordinates_in_place(e, dtype):
    index = np.array([[0, 3, 5], [7, 1, 2], [6, 4, 0]])
    targets = np.array([[1.0, -2.0, 4.0], [0.5, 0.5, -1.0], [3.0, 2.0, 1.0]])
    w = np.arange(8, dtype=dtype) / 4
    before, alias = w.copy(), w
    hogwild.hogwild_step(w, HandProblem(index, targets.astype(dtype)), e, 0.25)
    expected = before.copy()
    support = index[e]
    expected[support] = before[support] - 0.25 * (2.0 * before[support] - targets[e])   # hand-worked update
    assert w is alias and w.dtype == dtype
    np.testing.assert_allclose(w, expected, rtol=1e-6 if dtype == np.float32 else 1e-15)
    untouched = np.setdiff1d(np.arange(8), support)
    np.testing.assert_array_equal(w[untouched], before[untouched])


@pytest.mark.task("5.5")
def test_two_hogwild_steps_on_overlapping_supports_read_the_first_ones_write():
    index = np.array([[0, 1], [1, 2]])
    problem = HandProblem(index, np.array([[2.0, 2.0], [2.0, 2.0]]))
    w = np.zeros(3)
    hogwild.hogwild_step(w, problem, 0, 0.5)      # w[0, 1] <- 0 - 0.5 (0 - 2) = 1
    hogwild.hogwild_step(w, problem, 1, 0.5)      # w[1] <- 1 - 0.5 (2 - 2) = 1; w[2] <- 1
    np.testing.assert_array_equal(w, [1.0, 1.0, 1.0])


# ---- 5.6: dropping a silent worker -----------------------------------------------------------------

ROLES = ("silent", "held", "recent", "finished")


@pytest.mark.task("5.6")
@pytest.mark.parallel(nprocs=[3, 5, 6, 7])
def test_server_zero_drops_exactly_the_silent_workers_and_tells_the_other_servers():
    # one worker of each kind: silent past the timeout (dropped), held by the server, heard from
    # recently, finished, and the last one silent but with a request in server 0's queue (kept)
    comm = MPI.COMM_WORLD
    servers = {3: 1, 5: 1, 6: 2, 7: 2}[comm.size]
    workers = comm.size - servers
    roles = {w: ROLES[w % len(ROLES)] for w in range(workers - 1)}
    roles[workers - 1] = "queued"
    outcome = drop_silent_scenario(comm, servers, roles)
    dropped, logged, told = outcome["dropped"], outcome["logged"], outcome["told"]
    silent = sorted(w for w, role in roles.items() if role == "silent")
    parallel_assert(dropped == silent and logged == silent,
                    f"p={comm.size}: dropped {dropped} (logged {logged}), expected the silent workers {silent}")
    parallel_assert(outcome["refreshed"], "a worker with a request waiting was not counted as heard from")
    parallel_assert(told is None or told == [{"drop": w} for w in silent],
                    f"server {comm.rank} was told {told}, expected the drops of {silent}")
