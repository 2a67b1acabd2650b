"""Grade course-assignment tasks: each task's tests, run in isolation, scored by the registry's points.

    python tests/grade.py                                  # grade this tree (a student's, or the reference)
    python tests/grade.py --student DIR                    # grade DIR against this (reference) tree
    python tests/grade.py --tasks 3.4,3.5 --json out.json  # some tasks; the table as JSON too
    python tests/grade.py --student DIR --gradescope results.json   # Gradescope's results format

A task's tests are the ones marked ``@pytest.mark.task("<id>")`` (tests/hidden/ holds the hidden
ones; a student tree has none). With ``--student DIR``:

- **Every task** runs its tests here, in this checkout, with the hidden tests and their answers;
  only the task's function runs in the sandbox
  (tutorials/assignments/sandbox.py), imported from a copy of DIR without solution-only files and
  with this tree's tests/helpers.py and tests/handed.py (the tests' code, not the student's), one
  sandboxed job per rank count serving every call (tests/grade_proxy.py). Its arguments cross as
  values (tutorials/assignments/values.py): arrays, numbers, lists, dicts, and the project's own
  objects, functions and closures (a model, an optimizer, an autograd closure's cells), each
  rebuilt there from the student's tree and, after the call, written back into the caller's own
  objects here. A function that is a closure (``matmul.backward``) is called with the enclosing
  function's variables; a method with its object. The student's code can hand back plain values
  and nothing else: no record file, no patched pytest, no answer to read, no code of its own.
  **Prerequisites run as the student wrote them:** in the sandbox the whole student tree is the
  student's, so a task whose code calls another task's function (``requires``) fails if that one
  is unfinished or wrong; its message then leads with "task X runs through your task Y ... which
  is still a stub (or raised): finish or fix Y first".
  **Whole calls:** a task may also name ``forward = ["module.qualname", ...]`` in tasks.toml,
  functions whose *whole* call is forwarded as the task's function's are: a batch helper
  (``tests.helpers.run_calls``, through ``results_of``: thousands of calls of the task's function
  in one round trip, where each call alone costs milliseconds) or a run that every rank enters,
  servers included (once on ``comm.size`` sandboxed ranks). They run with the student's code
  (tests/helpers.py and tests/handed.py are this tree's) and hand back only values, which the
  tests check here.
- No student code runs outside the sandbox: where the sandbox cannot run (not root, neither
  bubblewrap nor setpriv), ``--student`` stops with ``error:`` and exit status 2.
- A body that calls one of its task's ``forbid`` methods (``comm.Allreduce`` in a ring task) is
  not run: the task scores 0 and says why.

Without ``--student`` the tree is graded as it is (a student checking their own work: there,
unfinished prerequisites do cascade).

Each rank count runs in its own ``mpiexec`` (one pytest per rank, as tests/run.py does) with a
per-test timeout (pytest-timeout, ``--timeout``, 30 s by default; a test that calls a sandboxed
function hundreds of times may carry a longer ``timeout`` mark, since each call there has its own
limit of 0.7 ``--timeout``: a deadlock in the student's code still costs one call's limit). A
test that deadlocks kills its
run, and the task stops there: that test fails with "timed out after N s at p = P", and the task's
tests that had not run yet are marked "not run" (they count as failed), so a deadlock costs its
task at most about one timeout and the other tasks nothing. ``--time-limit`` bounds the whole
submission: tasks not reached by then score 0, marked "not graded". A task's points are its
registry points times the fraction of its tests that pass (skipped tests, e.g. GPU ones without a
GPU, do not count; nor do tests on more ranks than ``--max-ranks``).

Feedback: every failed test says what failed, in the words of its assertion (which rank, which
index, expected against got, as the test reports it), printed under the task's line and kept in
the JSON; ``--gradescope`` writes Gradescope's ``results.json`` (``score``, and per test ``name``,
``score``, ``max_score``, ``status``, ``output``, ``visibility``: hidden tests ``after_published``).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tutorials import assignments  # noqa: E402
from tutorials.assignments import sandbox  # noqa: E402
from tutorials.assignments.sandbox import SandboxError  # noqa: E402

def test_files(tree, task):
    """The test files that mark a test for ``task`` (so pytest collects only those: much faster)."""
    mark = re.compile(r"""task\(\s*["']""" + re.escape(task.id) + r"""["']""")
    return sorted(str(path.relative_to(tree)) for path in (Path(tree) / "tests").rglob("test_*.py")
                  if mark.search(path.read_text()))


def collect(tree, task, env):
    """{rank count: [node ids]} of the task's tests in ``tree`` (the sizes from their markers)."""
    with tempfile.NamedTemporaryFile("r", suffix=".tsv") as listing:
        subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-p", "tests.grade_record", "--task", task.id, *test_files(tree, task)], cwd=tree,
                       env=dict(env, MINIDL_GRADE_COLLECT=listing.name), capture_output=True, timeout=300)
        groups = {}
        for line in Path(listing.name).read_text().splitlines():
            nprocs, nodeid = line.split("\t")
            groups.setdefault(int(nprocs), []).append(nodeid)
        return groups


def command(tree, nprocs, selection, timeout, proxy=False):
    """The pytest command for ``selection`` (a --task option, or node ids) on ``nprocs`` ranks."""
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.grade_record",
              *(["-p", "tests.grade_proxy"] if proxy else []),
              "-m", f"parallel[{nprocs}]", f"--timeout={timeout}", "-q", "--no-header", "--tb=short", *selection]
    if nprocs == 1:
        return pytest
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    return [mpiexec, "-n", "1", *pytest, ":", "-n", str(nprocs - 1), *pytest, "-p", "tests.quiet_rank"]


def run(tree, nprocs, selection, timeout, count, env):
    """Run and return ({node id: ('passed' | 'failed' | 'skipped', message)} for the tests rank 0
    reported, {node id: (rank, message)}: the first failure another rank reported)."""
    with tempfile.NamedTemporaryFile("r", suffix=".tsv") as record:
        env = dict(env, MINIDL_GRADE_RECORD=record.name)
        process = subprocess.Popen(command(tree, nprocs, selection, timeout, "MINIDL_GRADE_PROXY" in env),
                                   cwd=tree, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            process.wait(timeout=timeout * count + 300)  # + a test's own longer timeout mark
        except subprocess.TimeoutExpired:                # pytest-timeout should have ended it first
            os.killpg(process.pid, signal.SIGKILL)       # mpiexec and every rank: one process group
            process.wait()
        outcomes, elsewhere = {}, {}
        for line in Path(record.name).read_text().splitlines():
            when, outcome, nodeid, message, rank = (line.split("\t") + ["", "0"])[:5]
            if rank != "0":                          # the root cause first: the sandbox's words
                said = (rank, message if when == "call" else f"{when}: {message}")
                if nodeid not in elsewhere or ("in the sandbox" in message and "in the sandbox" not in elsewhere[nodeid][1]):
                    elsewhere[nodeid] = said
                continue
            before = outcomes.get(nodeid, ("", ""))[0]
            if outcome == "failed" and before != "failed":
                outcomes[nodeid] = ("failed", message if when == "call" else f"{when}: {message}")
            elif outcome == "skipped" and before != "failed":
                outcomes[nodeid] = ("skipped", "")
            elif when == "call" and outcome == "passed" and nodeid not in outcomes:
                outcomes[nodeid] = ("passed", "")
        for nodeid, (rank, message) in elsewhere.items():   # rank 0 passed, another rank did not
            if outcomes.get(nodeid, ("",))[0] == "passed":
                outcomes[nodeid] = ("failed", f"rank {rank}: {message}")
        return outcomes, elsewhere


def grade_task(tree, task, timeout, env, max_ranks=8):
    """{node id: (outcome, message)} of the task's tests in ``tree``.

    One run per rank count, in the order of the tests. If a run dies before every test reported (a
    deadlock, or a crash), its first silent test is the one that hung: it fails with a timeout
    message, and every test of the task not yet run is "not run" (the task stops there).
    """
    outcomes, stopped = {}, None
    for nprocs, ids in sorted(collect(tree, task, env).items()):
        if nprocs > max_ranks:
            continue
        if stopped:
            outcomes.update({nodeid: ("not run", stopped) for nodeid in ids})
            continue
        got, elsewhere = run(tree, nprocs, ["--task", task.id, *test_files(tree, task)], timeout, len(ids), env)
        outcomes.update({nodeid: got[nodeid] for nodeid in ids if nodeid in got})
        silent = [nodeid for nodeid in ids if nodeid not in got]
        if silent and silent[0] in elsewhere:        # one rank failed, the others waited for it
            rank, message = elsewhere[silent[0]]
            outcomes[silent[0]] = ("failed", f"rank {rank} of p = {nprocs}: {message} (the other ranks then "
                                             f"waited for it until the timeout, {timeout} s)")
        elif silent:                                 # the run died in silent[0]
            outcomes[silent[0]] = ("failed", f"timed out after {timeout} s at p = {nprocs} (or the run crashed): "
                                             "probably a receive that no rank's send matches, or a rank that "
                                             "stopped sending")
        if silent:
            stopped = f"not run: an earlier test of this task timed out at p = {nprocs}"
            outcomes.update({nodeid: ("not run", stopped) for nodeid in silent[1:]})
    return outcomes


# The tests' own code that runs in the sandbox: a forwarded entry (tasks.toml's ``forward``) sets up a
# server run and reports what happened, and the objects tests hand over are built from these files.
TEST_CODE = ("tests/helpers.py", "tests/handed.py")


def sandbox_tree(out, student, generator):
    """A world-readable copy of the student's tree for the sandbox, without the solution-only files
    (a student tree has none; ``--student .`` on the reference checkout must not hand them over), and
    with this tree's ``TEST_CODE`` in place of the student's copies: those are the grader's, not
    the student's (a helper that reports what a run did must not be one the student rewrote)."""
    sandbox.mode()                                   # root, and bubblewrap or setpriv: else SandboxError
    assignments.copy_tree(out, student, leave_out=generator.get("remove", ()))
    for name in TEST_CODE:
        shutil.copyfile(ROOT / name, Path(out) / name)
    for folder, _, files in os.walk(out):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    os.chmod(Path(out).parent, 0o755)
    return out


def score(task, outcomes):
    """The task's row: points pro rata over its counted tests, and every test's outcome and message."""
    counted = {nodeid: result for nodeid, result in outcomes.items() if result[0] != "skipped"}
    passed = sum(result[0] == "passed" for result in counted.values())
    points = task.points * passed / len(counted) if counted else 0.0
    return {"id": task.id, "title": task.title, "passed": passed, "total": len(counted),
            "skipped": len(outcomes) - len(counted), "points": round(points, 2), "max_points": task.points,
            "failed": sorted(nodeid for nodeid, result in counted.items() if result[0] != "passed"),
            "tests": [{"name": nodeid, "status": result[0], "message": result[1]}
                      for nodeid, result in sorted(outcomes.items())]}


def gradescope(results, seconds):
    """Gradescope's results.json: one entry per test, its share of the task's points."""
    tests = []
    for row in results:
        counted = [test for test in row["tests"] if test["status"] != "skipped"]
        for test in row["tests"] or [{"name": f"task {row['id']}", "status": "failed",
                                      "message": "; ".join(row["failed"]) or "no tests ran"}]:
            share = row["max_points"] / len(counted) if counted else row["max_points"]
            share = 0.0 if test["status"] == "skipped" else share          # a skipped test (no GPU) counts for nothing
            tests.append({"name": f"{row['id']} {row['title']}: {test['name']}", "max_score": round(share, 6),
                          "score": round(share, 6) if test["status"] == "passed" else 0.0,
                          "status": "passed" if test["status"] in ("passed", "skipped") else "failed",
                          "output": test["message"] or test["status"],
                          "visibility": "after_published" if "tests/hidden/" in test["name"] else "visible"})
    return {"score": round(sum(test["score"] for test in tests), 4), "execution_time": round(seconds, 1),
            "tests": tests}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--student", default=None, help="a student tree to grade against this one")
    parser.add_argument("--tasks", default=None, help="comma-separated task ids (default: all)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--timeout", type=int, default=30, help="seconds per test (a deadlock costs one)")
    parser.add_argument("--time-limit", type=int, default=1800,
                        help="seconds for the whole submission; tasks not reached by then score 0")
    parser.add_argument("--gradescope", default=None, help="also write Gradescope's results.json here")
    parser.add_argument("--max-ranks", type=int, default=8, help="leave out tests on more ranks (not counted)")
    args = parser.parse_args(argv)
    tasks, generator = assignments.load()
    try:
        chosen = assignments.select(tasks, args.tasks)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    started, results = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as scratch:
        tree = ROOT
        if args.student:
            student = Path(args.student).resolve()
            try:
                sandboxed = sandbox_tree(Path(scratch) / "student", student, generator)
            except (SandboxError, OSError, ValueError) as error:
                print(f"error: the sandbox cannot run here ({error}); grading a submission needs it", file=sys.stderr)
                return 2
        for task in chosen:
            if time.perf_counter() - started > args.time_limit:
                results.append({**score(task, {}), "failed": [f"not graded: the submission's --time-limit of "
                                                              f"{args.time_limit} s ran out"]})
                continue
            if args.student:
                try:
                    submitted = assignments.body(task, student)
                    forbidden = assignments.forbidden_calls(task, submitted)
                except (ValueError, OSError, SyntaxError) as error:
                    results.append({**score(task, {}), "failed": [f"no gradable fence: {error}"]})
                    continue
                if forbidden:
                    results.append({**score(task, {}), "failed": [f"not graded: {forbidden}"]})
                    print(f"{task.id:<5} {task.title[:44]:<44}   0/-   {0:>5g}/{task.points:g}\n      {forbidden}")
                    continue
            if args.student:                         # the function alone in the sandbox, the tests here
                task_env = dict(env, PYTHONPATH=str(ROOT), MINIDL_GRADE_PROXY=task.id,
                                MINIDL_GRADE_STUDENT=str(sandboxed),
                                MINIDL_GRADE_CALL_TIMEOUT=str(max(1, int(args.timeout * 0.7))))
                results.append(score(task, grade_task(ROOT, task, args.timeout, task_env, args.max_ranks)))
            else:
                results.append(score(task, grade_task(tree, task, args.timeout, env, args.max_ranks)))
            last = results[-1]
            print(f"{task.id:<5} {task.title[:44]:<44} {last['passed']:>3}/{last['total']:<3} "
                  f"{last['points']:>5g}/{task.points:g}", flush=True)
            for test in last["tests"]:
                if test["status"] not in ("passed", "skipped"):
                    print(f"      {test['name']}: {test['message'] or test['status']}"[:400], flush=True)
    seconds = time.perf_counter() - started
    earned, possible = sum(r["points"] for r in results), sum(r["max_points"] for r in results)
    print(f"{'total':<50} {earned:>9g}/{possible:g}   ({seconds:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"tasks": results, "points": earned, "max_points": possible,
                                               "seconds": round(seconds, 1)}, indent=1))
    if args.gradescope:
        Path(args.gradescope).write_text(json.dumps(gradescope(results, seconds), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
