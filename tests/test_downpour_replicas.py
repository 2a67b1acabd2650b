"""Downpour with model-parallel replicas (--replica-size k, algorithms/ps/replica.py) on real MPI ranks.

One replica of k ranks against serial SGD and serial Adagrad written out here; two replicas of two
against two one-rank workers under the same deterministic schedule; each replica rank pushes and
fetches its own parameters only; bad settings stop every rank.
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import downpour_sgd
from algorithms.core import objective
from minidl.data import batches, epoch_order
from minidl.nn import Flatten, Linear, Sequential
from minidl.optim import SGD, Adagrad
from tests.helpers import EQUAL_UP_TO_ROUNDING, assert_stopped, launch, tiny_digits, uneven_mlp

WIDTHS = [64, 7, 5, 10]               # uneven for k = 2 and 3: 7 = 4+3 = 3+2+2, 5 = 3+2 = 2+2+1


def serial(optimizer, epochs, batch_size, lr, seed=0):
    """Serial SGD or Adagrad over the whole training set, in the epochs' orders: one replica's run."""
    model = objective.build(uneven_mlp, data=tiny_digits(n_train=40), seed=seed)
    step = (SGD if optimizer == "sgd" else Adagrad)([model.flat.as_parameter()], lr=lr)
    for epoch in range(epochs):
        order = epoch_order(model.n, seed, epoch)
        for batch in batches(model.n, batch_size):
            model.loss_and_grad(order[batch])
            step.step()
    return model.params.copy()


def own_parameters(position, size):
    """Rank ``position`` of a replica of ``size`` owns, of each layer i -> o, the columns of its o_j neurons."""
    total = 0
    for inputs, outputs in zip(WIDTHS[:-1], WIDTHS[1:]):
        neurons = outputs // size + (position < outputs % size)
        total += inputs * neurons + neurons
    return total


@pytest.mark.parallel(nprocs=[3, 4])
def test_one_replica_of_k_ranks_is_serial_sgd_and_serial_adagrad_and_moves_only_its_own_parameters():
    # 3 ranks: 1 server + one replica of 2; 4 ranks: 2 servers (shards cut across the layers) + one replica of 2
    comm = MPI.COMM_WORLD
    servers, epochs, batch_size, lr = comm.size - 2, 2, 8, 0.1
    steps = epochs * -(-40 // batch_size)            # 40 rows in batches of 8: 5 steps an epoch
    for optimizer in ("sgd", "adagrad"):
        report = {}
        params, _ = downpour_sgd.train(comm, model=uneven_mlp, data=tiny_digits(n_train=40), epochs=epochs,
                                       batch_size=batch_size, lr=lr, server_optimizer=optimizer, servers=servers,
                                       replica_size=2, timeout=None, quiet=True, report=report)
        expected = serial(optimizer, epochs, batch_size, lr)
        error = float(np.abs(params - expected).max())
        parallel_assert(error < EQUAL_UP_TO_ROUNDING, f"{optimizer}: {error} from serial {optimizer}")
    # n_push = n_fetch = 1: a push and a fetch per step (the first fetch before step 0, none after the last)
    n = sum(i * o + o for i, o in zip(WIDTHS[:-1], WIDTHS[1:]))
    moved = {rank - servers: values for rank, values in report["values"].items()}
    wanted = {j: (steps * own_parameters(j, 2),) * 2 for j in range(2)}
    parallel_assert(moved == wanted, f"values pushed, fetched per replica rank {moved}, wanted {wanted}")
    parallel_assert(own_parameters(0, 2) + own_parameters(1, 2) == n, "the ranks' parameters partition the model")
    # inside the replica, model_parallel's exchanges: each layer's output to the other rank (7 + 5 + 10
    # values a row), each inner da (7 + 5) back; 8 rows, float64
    inside = sum(report["replica_bytes"].values())
    parallel_assert(inside == steps * (7 + 5 + 10 + 7 + 5) * 8 * 8, f"{inside} bytes inside the replica")


@pytest.mark.parallel(nprocs=[5])
def test_two_replicas_of_two_equal_two_one_rank_workers_under_the_same_deterministic_schedule():
    # ranks 0-4: 1 server + replicas {1, 2}, {3, 4}; then ranks 0-2 alone: 1 server + workers 1, 2
    comm = MPI.COMM_WORLD
    settings = dict(model=uneven_mlp, data=tiny_digits(n_train=40), epochs=2, batch_size=4, lr=0.05, n_push=2,
                    n_fetch=3,
                    deterministic=True, seed=4, quiet=True)
    report = {}
    params, _ = downpour_sgd.train(comm, replica_size=2, report=report, **settings)
    small = comm.Split(color=0 if comm.rank < 3 else MPI.UNDEFINED, key=comm.rank)
    reference = None
    if small != MPI.COMM_NULL:
        one = {}
        reference = (downpour_sgd.train(small, report=one, **settings)[0], one["logs"])
        small.Free()
    reference = comm.bcast(reference, root=0)
    parallel_assert(report["logs"] == reference[1], "the server logs differ: not the same order of updates")
    error = float(np.abs(params - reference[0]).max())
    parallel_assert(error < EQUAL_UP_TO_ROUNDING, f"{error} from the run with one-rank workers")


def narrow():
    return Sequential(Flatten(), Linear(64, 1, rng=np.random.default_rng(0), dtype="float64"))


@pytest.mark.parallel(nprocs=[3])
@pytest.mark.parametrize("settings, message", [
    (dict(replica_size=3), "--replica-size 3 does not divide the 2 worker ranks"),
    (dict(replica_size=0), "--replica-size must be an integer >= 1"),
    (dict(replica_size=2, model=narrow), "2 ranks cannot split layer 0 (64 -> 1) by output"),
    (dict(replica_size=2, groups=1), "--replica-size > 1 cannot be combined with --groups or --fail-worker"),
])
def test_bad_replica_settings_raise_the_same_error_on_every_rank_before_training(settings, message):
    settings = {"model": uneven_mlp, **settings}
    try:
        downpour_sgd.train(MPI.COMM_WORLD, quiet=True, data=tiny_digits(n_train=40), **settings)
        raised = None
    except ValueError as error:
        raised = str(error)
    parallel_assert(raised is not None and message in raised, f"got {raised!r}, wanted {message!r}")


def test_command_line_replica_size_not_dividing_the_workers_prints_error_and_exits_2_on_every_rank():
    assert_stopped(launch("downpour_sgd", "--replica-size", "2", ranks=4),
                   "--replica-size 2 does not divide the 3 worker ranks", ranks=4)
