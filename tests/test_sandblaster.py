"""Sandblaster L-BFGS (algorithms/sandblaster_lbfgs.py), tied to serial full-batch L-BFGS.

Run: python tests/run.py --max-ranks 4 -- tests/test_sandblaster.py

- The sharded two-loop recursion equals ``minidl.optim.two_loop_direction`` (serial, in process:
  the real shard code, 1..3 shards).
- The scheduler: deterministic portions go to worker i mod W; a straggler's portions are backed
  up once the threshold is passed, the first push wins and every other copy is discarded and counted.
- On real ranks (p = 3, 4; p = 5, 6 work too but are left out of CI for time): a deterministic run
  equals serial ``minidl.optim.LBFGS`` on a least-squares problem to 1e-10 in float64, so does a
  run with backup tasks and a straggler, and the coordinator's messages are all small (commands
  and numbers: the largest is far below one shard's slice of the vector).
- The error contract of the new flags (mpiexec subprocesses).

Tolerance: the distributed run adds the same numbers in another order (portion sums, shard
partial dot products), a few ulps per evaluation; L-BFGS on this well-conditioned problem (20
iterations, far from the tolerances' thresholds) carries them forward without amplifying them
much: measured differences are about 1e-15, while a wrong history, step or weighting moves the
result by > 1e-3.
"""
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import sandblaster_lbfgs as sandblaster
from algorithms.objective import ConvexObjective
from minidl.data import least_squares
from minidl.optim import LBFGS, two_loop_direction
from tests.test_error_contract import ENV, MPIEXEC, ROOT, launch

TOLERANCE = 1e-10
D = 64                               # parameters: one shard's slice is >= 256 bytes at S <= 2


class InProcessShards(sandblaster.Shards):
    """The coordinator's handle on real ``Shard`` objects in this process (no messages)."""

    def __init__(self, shards):
        self.shards = shards

    def order(self, op, **args):
        for shard in self.shards:
            shard.command(op, args)

    def ask(self, op, **args):
        return [shard.command(op, args) for shard in self.shards]


@pytest.mark.task("7.1")
@pytest.mark.parametrize("servers", [1, 2, 3])
def test_sharded_two_loop_recursion_equals_the_serial_one(servers):
    rng = np.random.default_rng(servers)
    for pairs in (0, 1, 3, 5):
        d = 11
        s_history = [rng.standard_normal(d) for _ in range(pairs)]
        y_history = [s + 0.3 * rng.standard_normal(d) for s in s_history]     # <s, y> > 0
        g = rng.standard_normal(d)
        roles = sandblaster.Roles(servers + 2, servers, d)
        shards = [sandblaster.Shard(None, roles, k, np.zeros(d), history_size=10) for k in range(servers)]
        for shard, (start, stop) in zip(shards, roles.ranges):
            shard.vectors["g"][...] = g[start:stop]
            shard.s_history = [s[start:stop].copy() for s in s_history]
            shard.y_history = [y[start:stop].copy() for y in y_history]
        sandblaster.sharded_direction(InProcessShards(shards), pairs)
        direction = np.concatenate([shard.vectors["d"] for shard in shards])
        expected = two_loop_direction(g, s_history, y_history)
        assert np.allclose(direction, expected, rtol=1e-12, atol=1e-14), (servers, pairs)
        assert np.array_equal(g, np.concatenate([shard.vectors["g"] for shard in shards]))   # g untouched


def drive(batch, order):
    """Play reports [(worker, portion)] into ``batch``; returns the (keep, drop, push) answers."""
    return [batch.report(worker, portion, loss=1.0) for worker, portion in order]


def test_deterministic_portions_go_to_worker_i_mod_w_and_are_pushed_once():
    batch = sandblaster.Batch(1, portions=7, workers=3, threshold=1.0, push_every=2, deterministic=True)
    given = {w: [] for w in range(3)}
    for _ in range(3):
        for w in range(3):
            portion = batch.next_for(w)
            if portion is not None:
                given[w].append(portion)
                batch.report(w, portion, loss=1.0)
    assert given == {0: [0, 3, 6], 1: [1, 4], 2: [2, 5]}
    assert batch.complete() and batch.discarded == 0 and batch.backups == 0


def test_a_straggler_is_backed_up_and_the_first_push_wins():
    batch = sandblaster.Batch(1, portions=4, workers=2, threshold=0.5, push_every=4, deterministic=False)
    assert batch.next_for(1) == 0                           # worker 1: the straggler, stuck on portion 0
    pushes = []
    for portion in (1, 2, 3):
        assert batch.next_for(0) == portion
        keep, drop, push = batch.report(0, portion, 1.0)
        assert keep and not drop
        pushes.append(push)
    assert pushes == [0, 2, 1]                              # from the tail (2 of 4 finished) on: at once
    assert batch.next_for(0) == 0 and batch.backups == 1     # a backup copy of the straggler's portion
    assert batch.report(0, 0, 1.0) == (True, False, 1)      # worker 0 pushes portion 0 first ...
    assert batch.complete()
    assert batch.report(1, 0, 1.0)[0] is False               # ... the straggler's copy is discarded
    assert batch.discarded == 1 and sorted(batch.losses) == [0, 1, 2, 3]


def test_an_accumulator_holding_a_portion_pushed_by_another_is_dropped():
    batch = sandblaster.Batch(1, portions=3, workers=2, threshold=0.5, push_every=3, deterministic=False)
    assert batch.next_for(1) == 0
    assert batch.report(1, 0, 1.0) == (True, False, 0)      # the straggler holds portion 0, unpushed
    assert batch.next_for(1) == 1                           # ... and is slow on portion 1
    assert batch.next_for(0) == 2
    assert batch.report(0, 2, 1.0) == (True, False, 1)      # tail: worker 0 pushes at once
    assert batch.next_for(0) == 0                           # backup of the held, unpushed portion 0
    assert batch.report(0, 0, 1.0) == (True, False, 1)
    assert batch.next_for(0) == 1                           # and of the running portion 1
    assert batch.report(0, 1, 1.0) == (True, False, 1)
    assert batch.complete()
    keep, drop, _ = batch.report(1, 1, 1.0)                 # the straggler's accumulator held 0: dropped
    assert drop and not keep and batch.discarded == 2


def serial_lbfgs(problem, epochs, max_iter, history):
    """minidl.optim.LBFGS on the full batch, one step(closure) per epoch."""
    objective = ConvexObjective(problem)
    optimizer = LBFGS([objective.flat.as_parameter()], lr=1.0, history_size=history, max_iter=max_iter)
    rows = np.arange(problem.n)
    for _ in range(epochs):
        optimizer.step(lambda: objective.loss_and_grad(rows))
    return objective.params.copy()


@pytest.mark.parallel(nprocs=[3, 4])
def test_sandblaster_equals_serial_lbfgs_with_and_without_backup_tasks():
    comm = MPI.COMM_WORLD
    problem = least_squares(96, D, np.random.default_rng(3))
    serial = serial_lbfgs(problem, epochs=2, max_iter=8, history=4)
    common = dict(problem=problem, epochs=2, max_iter=8, history=4, quiet=True)
    checks = {}
    for servers in (1, 2) if comm.size == 4 else (1,):
        report = {}
        params, _ = sandblaster.train(comm, servers=servers, portions=12, push_every=2, deterministic=True,
                                      report=report, **common)
        checks[f"deterministic, S={servers}"] = np.max(np.abs(params - serial)) <= TOLERANCE * np.max(np.abs(serial))
        slice_bytes = min(stop - start for start, stop in report["roles"].ranges) * 8
        sizes = [message.nbytes for message in report["messages"]]
        checks[f"coordinator messages small, S={servers}"] = sizes and max(sizes) < min(200, slice_bytes)
        checks[f"coordinator tags, S={servers}"] = {m.tag for m in report["messages"]} <= {
            sandblaster.CMD, sandblaster.REPLY, sandblaster.REPORT, sandblaster.WORK}
    if comm.size == 4:                          # 2 workers: one straggler, backups from the other
        report = {}
        params, _ = sandblaster.train(comm, servers=1, portions=12, push_every=2, backup_threshold=0.5,
                                      slow_worker=3, slow_factor=100.0, report=report, **common)
        checks["backups: same result"] = np.max(np.abs(params - serial)) <= TOLERANCE * np.max(np.abs(serial))
        checks["backups issued and duplicates discarded"] = report["backups"] > 0 and report["discarded"] > 0
    failed = [name for name, ok in checks.items() if not ok]
    parallel_assert(not failed, f"failed: {failed}")


@pytest.mark.parametrize("module, flags, ranks, message", [
    ("sandblaster_lbfgs", ["--portions", "1"], 4, "--portions 1 is fewer than the 2 workers"),
    ("sandblaster_lbfgs", ["--backup-threshold", "0"], 3, "--backup-threshold must be a finite number > 0 and <= 1"),
    ("sandblaster_lbfgs", ["--slow-worker", "1", "--slow-factor", "3"], 3, "--slow-worker must be a worker rank (2..2"),
    ("sandblaster_lbfgs", ["--batch-size", "8"], 3, "--batch-size is not used by sandblaster_lbfgs"),
    ("async_easgd", ["--tau", "0"], 3, "--tau must be an integer >= 1, got 0"),
    ("sandblaster_lbfgs", ["--lr", "1e300"], 3, "at L-BFGS iteration 0; lower --lr"),
])
def test_bad_flags_stop_every_rank(module, flags, ranks, message):
    extra = ["--problem", "least-squares"] if module == "sandblaster_lbfgs" else []
    done = launch(module, *extra, "--epochs", "1", *flags, ranks=ranks)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("error: ") == ranks and done.stderr.count(message) == ranks, done.stderr
    assert "epoch" not in done.stdout


PLANTED = """
from algorithms import sandblaster_lbfgs as sandblaster
command = sandblaster.Shard.command
def failing(self, op, args):
    if op == "accept":
        raise RuntimeError("planted failure")
    return command(self, op, args)
sandblaster.Shard.command = failing
sandblaster.main(["--problem", "least-squares", "--epochs", "1"])
"""


def test_an_exception_on_one_rank_stops_the_whole_job():
    # the failing shard aborts the job: the coordinator and the workers, waiting for its messages,
    # must not hang (the subprocess timeout would fail the test)
    done = subprocess.run([MPIEXEC, "-n", "4", sys.executable, "-c", PLANTED], capture_output=True, text=True,
                          timeout=60, env=ENV, cwd=ROOT)
    assert done.returncode != 0
    assert "error: planted failure (RuntimeError in the server on rank 1)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
