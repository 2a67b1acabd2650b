"""Hidden: chapter 4's hearts on 3, 5, 6 and 7 ranks, with uneven and empty pieces (tasks 4.1-4.6).

The visible tests run these algorithms on 1 to 4 ranks through their training loops. Here each
heart is called directly, step by step, on rank counts that are not powers of two, with data
sizes whose last batch does not divide among the ranks (some ranks get no rows at all), with
momentum on and off, and is compared with a serial simulation written in this file: p float64
replicas in one process, each doing by hand what the paper's rule says. The simulations are
solutions of the tasks, so they stay out of student trees.
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import admm_sgd, allreduce_sgd, easgd, ensemble, gossip_sgd, model_averaging
from algorithms.core import run
from algorithms.core.objective import NetworkObjective
from minidl.data import rank_batches
from minidl.data.sharding import Batch
from minidl.optim import SGD
from tests.helpers import float64_mlp, parallel_assert_close, relative_error, serial_reference, tiny_digits

ODD_RANKS = [3, 5, 6, 7]
SUM = run.allreduce_function("mpi")
# p replicas summed by MPI in some order and by NumPy in another: a few ulps per step, carried
# over a handful of steps; a wrong weight, period or sign moves the parameters by > 1e-4.
CLOSE = 1e-10


def replica(data, lr=0.1, momentum=0.0):
    objective = NetworkObjective(float64_mlp(), data)
    return objective, SGD([objective.flat.as_parameter()], lr=lr, momentum=momentum)


def awkward_rows(size):
    """4 p + 2 rows: shards of 5 and 4 rows, so at batch 2 the ranks with 4 rows have an empty 3rd step."""
    return 4 * size + 2


def shard_steps(data, size, epochs=1):
    """Every rank's batches of 2 rows of its own shard (seed 0), epoch after epoch: [rank][step]."""
    return [[piece for epoch in range(epochs)
             for piece in rank_batches(len(data.y_train), 2, rank, size, seed=0, epoch=epoch, partition="shards")]
            for rank in range(size)]


# ---- 4.1: the weighted data-parallel step ----------------------------------------------------------

@pytest.mark.task("4.1")
@pytest.mark.parallel(nprocs=ODD_RANKS)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sync_steps_with_an_uneven_last_batch_and_idle_ranks_equal_serial_sgd(momentum):
    # 4 p + p // 2 rows at batch 2 per rank: the last global batch has p // 2 < p rows, so some
    # ranks have none and the others one each; its mean is over p // 2 rows, not p b.
    comm = MPI.COMM_WORLD
    batch, data = 2, tiny_digits(n_train=4 * comm.size + comm.size // 2)
    objective, optimizer = replica(data, momentum=momentum)
    pieces = rank_batches(objective.n, batch, comm.rank, comm.size, seed=0, epoch=0)
    parallel_assert(sum(comm.allgather(len(pieces[-1].index))) == comm.size // 2, "the set-up lost its short batch")
    for piece in pieces:
        allreduce_sgd.data_parallel_step(comm, objective, optimizer, piece, SUM)
    serial = serial_reference(data, epochs=1, lr=0.1, momentum=momentum, batch_size=comm.size * batch)
    parallel_assert_close(objective.params, serial, CLOSE, f"p={comm.size}, momentum {momentum} from serial SGD")


@pytest.mark.task("4.1")
@pytest.mark.parallel(nprocs=[5, 7])
def test_one_step_in_which_only_the_last_rank_has_rows_is_serial_sgd_on_those_rows():
    comm = MPI.COMM_WORLD
    data = tiny_digits(n_train=20)
    rows = np.array([3, 11, 17])
    objective, optimizer = replica(data, lr=0.2)
    mine = rows if comm.rank == comm.size - 1 else rows[:0]
    loss = allreduce_sgd.data_parallel_step(comm, objective, optimizer, Batch(mine, len(rows)), SUM)
    serial, serial_optimizer = replica(data, lr=0.2)
    serial.loss_and_grad(rows)
    serial_optimizer.step()
    parallel_assert_close(objective.params, serial.params, 1e-13, f"p={comm.size} from one serial step on 3 rows")
    parallel_assert(comm.rank == comm.size - 1 or loss == 0.0, f"an idle rank reported loss {loss}")


# ---- 4.2: local SGD with model averaging every H steps ---------------------------------------------

def simulated_local_sgd(data, size, steps_of, period, momentum):
    """p replicas, each with its own SGD state, averaged (only the weights) when (step + 1) % H == 0."""
    replicas = [replica(data, momentum=momentum) for _ in range(size)]
    for step in range(len(steps_of[0])):
        for rank, (objective, optimizer) in enumerate(replicas):
            rows = steps_of[rank][step].index
            if len(rows):
                objective.loss_and_grad(rows)
                optimizer.step()
        if period is not None and (step + 1) % period == 0:
            mean = sum(objective.params for objective, _ in replicas) / size
            for objective, _ in replicas:
                objective.params[...] = mean
    return [objective.params.copy() for objective, _ in replicas]


@pytest.mark.task("4.2")
@pytest.mark.parallel(nprocs=ODD_RANKS)
@pytest.mark.parametrize("period,momentum", [(1, 0.0), (2, 0.9), (4, 0.0)])
def test_local_sgd_on_uneven_shards_averages_exactly_every_h_steps(period, momentum):
    comm = MPI.COMM_WORLD
    data = tiny_digits(n_train=awkward_rows(comm.size))
    steps_of = shard_steps(data, comm.size, epochs=2)
    objective, optimizer = replica(data, momentum=momentum)
    for step, piece in enumerate(steps_of[comm.rank]):
        model_averaging.parallel_sgd_step(comm, objective, optimizer, piece, step, period, SUM)
    expected = simulated_local_sgd(data, comm.size, steps_of, period, momentum)[comm.rank]
    parallel_assert_close(objective.params, expected, CLOSE, f"H={period}, p={comm.size} from the simulation")


@pytest.mark.task("4.2")
@pytest.mark.parallel(nprocs=[3, 7])
def test_without_a_period_the_ranks_never_average_and_drift_apart():
    # period None is --period end: no average inside the loop (the one after training is not this step's)
    comm = MPI.COMM_WORLD
    data = tiny_digits(n_train=awkward_rows(comm.size))
    steps_of = shard_steps(data, comm.size)
    objective, optimizer = replica(data, momentum=0.9)
    for step, piece in enumerate(steps_of[comm.rank]):
        model_averaging.parallel_sgd_step(comm, objective, optimizer, piece, step, None, SUM)
    expected = simulated_local_sgd(data, comm.size, steps_of, None, 0.9)[comm.rank]
    parallel_assert(bool(np.array_equal(objective.params, expected)), f"p={comm.size}: H = None is not local SGD")
    first = comm.bcast(objective.params.copy() if comm.rank == 0 else None)
    parallel_assert(comm.rank == 0 or not np.array_equal(objective.params, first), "the ranks were averaged")


# ---- 4.3: one consensus-ADMM round -----------------------------------------------------------------

@pytest.mark.task("4.3")
@pytest.mark.parallel(nprocs=ODD_RANKS)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_two_admm_rounds_with_an_empty_local_step_equal_the_hand_written_rounds(momentum):
    comm = MPI.COMM_WORLD
    size, rho = comm.size, 0.7
    data = tiny_digits(n_train=awkward_rows(size))
    steps_of = shard_steps(data, size)
    objective, optimizer = replica(data, momentum=momentum)
    z = objective.params.copy()
    u = np.zeros_like(z)
    for _ in range(2):
        admm_sgd.admm_round(comm, objective, optimizer, steps_of[comm.rank], z, u, rho, SUM)
    # the simulation: x-step on f_i + rho/2 |x - z + u|^2 (empty pieces skip), z = mean(x + u), u += x - z
    replicas = [replica(data, momentum=momentum) for _ in range(size)]
    zs = replicas[0][0].params.copy()
    us = [np.zeros_like(zs) for _ in range(size)]
    for _ in range(2):
        for rank, (x, opt) in enumerate(replicas):
            for piece in steps_of[rank]:
                if len(piece.index):
                    x.loss_and_grad(piece.index)
                    x.grad += rho * (x.params - zs + us[rank])
                    opt.step()
        zs = sum(x.params + us[rank] for rank, (x, _) in enumerate(replicas)) / size
        for rank, (x, _) in enumerate(replicas):
            us[rank] = us[rank] + x.params - zs
    errors = (relative_error(objective.params, replicas[comm.rank][0].params), relative_error(z, zs),
              float(np.max(np.abs(u - us[comm.rank]))) / float(np.max(np.abs(zs))))
    parallel_assert(max(errors) < CLOSE, f"p={comm.size}: relative errors (x, z, u) = {errors}")


@pytest.mark.task("4.3")
@pytest.mark.parallel(nprocs=[5])
def test_admm_round_with_no_local_rows_anywhere_is_the_pure_consensus_update():
    # K = 1 empty step on every rank: x stays, z = mean(x_i + u_i), u_i += x_i - z (closed form)
    comm = MPI.COMM_WORLD
    data = tiny_digits(n_train=10)
    objective, optimizer = replica(data)
    rng = np.random.default_rng([5, comm.rank])
    objective.params[...] = rng.standard_normal(objective.params.size)
    x0 = objective.params.copy()
    u = rng.standard_normal(x0.size)
    u0, z = u.copy(), np.zeros_like(x0)
    admm_sgd.admm_round(comm, objective, optimizer, [Batch(np.array([], dtype=int), 0)], z, u, 1.0, SUM)
    everyone = comm.allgather((x0, u0))
    mean = sum(x + v for x, v in everyone) / comm.size
    parallel_assert(bool(np.array_equal(objective.params, x0)), "an empty x-step moved x")
    parallel_assert(float(np.max(np.abs(z - mean))) < 1e-13, "z is not the mean of x + u")
    parallel_assert(float(np.max(np.abs(u - (u0 + x0 - mean)))) < 1e-13, "u is not u + x - z")


# ---- 4.4: one synchronous EASGD step -----------------------------------------------------------------

@pytest.mark.task("4.4")
@pytest.mark.parallel(nprocs=ODD_RANKS)
@pytest.mark.parametrize("tau,momentum", [(1, 0.0), (2, 0.9)])
def test_easgd_steps_with_empty_pieces_equal_the_hand_written_spring(tau, momentum):
    comm = MPI.COMM_WORLD
    size, alpha = comm.size, 0.9 / (comm.size * 1.5)
    data = tiny_digits(n_train=awkward_rows(size))
    steps_of = shard_steps(data, size)
    objective, optimizer = replica(data, momentum=momentum)
    objective.params[...] += 0.05 * np.random.default_rng([9, comm.rank]).standard_normal(objective.params.size)
    start = comm.allgather(objective.params.copy())
    center = np.mean(start, axis=0)
    for step, piece in enumerate(steps_of[comm.rank]):
        easgd.easgd_step(comm, objective, optimizer, piece, center, step, tau, alpha, SUM)
    # the simulation: gradient at the old x_i; every tau steps x_i -= a (x_i - c), c += a sum_j (x_j - c)
    replicas = [replica(data, momentum=momentum) for _ in range(size)]
    for (x, _), x0 in zip(replicas, start):
        x.params[...] = x0
    c = np.mean(start, axis=0)
    for step in range(len(steps_of[0])):
        grads = []
        for rank, (x, _) in enumerate(replicas):
            rows = steps_of[rank][step].index
            if len(rows):
                x.loss_and_grad(rows)
            grads.append(x.grad.copy())
        if step % tau == 0:
            old = [x.params.copy() for x, _ in replicas]
            for x, _ in replicas:
                x.params[...] -= alpha * (x.params - c)
            c = c + alpha * sum(o - c for o in old)
        for rank, (x, opt) in enumerate(replicas):
            if len(steps_of[rank][step].index):
                x.grad[...] = grads[rank]
                opt.step()
    errors = relative_error(objective.params, replicas[comm.rank][0].params), relative_error(center, c)
    parallel_assert(max(errors) < CLOSE, f"tau={tau}, p={comm.size}: relative errors (x, centre) = {errors}")


# ---- 4.5: one gossip round -------------------------------------------------------------------------

@pytest.mark.task("4.5")
@pytest.mark.parallel(nprocs=ODD_RANKS)
@pytest.mark.parametrize("pairing,round_number", [("ring", 0), ("ring", 1), ("random", 3)])
def test_a_gossip_round_on_p_ranks_averages_each_pair_and_leaves_the_odd_one_out(pairing, round_number):
    # rank r holds (r + 1) * 10^k for k = 0..3: every pair's average, and every idle rank, is exact
    comm = MPI.COMM_WORLD
    values = (comm.rank + 1.0) * 10.0 ** np.arange(4)
    params = values.copy()
    gossip_sgd.gossip_round(comm, params, round_number, pairing, seed=11)
    if pairing == "ring":
        position = (comm.rank - round_number % 2) % comm.size
        partner = (None if position == comm.size - 1 else (comm.rank + 1) % comm.size) if position % 2 == 0 \
            else (comm.rank - 1) % comm.size
    else:
        order = list(np.random.default_rng([11, round_number]).permutation(comm.size))
        where = order.index(comm.rank)
        mate = where + 1 if where % 2 == 0 else where - 1
        partner = int(order[mate]) if mate < comm.size else None
    expected = values if partner is None else (comm.rank + partner + 2.0) / 2 * 10.0 ** np.arange(4)
    parallel_assert(bool(np.array_equal(params, expected)),
                    f"p={comm.size}, {pairing} round {round_number}: rank {comm.rank} (partner {partner}) "
                    f"holds {params}, expected {expected}")
    idle = sum(comm.allgather(partner is None))
    parallel_assert(idle == comm.size % 2, f"{idle} idle ranks at p = {comm.size}")


# ---- 4.6: the ensemble's averaged prediction --------------------------------------------------------

@pytest.mark.task("4.6")
@pytest.mark.parallel(nprocs=ODD_RANKS)
@pytest.mark.parametrize("rows", [1, 7])
def test_ensemble_prediction_on_p_members_is_their_mean_with_the_shape_of_one(rows):
    comm = MPI.COMM_WORLD
    data = tiny_digits(n_train=10, n_test=rows)
    objective = NetworkObjective(float64_mlp(), data)
    objective.params[...] = np.random.default_rng([6, comm.rank]).standard_normal(objective.params.size) * 0.3
    averaged = ensemble.ensemble_predict(comm, objective, data.x_test, SUM)
    members = comm.allgather(objective.predict(data.x_test))
    expected = sum(members) / comm.size
    parallel_assert(averaged.shape == (rows, 10), f"shape {averaged.shape}, expected {(rows, 10)}")
    parallel_assert(float(np.max(np.abs(averaged - expected))) < 1e-14, f"p={comm.size}: not the members' mean")
    parallel_assert(float(np.max(np.abs(averaged.sum(axis=1) - 1))) < 1e-13, "the mean is not a distribution")
