"""What the grader tells a student and writes for Gradescope.

- A failed test says what failed, in its assertion's words; a deadlock says where it timed out and
  stops its task there (the task's later tests are "not run"), costing about one timeout.
- ``--gradescope`` writes Gradescope's results.json: ``score`` and, per test, ``name``, ``score``,
  ``max_score``, ``status``, ``output`` and ``visibility`` (hidden tests ``after_published``),
  with the scores adding up to the table's points.
"""
import json
import subprocess
import sys
from pathlib import Path

from tutorials import assignments

ROOT = Path(__file__).resolve().parent.parent
TASKS, _ = assignments.load()
FIELDS = {"name", "score", "max_score", "status", "output", "visibility"}


def grade(*flags, timeout=600):
    return subprocess.run([sys.executable, str(ROOT / "tests/grade.py"), *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_a_deadlock_is_named_and_stops_its_task_and_results_json_has_gradescopes_fields(tmp_path):
    tree = tmp_path / "tree"
    assignments.make(tree, ids="3.4,9.2")
    task = assignments.select(TASKS, ["3.4"])[0]
    lines, begin, _ = assignments.fence_of(task, tree)
    indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
    # every rank waits for a message nobody sends
    assignments.replace_body(task, tree, [f"{indent}comm.Recv(data, source=(comm.Get_rank() + 1) % comm.Get_size())\n"])
    results = tmp_path / "results.json"
    done = grade("--student", str(tree), "--tasks", "3.4,9.2", "--timeout", "8", "--max-ranks", "2",
                 "--json", str(tmp_path / "g.json"), "--gradescope", str(results))
    assert done.returncode == 0, done.stderr
    rows = {row["id"]: row for row in json.loads((tmp_path / "g.json").read_text())["tasks"]}
    statuses = [test["status"] for test in rows["3.4"]["tests"]]
    timed_out = [test for test in rows["3.4"]["tests"] if "timed out after 8 s at p = 2" in test["message"]]
    assert len(timed_out) == 1 and statuses.count("not run") == len(statuses) - statuses.count("passed") - 1, rows
    assert "timed out after 8 s at p = 2" in done.stdout
    # 9.2 is the stub: each of its tests says which task is unfinished and where the chapter explains it
    stubbed = rows["9.2"]["tests"]
    assert stubbed and all(test["status"] == "failed" and "NotImplementedError" in test["message"]
                           and "Task 9.2" in test["message"] for test in stubbed), stubbed
    found = json.loads(results.read_text())
    assert set(found) >= {"score", "tests"} and all(set(test) >= FIELDS for test in found["tests"])
    assert all(test["status"] in ("passed", "failed") and test["visibility"] in ("visible", "after_published")
               for test in found["tests"])
    hidden = [test for test in found["tests"] if "tests/hidden/" in test["name"]]
    assert hidden and all(test["visibility"] == "after_published" for test in hidden)
    assert abs(sum(test["score"] for test in found["tests"]) - found["score"]) < 1e-3
    assert abs(sum(test["max_score"] for test in found["tests"])
               - sum(task.points for task in TASKS if task.id in ("3.4", "9.2"))) < 1e-3
    assert found["score"] == sum(row["points"] for row in rows.values())


def test_the_gradescope_zip_builds_and_its_run_autograder_grades_a_submission_folder(tmp_path):
    from tutorials.assignments import gradescope
    archive = tmp_path / "autograder.zip"
    done = subprocess.run([sys.executable, "-m", "tutorials.assignments", "gradescope", "--tasks", "1.1,1.2",
                           "--out", str(archive)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    root = tmp_path / "autograder"
    gradescope.unpack(archive, root / "source")
    assert (root / "source/setup.sh").stat().st_mode & 0o111 and (root / "source/run_autograder").stat().st_mode & 0o111
    assert (root / "source/project/tests/hidden").is_dir() and (root / "source/project/tests/grade.py").is_file()
    # the submission: a student tree in which 1.1 is the reference's and 1.2 is left as the stub
    student = tmp_path / "student"
    assignments.make(student, ids="1.2")
    (root / "submission").symlink_to(student)
    done = subprocess.run(["bash", str(root / "source/run_autograder")], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "AUTOGRADER": str(root), "MINIDL_PYTHON": sys.executable})
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads((root / "results/results.json").read_text())
    points = {task.id: task.points for task in TASKS}
    assert found["score"] == points["1.1"], found["score"]
    assert all(set(test) >= FIELDS for test in found["tests"])
    assert {test["name"].split()[0] for test in found["tests"] if test["score"] < test["max_score"]} == {"1.2"}
