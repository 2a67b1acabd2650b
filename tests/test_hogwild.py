"""Hogwild!: one process is serial SGD; several converge on a sparse problem without locks."""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import common, hogwild, serial_sgd


def small_problem():
    return hogwild.sparse_logistic_regression(2000, 200, 5, np.random.default_rng(0), l2=1e-3)


def serial_sparse_sgd(problem, epochs, lr, decay, seed):
    """Plain serial SGD, one sample at a time, in serial_sgd's epoch order."""
    w = np.zeros(problem.features)
    for epoch in range(epochs):
        for e in serial_sgd.epoch_order(problem.n, seed, epoch):
            support = problem.index[e]
            w[support] = w[support] - lr * decay ** epoch * problem.sample_grad(w[support], e)
    return w


def test_the_optimum_is_a_stationary_point_of_the_split_objective():
    problem = small_problem()
    x = problem.dense()
    p = 1 / (1 + np.exp(-(x @ problem.w_star)))
    grad = x.T @ (p - problem.y) / problem.n + problem.l2 * problem.w_star
    assert np.linalg.norm(grad) < 1e-9
    # the per-sample gradients average to the full gradient (the regulariser split is right)
    w = np.random.default_rng(1).standard_normal(problem.features)
    total = np.zeros(problem.features)
    for e in range(problem.n):
        np.add.at(total, problem.index[e], problem.sample_grad(w[problem.index[e]], e))
    p = 1 / (1 + np.exp(-(x @ w)))
    np.testing.assert_allclose(total / problem.n, x.T @ (p - problem.y) / problem.n + problem.l2 * w, atol=1e-12)


def test_hogwild_with_one_process_equals_serial_sgd_on_the_sparse_problem():
    problem = small_problem()
    w, history = hogwild.train(MPI.COMM_SELF, sparse=problem, epochs=3, lr=0.5, lr_decay=0.8, quiet=True)
    np.testing.assert_array_equal(w, serial_sparse_sgd(problem, 3, 0.5, 0.8, seed=0))
    assert [h["staleness_max"] for h in history] == [0, 0, 0]


def test_hogwild_with_one_process_equals_serial_sgd_on_the_cnn():
    data = common.load_data("digits", 0)
    w, _ = hogwild.train(MPI.COMM_SELF, problem="dense", epochs=2, lr=0.05, batch_size=32, quiet=True, data=data)
    serial, _ = serial_sgd.train(epochs=2, lr=0.05, momentum=0.0, batch_size=32, quiet=True, data=data)
    np.testing.assert_array_equal(w, serial)


@pytest.mark.parallel(nprocs=[2, 3, 4])
def test_hogwild_on_several_processes_converges_to_the_serial_optimum_on_the_sparse_problem():
    # Serial SGD with these settings ends at F(w) - F(w*) = 7.9e-5 and ||w - w*|| / ||w*|| = 0.019.
    # Measured Hogwild runs (p = 2, 4; repeated) ended at 1.1-1.4x that gap and 0.020-0.023. Lock-free
    # interleavings vary with timing, so we allow 3x the serial gap and 2.5x its distance: far below
    # where the run starts (gap 0.2, distance 1.0) and where a wrong update would leave it.
    comm = MPI.COMM_WORLD
    problem = small_problem()
    w, history = hogwild.train(comm, sparse=problem, epochs=15, lr=0.5, lr_decay=0.8, quiet=True)
    best = problem.loss(problem.w_star)
    serial = serial_sparse_sgd(problem, 15, 0.5, 0.8, seed=0)
    serial_gap = problem.loss(serial) - best
    serial_distance = np.linalg.norm(serial - problem.w_star) / np.linalg.norm(problem.w_star)
    gap = problem.loss(w) - best
    distance = np.linalg.norm(w - problem.w_star) / np.linalg.norm(problem.w_star)
    parallel_assert(gap <= 3 * serial_gap, f"loss gap {gap:.2e} vs serial {serial_gap:.2e}")
    parallel_assert(distance <= 2.5 * serial_distance, f"||w - w*|| / ||w*|| = {distance:.3f} vs serial {serial_distance:.3f}")
    parallel_assert(sum(h["updates"] for h in history) == 15 * problem.n, f"{history}")
    # every rank returns the same shared vector
    first = comm.bcast(w, root=0)
    parallel_assert(bool(np.array_equal(first, w)), "ranks disagree about the shared vector")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="--lr-decay"):
        hogwild.train(MPI.COMM_SELF, sparse=small_problem(), lr_decay=0.0, quiet=True)
    with pytest.raises(ValueError, match="--problem"):
        hogwild.train(MPI.COMM_SELF, problem="both", quiet=True)
    with pytest.raises(ValueError, match="--nnz"):
        hogwild.sparse_logistic_regression(10, 5, 6, np.random.default_rng(0))
