"""Sufficient-factor broadcasting (algorithms/sufficient_factors.py): the same update as the full
gradient, the bytes of the formula, and the choice by the cost rule.

Run: python tests/run.py --max-ranks 3 -- tests/test_sufficient_factors.py
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import allreduce_sgd, sufficient_factors
from tests.helpers import float64_mlp, parallel_assert_close, tiny_digits

LAYERS = [(64, 16), (16, 10)]                                  # float64_mlp's Linear layers (in, out)
BIASES = 16 + 10


@pytest.mark.task("8.4")
@pytest.mark.parallel(nprocs=[2, 3])
def test_factors_give_the_full_gradient_update_and_send_the_formula_bytes():
    comm, p = MPI.COMM_WORLD, MPI.COMM_WORLD.size
    rows = 3 * p - 1                                          # one global batch, the last piece one row short
    common = dict(model=float64_mlp, data=tiny_digits(n_train=rows), epochs=1, lr=0.1, momentum=0.0,
                  batch_size=3, allreduce="mpi", quiet=True)
    full, _ = allreduce_sgd.train(comm, **common)
    factored, history = sufficient_factors.train(comm, factors="always", **common)
    parallel_assert_close(factored, full, 1e-12, f"p={p}: factors vs full gradient")
    # over all ranks: each rank's rows x (in + out) of every layer to p - 1 peers; the biases (26
    # numbers) by MPI's Allreduce (CountingComm's estimate 2 (p-1)/p n per rank); the 8-byte check twice
    factors = (p - 1) * rows * sum(i + o for i, o in LAYERS) * 8
    biases = p * (2 * (p - 1) * 26 * 8 // p)
    checks = p * 2 * (2 * (p - 1) * 8 // p)
    parallel_assert(history[-1]["bytes"] == factors + biases + checks,
                    f"bytes {history[-1]['bytes']} against the formula {factors + biases + checks}")


@pytest.mark.task("8.5")
@pytest.mark.parallel(nprocs=[2, 3])
def test_the_sharded_server_gives_the_full_gradient_update_and_moves_the_formula_bytes():
    comm, p = MPI.COMM_WORLD, MPI.COMM_WORLD.size
    rows = 3 * p                                              # one global batch, 3 rows on every rank
    common = dict(model=float64_mlp, data=tiny_digits(n_train=rows), epochs=1, lr=0.1, momentum=0.0,
                  batch_size=3, allreduce="mpi", quiet=True)
    full, _ = allreduce_sgd.train(comm, **common)
    served, history = sufficient_factors.train(comm, factors="always", exchange="server", **common)
    parallel_assert_close(served, full, 1e-12, f"p={p}: server factors vs full gradient")
    # each layer: the p - 1 ranks but its owner push 3 (in + out) numbers, the owner sends in out to each
    pushes = sum((p - 1) * 3 * (i + o) * 8 for i, o in LAYERS)
    pulls = sum((p - 1) * i * o * 8 for i, o in LAYERS)
    biases = p * (2 * (p - 1) * 26 * 8 // p)
    checks = p * 2 * (2 * (p - 1) * 8 // p)
    expected = pushes + pulls + biases + checks
    parallel_assert(history[-1]["bytes"] == expected, f"bytes {history[-1]['bytes']} against the formula {expected}")


@pytest.mark.parallel(nprocs=[2, 3])
def test_auto_factors_exactly_the_layers_the_cost_rule_picks():
    comm, p = MPI.COMM_WORLD, MPI.COMM_WORLD.size
    _, history = sufficient_factors.train(comm, model=float64_mlp, data=tiny_digits(), epochs=1, lr=0.1,
                                          batch_size=5, allreduce="mpi", quiet=True)
    expected = [[i, o] for i, o in LAYERS if (p - 1) * 5 * (i + o) < 2 * (p - 1) / p * i * o]
    parallel_assert(history[-1]["factored"] == expected, f"p={p}: {history[-1]['factored']} vs {expected}")
    parallel_assert(0 < len(expected) < len(LAYERS) or p == 2, "the case does not separate the layers")
    # the server's rule is the slides': B (in + out) < in out, whatever p
    _, history = sufficient_factors.train(comm, model=float64_mlp, data=tiny_digits(), epochs=1, lr=0.1,
                                          batch_size=7, allreduce="mpi", exchange="server", quiet=True)
    expected = [[i, o] for i, o in LAYERS if 7 * (i + o) < i * o]
    parallel_assert(history[-1]["factored"] == expected == [[64, 16]], f"server: {history[-1]['factored']}")


# ---- a growing batch (--batch-schedule): the factors of every step's rows, the choice per batch --------

ROWS = 50                                                     # tiny_digits: every epoch ends on a short step
GROWING = dict(epochs=3, batch_size=2, lr_decay=(1, 2), batch_schedule=True, decay_factor=2)   # 2, 4, 8 rows


def batch_at(epoch):
    return 2 * 2 ** epoch


def step_totals(epoch, p):
    """The global batch of each step of ``epoch``: p x batch rows, the last step what is left."""
    whole = p * batch_at(epoch)
    return [min(whole, ROWS - start) for start in range(0, ROWS, whole)]


def pays(exchange, batch, fan_in, fan_out, p):
    """The cost rule, written out: broadcast (p-1) B (in + out) < 2 (p-1)/p in out; server B (in + out) < in out."""
    if exchange == "server":
        return batch * (fan_in + fan_out) < fan_in * fan_out
    return (p - 1) * batch * (fan_in + fan_out) < 2 * (p - 1) / p * fan_in * fan_out


def always_bytes(exchange, epoch, p):
    """Bytes all ranks send in ``epoch`` with every layer factored: the factors of every row (peer to
    peer: to p - 1 peers; server: to the owner, rank l mod p, which sends dW back to p - 1 ranks), the
    biases by MPI's Allreduce (CountingComm's 2 (p-1)/p estimate), the 8-byte check per step and at the end."""
    total = 0
    for rows in step_totals(epoch, p):
        per_rank = [rows // p + (r < rows % p) for r in range(p)]     # the global partition's pieces
        for number, (fan_in, fan_out) in enumerate(LAYERS):
            if exchange == "server":
                pushed = rows - per_rank[number % p]
                total += pushed * (fan_in + fan_out) * 8 + (p - 1) * fan_in * fan_out * 8
            else:
                total += (p - 1) * rows * (fan_in + fan_out) * 8
        total += p * (2 * (p - 1) * BIASES * 8 // p)
    return total + (len(step_totals(epoch, p)) + 1) * p * (2 * (p - 1) * 8 // p)


@pytest.mark.parallel(nprocs=[2, 3, 4])
@pytest.mark.parametrize("exchange", ["broadcast", "server"])
def test_a_growing_batch_gives_allreduce_sgds_run_and_the_choice_follows_the_batch(exchange):
    # before the fix the receive buffers were sized for the first epoch's batch (a truncation error
    # at the first larger one) and --factors auto chose the layers once, at the first batch
    comm, p = MPI.COMM_WORLD, MPI.COMM_WORLD.size
    common = dict(model=float64_mlp, data=tiny_digits(n_train=ROWS), lr=0.1, momentum=0.9, allreduce="mpi",
                  quiet=True, **GROWING)
    full, reference = allreduce_sgd.train(comm, **common)
    parallel_assert([record["global_batch"] for record in reference] == [p * batch_at(e) for e in range(3)],
                    f"the schedule did not grow the batch: {reference}")
    # no factors: the same Allreduce on the same entries, so the same bits
    dense, _ = sufficient_factors.train(comm, factors="never", exchange=exchange, **common)
    parallel_assert(bool(np.array_equal(dense, full)), f"p={p}, {exchange}, never: not allreduce_sgd's bits")
    for factors in ("always", "auto"):
        params, history = sufficient_factors.train(comm, factors=factors, exchange=exchange, **common)
        # X^T D adds the rows in another order than the allreduce of per-rank x_r^T d_r: a few ulps a
        # step, so over these 13 to 24 momentum steps the parameters agree far below 1e-12 (measured:
        # at most 3.1e-16), while a step whose gradient misses a rank's rows is off by more than 1e-3
        parallel_assert_close(params, full, 1e-12, f"p={p}, {exchange}, {factors}")
        expected = [[[i, o] for i, o in LAYERS if factors == "always" or pays(exchange, batch_at(e), i, o, p)]
                    for e in range(3)]
        parallel_assert([record["factored"] for record in history] == expected,
                        f"p={p}, {exchange}, {factors}: factored {[r['factored'] for r in history]}, rule {expected}")
        if factors == "auto":
            parallel_assert(expected[0] != expected[-1], "the case does not change the choice")
        else:
            # every step sends the factors of all its rows, however many
            sent = [history[0]["bytes"]] + [b["bytes"] - a["bytes"] for a, b in zip(history, history[1:])]
            formula = [always_bytes(exchange, e, p) for e in range(3)]
            parallel_assert(sent == formula, f"p={p}, {exchange}: bytes per epoch {sent}, formula {formula}")


def test_the_rule_is_the_slides_rule_at_two_ranks_and_stricter_beyond():
    for batch in (1, 8, 32, 128):
        for fan_in, fan_out in ((64, 128), (128, 64), (64, 10), (784, 300), (10, 10)):
            assert sufficient_factors.factors_pay(batch, fan_in, fan_out, 2) == (batch * (fan_in + fan_out)
                                                                                 < fan_in * fan_out)
    assert sufficient_factors.factors_pay(32, 64, 128, 2) and not sufficient_factors.factors_pay(32, 64, 128, 4)
    assert not sufficient_factors.factors_pay(1, 1000, 1000, 1)
    for p in (2, 4, 8):
        assert sufficient_factors.factors_pay(32, 64, 128, p, "server") and \
            not sufficient_factors.factors_pay(64, 64, 128, p, "server")     # 64 x 192 > 8192
