"""pytest plugin: which course tasks' fenced bodies each test runs (for tests/test_prerequisites.py).

With ``$MINIDL_TASK_CALLS`` set to a path, each module that holds a task is compiled again from
its source with one call added on every ``# BEGIN SOLUTION`` line (on that line, so no line number
moves): ``_task_calls_record("3.6")  # BEGIN SOLUTION``. The function that holds the fence (for
``outer.inner``, the outer one) gets the new code in place (``__code__``), so every name bound to it,
``from x import f`` included, runs the recording version. A task counts as run when its body is
entered, not when its function is called: ``drop_silent`` without a timeout returns before its
fence, and runs no task. After each test this rank appends one line to ``<path>.<rank>``:
``nodeid<TAB>marked task ids<TAB>run task ids`` (ids comma-separated). ``UNWATCHED`` lists the
tasks whose function could not be swapped (none at present). Without ``$MINIDL_TASK_CALLS`` the
plugin does nothing.
The chapters' code blocks, the same way (their ``# needs:`` lines are their ``requires``): in a
chapter's notebook run (tests/chapter_run.py), ``watch_kernel`` records, cell by cell, the tasks each
block runs, the serial blocks' in the kernel and an ``%%mpiexec`` cell's on every one of its ranks
(``run_file``).
"""
import importlib
import itertools
import os
import tempfile
from pathlib import Path

from tutorials import assignments

CALLED = set()
UNWATCHED = []


def _record(task_id):
    CALLED.add(task_id)


def code_named(code, name, line):
    """The code object called ``name`` that starts at ``line``, inside ``code`` (a module's), or None."""
    for constant in code.co_consts:
        if hasattr(constant, "co_name"):
            if constant.co_name == name and constant.co_firstlineno == line:
                return constant
            found = code_named(constant, name, line)
            if found is not None:
                return found
    return None


def holder(task):
    """The function object whose code holds the task's fence: f, Class.method, or outer for outer.inner."""
    module = importlib.import_module(task.file[:-len(".py")].replace("/", "."))
    parts = task.function.split(".")
    target = getattr(module, parts[0], None)
    if len(parts) > 1 and isinstance(target, type):
        target = target.__dict__.get(parts[1])
    return getattr(target, "__func__", target)


def watch_file(file, tasks):
    """Swap in recording code for every task in ``file``; returns the ids it could not swap."""
    path = assignments.ROOT / file
    lines = path.read_text().splitlines(keepends=True)
    for task in tasks:
        _, begin, _ = assignments.fence_of(task)
        indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
        lines[begin] = f"{indent}_task_calls_record({task.id!r})  {assignments.BEGIN}\n"
    module_code = compile("".join(lines), str(path), "exec")
    missed = []
    for task in tasks:
        target = holder(task)
        code = getattr(target, "__code__", None)
        new = code and code_named(module_code, code.co_name, code.co_firstlineno)
        if new is None or new.co_freevars != code.co_freevars:
            missed.append(task.id)
            continue
        target.__globals__["_task_calls_record"] = _record
        target.__code__ = new
    return missed


def pytest_configure(config):
    if os.environ.get("MINIDL_TASK_CALLS"):
        install()


def pytest_runtest_setup(item):
    CALLED.clear()


def pytest_runtest_teardown(item):
    path = os.environ.get("MINIDL_TASK_CALLS")
    if not path:
        return
    from mpi4py import MPI
    marked = sorted({str(task_id) for mark in item.iter_markers("task") for task_id in mark.args})
    with open(f"{path}.{MPI.COMM_WORLD.Get_rank()}", "a") as file:
        file.write(f"{item.nodeid}\t{','.join(marked)}\t{','.join(sorted(CALLED))}\n")


def install():
    by_file = {}
    for task in assignments.load()[0]:
        by_file.setdefault(task.file, []).append(task)
    for file, tasks in by_file.items():
        UNWATCHED.extend(watch_file(file, tasks))


def run_file(path, out):
    """(under mpiexec) Run a block's file with every task watched; this rank's calls to ``out``.<rank>."""
    import runpy

    from mpi4py import MPI
    install()
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        with open(f"{out}.{MPI.COMM_WORLD.Get_rank()}", "w") as file:
            file.write(",".join(sorted(CALLED)))


def watch_kernel(ipython, out):
    """(in a notebook's kernel, after its set-up cell) One line per later cell to ``out``: "number<TAB>task ids",
    the tasks that cell ran: in the kernel, or on any rank of the ``%%mpiexec`` job it started."""
    from tutorials import notebook
    install()
    plain = notebook.run_mpi

    def run_mpi(code, ranks, *args, **kwargs):
        with tempfile.TemporaryDirectory() as scratch:
            script, record = Path(scratch) / "cell.py", Path(scratch) / "calls"
            script.write_text(code)
            status = plain(f"from tests.task_calls import run_file\nrun_file({str(script)!r}, {str(record)!r})\n",
                           ranks, *args, **kwargs)
            CALLED.update(task for path in Path(scratch).glob("calls.*") for task in path.read_text().split(",")
                          if task)
        return status

    notebook.run_mpi = run_mpi
    numbers = itertools.count(1)

    def written(result):
        with open(out, "a") as file:
            file.write(f"{next(numbers)}\t{','.join(sorted(CALLED))}\n")

    ipython.events.register("pre_run_cell", lambda info: CALLED.clear())
    ipython.events.register("post_run_cell", written)
