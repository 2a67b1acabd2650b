"""Large-batch schedules (algorithms/core/schedule.py) against their closed forms, and inside the one loop.

Run: python tests/run.py --max-ranks 2 -- tests/test_schedules.py

- Goyal et al.'s linear scaling and gradual warm-up: lr at global step t is lr + t (k lr - lr) / T
  for t < T = warmup_epochs * steps_per_epoch, then k lr (sqrt scaling: sqrt(k) lr).
- Step decay: lr / decay_factor ** (milestones passed).
- Smith et al.: the batch schedule's lr / batch is the decaying run's at every step of both runs.
- Run.loop applies the schedule: a scheduled allreduce SGD run equals a serial loop that sets
  lr and batch by the closed form; the defaults leave the schedule off (tests/test_shape.py pins bits).
"""
import math
import re
from numbers import Real

import pytest
from hypothesis import given, settings, strategies as st
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import allreduce_sgd
from algorithms.core import run
from algorithms.core.cli import SettingError
from algorithms.core.objective import NetworkObjective
from algorithms.core.schedule import Schedule
from minidl.data import epoch_order
from minidl.optim import SGD
from tests.helpers import (
    EQUAL_UP_TO_ROUNDING,
    assert_stopped,
    float64_mlp,
    launch,
    parallel_assert_close,
    results_of,
    tiny_digits,
)


@pytest.mark.task("9.1")
@settings(max_examples=10)
@given(lr=st.floats(1e-3, 1.0), ranks=st.integers(1, 16), batch=st.integers(1, 64),
       warmup=st.integers(1, 5), steps_per_epoch=st.integers(1, 30), scaling=st.sampled_from(["linear", "sqrt"]))
def test_warm_up_and_scaling_equal_goyals_closed_form_step_by_step(lr, ranks, batch, warmup, steps_per_epoch,
                                                                   scaling):
    schedule = Schedule(lr, batch, ranks, scaling, None, warmup)
    k = ranks * batch / batch                          # the reference batch is one rank's batch
    target = lr * k if scaling == "linear" else lr * math.sqrt(k)
    steps = warmup * steps_per_epoch                   # T: warm-up steps
    every_step = range(steps + 2 * steps_per_epoch)
    rates = results_of(schedule.lr_at, [(t / steps_per_epoch,) for t in every_step], Real)   # one call
    for t, got in zip(every_step, rates):
        expected = lr + t * (target - lr) / steps if t < steps else target
        assert got == pytest.approx(expected, rel=1e-12), f"step {t}: {got} != {expected}"


@pytest.mark.task("9.1")
def test_scaling_uses_the_reference_batch_and_step_decay_divides_at_each_milestone():
    schedule = Schedule(0.1, 32, 4, "linear", reference_batch=256, lr_decay=(3, 6), decay_factor=5.0)
    assert schedule.peak == pytest.approx(0.1 * 128 / 256, rel=1e-15)
    for epoch, divisor in [(0, 1), (2.99, 1), (3, 5), (5.5, 5), (6, 25), (9, 25)]:
        assert schedule.lr_at(epoch) == pytest.approx(0.05 / divisor, rel=1e-15), epoch
        assert schedule.global_batch_at(int(epoch)) == 128
    sqrt = Schedule(0.1, 8, 4, "sqrt")                 # k = 4: sqrt(4) = 2
    assert sqrt.lr_at(0) == pytest.approx(0.2, rel=1e-15) and not sqrt.constant


def steps_of(schedule, n, epochs):
    """[(fractional epoch, global batch)] of every step a run with ``schedule`` takes over n rows."""
    steps = []
    for epoch in range(epochs):
        count = -(-n // schedule.global_batch_at(epoch))
        steps += [(epoch + i / count, schedule.global_batch_at(epoch)) for i in range(count)]
    return steps


@pytest.mark.task("9.1")
@settings(max_examples=10)
@given(lr=st.floats(1e-3, 1.0), ranks=st.integers(1, 8), batch=st.integers(1, 32), factor=st.integers(2, 5),
       milestones=st.lists(st.integers(1, 7), min_size=1, max_size=3, unique=True),
       warmup=st.sampled_from([0, 1]), scaling=st.sampled_from(["none", "linear"]))
def test_the_batch_schedule_keeps_the_decaying_runs_lr_over_batch_at_every_step(lr, ranks, batch, factor,
                                                                              milestones, warmup, scaling):
    common = dict(lr=lr, batch_size=batch, ranks=ranks, scaling=scaling, warmup_epochs=warmup,
                  lr_decay=tuple(sorted(milestones)), decay_factor=float(factor))
    decaying, growing = Schedule(**common), Schedule(**common, batch_schedule=True)
    n = 200
    epochs = [epoch for run in (decaying, growing) for epoch, _ in steps_of(run, n, 8)]   # either run's steps
    lr_decaying = results_of(decaying.lr_at, [(epoch,) for epoch in epochs], Real)       # one call each
    lr_growing = results_of(growing.lr_at, [(epoch,) for epoch in epochs], Real)
    for epoch, rate_decaying, rate_growing in zip(epochs, lr_decaying, lr_growing):
        whole = int(epoch)
        noise_decaying = rate_decaying / decaying.global_batch_at(whole)
        noise_growing = rate_growing / growing.global_batch_at(whole)
        assert math.isclose(noise_growing, noise_decaying, rel_tol=1e-12), epoch
        passed = sum(m <= epoch for m in milestones)
        assert growing.global_batch_at(whole) == ranks * batch * factor ** passed
        assert math.isclose(rate_decaying, rate_growing / factor ** passed, rel_tol=1e-12)
    # the same epochs in fewer steps: each milestone passed divides the steps per epoch by about factor
    assert len(steps_of(growing, n, 8)) <= len(steps_of(decaying, n, 8))


def test_the_default_settings_leave_the_schedule_off_and_bad_schedules_are_refused():
    assert Schedule.of(run.Settings(), 4).constant
    assert Schedule.of(run.Settings(lr_scaling="linear"), 1).constant          # k = 1
    assert Schedule.of(run.Settings(warmup_epochs=3), 4).constant               # warm-up from lr to lr
    bad = [dict(lr_scaling="cubic"), dict(lr_decay=(0,)), dict(lr_decay=(5, 3), epochs=10),
           dict(lr_decay=(20,), epochs=20), dict(decay_factor=1.0), dict(warmup_epochs=-1),
           dict(reference_batch=0), dict(batch_schedule=True, decay_factor=2.5, lr_decay=(1,))]
    for given_settings in bad:
        with pytest.raises(SettingError, match="--"):
            run.Settings(**given_settings).check()


def scheduled_serial(data, epochs, schedule, seed=0):
    """Serial SGD on the float64 MLP with lr and batch set at every step by the schedule's closed form."""
    objective = NetworkObjective(float64_mlp(), data)
    optimizer = SGD([objective.flat.as_parameter()], lr=schedule.lr, momentum=0.9)
    decays = 0
    for epoch in range(epochs):
        decays += epoch in schedule.lr_decay
        batch = schedule.global_batch_at(0) * (int(schedule.decay_factor) ** decays if schedule.batch_schedule else 1)
        order = epoch_order(objective.n, seed, epoch)
        count = -(-len(order) // batch)
        for i, start in enumerate(range(0, len(order), batch)):
            e = epoch + i / count
            ramp = min(e / schedule.warmup_epochs, 1.0) if schedule.warmup_epochs else 1.0
            rate = schedule.lr + (schedule.peak - schedule.lr) * ramp
            optimizer.lr = rate if schedule.batch_schedule else rate / schedule.decay_factor ** decays
            objective.loss_and_grad(order[start:start + batch])
            optimizer.step()
    return objective.params.copy()


@pytest.mark.parallel(nprocs=[1, 2])
@pytest.mark.parametrize("batch_schedule", [False, True])
def test_the_loop_applies_the_schedule_like_a_serial_loop_with_the_closed_form(batch_schedule):
    comm = MPI.COMM_WORLD
    data = tiny_digits()
    flags = dict(lr=0.05, batch_size=2, lr_scaling="linear", reference_batch=1, warmup_epochs=1,
                 lr_decay=(2,), decay_factor=2.0, batch_schedule=batch_schedule)
    params, history = allreduce_sgd.train(comm, model=float64_mlp, data=data, epochs=3, momentum=0.9,
                                          allreduce="mpi", quiet=True, **flags)
    schedule = Schedule.of(run.Settings(**flags), comm.size)
    serial = scheduled_serial(data, 3, schedule)
    parallel_assert_close(params, serial, EQUAL_UP_TO_ROUNDING, f"p={comm.size}")
    batches = [record["global_batch"] for record in history]
    grown = [2 * comm.size, 2 * comm.size, 4 * comm.size] if batch_schedule else [2 * comm.size] * 3
    parallel_assert(batches == grown, f"logged global batches {batches}, expected {grown}")
    parallel_assert(all("lr" in record for record in history), "the lr is not logged per epoch")


def test_a_bad_schedule_flag_stops_every_rank_with_exit_2():
    done = launch("allreduce_sgd", "--lr-decay", "1", "--batch-schedule", "--decay-factor", "2.5", ranks=2)
    assert_stopped(done, re.compile("^--batch-schedule"), ranks=2)
