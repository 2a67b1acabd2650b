"""Shared test set-up.

Course-assignment tasks: ``@pytest.mark.task("3.4")`` marks a test of task 3.4 of
tutorials/assignments/tasks.toml, and ``--task 3.4,3.5`` runs only the tests marked with one of
those ids (every other test is deselected; without ``--task`` nothing changes). It combines with
mpi-pytest's markers as tests/run.py uses them: ``-m "parallel[3]" --task 3.4``. A marked item
must fail when only that task's body is the generated stub (``raise NotImplementedError``) and
pass with the reference, so items that never reach the function (a collective on one rank, a cost
of n = 0) carry no mark. Tests whose oracle would hand a student a solution live in tests/hidden/.

In a student tree (``python -m tutorials.assignments make``), a test of a task that the tree neither
assigns nor releases is skipped, saying so: its body is a stub there and nobody is to write it yet.

``@pytest.mark.needs("1.1", "4.1")`` marks a test that runs those tasks' code without being a test
of them (a figure script's quick run): in a student tree where one of them is still the stub, the
test is skipped and says which task it waits for, as a chapter block with a ``# needs:`` line is.

Hypothesis must draw the same examples on every MPI rank, or the ranks would disagree about
which test case they are running and deadlock. So examples are derandomized (a fixed sequence
derived from the test), nothing is read from an example database, and timing-based checks
(deadlines, the too-slow health check) are off, since ranks on an oversubscribed machine run
at different speeds and would otherwise fail on different examples.

Under the grader with a sandboxed task ($MINIDL_GRADE_PROXY: tests/grade_proxy.py), hypothesis
does not shrink a failing example: each call of the student's function crosses into the sandbox,
and a failing collective costs a restart of the sandboxed job (about a second), so shrinking would
spend the test's timeout; the student gets the first failing example instead.
"""
import os
import re

# The user's tuning file (python -m minidl.tune, minidl/tuning.py) never reaches a test: every test
# runs on the shipped defaults, tuned machine or not, and so does every process a test starts (they
# inherit this). A test of the tuning file names its own file.
os.environ["MINIDL_TUNING"] = "none"

from hypothesis import HealthCheck, Phase, settings  # noqa: E402

settings.register_profile(
    "minidl",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=list(HealthCheck),
    max_examples=int(os.environ.get("MINIDL_HYPOTHESIS_EXAMPLES", 25)),
    **({"phases": [Phase.explicit, Phase.reuse, Phase.generate]} if os.environ.get("MINIDL_GRADE_PROXY") else {}),
)
settings.load_profile("minidl")


import pytest  # noqa: E402

from minidl import backend  # noqa: E402


@pytest.fixture(params=["numpy", "cupy"])
def backend_name(request):
    """Run a test on each backend; CuPy is skipped, saying why, where no GPU is present."""
    if request.param == "cupy" and not backend.cupy_available():
        pytest.skip("CuPy backend: no CuPy installation with a CUDA GPU on this machine")
    previous = backend.get_backend()
    backend.set_backend(request.param)
    yield request.param
    backend.set_backend(previous)


def pytest_addoption(parser):
    parser.addoption("--task", default=None, metavar="IDS",
                     help="run only the tests marked @pytest.mark.task(<id>) for one of these comma-separated "
                          "course-assignment task ids (tutorials/assignments/tasks.toml)")
    parser.addoption("--rank-files", default=None, metavar="PATH",
                     help="write which test files hold tests for p > 1 ranks to PATH.<pid> (tests/run.py)")


def task_ids(item):
    """The task ids a test item is marked with (``@pytest.mark.task``, on the function or a param)."""
    return {str(task_id) for mark in item.iter_markers("task") for task_id in mark.args}


def pytest_runtest_setup(item):
    if task_ids(item):
        from tutorials.assignments import not_assigned
        why = next(filter(None, (not_assigned(task_id) for task_id in sorted(task_ids(item)))), "")
        if why:
            pytest.skip(why)
    wanted = [str(task_id) for mark in item.iter_markers("needs") for task_id in mark.args]
    if wanted:
        from tutorials.assignments import stubbed
        not_done = [task_id for task_id in wanted if stubbed(task_id)]
        if not_done:
            pytest.skip(f"needs task {not_done[0]}, which is not done yet in this tree (its body is the stub)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    option = config.getoption("--task")
    if option is None:
        return
    wanted = {part.strip() for part in option.split(",") if part.strip()}
    selected, deselected = [], []
    for item in items:
        (selected if task_ids(item) & wanted else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


# ---- which tests share a worker when tests/run.py spreads the serial tests over cores (pytest-xdist) ----------
# tests/run.py runs the serial tests as `pytest -n N --dist loadfile --no-loadscope-reorder`: each test file is
# one unit of work, handed to the next free worker, so a file's module fixtures are built once and its tests
# never run beside each other. Some units span files, and go out first (each is among the longest):
TOGETHER = {
    # every sandboxed job runs as a fresh uid of sandbox.SANDBOX_UIDS, and tests/test_sandbox.py and
    # tests/test_assignments.py check that no process of any of those uids (or the grader's) is left
    # over, so no other sandboxed job may run meanwhile
    "sandbox": ("tests/test_sandbox.py::", "tests/test_assignments.py::", "tests/test_redteam.py::"),
    # one notebook run of each chapter serves both: it runs the blocks and records the tasks each block
    # runs (tests/chapter_run.py), and the run is kept for the other test in the same worker
    "chapter blocks": ("tests/test_tutorials.py::test_chapter_code_runs[",
                       "tests/test_prerequisites.py::test_every_blocks_needs_line_names_the_tasks_it_runs["),
}


def work_unit(nodeid):
    """The unit of work a test belongs to: a name of TOGETHER, else its file."""
    for name, prefixes in TOGETHER.items():
        if nodeid.startswith(prefixes):
            return name
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Together(LoadFileScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid)

        def _assign_work_unit(self, node):
            for name in reversed(TOGETHER):           # the next unit a worker gets: TOGETHER's first, in order
                if name in self.workqueue:
                    self.workqueue.move_to_end(name, last=False)
            super()._assign_work_unit(node)

    return Together(config, log)


def pytest_deselected(items):
    """``--rank-files PATH`` (tests/run.py's serial run): the files that hold tests for p ranks, p > 1, as
    that run deselects them (mpi-pytest has marked each 'parallel[p]' by then), so that each mpiexec
    imports only those files. Appends one line per (p, file) to ``PATH.<pid>`` (one per xdist worker)."""
    path = items[0].config.getoption("--rank-files") if items else None
    if not path:
        return
    found = set()
    for item in items:
        for mark in item.iter_markers():
            ranks = re.fullmatch(r"parallel\[(\d+)\]", mark.name)
            if ranks and ranks.group(1) != "1":
                found.add(f"{ranks.group(1)}\t{item.nodeid.split('::', 1)[0]}\n")
    with open(f"{path}.{os.getpid()}", "a") as file:
        file.writelines(sorted(found))


def pytest_collection_finish(session):
    # an empty note says this process collected, and found no test for p > 1 ranks that it deselected
    path = session.config.getoption("--rank-files")
    if path:
        open(f"{path}.{os.getpid()}", "a").close()
