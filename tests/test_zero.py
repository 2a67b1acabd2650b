"""ZeRO stages 1, 2 and 3 are allreduce SGD with sharded state, on real MPI ranks (p = 1..5).

Run: python tests/run.py --max-ranks 5 -- tests/test_zero.py

Tolerance: none, bit for bit. Every stage sums the gradient with the ring's reduce-scatter (stage
1: the ring allreduce, whose first loop it is), and the ring adds the ranks' values of each element
in the same order whether it runs alone or inside the allreduce; the optimizer's update (momentum
SGD, Adam) is elementwise, so updating a block of the vector gives the same bits as updating the
whole; the allgathers only copy. So each stage must reproduce ``allreduce_sgd --allreduce ring``
(and, for Adam, allreduce SGD's own step ``data_parallel_step`` driving Adam) exactly; a wrong
block, weight, state slice or a missing gather moves the parameters by far more than an ulp.
The float64 MLP 64 -> 7 -> 5 -> 10 has 555 parameters: uneven shards at p = 2 and 4 (278 + 277,
139 x 3 + 138).
"""
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import allreduce_sgd, zero
from algorithms.core import checkpoint, run
from algorithms.core.cli import SettingError
from algorithms.core.objective import NetworkObjective, evaluate_at
from minidl.data import least_squares, rank_batches
from minidl.optim import Adam
from tests.helpers import assert_stopped, launch, same_on_every_rank, tiny_digits, uneven_mlp

SMALL = dict(model=uneven_mlp, epochs=2, lr=0.05, momentum=0.9, batch_size=3, quiet=True)


def allreduce_adam(comm, data, epochs, lr, momentum, batch_size):
    """Allreduce SGD's step (``data_parallel_step``, ring allreduce) driving Adam(beta1 = momentum)."""
    objective = NetworkObjective(uneven_mlp(), data)
    optimizer = Adam([objective.flat.as_parameter()], lr=lr, betas=(momentum, 0.999))
    summed = run.allreduce_function("ring")
    for epoch in range(epochs):
        for batch in rank_batches(objective.n, batch_size, comm.rank, comm.size, 0, epoch, "global"):
            allreduce_sgd.data_parallel_step(comm, objective, optimizer, batch, summed)
    return objective.params


@pytest.mark.task("4.7")
@pytest.mark.parallel(nprocs=[1, 2, 3, 4, 5])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_every_zero_stage_equals_ring_allreduce_sgd_bit_for_bit(optimizer):
    comm, data = MPI.COMM_WORLD, tiny_digits()        # 50 rows: the last global batch is uneven for p > 1
    settings = dict(SMALL, epochs=1, lr=0.01 if optimizer == "adam" else 0.05)
    if optimizer == "sgd":
        reference, _ = allreduce_sgd.train(comm, data=data, allreduce="ring", **settings)
    else:
        reference = allreduce_adam(comm, data, 1, 0.01, 0.9, 3)
    for stage in zero.STAGES:
        params, _ = zero.train(comm, stage=stage, optimizer=optimizer, data=data, **settings)
        differ = np.max(np.abs(params - reference))
        parallel_assert(bool(np.array_equal(params, reference)), f"stage {stage}, {optimizer}, p={comm.size}: "
                                                                  f"differs from allreduce SGD by {differ:.2e}")
        parallel_assert(same_on_every_rank(comm, params), f"stage {stage}: ranks disagree")


def zero_job(comm, stage, optimizer):
    """A ZeRO run's set-up (Run.start and the Shard) on the float64 MLP, as ``zero.train`` makes it."""
    settings = run.Settings.of(dict(SMALL, data=tiny_digits()), partition="global")
    job = run.Run.start(comm, settings, writer=checkpoint.Writer("zero"), optimizer=zero.make_optimizer(optimizer))
    return job, zero.Shard(job, stage, zero.make_optimizer(optimizer))


@pytest.mark.parallel(nprocs=[3])
@pytest.mark.parametrize("stage", zero.STAGES)
def test_each_stage_keeps_only_its_block_of_what_it_shards(stage):
    comm = MPI.COMM_WORLD
    job, shard = zero_job(comm, stage, "adam")
    batch = job.batches(0)[0]
    for _ in range(2):
        zero.zero_step(comm, job.objective, shard, batch, stage)
    n, mine = job.objective.params.size, 555 // 3                 # 555 = 3 x 185
    state = shard.optimizer.state[0]
    parallel_assert(sorted(state) == ["m", "v"] and all(value.size == mine for value in state.values()),
                    f"stage {stage}: optimizer state sizes {[value.size for value in state.values()]}, block {mine}")
    parallel_assert(not job.optimizer.state[0], "the whole model's optimizer holds state between steps")
    # the gradient: stage 1 a view of the whole summed one; stages 2 and 3 a block of their own
    parallel_assert(np.shares_memory(shard.grad, job.objective.grad) == (stage == 1) and shard.grad.size == mine,
                    f"stage {stage}: gradient block of {shard.grad.size}, shares the whole gradient's memory: "
                    f"{np.shares_memory(shard.grad, job.objective.grad)}")
    # the parameters: stage 3 keeps only its block, the whole vector is released (nan) after each step
    released = bool(np.isnan(job.objective.params).all())
    parallel_assert(released == (stage == 3) and shard.params.size == mine and
                    np.shares_memory(shard.params, job.objective.params) == (stage != 3),
                    f"stage {stage}: whole vector released {released}, parameter block {shard.params.size}")
    whole = shard.gather(comm, job.objective, stage)
    parallel_assert(whole.size == n and np.isfinite(whole).all() and same_on_every_rank(comm, whole),
                    f"stage {stage}: gather did not assemble the model")
    parallel_assert(all(job.optimizer.state[0][key].size == n for key in ("m", "v")), "gathered state is not whole")


def shared_folder(comm):
    folder = tempfile.mkdtemp(prefix="minidl-zero-") if comm.Get_rank() == 0 else None
    return Path(comm.bcast(folder, root=0))


@pytest.mark.parallel(nprocs=[3])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_zero_checkpoint_is_the_gathered_model_and_resumes_in_another_layout(optimizer):
    """1 epoch of stage 3, saved: the file holds the whole model and optimizer state; epoch 2 resumed
    in stage 1 (and, for momentum SGD, in allreduce SGD) is bitwise the unbroken stage-2 run."""
    comm = MPI.COMM_WORLD
    folder = shared_folder(comm)
    ck = str(folder / "zero.npz")
    data = tiny_digits()
    common = dict(SMALL, data=data, lr=0.01 if optimizer == "adam" else 0.05)
    unbroken, _ = zero.train(comm, stage=2, optimizer=optimizer, **common)
    first, history = zero.train(comm, stage=3, optimizer=optimizer, **dict(common, epochs=1), save=ck)
    saved = np.load(ck)
    buffers = ["optimizer.m.0", "optimizer.v.0"] if optimizer == "adam" else ["optimizer.momentum.0"]
    parallel_assert(all(saved[key].shape == (555,) for key in ["params"] + buffers), f"{optimizer}: {dict(saved)}")
    parallel_assert(bool(np.array_equal(saved["params"], first)), "the file's params are not the run's")
    found = evaluate_at(NetworkObjective(uneven_mlp(), data), saved["params"])   # serially: the logged numbers
    parallel_assert(found["test_loss"] == history[-1]["test_loss"], f"{found} vs {history[-1]}")
    resumed = {"zero stage 1": zero.train(comm, stage=1, optimizer=optimizer, **common, resume=ck)[0]}
    if optimizer == "sgd":
        resumed["allreduce_sgd"] = allreduce_sgd.train(comm, allreduce="ring", **common, resume=ck)[0]
    for name, params in resumed.items():
        parallel_assert(bool(np.array_equal(params, unbroken)), f"{optimizer}: {name} after the file differs")
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(folder)


def test_a_stage_that_is_not_1_2_or_3_stops_every_rank_with_an_error():
    done = launch("zero", "--stage", "4", "--epochs", "1", ranks=2)
    assert_stopped(done, "--stage must be 1, 2 or 3", ranks=2)


@pytest.mark.parallel(nprocs=[3])
def test_more_ranks_than_parameters_is_refused_on_every_rank():
    problem = least_squares(30, 2, np.random.default_rng(0))       # 2 parameters, 3 ranks
    with pytest.raises(SettingError, match="3 ranks but the model has only 2 parameters") as refused:
        zero.train(MPI.COMM_WORLD, stage=2, problem=problem, epochs=1, quiet=True)
    parallel_assert(refused.value.every_rank, "refused on one rank only")
