"""Sufficient-factor broadcasting (algorithms/sufficient_factors.py): the same update as the full
gradient, the bytes of the formula, and the choice by the cost rule.

Run: python tests/run.py --max-ranks 3 -- tests/test_sufficient_factors.py
"""
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import allreduce_sgd, sufficient_factors
from tests.test_sync_sgd import float64_mlp, relative_error, tiny_digits

LAYERS = [(64, 16), (16, 10)]                                  # float64_mlp's Linear layers (in, out)


@pytest.mark.task("8.4")
@pytest.mark.parallel(nprocs=[2, 3])
def test_factors_give_the_full_gradient_update_and_send_the_formula_bytes():
    comm, p = MPI.COMM_WORLD, MPI.COMM_WORLD.size
    rows = 3 * p - 1                                          # one global batch, the last piece one row short
    common = dict(model=float64_mlp, data=tiny_digits(n_train=rows), epochs=1, lr=0.1, momentum=0.0,
                  batch_size=3, allreduce="mpi", quiet=True)
    full, _ = allreduce_sgd.train(comm, **common)
    factored, history = sufficient_factors.train(comm, factors="always", **common)
    error = relative_error(factored, full)
    parallel_assert(error < 1e-12, f"p={p}: factors vs full gradient, relative error {error:.2e}")
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
    error = relative_error(served, full)
    parallel_assert(error < 1e-12, f"p={p}: server factors vs full gradient, relative error {error:.2e}")
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
