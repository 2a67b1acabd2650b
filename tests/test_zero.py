"""ZeRO stages 1, 2 and 3, unit by unit, are allreduce SGD with sharded state, on real MPI ranks (p = 1..5).

Run: python tests/run.py --max-ranks 5 -- tests/test_zero.py

Tolerance: none where the order of the sums is the same, bit for bit. Every stage sums each unit's
gradient with the ring's reduce-scatter over that unit, and the ring adds the ranks' values of each
element in the same order whether it runs alone or inside the allreduce; the optimizer's update
(momentum SGD, Adam) is elementwise, so updating a block gives the same bits as updating the whole;
the allgathers only copy. So with ``unit="model"`` (one unit: the whole vector's ring) each stage
must reproduce ``allreduce_sgd --allreduce ring`` exactly, and with ``unit="layer"`` allreduce SGD
whose ring runs layer by layer (the reference below); a wrong block, weight, state slice or missing
gather moves the parameters by far more than an ulp. Against the whole vector's ring, the layer
units add p >= 3 values in another order: 1e-13 relative after an epoch in float64 (a + b = b + a,
so p <= 2 is exact). The float64 MLP 64 -> 7 -> 5 -> 10 has 555 parameters in units of 455, 40 and
60: uneven blocks at p = 2..5.
"""
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

import collectives
from algorithms import allreduce_sgd, zero
from algorithms.core import checkpoint, run
from algorithms.core.cli import SettingError
from algorithms.core.objective import NetworkObjective, evaluate_at
from algorithms.shards import units
from collectives.trace import CountingComm, TracedComm
from minidl.data import least_squares, rank_batches
from tests.helpers import assert_stopped, launch, same_on_every_rank, tiny_digits, uneven_mlp

SMALL = dict(model=uneven_mlp, epochs=2, lr=0.05, momentum=0.9, batch_size=3, quiet=True)
UNIT_SIZES = (64 * 7 + 7, 7 * 5 + 5, 5 * 10 + 10)          # the MLP's layers, in the flat order


def unit_by_unit_ring(comm, buffer):
    """The sum over ranks of each layer's piece of ``buffer`` by its own ring allreduce (in place)."""
    start = 0
    for size in UNIT_SIZES:
        collectives.allreduce(comm, MPI.IN_PLACE, buffer[start:start + size], algorithm="ring", check=False)
        start += size


def allreduce_reference(comm, data, optimizer, summed, lr):
    """One epoch of allreduce SGD's step (``data_parallel_step``) with ``summed`` driving the optimizer."""
    objective = NetworkObjective(uneven_mlp(), data)
    settings = run.Settings(lr=lr, momentum=0.9)
    step = zero.make_optimizer(optimizer)([objective.flat.as_parameter()], settings)
    for batch in rank_batches(objective.n, 3, comm.rank, comm.size, 0, 0, "global"):
        allreduce_sgd.data_parallel_step(comm, objective, step, batch, summed)
    return objective.params


@pytest.mark.task("4.7")
@pytest.mark.parallel(nprocs=[1, 2, 3, 4, 5])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_every_zero_stage_equals_allreduce_sgd_with_the_same_ring_bit_for_bit(optimizer):
    comm, data = MPI.COMM_WORLD, tiny_digits()        # 50 rows: the last global batch is uneven for p > 1
    lr = 0.01 if optimizer == "adam" else 0.05
    whole = allreduce_reference(comm, data, optimizer, run.allreduce_function("ring"), lr)
    by_layer = allreduce_reference(comm, data, optimizer, unit_by_unit_ring, lr)
    parallel_assert(comm.size > 2 or bool(np.array_equal(whole, by_layer)), "p <= 2: the two rings differ")
    for unit, reference in (("model", whole), ("layer", by_layer)):
        for stage in zero.STAGES:
            params, _ = zero.train(comm, stage=stage, optimizer=optimizer, unit=unit, data=data,
                                   **dict(SMALL, epochs=1, lr=lr))
            differ = np.max(np.abs(params - reference))
            parallel_assert(bool(np.array_equal(params, reference)), f"stage {stage}, --unit {unit}, {optimizer}, "
                                                                      f"p={comm.size}: differs by {differ:.2e}")
            parallel_assert(same_on_every_rank(comm, params), f"stage {stage}: ranks disagree")
    apart = np.max(np.abs(by_layer - whole)) / np.max(np.abs(whole))
    parallel_assert(apart <= 1e-13, f"--unit layer vs the whole vector's ring: {apart:.1e} relative")


def zero_job(comm, stage, optimizer, unit="layer"):
    """A ZeRO run's set-up (Run.start and the Shard) on the float64 MLP, as ``zero.train`` makes it."""
    settings = run.Settings.of(dict(SMALL, data=tiny_digits()), partition="global")
    job = run.Run.start(comm, settings, writer=checkpoint.Writer("zero"), optimizer=zero.make_optimizer(optimizer))
    return job, zero.Shard(job, stage, zero.make_optimizer(optimizer), unit)


def absent(array):
    """A stand-in (``minidl.flat.absent``): read-only, one value broadcast, no memory of its own."""
    return not array.flags.writeable and all(stride == 0 for stride in array.strides)


@pytest.mark.parallel(nprocs=[3])
@pytest.mark.parametrize("stage", zero.STAGES)
def test_between_steps_each_stage_keeps_only_its_blocks_and_no_gradient(stage):
    comm = MPI.COMM_WORLD
    job, shard = zero_job(comm, stage, "adam")
    batch = job.batches(0)[0]
    for _ in range(2):
        zero.zero_step(comm, job.objective, shard, batch, stage)
    blocks = [collectives.block_counts(size, 3)[comm.rank] for size in UNIT_SIZES]
    parallel_assert([unit.n for unit in shard.units] == list(UNIT_SIZES), "the units are not the layers")
    parallel_assert([unit.shard.data.size for unit in shard.units] == blocks, "the parameter blocks")
    parallel_assert(all(sorted(state) == ["m", "v"] and all(value.size == block for value in state.values())
                        for state, block in zip(shard.optimizer.state, blocks)), "optimizer state not my blocks")
    parallel_assert(not job.optimizer.state[0], "the whole model's optimizer holds state between steps")
    layers = job.objective.flat.parameters
    parallel_assert(all(parameter.grad is None for parameter in layers) and
                    all(unit.gradient is None and unit.shard.grad is None for unit in shard.units),
                    f"stage {stage}: a gradient outlived the step")
    # the weights: stages 1, 2 the whole model (my blocks views of it); stage 3 only my blocks
    parallel_assert(all(absent(parameter.data) == (stage == 3) for parameter in layers),
                    f"stage {stage}: the layers' weights whole: {[not absent(p.data) for p in layers]}")
    parallel_assert(all((unit.shard.data.base is not None) == (stage < 3) for unit in shard.units),
                    f"stage {stage}: my blocks are views of the whole weights")
    whole = shard.whole_model(comm)                      # the end of a run: the weights only
    parallel_assert(whole.size == 555 and np.isfinite(whole).all() and same_on_every_rank(comm, whole),
                    f"stage {stage}: gather did not assemble the model")
    parallel_assert(not job.optimizer.state[0], f"stage {stage}: the weights' gather gathered the optimizer state")
    shard.whole_model(comm, state=True)                  # --save: the state whole on rank 0, which writes it
    sizes = {key: value.size for key, value in job.optimizer.state[0].items()}
    parallel_assert(sizes == ({"m": 555, "v": 555} if comm.rank == 0 else {}), f"gathered state: {sizes}")
    shard.let_go_of_state()
    parallel_assert(not job.optimizer.state[0], "the whole state outlived its writing")


def bytes_of_one_step(comm, stage, prefetch=False):
    """(bytes this rank sent, messages) for one step of stage ``stage``, the layers as units."""
    job, shard = zero_job(comm, stage, "sgd")
    shard.prefetch = prefetch
    counted = CountingComm(comm) if prefetch else TracedComm(comm)
    zero.zero_step(counted, job.objective, shard, job.batches(0)[0], stage)
    return counted.bytes_sent if prefetch else sum(m.nbytes for m in counted.messages if m.direction == "send"), \
        None if prefetch else sum(m.direction == "send" for m in counted.messages)


@pytest.mark.parallel(nprocs=[3, 4])
def test_stages_1_and_2_send_2_psi_and_stage_3_3_psi_per_step_prefetch_or_not():
    """The ring's halves per unit, rank r: a reduce-scatter sends every block but r, an allgather every
    block but r + 1; summed over ranks each sends (p - 1) n values. Stages 1, 2: one of each per unit,
    2 (p - 1) n values a step; stage 3: two allgathers and a reduce-scatter, 3 (p - 1) n (the paper's
    section 7). Messages: p - 1 per collective, per unit and rank."""
    comm, p, n, count = MPI.COMM_WORLD, MPI.COMM_WORLD.size, 555, len(UNIT_SIZES)
    for stage, times in ((1, 2), (2, 2), (3, 3)):
        sent, messages = bytes_of_one_step(comm, stage)
        total = comm.allreduce(sent)
        parallel_assert(total == times * (p - 1) * n * 8, f"stage {stage}: {total} bytes, not {times} psi")
        parallel_assert(messages == times * count * (p - 1), f"stage {stage}: {messages} messages")
    prefetched, _ = bytes_of_one_step(comm, 3, prefetch=True)
    parallel_assert(comm.allreduce(prefetched) == 3 * (p - 1) * n * 8, "stage 3 with --prefetch: other bytes")


def shared_folder(comm):
    folder = tempfile.mkdtemp(prefix="minidl-zero-") if comm.Get_rank() == 0 else None
    return Path(comm.bcast(folder, root=0))


@pytest.mark.parallel(nprocs=[3])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_zero_checkpoint_is_the_gathered_model_and_resumes_in_another_layout(optimizer):
    """1 epoch of stage 3, saved: the file holds the whole model and optimizer state; epoch 2 resumed
    in stage 1 (and, for momentum SGD, in allreduce SGD) is bitwise the unbroken stage-2 run (one unit:
    the whole vector's ring, allreduce SGD's)."""
    comm = MPI.COMM_WORLD
    folder = shared_folder(comm)
    ck = str(folder / "zero.npz")
    data = tiny_digits()
    common = dict(SMALL, data=data, lr=0.01 if optimizer == "adam" else 0.05, unit="model")
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
        plain = {key: value for key, value in common.items() if key != "unit"}
        resumed["allreduce_sgd"] = allreduce_sgd.train(comm, allreduce="ring", **plain, resume=ck)[0]
    for name, params in resumed.items():
        parallel_assert(bool(np.array_equal(params, unbroken)), f"{optimizer}: {name} after the file differs")
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(folder)


class Watched(units.Shard):
    """The Shard zero.train makes, remembering its run and what the whole model's optimizer held after
    each gather of the whole model (``seen``) and when --save wrote it (``written``)."""
    made = []

    def __init__(self, job, *args):
        super().__init__(job, *args)
        self.job, self.seen = job, []
        Watched.made.append(self)

    def whole_model(self, comm, state=False):
        params = super().whole_model(comm, state)
        self.seen.append(sorted(self.whole.state[0]))
        return params


@pytest.mark.parallel(nprocs=[2])
def test_a_run_gathers_the_whole_state_only_to_save_it_on_rank_0_and_keeps_nothing_whole_of_its_resume(
        monkeypatch):
    """Adam, stage 3: the end of a run gathers the weights (train()'s return) and the optimizer state only
    for --save, onto rank 0, dropped once written; a resumed run keeps of the file only the epoch."""
    comm, folder = MPI.COMM_WORLD, shared_folder(MPI.COMM_WORLD)
    ck = str(folder / "zero.npz")
    monkeypatch.setattr(zero, "Shard", Watched)
    common = dict(SMALL, data=tiny_digits(), lr=0.01, epochs=1)
    for flags in (dict(), dict(save=ck), dict(resume=ck, epochs=2)):
        Watched.made.clear()
        zero.train(comm, stage=3, optimizer="adam", **common | flags)
        shard = Watched.made[0]
        gathered = ["m", "v"] if "save" in flags and comm.rank == 0 else []
        parallel_assert(shard.seen == [gathered], f"{flags}: the whole state held at the end: {shard.seen}")
        parallel_assert(not shard.whole.state[0], f"{flags}: the whole state outlived the run")
        large = {key: value.size for key, value in shard.job.checkpoint.items() if np.size(value) > 1}
        parallel_assert(not large, f"{flags}: the run keeps the file's {large}")
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(folder)


def test_a_bad_stage_unit_or_prefetch_stops_every_rank_with_an_error():
    for flags, message in ((("--stage", "4"), "--stage must be 1, 2 or 3"),
                           (("--unit", "row"), "argument --unit: invalid choice: 'row'"),
                           (("--stage", "2", "--prefetch"), "stage 2 gathers no weights")):
        done = launch("zero", *flags, "--epochs", "1", ranks=2)
        assert_stopped(done, message, ranks=2)


@pytest.mark.parallel(nprocs=[3])
def test_more_ranks_than_parameters_and_a_convex_problem_are_refused_on_every_rank():
    problem = least_squares(30, 2, np.random.default_rng(0))       # 2 parameters, 3 ranks
    with pytest.raises(SettingError, match="3 ranks but the model has only 2 parameters") as refused:
        zero.train(MPI.COMM_WORLD, stage=2, problem=problem, epochs=1, quiet=True)
    parallel_assert(refused.value.every_rank, "refused on one rank only")
    problem = least_squares(30, 5, np.random.default_rng(0))
    with pytest.raises(SettingError, match="a convex problem has none") as refused:
        zero.train(MPI.COMM_WORLD, stage=1, problem=problem, epochs=1, quiet=True)
    parallel_assert(refused.value.every_rank, "refused on one rank only")


def test_layer_units_are_the_layers_with_parameters_and_what_follows_them():
    net = uneven_mlp()                      # Flatten, Linear, ReLU, Linear, ReLU, Linear
    layers = units.units_of(net, "layer")
    assert [[type(layer).__name__ for layer in unit] for unit in layers] == \
        [["Flatten", "Linear", "ReLU"], ["Linear", "ReLU"], ["Linear"]]
    assert units.units_of(net, "model") == [net]
