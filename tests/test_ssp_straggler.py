"""SSP with a straggler (``--straggler R --straggler-delay D``): the bound still holds, bad values are refused.

The straggler only sleeps before its steps; the bound is enforced by the servers as always. With one
worker slow, the fast workers run ahead until the bound stops them, so this is where a broken gate
would show: the servers' logs are recomputed by ``clock_staleness_at_each_read`` (tests/helpers.py,
tested in tests/test_ssp.py).
"""
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import ssp_sgd
from tests.helpers import assert_stopped, clock_staleness_at_each_read, launch, small_data


@pytest.mark.task("5.4")
@pytest.mark.parallel(nprocs=[4])
def test_with_a_straggler_no_read_is_more_than_s_clocks_ahead_and_the_straggler_does_every_step():
    comm = MPI.COMM_WORLD
    data, workers = small_data(), comm.size - 1
    for staleness in (0, 1, 2):
        report = {}
        ssp_sgd.train(comm, model="mlp", epochs=2, lr=0.05, batch_size=8, seed=staleness, staleness=staleness,
                      straggler=comm.size - 1, straggler_delay=0.005, timeout=None, quiet=True, data=data,
                      report=report)
        reads = clock_staleness_at_each_read(report["logs"][0], workers)
        worst = max(max(values) for values in reads.values())
        parallel_assert(worst <= staleness, f"a read {worst} clocks ahead of the slowest worker, s = {staleness}")
        steps = [len(reads.get(w, [])) for w in range(workers)]
        parallel_assert(len(set(steps)) == 1 and steps[0] > 0, f"every worker reads once per step: {steps}")


@pytest.mark.parametrize("flags, message", [
    (["--straggler", "0", "--straggler-delay", "0.1"], "--straggler must be an integer >= 1"),   # a server
    (["--straggler", "1", "--straggler-delay", "-1"], "--straggler-delay must be a finite number >= 0"),
])
def test_a_bad_straggler_is_refused_on_every_rank_before_training(flags, message):
    assert_stopped(launch("ssp_sgd", "--epochs", "1", *flags, ranks=2), message, ranks=2)
