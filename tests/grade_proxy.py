"""pytest plugin for tests/grade.py: a task's function runs in the sandbox, its tests run here.

$MINIDL_GRADE_PROXY names a task (tutorials/assignments/tasks.toml) and
$MINIDL_GRADE_STUDENT the student tree. Before collection the plugin swaps the body of the task's
function in this (reference) checkout for a call of a forwarder, so every caller reaches it: a
function's or method's code is replaced; a closure (``matmul.backward``) is recompiled inside its
enclosing function so that each closure made hands the forwarder the enclosing function's
variables. The tests, their expected values and every other function stay here, in the grader's
process; only the call crosses into ``sandbox.Session`` (one job per rank count, serving every
call: ``{"function", "args", "kwargs"}`` packed by tutorials/assignments/values.py), which
rebuilds the function and its arguments from the student's tree and can hand back nothing but
arrays and one JSON text. From those, values.py writes the state the call left (arrays, the
project's objects, lists, dicts, generators) into the caller's own objects, after checking every
piece, and rebuilds the return value; a closure of the task's own code that comes back (a
Tensor's backward) is a stand-in that calls it in the sandbox again.

The call is collective over its communicator (an argument ``comm``, or one found in the
arguments: a partial's, a closure's, an object's): every rank sends its arguments to its rank 0,
which runs the student's function once on ``comm.size`` sandboxed ranks (rank i there gets rank
i's arguments) and sends each rank its reply. Communicators of some of the ranks make the call
the world's; a call without one runs alone, and the MPI objects it holds cross as stand-ins that
raise when used. A student function that raises, deadlocks ($MINIDL_GRADE_CALL_TIMEOUT s) or
replies with junk fails the test on every rank with the sandbox's message, led by the required
task to blame when the traceback shows one.

**Whole calls** (tasks.toml's ``forward = ["module.qualname", ...]``). A task whose tests call its
function thousands of times (each forwarded call costs milliseconds) names, besides, functions of
the project or of the tests' helpers whose *whole* call is forwarded the same way: a batch helper
(``tests.helpers.run_calls``: one round trip runs every call of the task's function it makes, in
the sandbox, with the student's code) or a whole training run that every rank enters, servers
included (run once on ``comm.size`` sandboxed ranks, rank i with rank i's arguments, exactly as
the task's function is). Only values come back, through values.py, and the tests check them here;
the task's function stays forwarded call by call for the tests that call it directly.
"""
import functools
import importlib
import inspect
import os
import re
import textwrap
import types

import numpy as np
from mpi4py import MPI

from collectives.trace import WatchedComm
from tests.helpers import idle_until_all_arrive
from tutorials.assignments import codec, fences, sandbox, values   # here, not at rank 0's first call: see below

# Every rank must draw the same hypothesis examples. Rank 0 alone runs the sandbox; importing a
# module for the first time inside a test on one rank only was seen to change which examples that
# rank drew next (rank 0 drew a length of 100 where the others drew 120), so the import is here.
SESSIONS = {}
MODULE = FUNCTION = CODE_NAME = TASK = TASKS = None
FORWARDS = {}                                     # "module.qualname" (tasks.toml's forward) -> its forwarder


def _session(size):
    if size not in SESSIONS:
        SESSIONS[size] = sandbox.Session(os.environ["MINIDL_GRADE_STUDENT"], MODULE, "*", nprocs=size)
    return SESSIONS[size]


def _run(size, per_rank):
    """The replies of one call on ``size`` sandboxed ranks, or the sandbox's message."""
    try:
        replies = _session(size)(per_rank, timeout=float(os.environ.get("MINIDL_GRADE_CALL_TIMEOUT", 20)))
        return [dict(replies[rank]) for rank in range(size)]
    except (sandbox.SandboxError, TypeError, ValueError) as error:
        return str(error)


def _comm_of(things, depth=4):
    """The call's communicator: the first MPI communicator among ``things`` or held by one of them
    (a partial's arguments, a closure's cells, an object's fields, a container's items; a few
    levels deep), or None."""
    for thing in things:
        if isinstance(thing, (MPI.Comm, WatchedComm)):
            return thing
        if depth == 0 or isinstance(thing, (np.ndarray, str, bytes, int, float)):
            continue
        if isinstance(thing, functools.partial):
            inner = [*thing.args, *thing.keywords.values()]
        elif isinstance(thing, codec.Remote):
            inner = list(thing.spec[3].values())
        elif isinstance(thing, types.FunctionType):
            inner = [cell.cell_contents for cell in thing.__closure__ or () if codec._full(cell)]
        elif isinstance(thing, (list, tuple)):
            inner = list(thing)
        elif isinstance(thing, dict):
            inner = list(thing.values())
        elif codec.ours(type(thing).__module__) and hasattr(thing, "__dict__"):
            inner = list(vars(thing).values())
        else:
            continue
        found = _comm_of(inner, depth - 1)
        if found is not None:
            return found
    return None


def call(function, args, kwargs, comm, name=None):
    """``function(*args, **kwargs)`` in the sandbox (collective when ``comm`` has several ranks):
    the return value; what it changed of the arguments is written into them here. ``name``: what
    the messages call it (the task's function by default)."""
    name = name or FUNCTION
    chain = [comm]
    while isinstance(chain[-1], WatchedComm):
        chain.append(chain[-1].comm)
    if chain[-1] is not None and chain[-1].Get_size() < MPI.COMM_WORLD.Get_size():
        comm, chain = None, [MPI.COMM_WORLD]     # communicators of some ranks: the call is the world's
    alone = chain[-1] is None or chain[-1].Get_size() == 1
    # a wrapper of the project's (collectives.trace's counting and tracing) crosses as an object around
    # the sandbox's own communicator, and its counts come back; a test's own is replayed (``__watch__``)
    watch = isinstance(comm, WatchedComm) and not all(codec.plain_class(type(part)) for part in chain[:-1])
    placeholder = tuple(part for part in (chain if watch else chain[-1:]) if part is not None)
    try:                                          # alone: other communicators cross as unusable stand-ins
        sent_arrays, sent = values.pack_call({"function": function, "args": tuple(args), "kwargs": dict(kwargs)},
                                             comm=placeholder,
                                             subcomm=(lambda c: None) if alone else values.world_ranks(MPI.COMM_WORLD))
    except TypeError as error:                    # the test hands the function something that cannot cross
        raise AssertionError(f"{name}: its arguments cannot cross into the sandbox: {error}") from None
    if watch:                                     # a test counts the messages: record them there
        sent_arrays["__watch__"] = np.array(True)
    inner = chain[-1]
    if alone:
        outcome = _run(1, [sent_arrays])
        reply = outcome if isinstance(outcome, str) else outcome[0]
    else:
        gathered, parts = inner.gather(sent_arrays, root=0), None
        if inner.Get_rank() == 0:
            outcome = _run(inner.Get_size(), gathered)
            parts = outcome if isinstance(outcome, list) else [outcome] * inner.Get_size()
        idle_until_all_arrive(inner)
        reply = inner.scatter(parts, root=0)
    if isinstance(reply, str):
        raise AssertionError(f"{name} (the student's, in the sandbox): {_blame(reply)}")
    if watch:                                     # the sandbox's messages, as if sent through ``comm``
        for row in reply.pop("__messages__", np.zeros((0, 6), dtype=np.int64)).reshape(-1, 6).tolist():
            sent_, received = tuple(row[:3]), tuple(row[3:])
            comm.watch(0.0, 0.0, sent=None if sent_[0] < 0 else sent_, received=None if received[0] < 0 else received)
    try:
        out = values.unpack_reply(reply, sent, comm=placeholder[0] if placeholder else None, remote=(MODULE, CODE_NAME))
        if not (isinstance(out, dict) and out.keys() == {"return", "after"}):
            raise ValueError("not a reply of the call: a dict of 'return' and 'after'")
    except ValueError as error:
        raise AssertionError(f"{name} (the student's, in the sandbox) replied with junk: {error}") from None
    return out["return"]


def _blame(message):
    """``message``, led by the required task (tasks.toml's ``requires``) whose function is still a
    stub or raised, when the sandbox's traceback says so: the student's own prerequisites run there."""
    frames = re.findall(r'File "([^"]+)", line \d+, in (\w+)', message)
    for needed in TASK.requires:
        other = TASKS[needed]
        stubbed = f"NotImplementedError: Task {needed}:" in message
        raised = any(path.endswith("/" + other.file) and name == other.function.split(".")[-1] for path, name in frames)
        if stubbed or raised:
            return (f"task {TASK.id} runs through your task {needed} ({other.function} in {other.file}, which it "
                    f"requires), and that {'is still a stub' if stubbed else 'raised'}: finish or fix {needed} "
                    f"first. {message}")
    return message


def _remote_call(remote, args, kwargs):
    """A closure of the student's task code that came back (a Tensor's backward): called in the sandbox."""
    return call(remote, args, kwargs, _comm_of([*args, *kwargs.values(), remote]))


def forwarder(original, function=None, method=0, name=None):
    """The forwarder for ``original`` (the task's function, or a closure's code: then each call
    gets the closure's cells and ``function`` builds the thing to call in the sandbox; or a
    function of tasks.toml's ``forward``). ``method``: 1 if args[0] is the method's object."""
    signature = inspect.signature(original)

    def forward(*args, **kwargs):
        target = original
        if function is not None:
            cells, args, kwargs = args
            target = function(cells)
        bound = signature.bind(*args, **kwargs)        # a method's object: its comm is not the call's
        comm = bound.arguments.get("comm") or _comm_of([*args[method:], *kwargs.values()])
        return call(target, args, kwargs, comm, name)
    return forward


def _trampoline(*args, **kwargs):
    """The body the task's function gets: every caller, however it holds the function (a module
    attribute, a dispatch table, a default argument, a closure), now reaches the forwarder."""
    return __import__("sys").modules["tests.grade_proxy"].FORWARD(*args, **kwargs)


def _trampoline_to(name):
    """``_trampoline``'s code for the function ``name`` of tasks.toml's ``forward``."""
    scope = {}
    exec(f"def forwarded(*args, **kwargs):\n"
         f"    return __import__('sys').modules['tests.grade_proxy'].FORWARDS[{name!r}](*args, **kwargs)\n", scope)
    return scope["forwarded"].__code__


def _forwarded(task, name):
    """The function ``name`` ("module.qualname": a module-level function, or a method) of task's
    ``forward``, in this tree: only the project's own functions and the tests' helpers cross."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name and module.startswith(error.name):
                continue
            raise
        found = codec.resolve(module, ".".join(parts[cut:]))
        if isinstance(found, types.FunctionType) and not found.__code__.co_freevars:
            return found
        break
    raise ValueError(f"tasks.toml: task {task.id} forwards {name!r}, which is not a module-level function or a "
                     "method of minidl, collectives, algorithms, tests/handed.py or tests/helpers.py")


def forward_whole_calls(task):
    """Swap the body of each function named in the task's ``forward`` for a forwarder of its whole
    call (one round trip runs it, and every call of the task's function it makes, in the sandbox)."""
    for name in task.forward:
        function = _forwarded(task, name)
        if name in FORWARDS or function.__code__ in (_trampoline.__code__, _trampoline_to(name)):
            continue                                 # the task's own function is forwarded already
        method = int("." in function.__qualname__)
        FORWARDS[name] = forwarder(function, method=method,
                                   name=f"{FUNCTION}, called by {function.__module__}.{function.__qualname__}")
        function.__code__ = _trampoline_to(name)


def _reroute(outer, inner):
    """Recompile ``outer`` (a module-level function) with the fenced body of its closure ``inner``
    replaced by a call of the forwarder that hands over the closure's arguments and the value of
    every local variable of ``outer`` (the student's closure may read any of them, not only those
    the reference's reads); ``outer`` keeps its identity, only its code changes."""
    lines = textwrap.dedent(inspect.getsource(outer)).splitlines()
    (begin, end), = fences("\n".join(lines))                  # the closure's one fence
    indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
    names = [name for name in (*outer.__code__.co_varnames, *outer.__code__.co_cellvars) if name != inner.co_name]
    arguments = inner.co_varnames[:inner.co_argcount + inner.co_kwonlyargcount]
    body = [f"{indent}_cells = {{}}"]
    for name in dict.fromkeys(names):
        body += [f"{indent}try:", f"{indent}    _cells[{name!r}] = {name}",
                 f"{indent}except NameError:", f"{indent}    pass"]
    body.append(f"{indent}return __import__('sys').modules['tests.grade_proxy'].FORWARD(_cells, "
                f"({''.join(a + ', ' for a in arguments)}), {{}})")
    source = "\n".join(lines[:begin] + body + lines[end + 1:]) + "\n"
    scope = {}
    exec(compile(source, outer.__code__.co_filename, "exec"), outer.__globals__, scope)
    outer.__code__ = scope[outer.__name__].__code__


def pytest_configure(config):
    global MODULE, FUNCTION, CODE_NAME, FORWARD
    task_id = os.environ.get("MINIDL_GRADE_PROXY")
    if not task_id:
        return
    from tutorials import assignments
    tasks, _ = assignments.load()
    global TASK, TASKS
    TASKS = {task.id: task for task in tasks}
    task = TASK = TASKS[task_id]
    MODULE, FUNCTION = task.file.removesuffix(".py").replace("/", "."), task.function
    for package in ("minidl", "collectives", "algorithms"):
        importlib.import_module(package)
    codec.Remote.CALL = _remote_call
    module = importlib.import_module(MODULE)
    head, _, tail = FUNCTION.partition(".")
    owner = getattr(module, head)
    if not tail or isinstance(owner, type):      # a function, or a method of a class
        original, method = (getattr(owner, tail), 1) if tail else (owner, 0)
        CODE_NAME = original.__qualname__
        FORWARD = forwarder(original, method=method)     # its signature is read before the body is swapped
        original.__code__ = _trampoline.__code__
        forward_whole_calls(task)
        return
    CODE_NAME = f"{head}.<locals>.{tail}"         # a closure made inside a function
    code = codec.code_of(MODULE, CODE_NAME, 0)
    dummy = types.FunctionType(code, module.__dict__, code.co_name, None,
                               tuple(types.CellType() for _ in code.co_freevars))
    FORWARD = forwarder(dummy, lambda cells: codec.Remote(MODULE, CODE_NAME, 0, cells, None, None))
    _reroute(owner, code)
    forward_whole_calls(task)


def pytest_unconfigure(config):
    for session in SESSIONS.values():
        session.close()
    SESSIONS.clear()
