"""Asynchronous EASGD (algorithms/async_easgd.py): one worker is the serial spring, many converge.

Run: python tests/run.py --max-ranks 4 -- tests/test_async_easgd.py

- A serial loop of algorithm 2 with one worker (written here) equals synchronous EASGD at p = 1.
- One server and one worker (p = 2) equal that loop to 1e-12 in float64: the server adds the
  elastic moves exactly (rate 1), so the only difference would be the order of additions, and
  there is none: measured 0.
- Three workers on a least-squares problem: the centre's loss comes within 1e-3 of the optimum's
  (EASGD's fixed point is only near the optimum when the workers' shards differ: O(1/rho)).
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import async_easgd, easgd
from minidl.data import epoch_order, least_squares

LR, RHO, TAU, BATCH, EPOCHS = 0.05, 2.0, 4, 8, 3


def problem():
    return least_squares(64, 6, np.random.default_rng(5))


def serial_spring(problem, epochs, lr, rho, tau, batch, seed=0):
    """Algorithm 2 with one worker, serially: the exchange at steps i % tau == 0 of each epoch."""
    x, center, alpha = np.zeros(problem.d), np.zeros(problem.d), lr * rho
    for epoch in range(epochs):
        order = epoch_order(problem.n, seed, epoch)
        for i, start in enumerate(range(0, problem.n, batch)):
            grad = problem.grad(x, order[start:start + batch])
            if i % tau == 0:
                elastic = alpha * (x - center)
                x -= elastic
                center += elastic
            x -= lr * grad
    return center


def test_the_serial_spring_is_sync_easgd_at_p_1():
    task = problem()                                           # 64 rows / batch 8 = 8 steps: tau 4 divides
    center, _ = easgd.train(MPI.COMM_SELF, tau=TAU, rho=RHO, problem=task, epochs=EPOCHS, lr=LR, momentum=0.0,
                            batch_size=BATCH, quiet=True)
    assert np.allclose(center, serial_spring(task, EPOCHS, LR, RHO, TAU, BATCH), rtol=1e-12, atol=1e-14)


@pytest.mark.task("7.2")
@pytest.mark.parallel(nprocs=[2])
def test_async_easgd_with_one_worker_equals_the_serial_spring():
    task = problem()
    center, _ = async_easgd.train(MPI.COMM_WORLD, tau=TAU, rho=RHO, problem=task, epochs=EPOCHS, lr=LR,
                                  batch_size=BATCH, quiet=True)
    expected = serial_spring(task, EPOCHS, LR, RHO, TAU, BATCH)
    error = float(np.max(np.abs(center - expected)))
    parallel_assert(error <= 1e-12 * np.max(np.abs(expected)), f"differs from the serial spring by {error:.3g}")


@pytest.mark.task("7.2")
@pytest.mark.parallel(nprocs=[4])
def test_async_easgd_centre_converges_on_a_quadratic():
    task = least_squares(300, 6, np.random.default_rng(2))
    center, history = async_easgd.train(MPI.COMM_WORLD, tau=2, problem=task, epochs=15, lr=0.05, batch_size=10,
                                        deterministic=True, quiet=True)
    gap = task.loss(center) - task.loss(task.w_star)
    start = task.loss(np.zeros(task.d)) - task.loss(task.w_star)
    parallel_assert(0 <= gap < 1e-3 * start, f"centre's loss gap {gap:.3g} (start {start:.3g})")
