"""pytest plugin for tests/grade.py: a task's function runs in the sandbox, its tests run here.

$MINIDL_GRADE_PROXY names a task (tutorials/assignments/tasks.toml, ``sandbox = true``) and
$MINIDL_GRADE_STUDENT the student tree. Before collection the plugin swaps the body of the task's
function in this (reference) checkout for a call of a forwarder, so every caller reaches it. The
tests, their expected values and every other function stay here, in the grader's process; only
the call crosses into ``sandbox.Session``, which imports the student's module in a sandbox and
can hand back nothing but arrays and one JSON text, from which tutorials/assignments/values.py
rebuilds plain values (numbers, strings, arrays, lists, tuples, dicts, the project's namedtuples,
random generators) and nothing else.

With a ``comm`` argument the call is collective: every rank of ``comm`` sends its arguments to
its rank 0, which runs the student's function once on ``comm.size`` sandboxed ranks (rank i there
gets rank i's arguments) and sends each rank its reply. Arrays the student's function changed in
place are copied into the caller's arrays, and generators it drew from are advanced alike; the
return value comes back as the function gave it.
A student function that raises, deadlocks (``$MINIDL_GRADE_CALL_TIMEOUT`` s) or replies with
junk fails the test on every rank with the sandbox's message.
"""
import importlib
import inspect
import os
import time

import numpy as np

from collectives.trace import WatchedComm
from tutorials.assignments import sandbox, values       # here, not at rank 0's first call: see below

# Every rank must draw the same hypothesis examples. Rank 0 alone runs the sandbox; importing a
# module for the first time inside a test on one rank only was seen to change which examples that
# rank drew next (rank 0 drew a length of 100 where the others drew 120), so the import is here.
SESSIONS = {}


def _decode(reply, originals):
    """Copy in-place changes back into the caller's arrays; the return value as the function gave it."""
    if "__values__" in reply:                     # packed (tutorials/assignments/values.py): checked piece by piece
        try:
            out = values.unpack(reply)
            if not (isinstance(out, dict) and out.keys() == {"return", "after"} and isinstance(out["after"], dict)
                    and out["after"].keys() == originals.keys()):
                raise ValueError("not a reply of the call: a dict of 'return' and the arguments 'after' it")
            for name, value in originals.items():
                values.copy_back(value, out["after"][name])
        except ValueError as error:
            raise AssertionError(f"{FUNCTION} (the student's, in the sandbox) replied with junk: {error}") from None
        return out["return"]
    for name, array in reply.items():
        target = originals.get(name)
        if isinstance(target, np.ndarray) and not name.startswith("return"):
            if target.shape != array.shape or target.dtype != array.dtype:
                raise AssertionError(f"{name} came back as {array.dtype}{list(array.shape)}, "
                                     f"was {target.dtype}{list(target.shape)}")
            target[...] = array
    parts = sorted((name for name in reply if name.startswith("return.")), key=lambda n: int(n.split(".")[1])
                   if n.split(".")[1].isdigit() else n)
    if "return" in reply:
        value = reply["return"]
        return value.item() if value.ndim == 0 else value
    if parts:
        return tuple(reply[name].item() if reply[name].ndim == 0 else reply[name] for name in parts)
    return None


def _session(size):
    if size not in SESSIONS:
        SESSIONS[size] = sandbox.Session(os.environ["MINIDL_GRADE_STUDENT"], MODULE, FUNCTION, nprocs=size)
    return SESSIONS[size]


def _run(size, per_rank):
    """The replies of one call on ``size`` sandboxed ranks, or the sandbox's message."""
    try:
        replies = _session(size)(per_rank, timeout=float(os.environ.get("MINIDL_GRADE_CALL_TIMEOUT", 20)))
        return [dict(replies[rank]) for rank in range(size)]
    except (sandbox.SandboxError, TypeError, ValueError) as error:
        return str(error)


def _idle_until_all_arrive(comm):
    """A barrier that sleeps instead of spinning: while rank 0 waits for the sandbox, the p - 1 other
    trusted ranks would otherwise busy-poll in MPI and take the cores the sandboxed ranks need."""
    request, pause = comm.Ibarrier(), 0.0002
    while not request.Test():
        time.sleep(pause)
        pause = min(2 * pause, 0.001)


def forwarder(original):
    signature = inspect.signature(original)

    def forward(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        comm = watched = arguments.pop("comm", None)
        sent = values.pack(arguments)            # any value the codec carries; never pickle
        if isinstance(comm, WatchedComm):         # a test counts the messages: record them there
            sent["__watch__"] = True
            while isinstance(comm, WatchedComm):
                comm = comm.comm
        else:
            watched = None
        if comm is None or comm.Get_size() == 1:
            outcome = _run(1, [sent])
            reply = outcome if isinstance(outcome, str) else outcome[0]
        else:
            gathered, parts = comm.gather(sent, root=0), None
            if comm.Get_rank() == 0:
                outcome = _run(comm.Get_size(), gathered)
                parts = outcome if isinstance(outcome, list) else [outcome] * comm.Get_size()
            _idle_until_all_arrive(comm)
            reply = comm.scatter(parts, root=0)
        if isinstance(reply, str):
            raise AssertionError(f"{FUNCTION} (the student's, in the sandbox): {reply}")
        if watched is not None:                   # the sandbox's messages, as if sent through ``watched``
            for row in reply.pop("__messages__", np.zeros((0, 6), dtype=np.int64)).reshape(-1, 6).tolist():
                sent_, received = tuple(row[:3]), tuple(row[3:])
                watched.watch(0.0, 0.0, sent=None if sent_[0] < 0 else sent_,
                              received=None if received[0] < 0 else received)
        return _decode(reply, arguments)
    forward.__wrapped__ = original
    forward.__name__ = original.__name__
    return forward


def _trampoline(*args, **kwargs):
    """The body the task's function gets: every caller, however it holds the function (a module
    attribute, a dispatch table, a default argument, a closure), now reaches the forwarder."""
    return __import__("sys").modules["tests.grade_proxy"].FORWARD(*args, **kwargs)


def pytest_configure(config):
    global MODULE, FUNCTION
    task_id = os.environ.get("MINIDL_GRADE_PROXY")
    if not task_id:
        return
    from tutorials import assignments
    tasks, _ = assignments.load()
    task = next(task for task in tasks if task.id == task_id)
    MODULE, FUNCTION = task.file.removesuffix(".py").replace("/", "."), task.function
    for package in ("minidl", "collectives", "algorithms"):
        importlib.import_module(package)
    global FORWARD
    original = getattr(importlib.import_module(MODULE), FUNCTION)
    FORWARD = forwarder(original)                # its signature is read before the body is swapped
    original.__code__ = _trampoline.__code__


def pytest_unconfigure(config):
    for session in SESSIONS.values():
        session.close()
    SESSIONS.clear()
