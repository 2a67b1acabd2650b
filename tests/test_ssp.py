"""Stale-synchronous SGD on real MPI ranks: the bound holds, s = 0 is synchronous SGD, failures do not stall it."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import common, ps_job, ssp_sgd
from minidl.flat import flatten
from minidl.optim import SGD
from minidl.tensor import Parameter
from tests import ps_replay
from tests.test_downpour import mpiexec, small_data


@pytest.mark.parallel(nprocs=[2, 3, 4])
@settings(max_examples=5)
@given(staleness=st.integers(0, 3), seed=st.integers(0, 1000), deterministic=st.booleans(),
       two_servers=st.booleans())
def test_every_logged_clock_staleness_is_at_most_s(staleness, seed, deterministic, two_servers):
    comm = MPI.COMM_WORLD
    servers = 2 if two_servers and comm.size >= 3 else 1
    data, lr, epochs, batch = small_data(), 0.05, 2, 8
    report = {}
    params, history = ssp_sgd.train(comm, model="mlp", epochs=epochs, lr=lr, batch_size=batch, seed=seed,
                                     staleness=staleness, servers=servers, deterministic=deterministic,
                                     quiet=True, data=data, report=report)
    updates = [event[1] for log in report["logs"] for event in log if event[0] == "push"]
    worst = max(update.clock_staleness for update in updates)
    parallel_assert(worst <= staleness, f"a clock staleness of {worst} > s = {staleness}")
    parallel_assert(all(h["clock_staleness_max"] <= staleness for h in history), f"{history}")
    if deterministic:    # a deterministic SSP run is also its log replayed
        workers = comm.size - servers
        programs = [ps_replay.worker_program(w, workers, data, "mlp", seed, epochs, batch, lr, 1, 1)
                    for w in range(workers)]
        initial = flatten(common.build_model("mlp", seed)).data.copy()
        replayed = ps_replay.replay(report["logs"], report["layout"].ranges, initial, programs, "sgd", lr)
        parallel_assert(bool(np.array_equal(params, replayed)), "the deterministic SSP run differs from its replay")


def synchronous_sgd(data, model, seed, epochs, batch_size, lr, workers, ranges, logs):
    """w_{c+1} = w_c - lr * sum_w grad_w(w_c): every gradient of clock c at the same w_c.

    The gradients of one clock are applied one by one (as the servers do) in the order server k
    logged them, so float32 rounding matches; which w each is computed at is this function's own.
    """
    net = common.build_model(model, seed)
    flat = flatten(net)
    steps = [[batch for epoch in range(epochs)
              for batch in ps_job.worker_batches(len(data.x_train), seed, epoch, w, workers, batch_size)]
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
                common.loss_and_grad(net, data.x_train[steps[w][clock]], data.y_train[steps[w][clock]])
                grads[w] = flat.grad.copy()
        for k, (start, stop) in enumerate(ranges):
            param, optimizer = shards[k]
            for _ in grads:
                w = orders[k].pop(0)
                param.grad[...] = grads[w][start:stop]     # KeyError if the log mixes clocks
                optimizer.step()
    return np.concatenate([param.data for param, _ in shards])


@pytest.mark.parallel(nprocs=[2, 3, 4])
@pytest.mark.parametrize("servers", [1, 2])
def test_ssp_with_s_0_equals_synchronous_sgd(servers):
    comm = MPI.COMM_WORLD
    if servers >= comm.size:
        servers = 1
    data = small_data(n_train=100)        # 100 rows: unequal shards for 3 workers, so clocks end unevenly
    report = {}
    params, _ = ssp_sgd.train(comm, model="mlp", epochs=2, lr=0.05, batch_size=8, seed=1, staleness=0,
                              servers=servers, quiet=True, data=data, report=report)
    try:
        reference = synchronous_sgd(data, "mlp", 1, 2, 8, 0.05, comm.size - servers, report["layout"].ranges,
                                    report["logs"])
        message = f"max difference {np.abs(params - reference).max()} from synchronous SGD"
        equal = bool(np.array_equal(params, reference))
    except KeyError as error:
        equal, message = False, f"a clock's pushes were interleaved with another clock's: worker {error}"
    parallel_assert(equal, message)


def test_ssp_with_a_failed_worker_is_not_stalled_after_the_timeout():
    # s = 0 would wait for the silent worker forever; the servers drop it after 2 s instead
    done = mpiexec(4, "-m", "algorithms.ssp_sgd", "--staleness", "0", "--epochs", "2", "--servers", "2",
                   "--fail-worker", "3", "--fail-step", "4", "--timeout", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "lost worker: rank 3 after 4 applied steps" in done.stdout
    assert done.stdout.count("test_accuracy") == 2


def test_negative_staleness_is_refused_on_every_rank():
    done = mpiexec(2, "-m", "algorithms.ssp_sgd", "--staleness", "-1")
    assert done.returncode == 2 and done.stderr.count("error: --staleness must be an integer >= 0") == 2
