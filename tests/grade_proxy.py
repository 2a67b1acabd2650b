"""pytest plugin for tests/grade.py: a task's function runs in the sandbox, its tests run here.

$MINIDL_GRADE_PROXY names a task (tutorials/assignments/tasks.toml) and $MINIDL_GRADE_STUDENT the
student tree. Before collection the plugin swaps the body of the task's function in this
(reference) checkout for a call of a forwarder, so every caller reaches it: a function's or
method's code is replaced; a closure (``matmul.backward``) is recompiled inside its enclosing
function so that each closure made hands the forwarder the enclosing function's variables. The
tests, their expected values and every other function stay here; only the call crosses.

**Each rank has its own sandboxed worker** (``sandbox.Job("serve")``, one per pytest process,
kept for every call), which builds the function and its arguments from the student's tree
(values.py) and answers with data (replies.py): the return value, and what the call changed of
what it was sent, checked here and then written into the caller's own arrays, lists and objects.
Nothing in a reply is ever called, formatted by its own methods or compared by its own ``__eq__``
here: a reply cannot hold anything that runs. A Tensor the call made is rebuilt here by minidl's
own class; its backward stays in the sandbox, and the rebuilt Tensor's backward asks for it there.

**The grader is the network.** A communicator in the arguments crosses as a handle: in the
sandbox it is a stand-in (proxy.py) whose every MPI call comes back here as an "op" frame, and
this rank makes that call on the test's own communicator (``Network``). So the student's ring on
five sandboxed ranks is five grader ranks' messages, and a ``TracedComm`` the test handed over
records them here, where the student's code cannot reach the records.

**Whole runs** (tasks.toml's ``forward``, called with a communicator: a parameter-server run,
servers included, or Hogwild!'s shared window, which need MPI among their own ranks): every rank sends its
arguments to its rank 0, which runs the function once on ``comm.size`` ranks of one sandboxed
``mpiexec`` job (rank i there gets rank i's arguments) and sends each rank its reply, data only.
A batch helper (``tests.helpers.run_calls``) runs on this rank's worker: thousands of calls of the
task's function in one round trip.

A call that does not come back within $MINIDL_GRADE_CALL_TIMEOUT seconds (a receive that no send
matches, an endless loop) fails its test and ends this pytest run at once (grade_record.hang), so a
deadlock costs its task one timeout. A student function that raises, or replies with anything but
data, fails the test on that rank with the sandbox's message, led by the required task to blame
when the traceback shows one.
"""
import functools
import importlib
import inspect
import os
import re
import textwrap
import threading
import time
import types

import numpy as np
import pytest
from mpi4py import MPI

from collectives.trace import WatchedComm
from minidl.tensor import Tensor
from tests import grade_network, grade_record
from tests.helpers import idle_until_all_arrive
from tutorials.assignments import channel, codec, fences, replies, sandbox, values  # imported on every rank

MODULE = FUNCTION = CODE_NAME = TASK = TASKS = FORWARD = None
RECORDS = {}                                      # tasks.toml's returns: "module:qualname" -> this tree's class
FORWARDS = {}                                     # "module.qualname" (tasks.toml's forward) -> its forwarder
STATE = {"worker": None, "jobs": {}, "modules": []}


def call_timeout():
    return float(os.environ.get("MINIDL_GRADE_CALL_TIMEOUT", 20))


class Watchdog:
    """Ends this process (grade_record.hang) when a sandboxed call outlives its deadline, wherever this
    rank is waiting then: for the sandbox's reply, or inside an MPI call made for the sandbox."""

    def __init__(self):
        self.deadline, self.what, self.thread = None, "", None

    def arm(self, seconds, what):
        self.deadline, self.what = time.monotonic() + seconds, what
        if self.thread is None:
            self.thread = threading.Thread(target=self._watch, daemon=True)
            self.thread.start()

    def disarm(self):
        self.deadline = None

    def _watch(self):
        while True:
            time.sleep(0.1)
            deadline = self.deadline
            if deadline is not None and time.monotonic() > deadline:
                grade_record.hang(self.what)


WATCHDOG = Watchdog()


NETWORK = grade_network.Network()


STARTUP = 120.0                                   # seconds for a worker to start and import the task's module


def _started(mode, nprocs):
    """A sandboxed job of the student's tree, started (and the task's module imported there on every
    rank) before any call is timed: starting costs seconds on a busy machine, a call milliseconds."""
    job = sandbox.Job(os.environ["MINIDL_GRADE_STUDENT"], mode, nprocs)
    try:
        job.send({"__warm__": np.array(",".join(STATE["modules"] or [MODULE]))})
        frame = job.receive(time.monotonic() + STARTUP)
    except (channel.FrameError, TimeoutError) as error:
        job.close()
        raise AssertionError(f"the sandbox did not start: {error or 'no answer in time'}") from None
    if "__error__" in frame:
        job.close()
        raise AssertionError(f"importing {', '.join(STATE['modules'])} (the student's, in the sandbox): "
                             f"{sandbox.failure_of(frame, nprocs)}")
    return job


def _worker():
    """This rank's sandboxed worker (one process, kept for every call)."""
    if STATE["worker"] is None:
        STATE["worker"] = _started("serve", 1)
    return STATE["worker"]


def _drop_worker():
    worker, STATE["worker"] = STATE["worker"], None
    if worker is not None:
        worker.close()


def _hang_message(name, size):
    return (f"{name} (the student's, in the sandbox): timed out after {call_timeout():g} s at p = {size}: probably "
            "a receive that no rank's send matches, a rank that stopped sending, or an endless loop")


def exchange(arrays, sent, name, scope):
    """Send one call (or backward) to this rank's worker, answer its MPI ops (in ``scope``: the call's
    communicators and requests), and return its value."""
    worker = _worker()
    NETWORK.begin(scope)
    if "__backward__" in arrays and STATE["worker"] is not arrays.pop("__worker__"):
        raise AssertionError(f"{name}: its sandboxed worker has ended (an earlier call failed)")
    WATCHDOG.arm(call_timeout(), _hang_message(name, MPI.COMM_WORLD.Get_size()))
    try:
        worker.send(arrays)
        while True:
            frame = worker.receive()              # no deadline here: the watchdog bounds the wait
            kind = str(frame.get("kind", ""))
            if kind == "op":
                worker.send(NETWORK.answer(frame))
            elif kind == "error":
                said = f"{name} (the student's, in the sandbox): " \
                       f"{_blame(sandbox.failure_of(frame, MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()))}"
                grade_record.note(said)
                raise AssertionError(said)
            elif kind == "reply":
                break
            else:
                raise channel.FrameError(f"a frame of kind {kind[:40]!r}")
    except (channel.FrameError, grade_network.Stop) as error:
        _drop_worker()                            # a fresh worker for the next call
        raise AssertionError(f"{name} (the student's, in the sandbox): {error}") from None
    finally:
        WATCHDOG.disarm()
        left = NETWORK.settle()                   # requests it never finished: kept safe here, and its fault
    if left:
        raise AssertionError(f"{name} (the student's, in the sandbox) returned with {left} nonblocking request(s) "
                             "it started and never waited for (Isend or Irecv without Wait)")
    try:
        return replies.unpack_reply(frame, sent, tensor_class=Tensor, records=RECORDS, updates=TASK.in_place,
                                    remote=functools.partial(_backward, worker, sent, name, scope))
    except ValueError as error:
        raise AssertionError(f"{name} (the student's, in the sandbox) replied with junk: {error}") from None


def _backward(worker, sent, name, scope, handle, grad):
    """A rebuilt Tensor's backward: the closure the call made runs in the sandbox, where it stayed (with
    the communicators of that call)."""
    return exchange({"__backward__": np.array(handle), "grad": np.asarray(grad), "__worker__": worker}, sent,
                    f"the backward of {name}", scope)


def call(function, args, kwargs, name=None, whole=False):
    """``function(*args, **kwargs)`` in the sandbox: the return value; what it changed of the arguments
    is written into them here. ``whole``: a whole run, on one sandboxed job of comm.size ranks."""
    name = name or FUNCTION
    comm = _comm_of([*args, *kwargs.values()]) if whole else None
    if comm is not None:                          # a whole run: real MPI among the sandbox's own ranks
        return _whole(function, args, kwargs, comm, name)
    scope = NETWORK.begin()                      # this call's communicators: handles for it alone
    try:
        arrays, sent = values.pack_call({"function": function, "args": tuple(args), "kwargs": dict(kwargs)},
                                        comms=NETWORK.spec)
    except TypeError as error:                    # the test hands the function something that cannot cross
        raise AssertionError(f"{name}: its arguments cannot cross into the sandbox: {error}") from None
    return exchange(arrays, sent, name, scope)


def _innermost(comm):
    while isinstance(comm, WatchedComm):
        comm = comm.comm
    return comm


def _comm_of(things, depth=3):
    """The call's communicator: the first one among ``things`` or held by one of them, or None."""
    for thing in things:
        if isinstance(thing, (MPI.Comm, WatchedComm)):
            return thing
        if depth == 0 or isinstance(thing, (np.ndarray, str, bytes, int, float)):
            continue
        if isinstance(thing, functools.partial):
            inner = [*thing.args, *thing.keywords.values()]
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


def _whole(function, args, kwargs, comm, name):
    """A whole run (servers included) on one sandboxed job of comm.size ranks, driven by rank 0."""
    inner = _innermost(comm)
    rank, size = inner.Get_rank(), inner.Get_size()

    def spec(thing):
        if thing is comm or thing is inner:
            return ["comm", 0, rank, size]
        return ["mpi"] if isinstance(thing, WatchedComm) or type(thing).__module__ == "mpi4py.MPI" else None
    try:
        arrays, sent = values.pack_call({"function": function, "args": tuple(args), "kwargs": dict(kwargs)},
                                        comms=spec)
    except TypeError as error:
        raise AssertionError(f"{name}: its arguments cannot cross into the sandbox: {error}") from None
    gathered, parts = inner.gather(arrays, root=0), None
    if rank == 0:
        parts = _run_job(size, gathered, name)
    idle_until_all_arrive(inner)
    reply = inner.scatter(parts, root=0)
    if isinstance(reply, str):
        said = f"{name} (the student's, in the sandbox): {_blame(reply)}"
        grade_record.note(said)
        raise AssertionError(said)
    try:
        return replies.unpack_reply(reply, sent, records=RECORDS, updates=TASK.in_place)
    except ValueError as error:
        raise AssertionError(f"{name} (the student's, in the sandbox) replied with junk: {error}") from None


def _run_job(size, gathered, name):
    """Rank 0: every rank's reply of one call of a whole run, or the message of why there is none."""
    jobs = STATE["jobs"]
    if size not in jobs:
        try:
            jobs[size] = _started("job", size)
        except AssertionError as error:
            return [str(error)] * size
    job = jobs[size]
    WATCHDOG.arm(call_timeout(), _hang_message(name, size))
    errors = []
    try:
        job.send({f"r{r}.{key}": array for r, arrays in enumerate(gathered) for key, array in arrays.items()})
        while True:
            frame = job.receive(time.monotonic() + 1.0) if errors else job.receive()
            if str(frame.get("kind", "")) == "error":
                errors.append(frame)              # this rank's root cause; the job is ending: hear the others
                continue
            if str(frame.get("kind", "")) != "reply" or errors:
                raise channel.FrameError("a frame that is not a reply")
            return [{key.split(".", 1)[1]: array for key, array in frame.items() if key.startswith(f"r{r}.")}
                    for r in range(size)]
    except (channel.FrameError, TimeoutError) as error:
        jobs.pop(size).close()
        if errors:                                # a stub's own words first: the root cause
            errors.sort(key=lambda frame: "NotImplementedError" not in str(frame.get("__error__")))
            return [sandbox.failure_of(errors[0], size)] * size
        return [f"{error} (p = {size})"] * size
    finally:
        WATCHDOG.disarm()


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


def forwarder(original, function=None, method=0, name=None, whole=False):
    """The forwarder for ``original`` (the task's function, or a closure's code: then each call
    gets the closure's cells and ``function`` builds the thing to call in the sandbox; or a
    function of tasks.toml's ``forward``). ``method``: 1 if args[0] is the method's object."""
    signature = inspect.signature(original)

    def forward(*args, **kwargs):
        target = original
        if function is not None:
            cells, args, kwargs = args
            target = function(cells)
        signature.bind(*args, **kwargs)           # a wrong call fails here, as it would have
        return call(target, args, kwargs, name, whole=whole)
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


def _rerouted(outer, inner):
    """``outer`` (a module-level function) compiled again with the fenced body of its closure ``inner``
    replaced by a call of the forwarder that hands over the closure's arguments and the value of
    every local variable of ``outer`` (the student's closure may read any of them, not only those
    the reference's reads): the code that ``outer`` gets while its task is graded."""
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
    return scope[outer.__name__].__code__


class Swap:
    """What grading one task changes in this process, made once and put in place for each of its tests:
    the task's function (or the closure's enclosing function) and each function of its ``forward``
    get a body that forwards to the sandbox; everything else, the tests' oracles included, stays the
    reference's. ``install`` before a test of the task, ``remove`` after it."""

    def __init__(self, task):
        self.task, self.codes, self.forwards = task, [], {}
        self.module, self.function = task.file.removesuffix(".py").replace("/", "."), task.function
        self.records = {}
        for name in task.returns:                 # the task's schema: records rebuilt by this tree's classes
            module, _, qualname = name.partition(":")
            cls = codec.resolve(module, qualname, importing=True)
            if not isinstance(cls, type):
                raise ValueError(f"tasks.toml: task {task.id} returns {name!r}, which is no class of the project")
            self.records[name] = cls
        module = importlib.import_module(self.module)
        head, _, tail = self.function.partition(".")
        owner = getattr(module, head)
        if not tail or isinstance(owner, type):   # a function, or a method of a class
            original, method = (getattr(owner, tail), 1) if tail else (owner, 0)
            self.code_name = original.__qualname__
            self.forward = forwarder(original, method=method)     # its signature is read while it is the reference's
            self.codes.append((original, original.__code__, _trampoline.__code__))
        else:                                     # a closure made inside a function
            self.code_name = f"{head}.<locals>.{tail}"
            code = codec.code_of(self.module, self.code_name, 0)
            dummy = types.FunctionType(code, module.__dict__, code.co_name, None,
                                       tuple(types.CellType() for _ in code.co_freevars))
            module_name, code_name = self.module, self.code_name
            self.forward = forwarder(dummy, lambda cells: codec.Closure(module_name, code_name, 0, cells))
            self.codes.append((owner, owner.__code__, _rerouted(owner, code)))
        for name in task.forward:                 # whole calls: one round trip runs them, and the task's calls in them
            function = _forwarded(task, name)
            if any(function is swapped for swapped, _, _ in self.codes):
                continue                          # the task's own function is forwarded already
            self.forwards[name] = forwarder(function, method=int("." in function.__qualname__), whole=True,
                                            name=f"{self.function}, called by {function.__module__}."
                                                 f"{function.__qualname__}")
            self.codes.append((function, function.__code__, _trampoline_to(name)))

    def install(self):
        global MODULE, FUNCTION, CODE_NAME, FORWARD, TASK, RECORDS
        TASK, MODULE, FUNCTION, CODE_NAME = self.task, self.module, self.function, self.code_name
        FORWARD, RECORDS = self.forward, self.records
        FORWARDS.clear()
        FORWARDS.update(self.forwards)
        NETWORK.forbid, NETWORK.task = set(self.task.forbid), self.task.id
        for function, _, new in self.codes:
            function.__code__ = new

    def remove(self):
        for function, old, _ in self.codes:
            function.__code__ = old


SWAPS = {}                                        # task id -> its Swap, for every task this run grades
INSTALLED = []


def pytest_configure(config):
    global TASKS
    graded = [part for part in os.environ.get("MINIDL_GRADE_PROXY", "").split(",") if part]
    if not graded:
        return
    from tutorials import assignments
    tasks, _ = assignments.load()
    TASKS = {task.id: task for task in tasks}
    grade_network.start()                         # the sandbox's own network: collective, every rank here
    for package in ("minidl", "collectives", "algorithms"):
        importlib.import_module(package)
    for task_id in graded:
        SWAPS[task_id] = Swap(TASKS[task_id])
    STATE["modules"] = sorted({swap.module for swap in SWAPS.values()})


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Put in place the swap of the task this test is of (one task per test), before its fixtures run."""
    marked = [str(task) for mark in item.iter_markers("task") for task in mark.args if str(task) in SWAPS]
    if INSTALLED:
        INSTALLED.pop().remove()
    if marked:
        SWAPS[marked[0]].install()
        INSTALLED.append(SWAPS[marked[0]])


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if INSTALLED:
        INSTALLED.pop().remove()


def pytest_unconfigure(config):
    _drop_worker()
    for job in STATE["jobs"].values():
        job.close()
    STATE["jobs"].clear()
