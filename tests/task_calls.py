"""pytest plugin: which course tasks' functions each test runs (for tests/test_prerequisites.py).

With ``$MINIDL_TASK_CALLS`` set to a path, every task function of tutorials/assignments/tasks.toml
is wrapped in place (its ``__code__`` swapped for a small recorder, so names imported elsewhere with
``from x import f`` are wrapped too), and after each test this rank appends one line to
``<path>.<rank>``: ``nodeid<TAB>marked task ids<TAB>called task ids`` (ids comma-separated).

What it cannot wrap, and so cannot see: a function defined inside another (``matmul.backward``,
made anew at each call) and one with free variables (a closure, or a method using ``super()``);
``UNWATCHED`` lists them. Without ``$MINIDL_TASK_CALLS`` the plugin does nothing.

The chapters' code blocks, the same way (their ``# needs:`` lines are their ``requires``)::

    python -m tests.task_calls CHAPTER OUT     # OUT: one line per block, "number<TAB>called task ids"

runs the chapter's blocks as tests/test_tutorials.py does (serial blocks in one namespace, in this
process; each MPI block under its own ``mpiexec``, every rank recording).
"""
import contextlib
import functools
import importlib
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tutorials import assignments

CALLED = set()
UNWATCHED = []


def _record(task_id):
    CALLED.add(task_id)


def watch(task):
    """Wrap the task's function where it is defined; False if it cannot be wrapped."""
    module = importlib.import_module(task.file[:-len(".py")].replace("/", "."))
    owner, *rest = task.function.split(".")
    holder = module
    target = getattr(module, owner, None)
    if rest and isinstance(target, type):                 # Class.method
        holder, target = target, target.__dict__.get(rest[0])
    elif rest:                                            # outer.inner: made at each call of outer
        return False
    if target is None or not hasattr(target, "__code__") or target.__code__.co_freevars:
        return False
    original = type(target)(target.__code__, target.__globals__, target.__name__, target.__defaults__,
                            target.__closure__)
    original.__kwdefaults__ = target.__kwdefaults__
    functools.update_wrapper(original, target)
    name = f"_task_calls_original_{task.id.replace('.', '_')}"
    target.__globals__[name] = original
    target.__globals__["_task_calls_record"] = _record
    namespace = {}
    exec(f"def recorder(*args, **kwargs):\n"
         f"    _task_calls_record({task.id!r})\n"
         f"    return {name}(*args, **kwargs)\n", {}, namespace)
    target.__code__ = namespace["recorder"].__code__
    target.__defaults__ = target.__kwdefaults__ = None
    del holder
    return True


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
    for task in assignments.load()[0]:
        if not watch(task):
            UNWATCHED.append(task.id)


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


def run_chapter(chapter, out):
    """Run every block of ``chapter`` (e.g. '03') with every task watched; write one line per block."""
    from tutorials.block import blocks, chapter_file, ranks_of
    install()
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    namespace, lines = {"__name__": f"tutorial_{chapter}"}, []
    for number, code in enumerate(blocks(chapter_file(chapter)), 1):
        CALLED.clear()
        ranks = ranks_of(code)
        if ranks is None:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, f"block {number}", "exec"), namespace)
            called = set(CALLED)
        else:
            with tempfile.TemporaryDirectory() as scratch:
                script = Path(scratch) / f"block{number}.py"
                script.write_text(code)
                record = Path(scratch) / "calls"
                subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-m", "tests.task_calls", "--file",
                                str(script), str(record)], check=True, capture_output=True, timeout=600)
                called = {task for path in Path(scratch).glob("calls.*")
                          for task in path.read_text().split(",") if task}
        lines.append(f"{number}\t{','.join(sorted(called))}\n")
    Path(out).write_text("".join(lines))


if __name__ == "__main__":
    if sys.argv[1] == "--file":
        run_file(sys.argv[2], sys.argv[3])
    else:
        run_chapter(sys.argv[1], sys.argv[2])
