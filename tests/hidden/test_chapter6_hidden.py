"""Hidden: chapter 6's pipelines, partitions and hybrids beyond 4 ranks and at their edges (tasks 6.1-6.3).

The visible tests run P = 1..4. Here: both schedules at P = 3, 5, 6, 7 for m = 1, m < P, m = P and
m > P, checked against hand-worked orders and against the properties that define them (6.1), and
the training runs at those P with m < P and the stage's peak of held micro-batches; a wider MLP
and CNN partitioned over 3 to 7 ranks against the unpartitioned model (6.2); and hybrid grids of
3, 5, 6 and 7 ranks whose last global batch leaves a replica without rows (6.3).
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import hybrid_parallel, pipeline_parallel
from algorithms.core.objective import NetworkObjective
from minidl.data import Batch, epoch_order
from minidl.nn import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidl.optim import SGD
from tests.helpers import (
    EQUAL_UP_TO_ROUNDING,
    check_partitioned_equals_whole,
    float64_mlp_of,
    parallel_assert_close,
    serial_reference,
    six_layer_mlp,
    tiny_digits,
)

F, B = "forward", "backward"


# ---- 6.1: the schedules ----------------------------------------------------------------------------

HAND_WORKED = {   # P: {(kind, stage, m): the order, worked out on paper from the schedules' definitions}
    3: {("1f1b", 0, 5): [(F, 0), (F, 1), (F, 2), (B, 0), (F, 3), (B, 1), (F, 4), (B, 2), (B, 3), (B, 4)],
        ("1f1b", 1, 5): [(F, 0), (F, 1), (B, 0), (F, 2), (B, 1), (F, 3), (B, 2), (F, 4), (B, 3), (B, 4)],
        ("1f1b", 0, 1): [(F, 0), (B, 0)]},                                     # m = 1 < P - s - 1
    5: {("1f1b", 0, 2): [(F, 0), (F, 1), (B, 0), (B, 1)],                      # m < P: all warm-up
        ("1f1b", 3, 2): [(F, 0), (F, 1), (B, 0), (B, 1)],                      # warm-up of 1, holds 2
        ("1f1b", 4, 2): [(F, 0), (B, 0), (F, 1), (B, 1)],                      # the last stage
        ("1f1b", 1, 3): [(F, 0), (F, 1), (F, 2), (B, 0), (B, 1), (B, 2)]},     # m = P - s - 1 + 1
    6: {("gpipe", 2, 3): [(F, 0), (F, 1), (F, 2), (B, 2), (B, 1), (B, 0)],
        ("1f1b", 2, 4): [(F, 0), (F, 1), (F, 2), (F, 3), (B, 0), (B, 1), (B, 2), (B, 3)],
        ("1f1b", 1, 2): [(F, 0), (F, 1), (B, 0), (B, 1)]},
    7: {("1f1b", 2, 1): [(F, 0), (B, 0)],                                      # m = 1
        ("gpipe", 6, 1): [(F, 0), (B, 0)],
        ("1f1b", 0, 3): [(F, 0), (F, 1), (F, 2), (B, 0), (B, 1), (B, 2)],
        ("1f1b", 5, 4): [(F, 0), (F, 1), (B, 0), (F, 2), (B, 1), (F, 3), (B, 2), (B, 3)]},
}


@pytest.mark.task("6.1")
@pytest.mark.parametrize("stages", sorted(HAND_WORKED))
def test_schedules_match_the_hand_worked_orders(stages):
    for (kind, stage, m), expected in HAND_WORKED[stages].items():
        got = pipeline_parallel.schedule(kind, stage, stages, m)
        assert got == expected, f"{kind}, P={stages}, stage {stage}, m={m}: {got}, expected {expected}"


def check_1f1b(order, stages, stage, m):
    """What defines 1F1B: every micro-batch forward then backward once, backwards oldest first, min(P - s, m)
    forwards before the first backward, then strict alternation while forwards remain."""
    assert sorted(order) == sorted([(F, i) for i in range(m)] + [(B, i) for i in range(m)]), order
    assert [i for step, i in order if step == F] == list(range(m)), order
    assert [i for step, i in order if step == B] == list(range(m)), order       # oldest first
    first_backward = order.index((B, 0))
    assert first_backward == min(stages - stage, m), f"{first_backward} forwards before the first backward: {order}"
    rest = order[first_backward:]
    forwards_left = m - first_backward
    alternating = rest[:2 * forwards_left]
    assert alternating == [pair for i in range(forwards_left)
                           for pair in ((B, i), (F, first_backward + i))], f"no alternation after warm-up: {order}"
    held = peak = 0
    for step, _ in order:
        held += 1 if step == F else -1
        peak = max(peak, held)
    assert peak == min(stages - stage, m), f"held {peak} at stage {stage}, expected min(P - s, m)"


def check_gpipe(order, m):
    assert order == [(F, i) for i in range(m)] + [(B, i) for i in reversed(range(m))], order


@pytest.mark.task("6.1")
@pytest.mark.parametrize("stages", [3, 5, 6, 7])
@pytest.mark.parametrize("ms", ["1 to 3", "P - 2 and P - 1", "P and P + 3"])
def test_every_stage_of_both_schedules_follows_the_definition(stages, ms):
    chosen = {"1 to 3": [1, 2, 3], "P - 2 and P - 1": [stages - 2, stages - 1], "P and P + 3": [stages, stages + 3]}[ms]
    for m in chosen:
        for stage in range(stages):
            check_1f1b(pipeline_parallel.schedule("1f1b", stage, stages, m), stages, stage, m)
            check_gpipe(pipeline_parallel.schedule("gpipe", stage, stages, m), m)


def eight_layer_mlp():
    """64 -> 16 -> 12 -> 12 -> 10 in 8 layers, float64: enough layers for 7 stages."""
    return float64_mlp_of([64, 16, 12, 12, 10], seed=8)


def serial_steps(data, lr, momentum, batch_size):
    objective = NetworkObjective(eight_layer_mlp(), data)
    optimizer = SGD([objective.flat.as_parameter()], lr=lr, momentum=momentum)
    order = epoch_order(objective.n, 0, 0)
    for start in range(0, len(order), batch_size):
        objective.loss_and_grad(order[start:start + batch_size])
        optimizer.step()
    return objective.params.copy()


@pytest.mark.task("6.1")
@pytest.mark.parallel(nprocs=[3, 5, 6, 7])
def test_pipelines_with_fewer_micro_batches_than_stages_train_as_serial_sgd_and_hold_at_most_m():
    # 22 rows at batch 6: three batches of 6 and a last of 4 rows, split into m = 1, 2 and P - 1 micro-batches
    comm, data = MPI.COMM_WORLD, tiny_digits(n_train=22, n_test=5)
    P, s = comm.size, comm.rank
    serial = serial_steps(data, lr=0.1, momentum=0.9, batch_size=6)
    for kind in ("1f1b", "gpipe"):
        for m in sorted({1, 2, P - 1}):
            params, _ = pipeline_parallel.train(comm, schedule=kind, micro_batches=m, model=eight_layer_mlp,
                                                data=data, epochs=1, lr=0.1, momentum=0.9, batch_size=6, quiet=True)
            parallel_assert_close(params, serial, EQUAL_UP_TO_ROUNDING, f"{kind}, P={P}, m={m}")
            net = eight_layer_mlp()
            objective = NetworkObjective(net, data)
            stage = pipeline_parallel.Stage(net, s, P, data.x_train[:1])
            pipeline_parallel.pipeline_gradient(comm, stage, objective, Batch(np.arange(6), 6), m, kind)
            bound = m if kind == "gpipe" else min(P - s, m)
            parallel_assert(stage.peak_held == bound, f"{kind}, P={P}, m={m}, stage {s}: held {stage.peak_held}, "
                                                      f"expected {bound}")


# ---- 6.2: the partitioned network's gradient ---------------------------------------------------------

def wide_uneven_mlp():
    """64 -> 13 -> 9 -> 10, float64: every layer at least 7 wide, split unevenly over 3, 5, 6, 7 ranks."""
    return float64_mlp_of([64, 13, 9, 10], seed=12)


def seven_channel_cnn():
    """(N, 1, 8, 8) -conv 6-> pool -conv 7-> pool -> 28 -> 10, float64."""
    rng = np.random.default_rng(13)
    return Sequential(Conv2d(1, 6, 3, padding=1, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      Conv2d(6, 7, 3, padding=1, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      Flatten(), Linear(28, 10, rng=rng, init="glorot", dtype="float64"))


@pytest.mark.task("6.2")
@pytest.mark.parallel(nprocs=[3, 5, 6, 7])
def test_wide_mlp_split_over_p_ranks_both_ways_equals_the_unpartitioned_model():
    check_partitioned_equals_whole(wide_uneven_mlp, [64, 13, 9, 10], ["output", "input"])


@pytest.mark.task("6.2")
@pytest.mark.parallel(nprocs=[3, 5, 6])
def test_cnn_split_by_output_channels_over_p_ranks_equals_the_unpartitioned_model():
    check_partitioned_equals_whole(seven_channel_cnn, [64, 6 * 4 * 4, 7 * 2 * 2, 10], ["output"])


# ---- 6.3: the hybrid step --------------------------------------------------------------------------

GRIDS = {3: (1, "pipeline", "1f1b"), 5: (1, "model", "output"), 6: (2, "model", "input"), 7: (1, "pipeline", "gpipe")}


@pytest.mark.task("6.3")
@pytest.mark.parallel(nprocs=[3, 5, 6, 7])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_hybrid_grid_with_an_empty_replica_in_the_last_batch_equals_serial_sgd(momentum):
    # R replicas x `stages` ranks at batch 3 per replica; R * 3 * 2 + 1 rows: the last global batch has
    # one row, so every replica but one has none there
    comm = MPI.COMM_WORLD
    stages, group, variant = GRIDS[comm.size]
    replicas = comm.size // stages
    data = tiny_digits(n_train=replicas * 3 * 2 + 1, n_test=5)
    how = dict(schedule=variant, micro_batches=2) if group == "pipeline" else dict(split=variant)
    params, _ = hybrid_parallel.train(comm, stages=stages, group=group, **how, allreduce="mpi", model=six_layer_mlp,
                                      data=data, epochs=1, lr=0.1, momentum=momentum, batch_size=3, quiet=True)
    serial = serial_reference(data, epochs=1, lr=0.1, momentum=momentum, batch_size=replicas * 3,
                              model=six_layer_mlp)
    parallel_assert_close(params, serial, EQUAL_UP_TO_ROUNDING,
                          f"{replicas} replicas x {group} {stages} ({variant}), momentum {momentum}")


@pytest.mark.task("6.3")
@pytest.mark.parallel(nprocs=[6])
def test_two_replicas_of_a_three_stage_pipeline_equal_serial_sgd():
    comm, data = MPI.COMM_WORLD, tiny_digits(n_train=17, n_test=5)       # 17 = 2 x 2 x 4 + 1
    params, _ = hybrid_parallel.train(comm, stages=3, group="pipeline", schedule="1f1b", micro_batches=2,
                                      allreduce="mpi", model=six_layer_mlp, data=data, epochs=1, lr=0.1, momentum=0.9,
                                      batch_size=4, quiet=True)
    serial = serial_reference(data, epochs=1, lr=0.1, momentum=0.9, batch_size=8, model=six_layer_mlp)
    parallel_assert_close(params, serial, EQUAL_UP_TO_ROUNDING, "2 replicas x pipeline 3")
