"""Asynchronous EASGD (algorithms/async_easgd.py): one worker is the serial spring, many converge.

Run: python tests/run.py --max-ranks 4 -- tests/test_async_easgd.py

- A serial loop of algorithm 2 with one worker (written here) equals synchronous EASGD at p = 1.
- One server and one worker (p = 2) equal that loop to 1e-12 in float64: the server adds the
  elastic moves exactly (rate 1), so the only difference would be the order of additions, and
  there is none: measured 0.
- Three workers on a least-squares problem: the centre's loss comes within 1e-3 of the optimum's
  (EASGD's fixed point is only near the optimum when the workers' shards differ: O(1/rho)).
- Three workers, deterministic, tau larger than an epoch's steps (one exchange per worker and epoch,
  at its step 0): the centre is the hand-computed elastic moves e = alpha (x_i - x~_read),
  x_i <- x_i - e, x~ <- x~ + e, applied in the order of the server's log, each worker's x_i
  carried through its local SGD steps between exchanges. Tolerance 1e-12 (relative): the same float64
  operations in the same order (measured 0). A sign error on either end of the spring, or an alpha
  other than lr * rho, moves the centre by far more (the moves are about 1e-2 here).
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import async_easgd, easgd
from minidl.data import batches, epoch_order, least_squares, shard

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


def hand_computed_springs(task, log, workers, epochs, seed, lr, alpha, batch):
    """The centre after the exchanges in ``log``'s order, when each worker exchanges once per epoch, at
    its step 0: its gradient at x_i, then e = alpha (x_i - x~ as its fetch read it), x_i <- x_i - e,
    x~ <- x~ + e, then x_i <- x_i - lr grad and the epoch's other local steps."""
    center, x, read, done = np.zeros(task.d), [None] * workers, {}, [0] * workers
    for event in log:
        if event[0] == "fetch":
            worker = event[1]
            if x[worker] is None:                  # the job's first fetch: start from the centre
                x[worker] = center.copy()
            else:
                read[worker] = center.copy()
        elif event[0] == "push":
            worker = event[1].worker
            order = epoch_order(task.n, seed, done[worker])[shard(task.n, worker, workers)]
            steps = [order[rows] for rows in batches(len(order), batch)]
            assert len(steps) < TAU, "the hand computation wants one exchange per epoch"
            grad = task.grad(x[worker], steps[0])
            elastic = alpha * (x[worker] - read.pop(worker))
            x[worker] = x[worker] - elastic
            center = center + elastic
            x[worker] = x[worker] - lr * grad
            for rows in steps[1:]:
                x[worker] = x[worker] - lr * task.grad(x[worker], rows)
            done[worker] += 1
    assert done == [epochs] * workers, f"exchanges per worker {done}, expected {epochs} each"
    return center


@pytest.mark.task("7.2")
@pytest.mark.parallel(nprocs=[4])
def test_three_workers_move_the_centre_by_the_hand_computed_elastic_terms_in_the_servers_order():
    task, seed, epochs = problem(), 2, 3           # 22, 21, 21 rows in batches of 8: 3 steps < tau = 4
    report = {}
    center, _ = async_easgd.train(MPI.COMM_WORLD, tau=TAU, rho=RHO, problem=task, epochs=epochs, lr=LR,
                                  batch_size=BATCH, seed=seed, deterministic=True, quiet=True, report=report)
    try:
        expected = hand_computed_springs(task, report["logs"][0], 3, epochs, seed, LR, LR * RHO, BATCH)
        error = float(np.max(np.abs(center - expected)))
        ok, message = error <= 1e-12 * np.max(np.abs(expected)), f"differs from the hand computation by {error:.3g}"
        moved = float(np.max(np.abs(expected)))     # the springs did pull: the test can see a wrong pull
        ok, message = ok and moved > 1e-3, message + f" (centre moved {moved:.3g})"
    except AssertionError as failure:
        ok, message = False, f"the log does not fit one exchange per epoch: {failure}"
    parallel_assert(ok, message)
