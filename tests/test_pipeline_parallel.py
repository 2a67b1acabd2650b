"""Pipeline parallelism (GPipe, 1F1B) tied to serial SGD and to the schedules' definitions, on P = 1..4 ranks.

Run: python tests/run.py --max-ranks 4 -- tests/test_pipeline_parallel.py

The network is a float64 MLP of six layers (Flatten, Linear, ReLU, Linear, ReLU, Linear), so
P = 4 stages hold 2, 2, 1, 1 layers. The schedule each stage followed is read from the messages
it sent and received (a traced communicator), not from the module's own bookkeeping, and checked
against the schedules' definitions written here in another form (a greedy rule for 1F1B).
"""
import re

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import pipeline_parallel
from algorithms.core.cli import SettingError
from algorithms.core.objective import NetworkObjective
from collectives.trace import TracedComm, WatchedComm
from minidl.data import Batch
from minidl.nn import Flatten, Linear, ReLU, Sequential
from tests.helpers import (
    EQUAL_UP_TO_ROUNDING,
    assert_stopped,
    launch,
    parallel_assert_close,
    serial_reference,
    six_layer_mlp,
    tiny_digits,
)

WIDTHS = [64, 64, 16, 16, 12, 12, 10]          # features entering layer k (k = 0..5) and leaving the last


@pytest.mark.task("6.1")
@pytest.mark.parallel(nprocs=[1, 2, 3, 4])
def test_pipeline_with_m_micro_batches_equals_serial_sgd_at_the_same_global_batch():
    # 50 rows at batch 9: five full batches and a last one of 5 rows (fewer rows than m = 2P+1 = 9 at P = 4)
    comm, data = MPI.COMM_WORLD, tiny_digits()
    serial = serial_reference(data, epochs=1, lr=0.1, momentum=0.9, batch_size=9, model=six_layer_mlp)
    for kind in ("gpipe", "1f1b"):
        for m in sorted({1, comm.size, 2 * comm.size + 1}):
            params, _ = pipeline_parallel.train(comm, schedule=kind, micro_batches=m, model=six_layer_mlp,
                                                data=data, epochs=1, lr=0.1, momentum=0.9, batch_size=9,
                                                quiet=True)
            parallel_assert_close(params, serial, EQUAL_UP_TO_ROUNDING, f"{kind}, P={comm.size}, m={m}")


class TracedWithIsend(TracedComm):
    """TracedComm that also records Isend (at the call: the pipeline waits on its sends at the step's end)."""
    Isend = WatchedComm.Isend


def gpipe_definition(stages, stage, m):
    """All forwards; then the backwards, last in first out (a stack of held micro-batches)."""
    order, held = [], []
    for i in range(m):
        order.append(("forward", i))
        held.append(i)
    while held:
        order.append(("backward", held.pop()))
    return order


def one_f_one_b_definition(stages, stage, m):
    """Greedy: a backward (oldest first) whenever P - s micro-batches are held or no forward is left."""
    order, held, next_forward = [], [], 0
    while next_forward < m or held:
        if held and (len(held) == stages - stage or next_forward == m):
            order.append(("backward", held.pop(0)))
        else:
            order.append(("forward", next_forward))
            held.append(next_forward)
            next_forward += 1
    return order


def order_from_trace(records, stage, stages):
    """A stage's forwards and backwards from its own messages, in the order it made them: forward i is
    the receive of activation i (stage 0: its send), backward i the send of gradient i (stage 0: its receive)."""
    order = []
    for record in records:
        kind, i = divmod(record.tag - pipeline_parallel.ACTIVATION, 2)[::-1]
        if kind == 0 and (record.direction == "recv") == (stage > 0):
            order.append(("forward", i))
        elif kind == 1 and (record.direction == "send") == (stage > 0):
            order.append(("backward", i))
    return order


def most_held(order):
    held = peak = 0
    for step, _ in order:
        held += 1 if step == "forward" else -1
        peak = max(peak, held)
    return peak


def timeline(kind, stages, m):
    """Each stage's row of slots when every stage runs ``schedule``'s order, one slot per forward or
    backward, each as early as its input allows: forward i on stage s after forward i on s-1, backward i
    after backward i on s+1 (the last stage: after its own forward i). '.' is an idle slot."""
    orders = [pipeline_parallel.schedule(kind, stage, stages, m) for stage in range(stages)]
    done, free = {}, [0] * stages              # done[(stage, step, i)]: the slot it ended in
    while any(orders):
        for stage in range(stages):
            while orders[stage]:
                step, i = orders[stage][0]
                before = ((stage - 1, "forward", i) if step == "forward" else
                          (stage + 1, "backward", i) if stage < stages - 1 else (stage, "forward", i))
                if before[0] in (-1, stages) or before in done:
                    slot = max(free[stage], done.get(before, -1) + 1)
                    done[(stage, step, i)], free[stage] = slot, slot + 1
                    orders[stage].pop(0)
                else:
                    break
    width = max(free)
    rows = [["."] * width for _ in range(stages)]
    for (stage, step, i), slot in done.items():
        rows[stage][slot] = f"{step[0].upper()}{i}"
    return [" ".join(row) for row in rows]


def pictured(title):
    """The rows of the docstring's picture under ``title`` (its slot tokens, comments dropped)."""
    lines = pipeline_parallel.__doc__.splitlines()
    start = next(k for k, line in enumerate(lines) if line.strip() == title)
    rows = []
    for line in lines[start + 1:]:
        if not re.match(r"\s*stage \d+ ", line):
            break
        tokens = line.split()[2:]
        slots = [token for token in tokens[:next((k for k, t in enumerate(tokens)
                                                   if not re.fullmatch(r"[FB]\d+|\.", t)), len(tokens))]]
        rows.append(" ".join(slots))
    return rows


@pytest.mark.parametrize("kind, title", [("gpipe", "GPipe, P = 3, m = 4 (F = forward, B = backward, . = bubble; one "
                                                   "slot each)"),
                                         ("1f1b", "1F1B, P = 3, m = 4")])
def test_the_docstrings_schedule_pictures_are_what_the_schedules_run(kind, title):
    assert pictured(title) == timeline(kind, 3, 4)


@pytest.mark.task("6.1")
@pytest.mark.parallel(nprocs=[2, 3, 4])
def test_traced_schedules_follow_their_definitions_and_hold_m_or_at_most_p_micro_batches():
    comm, data = MPI.COMM_WORLD, tiny_digits()
    P, s, rows = comm.size, comm.rank, 2 * comm.size + 1
    for kind, definition in (("gpipe", gpipe_definition), ("1f1b", one_f_one_b_definition)):
        for m in (P, 2 * P + 1):
            net = six_layer_mlp()
            objective = NetworkObjective(net, data)
            stage = pipeline_parallel.Stage(net, s, P, data.x_train[:1])
            traced = TracedWithIsend(comm)
            pipeline_parallel.pipeline_gradient(traced, stage, objective, Batch(np.arange(rows), rows), m, kind)
            order = order_from_trace(traced.messages, s, P)
            expected = definition(P, s, m)
            parallel_assert(order == expected, f"{kind}, P={P}, m={m}, stage {s}: traced {order}, expected {expected}")
            peak = most_held(order)
            bound = m if kind == "gpipe" else min(P - s, m)
            parallel_assert(peak == bound and stage.peak_held == bound,
                            f"{kind}, m={m}, stage {s}: held {peak} (traced), {stage.peak_held} (counted), "
                            f"expected {bound}")
            if kind == "1f1b":
                parallel_assert(peak <= P, f"1f1b stage {s} held {peak} > P = {P}")
            # bytes: every row's activation and gradient across every boundary, 8 bytes a number
            sent = comm.allreduce(sum(r.nbytes for r in traced.messages if r.direction == "send"))
            stops = np.cumsum([6 // P + (k < 6 % P) for k in range(P)])[:-1]
            formula = 2 * rows * sum(WIDTHS[stop] for stop in stops) * 8
            parallel_assert(sent == formula, f"{kind}, P={P}: {sent} bytes sent, formula {formula}")
            parallel_assert(pipeline_parallel.bytes_per_step(rows, [WIDTHS[k] for k in stops], 8) == formula,
                            "bytes_per_step disagrees with the formula")


@pytest.mark.parallel(nprocs=[4])
def test_more_stages_than_layers_is_refused_on_every_rank():
    def three_layers():
        rng = np.random.default_rng(0)
        return Sequential(Flatten(), Linear(64, 10, rng=rng, dtype="float64"), ReLU())
    with pytest.raises(SettingError, match="4 stages .ranks. but the model has only 3 layers"):
        pipeline_parallel.train(MPI.COMM_WORLD, model=three_layers, data=tiny_digits(), epochs=1, quiet=True)


def test_more_micro_batches_than_rows_stops_every_rank_with_an_error():
    done = launch("pipeline_parallel", "--batch-size", "8", "--micro-batches", "9", ranks=2)
    assert_stopped(done, "--micro-batches 9 is more than --batch-size 8", ranks=2)
