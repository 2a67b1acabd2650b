"""Hogwild!: one process is serial SGD; several converge on a sparse problem without locks.

Serial SGD's own numbers on the small problem are written down here (SERIAL_SGD); the loop that
gives them is a solution of task 5.5, so it lives in tests/hidden/test_hogwild_serial.py, which
checks these numbers and that one process is serial SGD bit for bit.
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import hogwild, serial_sgd
from algorithms.core.cli import SettingError
from algorithms.core.objective import load_data
from minidl.data import sparse_logistic_regression
from tests.helpers import SERIAL_SGD, small_problem


def logistic_gradient(x, y, w, l2):
    """The dense form: X^T (sigma(X w) - y) / n + l2 w."""
    return x.T @ (1 / (1 + np.exp(-(x @ w))) - y) / len(y) + l2 * w


def test_the_sparse_gradients_match_the_dense_form_and_finite_differences():
    problem = sparse_logistic_regression(300, 40, 4, np.random.default_rng(3), l2=1e-2)
    x, w = problem.dense(), np.random.default_rng(1).standard_normal(problem.features)
    np.testing.assert_allclose(problem.grad(w), logistic_gradient(x, problem.y, w, problem.l2), atol=1e-12)
    rows = np.arange(0, 300, 7)
    np.testing.assert_allclose(problem.grad(w, rows), logistic_gradient(x[rows], problem.y[rows], w, problem.l2),
                               atol=1e-12)
    step = 1e-6
    numeric = [(problem.loss(w + step * unit) - problem.loss(w - step * unit)) / (2 * step)
               for unit in np.eye(problem.features)]
    np.testing.assert_allclose(problem.grad(w), numeric, atol=1e-7)
    p = 1 / (1 + np.exp(-(x @ w)))
    np.testing.assert_allclose(problem.hess(w), (x.T * (p * (1 - p))) @ x / problem.n + problem.l2 * np.eye(40),
                               atol=1e-12)


def test_the_optimum_is_a_stationary_point_and_the_split_regulariser_sums_to_the_full_gradient():
    problem = small_problem()
    x = problem.dense()
    assert np.linalg.norm(logistic_gradient(x, problem.y, problem.w_star, problem.l2)) < 1e-9
    # the per-sample gradients average to the full gradient (every coordinate is touched here)
    assert problem.degree.min() > 0
    w = np.random.default_rng(1).standard_normal(problem.features)
    total = np.zeros(problem.features)
    for e in range(problem.n):
        np.add.at(total, problem.index[e], problem.sample_grad(w[problem.index[e]], e))
    np.testing.assert_allclose(total / problem.n, logistic_gradient(x, problem.y, w, problem.l2), atol=1e-12)


@pytest.mark.task("5.5")
def test_hogwild_with_one_process_ends_where_serial_sgd_does_on_the_sparse_problem():
    problem = small_problem()
    w, history = hogwild.train(MPI.COMM_SELF, sparse=problem, epochs=3, lr=0.5, lr_decay=0.8, quiet=True)
    loss, gap, distance, norm = SERIAL_SGD[3]
    assert problem.loss(w) == pytest.approx(loss, rel=1e-9), "one process is not serial SGD"
    assert np.linalg.norm(w) == pytest.approx(norm, rel=1e-9), "one process is not serial SGD"
    assert np.linalg.norm(w - problem.w_star) / np.linalg.norm(problem.w_star) == pytest.approx(distance, rel=1e-9)
    assert [h["staleness_max"] for h in history] == [0, 0, 0]
    assert sum(h["updates"] for h in history) == 3 * problem.n


def test_hogwild_with_one_process_equals_serial_sgd_on_the_cnn():
    data = load_data("digits", 0)
    w, _ = hogwild.train(MPI.COMM_SELF, problem="dense", epochs=2, lr=0.05, batch_size=32, quiet=True, data=data)
    serial, _ = serial_sgd.train(epochs=2, lr=0.05, momentum=0.0, batch_size=32, quiet=True, data=data)
    np.testing.assert_array_equal(w, serial)


def test_save_then_resume_continues_the_run_bit_for_bit(tmp_path):
    problem, path = small_problem(), str(tmp_path / "hogwild.npz")
    kw = dict(sparse=problem, lr=0.5, lr_decay=0.8, quiet=True)
    straight, _ = hogwild.train(MPI.COMM_SELF, epochs=3, **kw)
    hogwild.train(MPI.COMM_SELF, epochs=2, save=path, **kw)
    resumed, history = hogwild.train(MPI.COMM_SELF, epochs=3, resume=path, **kw)
    np.testing.assert_array_equal(resumed, straight)
    assert [h["epoch"] for h in history] == [3]
    with np.load(path) as saved:
        assert int(saved["epoch"]) == 2 and int(saved["optimizer.steps"]) == 2 * problem.n


@pytest.mark.task("5.5")
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
    _, serial_gap, serial_distance, _ = SERIAL_SGD[15]
    gap = problem.loss(w) - best
    distance = np.linalg.norm(w - problem.w_star) / np.linalg.norm(problem.w_star)
    parallel_assert(gap <= 3 * serial_gap, f"loss gap {gap:.2e} vs serial {serial_gap:.2e}")
    parallel_assert(distance <= 2.5 * serial_distance, f"||w - w*|| / ||w*|| = {distance:.3f} vs serial "
                                                       f"{serial_distance:.3f}")
    parallel_assert(sum(h["updates"] for h in history) == 15 * problem.n, f"{history}")
    # every rank returns the same shared vector
    first = comm.bcast(w, root=0)
    parallel_assert(bool(np.array_equal(first, w)), "ranks disagree about the shared vector")


@pytest.mark.parallel(nprocs=[3])
def test_every_rank_draws_the_same_sparse_problem_so_nothing_is_sent():
    comm = MPI.COMM_WORLD
    w, history = hogwild.train(comm, n_samples=300, features=30, nnz=3, epochs=1, quiet=True)
    mine = sparse_logistic_regression(300, 30, 3, np.random.default_rng(0))
    theirs = comm.bcast(mine, root=0)
    same = all(np.array_equal(getattr(mine, name), getattr(theirs, name)) for name in ("index", "value", "y", "w_star"))
    parallel_assert(same, "the ranks drew different problems")
    parallel_assert(history[0]["loss_gap"] < 0.2, f"{history}")


def test_bad_settings_are_refused():
    with pytest.raises(SettingError, match="--lr-decay"):
        hogwild.train(MPI.COMM_SELF, sparse=small_problem(), lr_decay=0.0, quiet=True)
    with pytest.raises(SettingError, match="--problem"):
        hogwild.train(MPI.COMM_SELF, problem="both", quiet=True)
    with pytest.raises(SettingError, match="--momentum"):
        hogwild.train(MPI.COMM_SELF, sparse=small_problem(), momentum=0.9, quiet=True)
    with pytest.raises(SettingError, match="--nnz"):
        hogwild.train(MPI.COMM_SELF, n_samples=10, features=5, nnz=6, quiet=True)
    with pytest.raises(ValueError, match="nnz"):
        sparse_logistic_regression(10, 5, 6, np.random.default_rng(0))
