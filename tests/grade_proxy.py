"""pytest plugin for tests/grade.py: a task's function runs in the sandbox, its tests run here.

$MINIDL_GRADE_PROXY names a task (tutorials/assignments/tasks.toml, ``sandbox = true``) and
$MINIDL_GRADE_STUDENT the student tree. Before collection the plugin replaces the task's function,
wherever this (reference) checkout holds it (module attributes and the dispatch tables that name
it), by a forwarder: the tests, their expected values and every other function stay here, in the
grader's process; only the call crosses into ``sandbox.Session``, which imports the student's
module in a sandbox and can hand back nothing but arrays.

With a ``comm`` argument the call is collective: every rank of ``comm`` sends its arguments to
its rank 0, which runs the student's function once on ``comm.size`` sandboxed ranks (rank i there
gets rank i's arguments) and sends each rank its reply. Arrays the student's function changed in
place are copied into the caller's arrays; the return value comes back as arrays and numbers.
A student function that raises, deadlocks (``$MINIDL_GRADE_CALL_TIMEOUT`` s) or replies with
junk fails the test on every rank with the sandbox's message.
"""
import importlib
import inspect
import os
import sys

import numpy as np

SESSIONS = {}


def _decode(reply, originals):
    """Copy in-place changes back into the caller's arrays; the return value as the function gave it."""
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
    from tutorials.assignments import sandbox
    if size not in SESSIONS:
        SESSIONS[size] = sandbox.Session(os.environ["MINIDL_GRADE_STUDENT"], MODULE, FUNCTION, nprocs=size)
    return SESSIONS[size]


def _run(size, per_rank):
    """The replies of one call on ``size`` sandboxed ranks, or the sandbox's message."""
    from tutorials.assignments import sandbox
    try:
        replies = _session(size)(per_rank, timeout=float(os.environ.get("MINIDL_GRADE_CALL_TIMEOUT", 20)))
        return [dict(replies[rank]) for rank in range(size)]
    except (sandbox.SandboxError, TypeError, ValueError) as error:
        return str(error)


def forwarder(original):
    signature = inspect.signature(original)

    def forward(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        comm = arguments.pop("comm", None)
        sent = {name: np.asarray(value) if isinstance(value, (tuple, list)) else value   # a shape: as an array
                for name, value in arguments.items()}
        if comm is None or comm.Get_size() == 1:
            outcome = _run(1, [sent])
            reply = outcome if isinstance(outcome, str) else outcome[0]
        else:
            gathered, parts = comm.gather(sent, root=0), None
            if comm.Get_rank() == 0:
                outcome = _run(comm.Get_size(), gathered)
                parts = outcome if isinstance(outcome, list) else [outcome] * comm.Get_size()
            reply = comm.scatter(parts, root=0)
        if isinstance(reply, str):
            raise AssertionError(f"{FUNCTION} (the student's, in the sandbox): {reply}")
        return _decode(reply, arguments)
    forward.__wrapped__ = original
    forward.__name__ = original.__name__
    return forward


def _replace_everywhere(original, replacement):
    """Every module attribute and module-level dict entry of this checkout that is ``original``."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.split(".")[0] in ("minidl", "collectives", "algorithms", "tests"):
            continue
        for key, value in list(vars(module).items()):
            if value is original:
                setattr(module, key, replacement)
            elif isinstance(value, dict):
                for entry, item in list(value.items()):
                    if item is original:
                        value[entry] = replacement


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
    original = getattr(importlib.import_module(MODULE), FUNCTION)
    _replace_everywhere(original, forwarder(original))


def pytest_unconfigure(config):
    for session in SESSIONS.values():
        session.close()
    SESSIONS.clear()
