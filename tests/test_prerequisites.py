"""Every prerequisite is listed: a task's visible tests run no other task's code than the tasks its
``requires`` names (directly or through them), so in a student tree with only task T unfinished the
tests of every task that does not list T still pass. Likewise every chapter block's ``# needs:``
line names exactly the tasks the block runs (with the serial blocks before it: a skipped block
skips the rest of its chapter), so a block is skipped, not failed, while a task it runs is a stub,
and never skipped for a task it does not run.

How: the visible tests of the checked tasks run once on the reference, on 1 to 3 ranks, with the
plugin tests/task_calls.py, which instruments every fence in place and records, test by test,
which task functions ran. A test marked for task U that ran task T's function, T neither U nor
among U's prerequisites (closed under ``requires``), is an unlisted prerequisite. Running each
test once with a recorder is what makes this affordable; stubbing each task in turn and rerunning
the others' tests would cost one whole run per task.

Scope: the collectives' chain (chapter 3) and the tasks that train through it (chapter 4), on
1 to 3 ranks (p = 3 is where the fold-in runs). The other chapters' tasks take minutes more of
training tests: ``MINIDL_PREREQUISITE_CHAPTERS=1,2,3,4,5,6,7,8,9 pytest tests/test_prerequisites.py``
checks them all (with ``MINIDL_PREREQUISITE_MAX_RANKS=4``: 6.3's tests run on 4 ranks).
The chapters' blocks: every chapter, recorded in the notebook run that tests/test_tutorials.py checks
(tests/chapter_run.py), so they cost no run of their own.
A task counts as run when its fenced body is entered (tests/task_calls.py adds the record on the
``# BEGIN SOLUTION`` line), not when its function is called: a function that returns before its
fence runs no task.
"""
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chapter_run import chapter_run
from tests.helpers import needs
from tests.task_calls import UNWATCHED, install
from tutorials import assignments
from tutorials.block import blocks, chapter_file, ranks_of

ROOT = Path(__file__).resolve().parent.parent
TASKS, _ = assignments.load()
BY_ID = {task.id: task for task in TASKS}
MAX_RANKS = int(os.environ.get("MINIDL_PREREQUISITE_MAX_RANKS", 3))
CHAPTERS = sorted({int(part) for part in os.environ.get("MINIDL_PREREQUISITE_CHAPTERS", "3,4").split(",")})
# the recorder runs the reference's bodies: in a student tree the stubs would fail the tests it runs
REFERENCE = pytest.mark.skipif(assignments.is_student_tree(ROOT), reason=assignments.STUDENT_TREE)
BLOCK_CHAPTERS = sorted(int(path.name[:2]) for path in (ROOT / "tutorials").glob("[0-9][0-9]_*.md"))


def prerequisites(task_id):
    """The task's ``requires``, closed: the tasks it needs, and the tasks they need."""
    found, todo = set(), list(BY_ID[task_id].requires)
    while todo:
        needed = todo.pop()
        if needed not in found:
            found.add(needed)
            todo.extend(BY_ID[needed].requires)
    return found


def unlisted(records):
    """[(nodeid, marked task, task run but not listed)] from the recorder's lines."""
    found = []
    for line in records:
        nodeid, marked, called = line.rstrip("\n").split("\t")
        for task_id in filter(None, marked.split(",")):
            allowed = {task_id} | prerequisites(task_id)
            for other in sorted(set(filter(None, called.split(","))) - allowed):
                found.append((nodeid, task_id, other))
    return found


def record_calls(ids, tmp_path, max_ranks=MAX_RANKS):
    """Run the visible tests of ``ids`` on 1..max_ranks ranks with the recorder; its lines."""
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    records = tmp_path / "calls"
    env = dict(os.environ, MINIDL_TASK_CALLS=str(records), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    files = sorted({str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py")
                    for task_id in ids if f'task("{task_id}")' in path.read_text()})
    for nprocs in range(1, max_ranks + 1):
        pytest_ = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.task_calls",
                   "-m", f"parallel[{nprocs}]", "--task", ",".join(ids), "--tb=line", *files]
        command = pytest_ if nprocs == 1 else \
            [mpiexec, "-n", "1", *pytest_, ":", "-n", str(nprocs - 1), *pytest_, "-p", "tests.quiet_rank"]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode in (0, 5), f"p={nprocs}: the tests themselves failed\n{done.stdout[-3000:]}"
    lines = []
    for path in sorted(tmp_path.glob("calls.*")):
        lines += path.read_text().splitlines()
    return lines


def test_the_rule_flags_a_task_run_by_another_tasks_test():
    records = ["t.py::a\t3.7\t3.6,3.7", "t.py::b\t3.6\t3.6,3.7", "t.py::c\t\t3.1", "t.py::d\t3.9\t3.1,3.6"]
    assert unlisted(records) == [("t.py::b", "3.6", "3.7")]      # 3.7 lists 3.6; 3.9 lists all of chapter 3
    assert prerequisites("3.9") >= {"3.6", "3.7"} and prerequisites("3.2") == {"3.3"}


@REFERENCE
def test_the_collectives_chain_runs_only_listed_prerequisites(tmp_path):
    ids = [task.id for task in TASKS if task.chapter in CHAPTERS]
    records = record_calls(ids, tmp_path)
    marked = {task for line in records for task in line.split("\t")[1].split(",") if task}
    assert marked >= set(ids), f"no record of the tests of {sorted(set(ids) - marked)}"
    found = unlisted(records)
    assert not found, "unlisted prerequisites (test, its task, the task it ran):\n" + "\n".join(
        f"  {nodeid}: task {task} ran {other}" for nodeid, task, other in found)


@functools.cache
def unwatched():
    """The tasks the recorder could not instrument (none at present); instruments them, once a process."""
    if not UNWATCHED:
        install()
    return frozenset(UNWATCHED)


def block_mismatches(chapter, called_by_block):
    """[(block, what)] where a block's ``# needs:`` line and the tasks it ran disagree."""
    found, listed_so_far = [], set()
    for number, code in enumerate(blocks(chapter_file(chapter)), 1):
        listed = set(needs(code))
        listed_so_far |= listed if ranks_of(code) is None else set()
        called = called_by_block.get(number, set())
        covered = listed | listed_so_far            # a serial block runs after the serial blocks before it
        for task_id in sorted(called - covered):
            found.append((number, f"runs task {task_id}, which its needs line does not name"))
        for task_id in sorted(listed - called - unwatched()):
            found.append((number, f"needs task {task_id}, which it never runs (a student would wait for nothing)"))
    return found


def test_the_block_rule_flags_unlisted_and_unused_tasks():
    assert unwatched() == set(), f"the recorder cannot see tasks {sorted(unwatched())}"
    mismatches = block_mismatches("03", {2: {"3.1", "3.4", "3.5", "3.6"}})
    assert (2, "runs task 3.6, which its needs line does not name") in mismatches
    assert any(number == 8 and "never runs" in what for number, what in mismatches)   # block 8 ran nothing here


@REFERENCE
@pytest.mark.timeout(600)
@pytest.mark.parametrize("chapter", [f"{chapter:02d}" for chapter in BLOCK_CHAPTERS])
def test_every_blocks_needs_line_names_the_tasks_it_runs(chapter, tmp_path):
    # the chapter's notebook run that tests/test_tutorials.py checks, made by whichever test comes first
    # (tests/chapter_run.py), with a record of the tasks each block ran
    pytest.importorskip("nbclient", reason="nbclient comes with the test extra: pip install -e '.[test]'")
    done = chapter_run(chapter, tmp_path)
    if done.error is not None:
        raise AssertionError(f"chapter {chapter}: block {done.failed} failed, so what it runs is unknown:\n"
                             f"{done.error[-3000:]}")
    count = len(blocks(chapter_file(chapter)))
    assert sorted(done.calls) == list(range(1, count + 1)), \
        f"chapter {chapter}: recorded blocks {sorted(done.calls)}, the chapter has 1..{count}"
    found = block_mismatches(chapter, done.calls)
    assert not found, f"chapter {chapter}:\n" + "\n".join(f"  block {number} {what}" for number, what in found)
