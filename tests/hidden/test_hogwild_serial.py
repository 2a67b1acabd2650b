"""Hidden: Hogwild! with one process is serial SGD bit for bit (task 5.5).

The oracle, serial SGD one sample at a time, is Hogwild!'s update in a loop: a solution of task
5.5, so it stays out of student trees. The visible tests (tests/test_hogwild.py) compare with the
numbers it gives, written down there as SERIAL_SGD; the last test here keeps those numbers true.
"""
import numpy as np
import pytest
from mpi4py import MPI

from algorithms import hogwild
from minidl.data import epoch_order
from tests.helpers import SERIAL_SGD, small_problem


def serial_sparse_sgd(problem, epochs, lr, decay, seed):
    """Plain serial SGD, one sample at a time, in serial SGD's epoch order."""
    w = np.zeros(problem.features)
    for epoch in range(epochs):
        for e in epoch_order(problem.n, seed, epoch):
            support = problem.index[e]
            w[support] = w[support] - lr * decay ** epoch * problem.sample_grad(w[support], e)
    return w


@pytest.mark.task("5.5")
def test_hogwild_with_one_process_equals_serial_sgd_on_the_sparse_problem():
    problem = small_problem()
    w, history = hogwild.train(MPI.COMM_SELF, sparse=problem, epochs=3, lr=0.5, lr_decay=0.8, quiet=True)
    np.testing.assert_array_equal(w, serial_sparse_sgd(problem, 3, 0.5, 0.8, seed=0))
    assert [h["staleness_max"] for h in history] == [0, 0, 0]


@pytest.mark.parametrize("epochs", sorted(SERIAL_SGD))
def test_the_serial_numbers_the_visible_tests_compare_with_are_serial_sgds(epochs):
    problem = small_problem()
    w = serial_sparse_sgd(problem, epochs, 0.5, 0.8, seed=0)
    best = problem.loss(problem.w_star)
    loss, gap, distance, norm = SERIAL_SGD[epochs]
    assert problem.loss(w) == pytest.approx(loss, rel=1e-9)
    assert problem.loss(w) - best == pytest.approx(gap, rel=1e-6)
    assert np.linalg.norm(w - problem.w_star) / np.linalg.norm(problem.w_star) == pytest.approx(distance, rel=1e-9)
    assert np.linalg.norm(w) == pytest.approx(norm, rel=1e-9)
