"""The hierarchical parameter server (Downpour's ``--groups G``, ``ps.relay``) against the flat one.

Run: python tests/run.py --max-ranks 4 -- tests/test_hierarchical_ps.py

- Groups of one worker (1 root shard, 1 group server, 1 worker) are the flat server bit for bit:
  a group server that relays one worker's push and fetch changes nothing (deterministic mode).
- One group of two workers is synchronous inside the group: it equals flat stale-synchronous SGD
  with s = 0 (both workers' gradients at the same parameters, applied before either goes on) up to
  the order of two additions (tolerance 1e-10; measured about 1e-16), and the root applies one
  push per round and answers one fetch: half the flat server's pushes, and half its bytes sent
  (counted by wrapping the job's communicator in collectives.trace.CountingComm).
- One group of three workers, deterministic: the group server sums the round's gradients in rank
  order, so two runs are byte-identical and equal, bit for bit, a serial replay that takes each
  round's three gradients at the same parameters and applies w <- w - lr ((g_0 + g_1) + g_2). (It
  used to sum in the order the requests arrived: the same seed gave different bits.)
- The root alone applies the server's optimizer, once per round, to the group's sum (the group
  server only adds): for SGD and for Adagrad, groups of one are the flat server bit for bit, and one
  group of two is serial SGD / Adagrad on each round's summed gradient, bit for bit. With Adagrad a
  group of two is not flat SSP s = 0, where the server applies Adagrad to each worker's gradient in
  turn (measured 0.33 apart, relative): Adagrad's step is not linear in the gradient.
- --groups that does not divide the workers stops every rank (exit 2).
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import downpour_sgd, ssp_sgd
from collectives.trace import CountingComm
from minidl.data import batches, epoch_order, least_squares, shard
from tests.helpers import assert_stopped, launch


def problem():
    return least_squares(64, 6, np.random.default_rng(4))


COMMON = dict(epochs=2, lr=0.05, batch_size=8, server_optimizer="sgd", deterministic=True, quiet=True)


def on_first(comm, ranks, function):
    """function(sub) on a communicator of the first ``ranks`` ranks; None on the others."""
    sub = comm.Split(0 if comm.rank < ranks else MPI.UNDEFINED, comm.rank)
    if sub == MPI.COMM_NULL:
        return None
    try:
        return function(sub)
    finally:
        sub.Free()


def pushes(report):
    return sum(1 for event in report["logs"][0] if event[0] == "push")


@pytest.mark.parallel(nprocs=[4])
def test_hierarchical_server_equals_the_flat_one_and_cuts_the_root_pushes_by_the_group_size():
    comm = MPI.COMM_WORLD
    task = problem()
    results = {}

    def run(name, ranks, train, **kwargs):
        report, root = {}, {}

        def counted(sub):                        # every message of the job through a byte counter
            counting = CountingComm(sub)
            params = train(counting, problem=task, report=report, **COMMON, **kwargs)[0]
            root["bytes"] = counting.bytes_sent  # on rank 0: the root shard's sends (its fetch replies)
            return params
        params = on_first(comm, ranks, counted)
        results[name] = comm.bcast((params, pushes(report), root.get("bytes")) if comm.rank == 0 else None, root=0)

    # groups of one worker: 1 shard + 1 group server + 1 worker, against 1 shard + 1 worker
    run("flat, 1 worker", 2, downpour_sgd.train)
    run("1 group of 1", 3, downpour_sgd.train, groups=1)
    # one group of two workers, against flat SSP with s = 0 (synchronous) and two workers
    run("flat SSP s=0, 2 workers", 3, ssp_sgd.train, staleness=0)
    run("1 group of 2", 4, downpour_sgd.train, groups=1)
    (flat, flat_pushes, _), (relayed, relayed_pushes, _) = results["flat, 1 worker"], results["1 group of 1"]
    (sync, sync_pushes, sync_bytes), (grouped, grouped_pushes, grouped_bytes) = (results["flat SSP s=0, 2 workers"],
                                                                                 results["1 group of 2"])
    checks = {
        "groups of one are the flat server bit for bit": np.array_equal(flat, relayed)
              and flat_pushes == relayed_pushes,
        "one group of two equals flat SSP s=0": np.max(np.abs(grouped - sync)) <= 1e-10 * np.max(np.abs(sync)),
        "the root applies 1/2 of the flat pushes": 2 * grouped_pushes == sync_pushes and grouped_pushes > 0,
        "the root sends 1/2 of the flat bytes (counted)": 2 * grouped_bytes == sync_bytes and grouped_bytes > 0,
    }
    failed = [name for name, ok in checks.items() if not ok]
    parallel_assert(not failed, f"failed: {failed} ({[(k, v[1]) for k, v in results.items()]})")


def rank_order_replay(task, workers, epochs, lr, batch_size, seed, optimizer="sgd"):
    """One group of ``workers`` in synchronous rounds, serially: every worker's gradient at the same w,
    summed in rank order, one step of the server's optimizer on the sum per round (every worker has the
    same number of steps). SGD: w <- w - lr g; Adagrad (eps 1e-10, as minidl.optim.Adagrad's default):
    sum_sq <- sum_sq + g^2, w <- w - lr g / (sqrt(sum_sq) + eps)."""
    w, sum_sq = np.zeros(task.d), np.zeros(task.d)
    for epoch in range(epochs):
        order = epoch_order(task.n, seed, epoch)
        mine = [order[shard(task.n, k, workers)] for k in range(workers)]
        plans = [[rows[b] for b in batches(len(rows), batch_size)] for rows in mine]
        assert len({len(plan) for plan in plans}) == 1, "the replay wants equal step counts"
        for steps in zip(*plans):
            total = task.grad(w, steps[0])
            for rows in steps[1:]:
                total = total + task.grad(w, rows)
            if optimizer == "adagrad":
                sum_sq = sum_sq + total * total
                w = w - lr * total / (np.sqrt(sum_sq) + 1e-10)
            else:
                w = w - lr * total
    return w


@pytest.mark.parallel(nprocs=[5])
def test_one_group_of_three_sums_in_rank_order_so_the_same_seed_gives_the_same_bits():
    comm = MPI.COMM_WORLD
    task, settings = problem(), dict(COMMON, epochs=5, batch_size=8, seed=3)   # 22, 21, 21 rows: 3 steps each
    runs = [downpour_sgd.train(comm, problem=task, groups=1, **settings)[0] for _ in range(2)]
    expected = rank_order_replay(task, 3, settings["epochs"], settings["lr"], settings["batch_size"], settings["seed"])
    parallel_assert(np.array_equal(runs[0], runs[1]), "two runs with the same seed differ: "
                    f"{np.max(np.abs(runs[0] - runs[1])):.3g}")
    parallel_assert(all(np.array_equal(params, expected) for params in runs), "differs from the rank-order replay by "
                    f"{max(np.max(np.abs(params - expected)) for params in runs):.3g}")


@pytest.mark.parallel(nprocs=[4])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_the_root_applies_the_server_optimizer_once_per_round_to_the_groups_sum(optimizer):
    # The group server only adds its workers' gradients; the root alone applies SGD or Adagrad, once per round.
    # So groups of one are the flat server bit for bit, and one group of two is serial <optimizer> on the sum of
    # the two workers' gradients at the same w, bit for bit. (Not flat SSP s = 0 for Adagrad: there the server
    # applies Adagrad to g_0 and then to g_1, and Adagrad of a sum is not the sum of two Adagrad steps.)
    comm = MPI.COMM_WORLD
    task, settings = problem(), dict(COMMON, server_optimizer=optimizer, epochs=3, seed=1)   # 32 rows: 4 steps each

    def run(ranks, **kwargs):
        params = on_first(comm, ranks, lambda sub: downpour_sgd.train(sub, problem=task, **settings, **kwargs)[0])
        return comm.bcast(params if comm.rank == 0 else None, root=0)
    flat, relayed, grouped = run(2), run(3, groups=1), run(4, groups=1)
    expected = rank_order_replay(task, 2, settings["epochs"], settings["lr"], settings["batch_size"], settings["seed"],
                                 optimizer)
    parallel_assert(np.array_equal(flat, relayed), f"a group of one differs from the flat server by "
                    f"{np.max(np.abs(flat - relayed)):.3g}")
    parallel_assert(np.array_equal(grouped, expected), f"one group of two differs from serial {optimizer} on the "
                    f"rounds' sums by {np.max(np.abs(grouped - expected)):.3g}")


def test_groups_that_do_not_divide_the_workers_stop_every_rank():
    assert_stopped(launch("downpour_sgd", "--epochs", "1", "--groups", "2", ranks=4),
                   "--groups 2 must divide the 1 workers", ranks=4)
