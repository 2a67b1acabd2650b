"""Hidden: a deterministic parameter-server run is its log replayed (Downpour: task 5.3, SSP: task 5.4).

The oracle, ps_replay.py, re-implements the server's update and the Downpour worker's schedule of
fetches and pushes (tasks 5.1 and 5.3), so these tests stay out of student trees. The visible tests
of the same runs are in tests/test_downpour.py and tests/test_ssp.py.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import downpour_sgd, ssp_sgd
from algorithms.core import objective
from minidl.flat import flatten
from tests.helpers import small_data
from tests.hidden import ps_replay


@pytest.mark.task("5.3")
@pytest.mark.parallel(nprocs=[2, 3, 4])
@settings(max_examples=4)
@given(seed=st.integers(0, 1000), two_servers=st.booleans(), n_fetch=st.integers(1, 3), n_push=st.integers(1, 3),
       optimizer=st.sampled_from(["sgd", "adagrad"]), warm_start=st.sampled_from([0, 4]))
def test_deterministic_downpour_equals_a_serial_replay_of_its_log(seed, two_servers, n_fetch, n_push, optimizer,
                                                                   warm_start):
    comm = MPI.COMM_WORLD
    servers = 2 if two_servers and comm.size >= 3 else 1
    data, lr, epochs, batch = small_data(), 0.05, 2, 8
    report = {}
    params, _ = downpour_sgd.train(comm, model="mlp", epochs=epochs, lr=lr, batch_size=batch, seed=seed,
                                   servers=servers, n_fetch=n_fetch, n_push=n_push, server_optimizer=optimizer,
                                   warm_start_steps=warm_start, deterministic=True, quiet=True, data=data,
                                   report=report)
    workers = comm.size - servers
    programs = [ps_replay.worker_program(w, workers, data, "mlp", seed, epochs, batch, lr, n_fetch, n_push)
                for w in range(workers)]
    initial = flatten(objective.build_model("mlp", seed)).data.copy()
    try:
        replayed = ps_replay.replay(report["logs"], report["layout"].ranges, initial, programs, optimizer, lr)
        message = f"max difference {np.abs(params - replayed).max()} from the replay"
        equal = bool(np.array_equal(params, replayed))
    except AssertionError as error:
        equal, message = False, f"the log cannot be replayed: {error}"
    parallel_assert(equal, message)
    # warm start: no fetch by another worker before worker 0 has pushed warm_start steps
    first_other = next((i for i, e in enumerate(report["logs"][0]) if e[0] == "fetch" and e[1] != 0), None)
    pushes_before = sum(1 for e in report["logs"][0][:first_other] if e[0] == "push")
    parallel_assert(first_other is None or pushes_before >= -(-warm_start // n_push),   # ceil(warm / n_push)
                    f"another worker started after {pushes_before} pushes of worker 0 (warm start {warm_start})")


@pytest.mark.task("5.4")
@pytest.mark.parallel(nprocs=[2, 3, 4])
@settings(max_examples=3)
@given(staleness=st.integers(0, 3), seed=st.integers(0, 1000), two_servers=st.booleans())
def test_deterministic_ssp_equals_a_serial_replay_of_its_log(staleness, seed, two_servers):
    comm = MPI.COMM_WORLD
    servers = 2 if two_servers and comm.size >= 3 else 1
    data, lr, epochs, batch = small_data(), 0.05, 2, 8
    workers = comm.size - servers
    report = {}
    params, _ = ssp_sgd.train(comm, model="mlp", epochs=epochs, lr=lr, batch_size=batch, seed=seed,
                              staleness=staleness, servers=servers, deterministic=True, quiet=True, data=data,
                              report=report)
    programs = [ps_replay.worker_program(w, workers, data, "mlp", seed, epochs, batch, lr, 1, 1)
                for w in range(workers)]
    initial = flatten(objective.build_model("mlp", seed)).data.copy()
    try:
        replayed = ps_replay.replay(report["logs"], report["layout"].ranges, initial, programs, "sgd", lr)
        message = f"max difference {np.abs(params - replayed).max()} from the replay"
        equal = bool(np.array_equal(params, replayed))
    except AssertionError as error:
        equal, message = False, f"the log cannot be replayed: {error}"
    parallel_assert(equal, message)
