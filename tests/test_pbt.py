"""Population-based training (algorithms/pbt.py): selection, exploit/explore, reproducibility, errors.

Run: python tests/run.py --max-ranks 4 -- tests/test_pbt.py

- Truncation selection, on hand-worked populations: the losers are exactly the bottom q and the
  NaN members, the winners come from the top q finite ones. (The same for hypothesis-drawn scores
  is a hidden test: its oracle, a ranking by counting better members, is a solution of task 9.2.)
- Exploit copies the winner's weights and SGD momentum buffer bit for bit, rank j to rank j, and
  explore perturbs the winner's hyperparameters by 0.8 or 1.2 on every rank alike.
- A whole run: the same seed gives the same lineage and the same bits; a member that diverges
  (NaN) is replaced at the first ranking and never chosen as a parent; every member reads the same
  examples per round (--ready x --ready-batch per rank), whatever its batch size.
- Bad input stops every rank with ``error:`` and exit 2.
"""
import json
import math
import os

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import pbt
from algorithms.core.cli import SettingError
from minidl.flat import FlatParameters
from minidl.optim import SGD
from minidl.tensor import Parameter
from tests.handed import ParamsOnly
from tests.helpers import assert_stopped, float64_mlp, launch, tiny_digits


@pytest.mark.task("9.2")
@pytest.mark.parametrize("scores, fraction, losers, winners", [
    ([3.0, 1.0, 2.0, math.nan], 0.25, [1, 3], {0}),             # q = 1: the worst finite member and the NaN one
    ([0.5, 0.9, 0.1, 0.7, 0.3], 0.4, [2, 4], {1, 3}),          # q = 2: 0.1 and 0.3 copy 0.9 or 0.7
    ([1.0, 1.0, 1.0, 1.0], 0.5, [2, 3], {0, 1}),                # ties: the lower index ranks higher
    ([2.0, math.nan, math.nan], 0.1, [1, 2], {0}),              # q = max(1, 0) = 1
    ([math.nan, math.nan], 0.5, [], set()),                     # nobody finite: nothing to copy
])
def test_truncation_selection_on_hand_worked_populations(scores, fraction, losers, winners):
    pairs = pbt.truncation_selection(scores, fraction, np.random.default_rng(0))
    assert sorted(loser for loser, _ in pairs) == losers, pairs
    assert {winner for _, winner in pairs} <= winners, pairs
    assert pairs == pbt.truncation_selection(scores, fraction, np.random.default_rng(0))   # the same draws


def member_state(rank):
    """A 7-element float64 'objective' and an SGD with a momentum buffer, both rank-specific."""
    flat = FlatParameters([Parameter(np.linspace(0, 1, 7) * (rank + 1) + np.pi)])
    objective = ParamsOnly(flat.data)
    optimizer = SGD([flat.as_parameter()], lr=0.1, momentum=0.9)
    optimizer.state[0]["momentum"] = np.sqrt(np.arange(7.0) + rank) / 3
    return objective, optimizer


@pytest.mark.task("9.3")
@pytest.mark.parallel(nprocs=[2, 4])
def test_exploit_copies_weights_and_momentum_bit_for_bit_and_explore_perturbs_the_winners_row():
    comm = MPI.COMM_WORLD
    for per_member in sorted({1, comm.size // 2}):
        population = comm.size // per_member
        member = comm.rank // per_member
        pairs = [(1, 0)] if population == 2 else [(2, 0), (3, 0)]       # member 0 wins twice on 4
        objective, optimizer = member_state(comm.rank % per_member)       # a member's ranks differ by piece j
        if member == 0:
            objective.params[...] = np.exp(np.arange(7.0))               # the winner's bits
            optimizer.state[0]["momentum"] = np.log1p(np.arange(7.0))
        before = (objective.params.copy(), optimizer.state[0]["momentum"].copy())
        hyper = np.array([[0.1 * (m + 1), 0.5, 32] for m in range(population)])
        pbt.exploit_and_explore(comm, per_member, pairs, objective, optimizer, hyper, np.random.default_rng(3))
        losers = [loser for loser, _ in pairs]
        expected = (np.exp(np.arange(7.0)), np.log1p(np.arange(7.0))) if member in losers else before
        parallel_assert(np.array_equal(objective.params, expected[0])                  # one collective per rank
                        and np.array_equal(optimizer.state[0]["momentum"], expected[1]),
                        f"member {member}: weights or momentum buffer not {'copied' if member in losers else 'kept'}")
        tables = comm.allgather(hyper)
        parallel_assert(all(np.array_equal(table, hyper) for table in tables), "ranks disagree on the table")
        for loser in losers:
            lr, momentum, batch = hyper[loser]
            parallel_assert(any(math.isclose(lr, 0.1 * f) for f in pbt.PERTURB), f"lr {lr} not 0.1 x 0.8|1.2")
            parallel_assert(any(math.isclose(1 - momentum, 0.5 * f) for f in pbt.PERTURB), f"momentum {momentum}")
            parallel_assert(batch in (round(32 * 0.8), round(32 * 1.2)), f"batch {batch}")
        parallel_assert(np.array_equal(hyper[[m for m in range(population) if m not in losers]],
                                       np.array([[0.1 * (m + 1), 0.5, 32] for m in range(population)
                                                 if m not in losers])), "a non-loser's row changed")


def diverging_prior(monkeypatch):
    """Member 1 samples lr = 1e200 (it diverges at once); the others a sane lr and momentum; member m
    batch 4 + m (so a round at --ready-batch 4 is not a whole number of steps for every member)."""
    drawn = []

    def sample(rng):
        drawn.append(None)
        return np.array([1e200 if len(drawn) == 2 else 10 ** rng.uniform(-2, -1), rng.uniform(0, 0.9),
                         float(3 + len(drawn))])
    monkeypatch.setattr(pbt, "sample", sample)


@pytest.mark.parallel(nprocs=[2])
def test_same_seed_same_lineage_and_bits_and_a_nan_member_is_replaced_never_chosen(monkeypatch, tmp_path_factory):
    comm = MPI.COMM_WORLD
    folder = comm.bcast(str(tmp_path_factory.mktemp("pbt")) if comm.rank == 0 else None)
    runs = []
    for attempt in range(2):
        diverging_prior(monkeypatch)
        path = os.path.join(folder, f"lineage{attempt}.json")
        params, history = pbt.train(comm, model=float64_mlp, data=tiny_digits(), ready=3, rounds=3, fraction=0.5,
                                    ready_batch=4, lineage=path, quiet=True)
        comm.Barrier()
        with open(path) as file:
            runs.append((params, json.load(file)["members"]))
    (first, lineage), (second, lineage_again) = runs
    parallel_assert(np.array_equal(first, second), "the same seed gave different bits")
    parallel_assert(json.dumps(lineage) == json.dumps(lineage_again), "the same seed gave a different lineage")
    round_one = {entry["member"]: entry for entry in lineage[0]}
    parallel_assert(math.isnan(round_one[1]["score"]) and round_one[1]["parent"] == 0,
                    f"the diverged member was not replaced by member 0: {round_one}")
    nan_members = {(entry["round"], entry["member"]) for row in lineage for entry in row if math.isnan(entry["score"])}
    parents = {(entry["round"], entry["parent"]) for row in lineage for entry in row
               if entry["parent"] != entry["member"]}
    parallel_assert(not nan_members & parents, f"a NaN member was chosen: {nan_members & parents}")
    parallel_assert(bool(np.isfinite(first).all()), "the result is not finite")
    read = [(entry["batch_size"], entry["examples"]) for row in lineage for entry in row]
    parallel_assert(len({batch for batch, _ in read}) > 1 and all(examples == 3 * 4 for _, examples in read),
                    f"members did not read 3 x 4 examples per round whatever their batch: {read}")
    # --search evolution: the diverged member restarts from the initial weights (finite again) with
    # member 0's hyperparameters perturbed; without a restart its NaN weights would stay NaN
    diverging_prior(monkeypatch)
    path = os.path.join(folder, "evolution.json")
    pbt.train(comm, model=float64_mlp, data=tiny_digits(), ready=3, rounds=2, fraction=0.5, ready_batch=4,
              search="evolution", lineage=path, quiet=True)
    comm.Barrier()
    with open(path) as file:
        evolution = json.load(file)["members"]
    first_row, second = evolution[0][0], evolution[1][1]
    parallel_assert(math.isnan(evolution[0][1]["score"]) and evolution[0][1]["parent"] == 0
                    and math.isfinite(second["score"])
                    and any(math.isclose(second["lr"], first_row["lr"] * f) for f in pbt.PERTURB),
                    f"the diverged member was not restarted with member 0's perturbed lr: {evolution}")


def test_bad_population_fraction_and_rank_counts_are_refused():
    for size, population, fraction in [(4, 1, 0.25), (4, 3, 0.25), (2, 4, 0.25), (4, 4, 0.0), (4, 4, 0.6)]:
        with pytest.raises(SettingError, match="--population|--fraction"):
            pbt.check(size, population, 10, 2, fraction, "pbt", 0.2)
    for ready_batch in (0, -4, 2.5):
        with pytest.raises(SettingError, match="--ready-batch"):
            pbt.check(4, 4, 10, 2, 0.25, "pbt", 0.2, ready_batch)
    pbt.check(4, 2, 10, 2, 0.5, "random", 0.2)


def test_a_population_that_does_not_divide_the_ranks_stops_every_rank_with_exit_2():
    done = launch("pbt", "--population", "2")
    assert_stopped(done, "--population 2 on 3 ranks")
    assert "round" not in done.stdout
