"""Stale-synchronous SGD on real MPI ranks: the bound holds, s = 0 is synchronous SGD, failures do not stall it.

That a deterministic run is its log replayed is checked by tests/hidden/test_ps_replay.py.
"""
import collections

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import ssp_sgd
from algorithms.core import objective
from algorithms.ps.worker import worker_batches
from minidl.flat import flatten
from minidl.optim import SGD
from minidl.tensor import Parameter
from tests.helpers import assert_stopped, clock_staleness_at_each_read, launch, ps_run, small_data


def test_the_recomputation_sees_a_read_that_broke_the_bound():
    # worker 1 reads after its 3rd push while worker 0 has pushed nothing: 3 clocks ahead
    Push = collections.namedtuple("Push", "worker")
    log = [("fetch", 0, 0), ("fetch", 1, 0), ("push", Push(1)), ("push", Push(1)), ("push", Push(1)),
           ("fetch", 1, 3), ("push", Push(0)), ("fetch", 0, 4), ("goodbye", 1), ("push", Push(0)), ("fetch", 0, 5)]
    assert clock_staleness_at_each_read(log, workers=2) == {0: [0, 0, 0], 1: [0, 3]}
    # a worker not heard from yet is at clock 0 and holds the minimum down
    assert clock_staleness_at_each_read([("push", Push(0)), ("fetch", 0, 1)], workers=2) == {0: [1]}


@pytest.mark.task("5.4")
@pytest.mark.parallel(nprocs=[2, 3, 4])
@settings(max_examples=5)
@given(staleness=st.integers(0, 3), seed=st.integers(0, 1000), deterministic=st.booleans(),
       two_servers=st.booleans())
def test_every_read_is_within_s_clocks_of_the_slowest_worker_by_the_servers_logs(staleness, seed, deterministic,
                                                                                 two_servers):
    comm = MPI.COMM_WORLD
    servers = 2 if two_servers and comm.size >= 3 else 1
    data, lr, epochs, batch = small_data(), 0.05, 2, 8
    workers = comm.size - servers
    report = {}
    ssp_sgd.train(comm, model="mlp", epochs=epochs, lr=lr, batch_size=batch, seed=seed, staleness=staleness,
                  servers=servers, deterministic=deterministic, timeout=None, quiet=True, data=data,
                  report=report)                          # timeout: see NO_DROPS in tests/test_downpour.py
    # every step of every worker reads once (the first before it, the others with the previous push)
    steps = [epochs * len(worker_batches(len(data.x_train), seed, 0, w, workers, batch)) for w in range(workers)]
    for log in report["logs"]:
        reads = clock_staleness_at_each_read(log, workers)
        parallel_assert([len(reads.get(w, [])) for w in range(workers)] == steps, f"reads {reads}, steps {steps}")
        worst = max(max(values) for values in reads.values())
        parallel_assert(worst <= staleness, f"a read {worst} clocks ahead of the slowest worker, s = {staleness}")
        # push j was computed at read j: the staleness the server logged with it is the recomputed one
        logged = {w: [e[1].clock_staleness for e in log if e[0] == "push" and e[1].worker == w] for w in reads}
        parallel_assert(logged == reads, f"the server logged {logged}, its events say {reads}")


def synchronous_sgd(data, model, seed, epochs, batch_size, lr, workers, ranges, logs):
    """w_{c+1} = w_c - lr * sum_w grad_w(w_c): every gradient of clock c at the same w_c.

    The gradients of one clock are applied one by one (as the servers do) in the order server k
    logged them, so float32 rounding matches; which w each is computed at is this function's own.
    """
    net = objective.build_model(model, seed)
    flat = flatten(net)
    steps = [[batch for epoch in range(epochs)
              for batch in worker_batches(len(data.x_train), seed, epoch, w, workers, batch_size)]
             for w in range(workers)]
    shards = []
    for start, stop in ranges:
        param = Parameter(flat.data[start:stop].copy())
        param.grad = np.zeros_like(param.data)
        shards.append((param, SGD([param], lr=lr)))
    orders = [[event[1].worker for event in log if event[0] == "push"] for log in logs]
    for clock in range(max(len(s) for s in steps)):
        w_c = np.concatenate([param.data for param, _ in shards])
        grads = {}
        for w in range(workers):
            if clock < len(steps[w]):
                flat.data[...] = w_c
                flat.zero_grad()
                objective.loss_and_grad(net, data.x_train[steps[w][clock]], data.y_train[steps[w][clock]])
                grads[w] = flat.grad.copy()
        for k, (start, stop) in enumerate(ranges):
            param, optimizer = shards[k]
            for _ in grads:
                w = orders[k].pop(0)
                param.grad[...] = grads[w][start:stop]     # KeyError if the log mixes clocks
                optimizer.step()
    return np.concatenate([param.data for param, _ in shards])


@pytest.mark.task("5.4")
@pytest.mark.parallel(nprocs=[2, 3, 4])
@pytest.mark.parametrize("servers", [1, 2])
def test_ssp_with_s_0_equals_synchronous_sgd(servers):
    comm = MPI.COMM_WORLD
    if servers >= comm.size:
        servers = 1
    data = small_data(n_train=100)        # 100 rows: unequal shards for 3 workers, so clocks end unevenly
    report = {}
    params, _ = ssp_sgd.train(comm, model="mlp", epochs=2, lr=0.05, batch_size=8, seed=1, staleness=0,
                              servers=servers, timeout=None, quiet=True, data=data,
                              report=report)              # timeout: see NO_DROPS in tests/test_downpour.py
    try:
        reference = synchronous_sgd(data, "mlp", 1, 2, 8, 0.05, comm.size - servers, report["layout"].ranges,
                                    report["logs"])
        message = f"max difference {np.abs(params - reference).max()} from synchronous SGD"
        equal = bool(np.array_equal(params, reference))
    except KeyError as error:
        equal, message = False, f"a clock's pushes were interleaved with another clock's: worker {error}"
    parallel_assert(equal, message)


@pytest.mark.task("5.6")
@pytest.mark.parallel(nprocs=[4])
def test_ssp_with_a_failed_worker_is_not_stalled_after_the_timeout():
    # s = 0 would wait for the silent worker forever; the servers drop it after 2 s instead, and the
    # other two workers train both epochs
    outcome = ps_run(ssp_sgd.train, MPI.COMM_WORLD, model="mlp", staleness=0, epochs=2, batch_size=8, servers=2,
                     fail_worker=3, fail_step=4, timeout=2.0, quiet=True, data=small_data())
    parallel_assert(outcome["error"] is None, f"the run raised {outcome['error']}")
    parallel_assert(outcome["lost"] == [(3, 4)], f"lost {outcome['lost']}, expected rank 3 after 4 applied steps")
    parallel_assert(outcome["history"] is not None and [h["epoch"] for h in outcome["history"]] == [1, 2],
                    f"history {outcome['history']}")


def test_negative_staleness_is_refused_on_every_rank():
    assert_stopped(launch("ssp_sgd", "--staleness", "-1", ranks=2, timeout=120), "--staleness must be an integer >= 0",
                   ranks=2)
