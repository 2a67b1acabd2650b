"""A serial replay of a deterministic asynchronous EASGD run's server log (the oracle of task 7.2's hidden tests).

The replay re-implements the worker's exchange (algorithm 2 of Zhang et al. 2015), so it stays
out of student trees. Each worker is a generator that yields its requests in order: ("fetch",) and
is sent the centre, or ("push", vector). The server's log says in which order it served them; the
replay serves them in that order, applies each push as the server does (rate 1: x~ <- x~ - push),
and must end on the centre the run returned. Least squares in float64, one server.
"""
import numpy as np
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import async_easgd
from algorithms.ps.worker import worker_batches

LR, RHO, TAU, BATCH, EPOCHS = 0.05, 2.0, 3, 8, 2


def worker_program(problem, worker, workers, seed, alpha):
    """Worker ``worker``'s requests, as algorithm 2 makes them, given what its fetches return."""
    x = yield ("fetch",)                       # the job's first fetch: start from the centre
    x = x.copy()
    for epoch in range(EPOCHS):
        for i, rows in enumerate(worker_batches(problem.n, seed, epoch, worker, workers, BATCH)):
            grad = problem.grad(x, rows)
            if i % TAU == 0:
                center = yield ("fetch",)
                elastic = alpha * (x - center)
                x -= elastic
                yield ("push", -elastic)
            x -= LR * grad


def replay(log, problem, workers, seed, alpha):
    center = np.zeros(problem.d)
    programs = [worker_program(problem, w, workers, seed, alpha) for w in range(workers)]
    pending = [next(program) for program in programs]
    for event in log:
        kind = event[0]
        worker = event[1].worker if kind == "push" else event[1]
        if kind == "fetch":
            assert pending[worker] == ("fetch",), f"worker {worker} fetched when its program wanted {pending[worker]}"
            pending[worker] = programs[worker].send(center.copy())
        elif kind == "push":
            assert pending[worker][0] == "push", f"worker {worker} pushed when its program wanted {pending[worker]}"
            center = center - 1.0 * pending[worker][1]
            pending[worker] = next(programs[worker], None)
        elif kind == "goodbye":
            assert pending[worker] is None, f"worker {worker} said goodbye with {pending[worker]} still to do"
    assert all(request is None for request in pending), "the log ended before every worker did"
    return center


def check_against_its_replay(problem, seed):
    """A deterministic run of async EASGD on every rank of COMM_WORLD (rank 0 the server) ends where a
    serial replay of its server's log ends, and pushed once per tau steps of every worker."""
    comm = MPI.COMM_WORLD
    report = {}
    center, _ = async_easgd.train(comm, tau=TAU, rho=RHO, problem=problem, epochs=EPOCHS, lr=LR, batch_size=BATCH,
                                  seed=seed, deterministic=True, quiet=True, report=report)
    workers = comm.size - 1
    try:
        replayed = replay(report["logs"][0], problem, workers, seed, LR * RHO)
        error = float(np.max(np.abs(center - replayed)))
        message = f"differs from the replay of its log by {error:.3g}"
        equal = error <= 1e-12 * max(1.0, float(np.max(np.abs(replayed))))
    except AssertionError as failure:
        equal, message = False, f"the log cannot be replayed: {failure}"
    parallel_assert(equal, f"p={comm.size}: {message}")
    pushes = sum(1 for event in report["logs"][0] if event[0] == "push")
    per_worker = [-(-len(worker_batches(problem.n, seed, 0, w, workers, BATCH)) // TAU) * EPOCHS
                  for w in range(workers)]
    parallel_assert(pushes == sum(per_worker), f"{pushes} pushes, expected {sum(per_worker)} (one per tau steps)")
