"""What several test files share, written once: test files import it from here, never from each other.

- commands:          ``mpiexec`` and ``launch`` run a program on P ranks with a timeout (a hang fails)
- the error contract: ``assert_stopped`` (a command stopped every rank with ``error: ...`` and exit
                     status 2), ``expect_error_on_every_rank`` (the same, in process, on every rank)
- data and models:   ``tiny_digits``, ``small_data``, the float64 MLPs, Hogwild!'s sparse problem
- whole runs:        ``ps_run`` and ``drop_silent_scenario``: every role of a parameter-server run
                     (servers and workers) in one call that returns plain values, so that the
                     grader can run the call in its sandbox and keep every check in the test
- references:        serial SGD written out (``serial_reference``), ``relative_error``,
                     ``parallel_assert_close`` and the tolerance ``EQUAL_UP_TO_ROUNDING``, a naive
                     convolution, rank-dependent fill values
- shared checks:     the checks that a visible test file and a hidden one both run
- many calls:        ``results_of`` runs a task's function on a list of cases in one call (``run_calls``),
                     which the grader forwards whole to the sandbox; ``results_on_every_rank``: each
                     rank's cases, run by rank 0; ``traced_costs``: traced allreduces beside cost.per_rank

The fence parser (``# BEGIN SOLUTION`` / ``# END SOLUTION``) is the assignment tool's,
``tutorials.assignments.fences``; tests import it from there. The course generator copies this file
into student trees with the rest of tests/ (only what ``[generator] remove`` names stays out), so
nothing here may come from tests/hidden/.
"""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI
from pytest_mpi import parallel_assert

import collectives
from algorithms import model_parallel, sandblaster_lbfgs as sandblaster
from algorithms.core import objective, partition
from algorithms.core.objective import Data, NetworkObjective, load_data
from algorithms.ps import wire as ps_wire
from algorithms.ps.server import ShardServer
from algorithms.sandblaster import wire
from algorithms.sandblaster.shard import Shard
from collectives import trace
from collectives.model import cost
from collectives.trace import TracedComm
from minidl.data import epoch_order, sparse_logistic_regression
from minidl.nn import Conv2d, Flatten, Linear, ReLU, Sequential
from minidl.optim import SGD
from tests.handed import InProcessShards

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT))


# ---- commands ----------------------------------------------------------------------------------------

def mpiexec(n, *args, timeout=120):
    """``mpiexec -n n python args`` from the repository root: the completed process (a hang raises)."""
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def launch(module, *flags, ranks=3, timeout=60):
    """``mpiexec -n ranks python -m algorithms.<module> flags``."""
    return mpiexec(ranks, "-m", f"algorithms.{module}", *flags, timeout=timeout)


# ---- the error contract -------------------------------------------------------------------------------

def assert_stopped(done, message, ranks=3, before_training=True):
    """``done`` stopped the way the error contract says: exit status 2, no traceback, and one line
    ``error: <what>`` (argparse's ``prog: error: <what>`` for a flag it cannot parse) from each of
    ``ranks`` ranks, each ``<what>`` saying ``message``: a string it
    contains, or a compiled pattern found in it (``^`` anchors at the start of ``<what>``). With
    ``before_training``, no epoch was printed."""
    shown = f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 2, shown
    assert "Traceback" not in done.stderr, shown
    said = re.findall(r"^(?:[\w.]+: )?error: (.*)$", done.stderr, re.M)
    assert said and done.stderr.count("error: ") == len(said), f"an 'error: ' not at the start of a line:\n{shown}"
    assert len(said) == ranks, f"{len(said)} error lines, expected one from each of {ranks} ranks:\n{shown}"
    saying = [what for what in said if (message.search(what) if isinstance(message, re.Pattern) else message in what)]
    assert len(saying) == len(said), f"not every error line says {message!r}:\n{shown}"
    if before_training:
        assert "epoch" not in done.stdout, f"trained before the error:\n{shown}"


def expect_error_on_every_rank(run, match):
    """``run()`` raises a ValueError (or FloatingPointError) containing ``match`` on every rank; its message."""
    try:
        run()
    except (ValueError, FloatingPointError) as error:
        parallel_assert(match in str(error), f"wrong message: {error}")
        return str(error)
    parallel_assert(False, f"no error (expected one containing {match!r})")


# ---- data and models ----------------------------------------------------------------------------------

def tiny_digits(n_train=50, n_test=30):
    """The first rows of the embedded digits, in float64: exact comparisons see only the order of additions."""
    data = load_data("digits", seed=0)
    return Data(data.x_train[:n_train].astype(np.float64), data.y_train[:n_train],
                data.x_test[:n_test].astype(np.float64), data.y_test[:n_test])


def small_data(n_train=96, n_test=60):
    """A slice of the digits (float32): enough for a few steps per worker, cheap enough for hypothesis."""
    data = load_data("digits", seed=0)
    return Data(data.x_train[:n_train], data.y_train[:n_train], data.x_test[:n_test], data.y_test[:n_test])


def float64_mlp_of(widths, seed):
    """Flatten, then Linear layers of ``widths`` with ReLU between, float64, the same weights on every rank."""
    rng = np.random.default_rng(seed)
    layers = [Flatten()]
    for k, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        last = k == len(widths) - 2
        layers += [Linear(fan_in, fan_out, rng=rng, dtype="float64", **({"init": "glorot"} if last else {}))]
        layers += [] if last else [ReLU()]
    return Sequential(*layers)


def float64_mlp():
    """64 -> 16 -> 10."""
    return float64_mlp_of([64, 16, 10], seed=7)


def six_layer_mlp():
    """64 -> 16 -> 12 -> 10: six layers (Flatten, Linear, ReLU, Linear, ReLU, Linear) for a pipeline."""
    return float64_mlp_of([64, 16, 12, 10], seed=3)


def uneven_mlp():
    """64 -> 7 -> 5 -> 10: widths that split unevenly over 2, 3 and 4 ranks."""
    return float64_mlp_of([64, 7, 5, 10], seed=5)


def small_problem():
    """Hogwild!'s sparse logistic regression: 2000 samples, 200 features, 5 per sample."""
    return sparse_logistic_regression(2000, 200, 5, np.random.default_rng(0), l2=1e-3)


# Plain serial SGD on small_problem(), one sample at a time in serial SGD's epoch order (seed 0),
# from w = 0 with lr 0.5 decaying by 0.8 per epoch: after `epochs` epochs,
# (F(w), F(w) - F(w*), ||w - w*|| / ||w*||, ||w||).
SERIAL_SGD = {3: (0.5340748255420451, 0.043440929937440975, 0.41477462029599915, 10.96116177829786),
              15: (0.4907126861431884, 7.879053858428353e-05, 0.018937636617328647, 9.611621989025247)}


# ---- references -----------------------------------------------------------------------------------------

# Tolerance for "equal up to the order of additions". One step's gradient is a mean over at most
# p b = 12 rows; regrouping it into p partial sums changes it by a few ulps (~1e-15 relative). Over
# the 2 epochs x 17 steps of tests/test_sync_sgd.py such differences are carried forward by the
# training map, whose step-to-step amplification for lr 0.1 on these MLPs is below 2, so they stay
# far below 1e-10 (measured: about 2e-16 for data parallelism, ~3e-16 for the pipeline, ~2e-16 for
# model parallelism, whose reductions regroup sums of <= 64 terms). A wrong sharding, weighting or
# momentum moves the parameters by > 1e-3.
EQUAL_UP_TO_ROUNDING = 1e-10


def relative_error(a, b):
    """max |a - b| over max |b| (kept off zero)."""
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def parallel_assert_close(actual, expected, tolerance, where):
    """On every rank: ``relative_error(actual, expected) < tolerance``; a failure says ``where`` and the error."""
    error = relative_error(actual, expected)
    parallel_assert(error < tolerance, f"{where}: relative error {error:.2e} (tolerance {tolerance:.0e})")


def serial_reference(data, epochs, lr, momentum, batch_size, seed=0, model=float64_mlp):
    """Serial SGD exactly as algorithms.serial_sgd runs it (its epoch order, batches in order), on ``model()``."""
    objective = NetworkObjective(model(), data)
    optimizer = SGD([objective.flat.as_parameter()], lr=lr, momentum=momentum)
    for epoch in range(epochs):
        order = epoch_order(objective.n, seed, epoch)
        for start in range(0, len(order), batch_size):
            objective.loss_and_grad(order[start:start + batch_size])
            optimizer.step()
    return objective.params.copy()


def naive_conv2d(x, weight, stride, padding):
    """Cross-correlation by loops, one output element at a time, for any kernel (kh, kw); float64."""
    n, c, h, w = x.shape
    f, _, kh, kw = weight.shape
    x_pad = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    out_h, out_w = (h + 2 * padding - kh) // stride + 1, (w + 2 * padding - kw) // stride + 1
    out = np.zeros((n, f, out_h, out_w), dtype=np.float64)
    for b, k, i, j in np.ndindex(out.shape):
        out[b, k, i, j] = np.sum(x_pad[b, :, i * stride:i * stride + kh, j * stride:j * stride + kw] * weight[k])
    return out


def fill(rank, length, dtype):
    """Rank-dependent small integers (negative ones too), exact in every dtype tested."""
    index = np.arange(length)
    return (((index * 7 + 3 * rank) % 11) - 5 + rank).astype(dtype)


def same_on_every_rank(comm, array):
    """True on every rank if every rank holds the same bytes."""
    return all(other == array.tobytes() for other in comm.allgather(array.tobytes()))


def only_check_messages(traced):
    """True if nothing but the agreement check was sent: the error came before any data."""
    return all(message.phase == "check" for message in traced.messages)


# ---- whole parameter-server runs, as plain values --------------------------------------------------------
# A test of a server task reaches the task's code only through one of these: every role runs inside
# the call, and what comes back is numbers, lists and dicts, checked by the test (tests/grade.py runs
# the call in its sandbox: tasks.toml's ``forward``).

def ps_run(train, comm, slow_evaluate=0.0, **settings):
    """``train(comm, **settings)`` of a parameter-server algorithm on every rank: {"history": its
    per-epoch history, "lost": [(rank, applied steps)] of the workers server 0 dropped, "error": what it
    raised as "Type: message", or None}. ``slow_evaluate`` s: rank 0's every evaluation takes that much
    longer (a server busy with its log while the workers' requests wait in its queue)."""
    evaluate = objective.evaluate

    def slow(*args, **kwargs):
        time.sleep(slow_evaluate)
        return evaluate(*args, **kwargs)
    if slow_evaluate and comm.Get_rank() == 0:
        objective.evaluate = slow
    report = {}
    try:
        _, history = train(comm, report=report, **settings)
        return {"history": history, "lost": [(rank, steps) for rank, steps, _ in report["lost"]], "error": None}
    except Exception as error:  # noqa: BLE001 - the error is the outcome the test checks
        return {"history": None, "lost": None, "error": f"{type(error).__name__}: {error}"}
    finally:
        objective.evaluate = evaluate


def drop_silent_scenario(comm, servers, roles, timeout=1.0):
    """Server 0 (of ``servers`` over 30 parameters) calls ``drop_silent`` once, its workers set up by
    ``roles`` ({worker: role}): "silent" (last heard 5 s ago), "recent" (0.2 s ago), "held" (its request
    held by the server), "finished", or "queued" (silent, but with a request in server 0's MPI queue).
    Returns on every rank {"dropped": server 0's dropped workers, "logged": the drops in its log,
    "refreshed": whether the queued worker counts as heard from now, "told": the control messages this
    rank received from server 0 (the other servers), or None on the workers and server 0}."""
    layout = ps_wire.Layout.make(comm.Get_size(), servers, 30)
    queued = [worker for worker, role in roles.items() if role == "queued"]
    for worker in queued:
        if comm.Get_rank() == layout.rank_of(worker):
            comm.send({"push": False, "fetch": True}, dest=0, tag=ps_wire.REQUEST)
    server = ShardServer(comm, layout, np.zeros(30), timeout=timeout) if layout.is_server(comm.Get_rank()) else None
    comm.Barrier()
    outcome = None
    if comm.Get_rank() == 0:
        for worker in queued:                             # every request has arrived
            while ps_wire.waiting_request(comm, layout.rank_of(worker)) is None:
                time.sleep(0.01)
        now = server.listening()
        for worker, role in roles.items():
            server.last_heard[worker] = now - (0.2 if role == "recent" else 5.0)
            if role == "held":
                server.waiting[worker] = {"push": False, "fetch": True}
            if role == "finished":
                server.finished.add(worker)
        server.drop_silent()
        server.outbox.complete()
        refreshed = all(server.last_heard[worker] >= now for worker in queued)
        for worker in queued:                             # leave no message behind
            comm.recv(source=layout.rank_of(worker), tag=ps_wire.REQUEST)
        outcome = {"dropped": sorted(server.dropped), "logged": [e[1] for e in server.log if e[0] == "drop"],
                   "refreshed": refreshed}
    comm.Barrier()
    told = None
    if server is not None and comm.Get_rank() > 0:
        told, expected = [], sum(role == "silent" for role in roles.values())
        deadline = time.monotonic() + 2.0
        while len(told) < expected and time.monotonic() < deadline:
            told += ps_wire.receive_all(comm, ps_wire.CONTROL, source=0)
        time.sleep(0.05)
        told += ps_wire.receive_all(comm, ps_wire.CONTROL, source=0)
    return {**comm.bcast(outcome, root=0), "told": told}


# ---- shared checks: a visible test file and a hidden one run them ---------------------------------------

def clock_staleness_at_each_read(log, workers):
    """Recompute, from one server's log alone, c - min_j clock_j at each fetch it answered, per worker.

    A worker's clock c is the number of its pushes the log shows applied so far (0 for all at the
    start); a worker leaves the minimum at its logged goodbye (or drop). The server's own counters
    play no part.
    """
    clocks, gone, reads = dict.fromkeys(range(workers), 0), set(), {}
    for event in log:
        kind, worker = event[0], (event[1].worker if event[0] == "push" else event[1])
        if kind == "push":
            clocks[worker] += 1
        elif kind in ("goodbye", "drop"):
            gone.add(worker)
        else:
            slowest = min(c for w, c in clocks.items() if w not in gone)
            reads.setdefault(worker, []).append(clocks[worker] - slowest)
    return reads


def own_block(layer, gradient, rows_or_cols, split):
    """The block of the whole layer's ``gradient`` that a rank's piece holds."""
    if isinstance(layer, Conv2d):                    # weight (out channels, in channels, k, k)
        return gradient[rows_or_cols]
    return gradient[:, rows_or_cols] if split == "output" else gradient[rows_or_cols, :]


def check_partitioned_equals_whole(model, features, splits):
    """Model parallelism on COMM_WORLD: the loss, every piece's gradients and ten SGD steps equal the
    unpartitioned ``model()``'s (minidl's autograd); the bytes sent equal ``expected_bytes``."""
    comm, data = MPI.COMM_WORLD, tiny_digits(n_test=20)
    rows = np.arange(12)
    whole = NetworkObjective(model(), data)
    loss = whole.loss_and_grad(rows)
    layers = [layer for layer in whole.net if isinstance(layer, (Linear, Conv2d))]
    # ten serial SGD steps at batch 5 (one epoch of 50 rows), from the same weights
    serial = NetworkObjective(model(), data)
    optimizer = SGD([serial.flat.as_parameter()], lr=0.1, momentum=0.9)
    order = epoch_order(serial.n, 0, 0)
    for start in range(0, 50, 5):
        serial.loss_and_grad(order[start:start + 5])
        optimizer.step()
    for split in splits:
        pieces = [partition.Piece(block, comm.rank, comm.size, split)
                  for block in partition.blocks_of(model())]
        for piece in pieces:
            for parameter in piece.parameters():
                parameter.grad = np.zeros_like(parameter.data)
        traced = TracedComm(comm)
        mine = model_parallel.model_parallel_gradient(traced, pieces, data.x_train[rows], data.y_train[rows], split)
        parallel_assert(abs(mine - loss) < 1e-12 * abs(loss), f"{split}, P={comm.size}: loss {mine} != {loss}")
        for k, (piece, layer) in enumerate(zip(pieces, layers)):
            own = piece.cols if split == "output" else piece.rows
            error = relative_error(piece.weight.grad, own_block(layer, layer.weight.grad, own, split))
            parallel_assert(error < EQUAL_UP_TO_ROUNDING, f"{split}, P={comm.size}, layer {k}: weight grad {error:.1e}")
            error = 0.0                           # parallel_assert is collective: every rank calls it
            if piece.bias is not None:
                bias = layer.bias.grad[own] if split == "output" else layer.bias.grad
                error = relative_error(piece.bias.grad, bias)
            parallel_assert(error < EQUAL_UP_TO_ROUNDING, f"{split}, layer {k}: bias grad {error:.1e}")
        owners = comm.allreduce(sum(piece.bias is not None for piece in pieces))
        parallel_assert(owners == len(layers) * (comm.size if split == "output" else 1),
                        f"{split}: each bias (block) must have exactly one owner, got {owners} owners")
        sent = comm.allreduce(sum(record.nbytes for record in traced.messages if record.direction == "send"))
        expected = expected_bytes(len(rows), comm.size, split, features)
        parallel_assert(sent == expected, f"{split}, P={comm.size}: {sent} bytes, formula {expected}")
        parallel_assert(sent == model_parallel.bytes_per_step(len(rows), features, comm.size, 8, split),
                        f"{split}: bytes_per_step disagrees")
        params, _ = model_parallel.train(comm, split=split, model=model, data=data, epochs=1, lr=0.1,
                                         momentum=0.9, batch_size=5, quiet=True)
        error = relative_error(params, serial.params)
        parallel_assert(error < EQUAL_UP_TO_ROUNDING, f"{split}, P={comm.size}: 10 steps, relative error {error:.1e}")


def expected_bytes(rows, size, split, features):
    """Every Sendrecv carries a block that crosses between partitions; summed over the ranks:
    output: each layer's output allgathered ((P-1) copies of every neuron), each inner da reduce-
    scattered ((P-1) partial sums of every feature); input: each layer's output reduce-scattered
    and allgathered, each inner da allgathered. ``features``: per row, the input and each layer's output."""
    outputs, inner = sum(features[1:]), sum(features[1:-1])
    forward = outputs * (1 if split == "output" else 2)
    return (size - 1) * rows * (forward + inner) * 8


def sharded(servers, g, s_history, y_history):
    """The direction sharded_direction leaves in the shards' d, and the shards' g after it."""
    d = len(g)
    roles = wire.Roles(servers + 2, servers, d)
    shards = [Shard(None, roles, k, np.zeros(d), history_size=10) for k in range(servers)]
    for shard, (start, stop) in zip(shards, roles.ranges):
        shard.vectors["g"][...] = g[start:stop]
        shard.s_history = [s[start:stop].copy() for s in s_history]
        shard.y_history = [y[start:stop].copy() for y in y_history]
    sandblaster.sharded_direction(InProcessShards(shards), len(s_history))
    return (np.concatenate([shard.vectors["d"] for shard in shards]),
            np.concatenate([shard.vectors["g"] for shard in shards]))


# ---- many calls of a graded function in one round trip ---------------------------------------------------

def run_calls(function, calls):
    """[function(*args) for args in calls]. Under the grader its whole call is forwarded to the sandbox
    (tasks.toml: ``forward = ["tests.helpers.run_calls"]``; tests/grade_proxy.py), so the thousands of
    calls a test makes of a task's function cost one round trip. Tests read it through ``results_of``."""
    return [function(*args) for args in calls]


def results_of(function, calls, kind):
    """``[function(*args) for args in calls]`` by one ``run_calls``, checked here: one result per call,
    each a ``kind``. The calls cross as tuples, so the call can write nothing back into a test's lists."""
    calls = tuple(tuple(args) for args in calls)
    results = run_calls(function, calls)
    count = len(results) if isinstance(results, list) else type(results).__name__
    assert isinstance(results, list) and len(results) == len(calls), \
        f"{len(calls)} calls of {function.__qualname__} gave {count} results"
    for args, result in zip(calls, results):
        assert isinstance(result, kind), f"{function.__qualname__}{args} returned a {type(result).__name__}"
    return results


def idle_until_all_arrive(comm):
    """A barrier that sleeps instead of spinning: while rank 0 waits for the sandbox, the other ranks
    would otherwise busy-poll in MPI and take the cores that the sandboxed code needs."""
    request, pause = comm.Ibarrier(), 0.0002
    while not request.Test():
        time.sleep(pause)
        pause = min(2 * pause, 0.001)


def results_on_every_rank(comm, function, calls, kind):
    """``results_of(function, calls, kind)`` of each rank's own ``calls``, all run by rank 0 in one call
    (under the grader: one sandbox for the p ranks, not one each) and scattered; a failure fails every rank."""
    everyone = comm.gather(tuple(calls), root=0)
    parts = None
    if comm.rank == 0:
        try:
            results = results_of(function, [args for mine in everyone for args in mine], kind)
            ends = np.cumsum([len(mine) for mine in everyone])
            parts = [results[end - len(mine):end] for mine, end in zip(everyone, ends)]
        except Exception as error:                   # every rank fails, none waits for rank 0
            why = str(error) if isinstance(error, AssertionError) else f"{type(error).__name__}: {error}"
            parts = [why] * comm.size
    idle_until_all_arrive(comm)
    mine = comm.scatter(parts, root=0)
    assert not isinstance(mine, str), mine
    return mine


def traced_costs(comm, runs, values=None):
    """For each (algorithm, length, dtype) of ``runs``, an allreduce of ``values(rank, length, dtype)``
    (default ``fill``) traced on this rank: (the run, the tracer, this rank's traced (messages, bytes
    sent, bytes reduced), cost.per_rank's RankCost of this rank). The RankCosts of every run and rank
    are asked for first, at once (``results_on_every_rank``)."""
    calls = [(algorithm, comm.size, length, np.dtype(dtype).itemsize, comm.rank) for algorithm, length, dtype in runs]
    formulas = results_on_every_rank(comm, cost.per_rank, calls, cost.RankCost)
    traced = TracedComm(comm)
    for (algorithm, length, dtype), formula in zip(runs, formulas):
        traced.reset()
        collectives.allreduce(traced, (values or fill)(comm.rank, length, dtype), algorithm=algorithm, check=False)
        yield (algorithm, length, dtype), traced, trace.counts(traced.messages, comm.rank), formula


# ---- chapter blocks -------------------------------------------------------------------------------------

MPI_LINE = re.compile(r"#\s*mpiexec\s+-n\s+(\d+)")
NEEDS_LINE = re.compile(r"#\s*needs:\s*(.*)$")


def needs(code):
    """The task ids of the block's ``# needs:`` line (first line, or second after ``# mpiexec -n N``)."""
    lines = code.lstrip().splitlines()
    head = lines[:2] if lines and MPI_LINE.match(lines[0]) else lines[:1]
    for line in head:
        match = NEEDS_LINE.match(line.strip())
        if match:
            return [task for task in re.split(r"[,\s]+", match.group(1)) if task]
    return []
