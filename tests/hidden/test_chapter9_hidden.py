"""Hidden: chapter 9's schedule at its edges, and PBT's ready step by hand and on 3 to 7 ranks (tasks 9.1-9.3).

9.1: the lr exactly at a milestone and just before it, exactly at the end of warm-up, a milestone
inside the warm-up, the batch schedule (no division), sqrt scaling at 5 and 7 ranks, all in closed
form. 9.2: truncation selection on hand-worked populations with ties, NaN scores, fewer finite
members than q, and q = 1 (so the winner is determined). 9.3: exploit and explore on 3, 5, 6 and 7
ranks, with members of 1, 2 and 3 ranks, a winner with two losers, a loser below its winner, and a
winner that has no momentum buffer yet.
"""
import math

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import pbt
from algorithms.core.schedule import Schedule
from minidl.flat import FlatParameters
from minidl.optim import SGD
from minidl.tensor import Parameter
from tests.handed import ParamsOnly

NAN = math.nan


# ---- 9.1: the large-batch learning rate ----------------------------------------------------------------

CASES = {
    # name: (Schedule keywords, epoch, expected lr worked out by hand)
    "exactly at the first milestone": (dict(lr=0.1, batch_size=16, ranks=4, scaling="linear", lr_decay=(2, 5),
                                            decay_factor=10.0), 2, 0.4 / 10),
    "just before the first milestone": (dict(lr=0.1, batch_size=16, ranks=4, scaling="linear", lr_decay=(2, 5),
                                             decay_factor=10.0), 1.999, 0.4),
    "exactly at the second milestone": (dict(lr=0.1, batch_size=16, ranks=4, scaling="linear", lr_decay=(2, 5),
                                             decay_factor=10.0), 5, 0.4 / 100),
    "exactly at the end of warm-up": (dict(lr=0.1, batch_size=8, ranks=5, scaling="linear", warmup_epochs=2), 2,
                                      0.5),
    "a quarter into warm-up": (dict(lr=0.1, batch_size=8, ranks=5, scaling="linear", warmup_epochs=2), 0.5,
                               0.1 + 0.25 * 0.4),
    "a milestone inside warm-up": (dict(lr=0.1, batch_size=8, ranks=7, scaling="linear", warmup_epochs=4,
                                        lr_decay=(1,), decay_factor=2.0), 2, (0.1 + 0.5 * 0.6) / 2),
    "the batch schedule does not divide": (dict(lr=0.1, batch_size=8, ranks=3, scaling="linear", lr_decay=(1, 2),
                                                decay_factor=2.0, batch_schedule=True), 3, 0.3),
    "sqrt scaling from a reference batch": (dict(lr=0.2, batch_size=10, ranks=7, scaling="sqrt",
                                                 reference_batch=14), 0, 0.2 * math.sqrt(5)),
}


@pytest.mark.task("9.1")
@pytest.mark.parametrize("name", list(CASES))
def test_lr_at_the_schedules_edges_in_closed_form(name):
    keywords, epoch, expected = CASES[name]
    assert Schedule(**keywords).lr_at(epoch) == pytest.approx(expected, rel=1e-12), name


# ---- 9.2: truncation selection ----------------------------------------------------------------------

SELECTIONS = {
    # name: (scores, fraction, the pairs worked out by hand: q = max(1, floor(fraction M)))
    "a three-way tie at the top: the lowest index wins": ([0.5, 0.9, 0.9, 0.1, 0.9], 0.2, [(3, 1)]),
    "a tie at the bottom: the higher index loses": ([0.2, 0.7, 0.2, 0.5], 0.25, [(2, 1)]),
    "NaN members lose beside the bottom q": ([NAN, 0.3, 0.8, NAN, 0.1], 0.2, [(0, 2), (3, 2), (4, 2)]),
    "fewer finite members than q": ([NAN, NAN, 0.4, NAN], 0.5, [(0, 2), (1, 2), (3, 2)]),
    "two members": ([0.6, 0.3], 0.5, [(1, 0)]),
    "a small fraction still replaces one": ([0.1, 0.2, 0.3], 0.1, [(0, 2)]),
    "every score NaN": ([NAN, NAN, NAN], 0.5, []),
    "equal scores everywhere": ([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 0.2, [(5, 0)]),
}


@pytest.mark.task("9.2")
@pytest.mark.parametrize("name", list(SELECTIONS))
def test_truncation_selection_on_hand_worked_populations(name):
    scores, fraction, expected = SELECTIONS[name]
    pairs = pbt.truncation_selection(scores, fraction, np.random.default_rng(0))
    assert sorted((int(loser), int(winner)) for loser, winner in pairs) == expected, (name, pairs)


@pytest.mark.task("9.2")
def test_with_q_two_the_winners_are_the_two_best_and_nan_never_wins():
    scores = [0.4, NAN, 0.9, 0.1, 0.8, NAN, 0.2, 0.3]                 # q = 2: top {2, 4}, bottom {3, 6}
    for seed in range(6):
        pairs = pbt.truncation_selection(scores, 0.25, np.random.default_rng(seed))
        assert sorted(loser for loser, _ in pairs) == [1, 3, 5, 6], pairs
        assert {winner for _, winner in pairs} <= {2, 4}, pairs


# ---- 9.3: exploit and explore ----------------------------------------------------------------------

PLANS = {   # p: (ranks per member, pairs)
    3: (1, [(2, 0), (1, 0)]),                   # one winner, two losers, not in index order
    5: (1, [(3, 1), (4, 0), (2, 1)]),
    6: (2, [(0, 2)]),                           # three members of two ranks; the loser below its winner
    7: (1, [(5, 6), (0, 6), (3, 1)]),
}


def member_state(member, piece, momentum):
    """Weights and a momentum buffer that differ by member and by the member's piece (rank j)."""
    flat = FlatParameters([Parameter(np.linspace(-1, 1, 9) * (member + 2) + 10 * piece)])
    objective = ParamsOnly(flat.data)
    optimizer = SGD([flat.as_parameter()], lr=0.1, momentum=0.9)
    if momentum:
        optimizer.state[0]["momentum"] = np.sqrt(np.arange(9.0) + member) + piece
    else:
        optimizer.state[0].pop("momentum", None)
    return objective, optimizer


@pytest.mark.task("9.3")
@pytest.mark.parallel(nprocs=[3, 5, 6, 7])
@pytest.mark.parametrize("momentum", [True, False], ids=["with momentum", "no momentum buffer yet"])
def test_exploit_and_explore_on_p_ranks_copies_each_winner_to_its_losers_piece_by_piece(momentum):
    comm = MPI.COMM_WORLD
    per_member, pairs = PLANS[comm.size]
    population = comm.size // per_member
    member, piece = divmod(comm.rank, per_member)
    objective, optimizer = member_state(member, piece, momentum)
    hyper = np.array([[0.01 * (m + 1), 0.1 * m, 8 + m] for m in range(population)], dtype=float)
    table = hyper.copy()
    pbt.exploit_and_explore(comm, per_member, pairs, objective, optimizer, hyper, np.random.default_rng(9))
    winner_of = dict(pairs)
    source = winner_of.get(member, member)
    want_w, _ = member_state(source, piece, momentum)
    want_v = np.sqrt(np.arange(9.0) + source) + piece if momentum else np.zeros(9)
    got_v = optimizer.state[0].get("momentum")
    untouched = member not in winner_of and not momentum                 # no buffer, and none received
    parallel_assert(not untouched or got_v is None, f"member {member} kept its weights but gained a momentum buffer")
    got_v = np.zeros(9) if untouched else got_v
    parallel_assert(bool(np.array_equal(objective.params, want_w.params)) and bool(np.array_equal(got_v, want_v)),
                    f"p={comm.size}, member {member} piece {piece}: expected member {source}'s weights and momentum")
    # explore: each loser's row is its winner's, perturbed, drawn in the order of the pairs
    rng, expected = np.random.default_rng(9), table.copy()
    for loser, winner in pairs:
        expected[loser] = pbt.perturb(table[winner], rng)
    parallel_assert(bool(np.array_equal(hyper, expected)), f"p={comm.size}: hyperparameters {hyper}, "
                                                           f"expected {expected}")
    parallel_assert(all(np.array_equal(other, hyper) for other in comm.allgather(hyper)),
                    "ranks disagree on the table")
