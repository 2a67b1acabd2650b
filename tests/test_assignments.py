"""Course-assignment mode: the registry, the fences, the student-tree generator and the grader.

- Registry and fences agree: each task's function holds exactly one fence (a fence that is no task
  says so in its module: tests/test_fences.py).
- Every task has visible tests (``@pytest.mark.task``) and every marked id is a task.
- ``make`` writes a tree that imports, with the hidden files gone and every body stubbed but the
  assigned tasks' prerequisites and ``--released`` ones (checked for every single task); a test of
  a task the tree neither assigns nor releases skips there, saying so; ``--solutions`` keeps the
  reference code.
- The student tree is leak-free: no fenced solution's lines appear anywhere else in it (sources,
  docstrings, tests, chapters), by the rule in ``test_no_solution_leaks_into_the_student_tree``.
- The grader gives a stubbed task 0 points with its stub's words (a server's stub too, not the
  worker's that waited for it), the reference its points. Hostile bodies: tests/test_redteam.py.
- Whole calls (tasks.toml's ``forward``): every name is a function the sandbox can rebuild, a
  forgery inside a forwarded ``run_calls`` or a forwarded server run records nothing and fails its
  test, and the sandbox runs the grader's test helpers, not the student's.
- ``--gradescope`` writes Gradescope's results.json (``score``; per test ``name``, ``score``,
  ``max_score``, ``status``, ``output``, ``visibility``: hidden tests ``after_published``), and the
  autograder zip's ``run_autograder`` grades a submission folder into it.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tutorials import assignments
from tutorials.assignments import sandbox

ROOT = Path(__file__).resolve().parent.parent
TASKS, GENERATOR = assignments.load()
MARK = re.compile(r"""task\(\s*["'](\d+\.\d+)["']""")
# what needs the reference checkout: its fenced bodies, its hidden tests, and git to list the files to copy
REFERENCE = [pytest.mark.skipif(assignments.is_student_tree(ROOT), reason=assignments.STUDENT_TREE),
             pytest.mark.skipif(not assignments.is_git_checkout(ROOT),
                                reason="not a git checkout (make lists the files to copy with git ls-files)")]


MISSING = (sandbox.why_not() or "") if os.geteuid() != 0 else __import__("tests.grade").grade.missing_tools()
needs_grader = pytest.mark.skipif(bool(MISSING), reason=f"grading a submission needs its sandbox, which cannot run "
                                  f"here: {MISSING or 'not root'}; it needs root and bubblewrap (apt-get install "
                                  "bubblewrap; CI installs it)")


def reference_only(test):
    for mark in REFERENCE:
        test = mark(test)
    return test


def test_every_task_names_one_fenced_function():
    for task in TASKS:
        lines, begin, end = assignments.fence_of(task)
        assert end > begin + 1, f"task {task.id}: an empty fence"


def test_every_forwarded_whole_call_is_a_function_the_sandbox_can_rebuild(tmp_path):
    from tests import grade_proxy
    for task in TASKS:
        for name in task.forward:
            function = grade_proxy._forwarded(task, name)
            assert f"{function.__module__}.{function.__qualname__}" == name, (task.id, name)
    # only the project's own functions and the tests' helpers cross, and only functions
    for name in ("tutorials.assignments.load", "tests.helpers.ROOT", "tests.helpers.no_such_function",
                 "no_such_module.run", "minidl.nn.Linear"):
        with pytest.raises(ValueError, match="forwards"):
            grade_proxy._forwarded(TASKS[0], name)
    registry = tmp_path / "tasks.toml"
    registry.write_text('[[task]]\nid = "1.1"\ntitle = "t"\nfile = "f.py"\nfunction = "f"\nchapter = 1\n'
                        'section = "s"\npoints = 1\nhours = 1\ndifficulty = "easy"\n'
                        'forward = ["tests.helpers.run_calls"]\nsandbox = false\n')
    with pytest.raises(ValueError, match=r"task 1.1 has unknown key\(s\) \['sandbox'\]"):
        assignments.load(registry)                   # no task can be graded outside the sandbox


def test_results_of_hands_over_tuples_and_refuses_a_reply_of_the_wrong_length_or_kind(monkeypatch):
    # what tests/grade_proxy.py forwards is run_calls; results_of checks its reply here
    from tests import helpers
    cases = [[7, 2], [9, 4]]
    assert helpers.results_of(divmod, cases, tuple) == [(3, 1), (2, 1)]
    handed = []
    monkeypatch.setattr(helpers, "run_calls", lambda function, calls: handed.append(calls) or [(0, 0)] * len(calls))
    helpers.results_of(divmod, cases, tuple)
    assert handed == [((7, 2), (9, 4))], handed           # tuples: nothing can be written back into the cases
    monkeypatch.setattr(helpers, "run_calls", lambda function, calls: [function(*calls[0])])
    with pytest.raises(AssertionError, match="2 calls of divmod gave 1 results"):
        helpers.results_of(divmod, cases, tuple)
    monkeypatch.setattr(helpers, "run_calls", lambda function, calls: [str(function(*args)) for args in calls])
    with pytest.raises(AssertionError, match=r"divmod\(7, 2\) returned a str"):
        helpers.results_of(divmod, cases, tuple)


def test_every_task_has_visible_tests_and_every_marked_id_is_a_task():
    visible, hidden = set(), set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        ids = set(MARK.findall(path.read_text()))
        (hidden if "hidden" in path.parts else visible).update(ids)
    known = {task.id for task in TASKS}
    assert not (visible | hidden) - known, f"tests marked for unknown tasks: {sorted((visible | hidden) - known)}"
    assert not known - visible, f"tasks without a visible test: {sorted(known - visible)}"


def chapter_sections(path):
    """{number: text} of a chapter's numbered sections (``## N. Title`` up to the next ``## ``
    heading; headings inside code blocks do not count)."""
    sections, number, in_code = {}, None, False
    for line in Path(path).read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        heading = None if in_code else re.match(r"## (?:(\d+)\. )?", line)
        if heading:
            number = heading.group(1)
        if number is not None:
            sections.setdefault(number, []).append(line)
    return {number: "\n".join(lines) for number, lines in sections.items()}


def test_every_stub_points_to_a_section_that_teaches_its_function():
    """A task's ``section`` ("tutorials/NN_name.md, section K") names a numbered heading of its own
    chapter, and that section names the function (in backquotes, alone or qualified, e.g.
    `ensemble.ensemble_predict`) or the file that holds it (`ring.py`, `collectives.ring`)."""
    for task in TASKS:
        match = re.fullmatch(r"(tutorials/(\d\d)_[\w]+\.md), section (\d+)", task.section)
        assert match, f"task {task.id}: section {task.section!r} is not 'tutorials/NN_name.md, section K'"
        path, chapter, number = match.groups()
        assert int(chapter) == task.chapter, f"task {task.id}: section in chapter {chapter}, task in {task.chapter}"
        sections = chapter_sections(ROOT / path)
        assert number in sections, f"task {task.id}: {path} has no section {number} (it has {sorted(sections)})"
        name = task.function.split(".")[-1]
        text = sections[number]
        named = re.search(r"`[^`\n]*\b" + re.escape(name) + r"\b[^`\n]*`", text)
        module = task.file[:-len(".py")].replace("/", ".")
        assert named or Path(task.file).name in text or module in text, \
            f"task {task.id}: {task.section} names neither {task.function} nor {task.file}"


def test_the_syllabus_page_is_the_registrys_and_every_task_has_one_week():
    weeks = assignments.weeks()
    assert [week["week"] for week in weeks] == list(range(1, len(weeks) + 1)), "weeks are numbered 1, 2, ..."
    placed = [task_id for week in weeks for task_id in week["tasks"]]
    assert sorted(placed) == sorted(task.id for task in TASKS), \
        f"every task in exactly one week: {sorted(set(t.id for t in TASKS).symmetric_difference(placed))} " \
        f"or repeated {sorted({t for t in placed if placed.count(t) > 1})}"
    chapter = {task.id: task.chapter for task in TASKS}
    for week in weeks:
        assert {chapter[task_id] for task_id in week["tasks"]} == {week["chapter"]}, f"week {week['week']}"
        assert week["papers"].strip(), f"week {week['week']} names no paper"
    page = (ROOT / "tutorials/assignments/syllabus.md").read_text()
    generated = re.search(r"<!-- syllabus: python -m tutorials.assignments syllabus -->\n(.*?)<!-- end syllabus -->",
                          page, re.S)
    assert generated, "syllabus.md lost its markers"
    assert generated.group(1) == assignments.syllabus(), \
        "syllabus.md differs from the registry: paste `python -m tutorials.assignments syllabus` between its markers"
    assert "(syllabus.md)" in (ROOT / "tutorials/assignments/README.md").read_text(), "README.md should link it"


def test_fence_parsing_refuses_broken_fences():
    with pytest.raises(ValueError, match="never ends"):
        assignments.fences(f"def f():\n    {assignments.BEGIN}\n    return 1\n")
    with pytest.raises(ValueError, match="two fences"):
        assignments.fenced_functions(f"def f():\n    {assignments.BEGIN}\n    x = 1\n    {assignments.END}\n"
                                     f"    {assignments.BEGIN}\n    y = 2\n    {assignments.END}\n")


@pytest.fixture(scope="module")
def student_tree(tmp_path_factory):
    out = tmp_path_factory.mktemp("student") / "tree"
    assignments.make(out)
    return out


@reference_only
def test_a_student_tree_imports_has_every_body_stubbed_and_no_hidden_files(student_tree):
    done = subprocess.run([sys.executable, "-c", "import minidl, collectives, algorithms.core.run, algorithms.hogwild, "
                           "algorithms.downpour_sgd, collectives.ring, minidl.conv.winograd"],
                          cwd=student_tree, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(student_tree)))
    assert done.returncode == 0, done.stderr
    for task in TASKS:
        assert assignments.stubbed(task.id, student_tree), task.id
        assert not assignments.stubbed(task.id, ROOT), task.id
    for removed in GENERATOR["remove"]:
        assert not (student_tree / removed).exists(), removed
    text = (student_tree / "collectives/ring.py").read_text()
    assert 'raise NotImplementedError("Task 3.4: Ring reduce-scatter' in text
    assert "tutorials/03_collectives.md, section 1" in text


def closure(task_id):
    """The tasks ``task_id`` runs through, by following ``requires`` (written here again, as the oracle)."""
    needed = set()
    for other in next(task for task in TASKS if task.id == task_id).requires:
        needed |= {other} | closure(other)
    return needed


def stubbed_in(tree):
    """{task id: whether its body is the stub} in ``tree``, each file parsed once."""
    out = {}
    for file in sorted({task.file for task in TASKS}):
        fenced = assignments.fenced_functions((tree / file).read_text())
        lines = (tree / file).read_text().splitlines()
        for task in (task for task in TASKS if task.file == file):
            begin, end = fenced[task.function]
            out[task.id] = [line.strip() for line in lines[begin + 1:end] if line.strip()] == [task.stub_line()]
    return out


@reference_only
def test_a_tree_for_each_single_task_keeps_the_reference_of_its_prerequisites_only(tmp_path):
    files = sorted({task.file for task in TASKS})
    for task in TASKS:
        out = tmp_path / task.id
        assignments.make(out, ids=[task.id], files=files)
        kept = closure(task.id)
        assert {i for i, stub in stubbed_in(out).items() if not stub} == kept, task.id
        assert assignments.assignment(out) == ({task.id}, kept), task.id
        assert not (out / "tests/hidden").exists()
    assert closure("3.7") == {"3.6"} and closure("1.5") == {"1.1", "1.2", "1.3", "1.4"} and closure("9.2") == set()
    out = tmp_path / "released"
    assignments.make(out, ids=["3.7"], also_released=["9.2"], files=files)
    assert {i for i, stub in stubbed_in(out).items() if not stub} == {"3.6", "9.2"}
    with pytest.raises(ValueError, match="both assigned and released"):
        assignments.make(tmp_path / "both", ids=["3.7"], also_released=["3.7"], files=files)


@reference_only
def test_in_a_student_tree_a_task_neither_assigned_nor_released_has_its_tests_skipped_saying_so(tmp_path):
    tree = tmp_path / "tree"
    assignments.make(tree, ids=["9.2"])
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "parallel[1]",
                           "tests/test_schedules.py", "tests/test_pbt.py", "--task", "9.1,9.2"], cwd=tree,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(tree)))
    assert "task 9.1 is not part of this assignment" in done.stdout, done.stdout[-3000:]
    assert re.search(r"\d+ failed", done.stdout) and "Task 9.2" in done.stdout, done.stdout[-3000:]   # 9.2: to do


TEXT_FILES = (".py", ".md", ".toml", ".txt", ".cfg", ".json", ".ipynb", ".rst")
TRIVIAL = re.compile(r"^(?:return|break|continue|pass|raise|yield|else|try|finally)\b[\w.()]*:?$"   # return x, else:
                     r"|^[\w.]+ = (?:None|True|False|0|1|0\.0|\[\]|\{\}|\(\))$"                 # x = 0, x = []
                     r"|^[^\w]*$")                                                         # lone punctuation


def code_lines(text):
    """The lines of ``text`` the leak rule compares: stripped, a doctest prompt and a trailing
    comment cut off, inner runs of spaces made one; blank, comment-only and trivial lines dropped."""
    kept = []
    for line in text.splitlines():
        line = line.strip()
        line = line[4:] if line.startswith((">>> ", "... ")) else line
        line = "" if line.startswith("#") else re.sub(r"\s+#.*$", "", line)
        line = re.sub(r"\s+", " ", line).strip()
        if line and not TRIVIAL.match(line.replace(" ", "")):
            kept.append(line)
    return kept


def runs(lines, length=3):
    return {tuple(lines[i:i + length]) for i in range(len(lines) - length + 1)}


def solution_runs():
    """{run of 3 code lines: task id} over every fenced body of the reference."""
    found = {}
    for task in TASKS:
        for run in runs(code_lines("".join(assignments.body(task)))):
            found.setdefault(run, task.id)
    return found


def leaks(tree, solutions):
    """[(file, task id, run)] for every run of a fenced solution found in a text file of ``tree``."""
    found = []
    for path in sorted(Path(tree).rglob("*")):
        if path.is_file() and path.suffix in TEXT_FILES and ".git" not in path.parts:
            for run in runs(code_lines(path.read_text(errors="replace"))) & solutions.keys():
                found.append((str(path.relative_to(tree)), solutions[run], run))
    return found


@reference_only
def test_no_solution_leaks_into_the_student_tree(student_tree):
    """The rule: a leak is 3 or more consecutive code lines of a fenced body (compared after
    ``code_lines``: blank lines, comments, lone punctuation and trivial lines such as ``return x``,
    ``else:`` or ``x = 0`` do not count, and do not break a run) found anywhere in the tree with
    every task stubbed: in any module, docstring, test, chapter or page. What the rule cannot see:
    the same idea written with other names; docstrings are kept to the idea and the cost for that."""
    solutions = solution_runs()
    # the rule sees every fence of 3 or more code lines in the reference tree itself
    short = {task.id for task in TASKS if len(code_lines("".join(assignments.body(task)))) < 3}
    seen = {task for _, task, _ in leaks(ROOT / "collectives", solutions) + leaks(ROOT / "algorithms", solutions)
            + leaks(ROOT / "minidl", solutions)}
    missed = sorted(set(t.id for t in TASKS) - short - seen)
    assert seen == {task.id for task in TASKS} - short, f"the rule misses fences: {missed}"
    found = leaks(student_tree, solutions)
    assert not found, "solution lines outside their fence:\n" + "\n".join(
        f"  {path}: task {task}: {' / '.join(run)}" for path, task, run in found)


@reference_only
def test_an_instructor_tree_keeps_every_body(tmp_path):
    out = assignments.make(tmp_path / "tree", solutions=True) and tmp_path / "tree"
    for task in TASKS:
        assert assignments.body(task, out) == assignments.body(task, ROOT), task.id
    assert (out / "tests/hidden").is_dir()


def grade(*flags, timeout=900):
    done = subprocess.run([sys.executable, str(ROOT / "tests/grade.py"), *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done


# one test of each: a serial one, an MPI collective, MPI training, a server's update on its own rank, a pure function
STUBBED = {
    "1.5": "tests/hidden/test_chapter1_hidden.py::test_two_sgd_steps_with_momentum_follow_the_velocity",
    "3.4": "tests/test_collectives.py::test_reduce_scatter_gives_rank_r_block_r_of_the_reduction[nprocs=2]",
    "4.1": "tests/hidden/test_chapter4_hidden.py::test_sync_steps_with_an_uneven_last_batch_and_idle_ranks_equal_"
           "serial_sgd[nprocs=3-0.9]",
    "5.1": "tests/hidden/test_chapter5_hidden.py::test_several_servers_apply_multi_step_pushes_as_one_optimizer_and_"
           "log_what_each_read[nprocs=5-sgd]",                   # a worker's Stopped waits for the servers' stub
    "5.2": "tests/hidden/test_chapter5_hidden.py::test_may_proceed_reads_the_clocks_of_a_dict_view_of_the_live_workers",
}


@reference_only
@needs_grader
def test_the_grader_gives_stubbed_tasks_nothing_in_their_stubs_words_and_the_reference_full_points(tmp_path):
    tree = tmp_path / "tree"
    assignments.make(tree, ids=list(STUBBED))
    tests = ["--tests", ",".join(STUBBED.values()), "--tasks", ",".join(STUBBED)]
    grade("--student", str(tree), *tests, "--json", str(tmp_path / "stub.json"))
    rows = {row["id"]: row for row in json.loads((tmp_path / "stub.json").read_text())["tasks"]}
    for task_id, row in rows.items():
        assert row["points"] == 0 and row["total"] == 1, row
        said = row["tests"][0]["message"]                 # a server's stub too, not the Stopped of a worker waiting
        before = said.split("NotImplementedError")[0]
        assert f"NotImplementedError: Task {task_id}:" in said and "Stopped" not in before, (task_id, said)
    grade(*tests, "--json", str(tmp_path / "reference.json"))
    reference = json.loads((tmp_path / "reference.json").read_text())
    assert reference["points"] == reference["max_points"], reference


@reference_only
@needs_grader
def test_a_grading_killed_outright_takes_every_process_it_started_with_it(tmp_path):
    # SIGKILL to grade.py itself (an instructor's kill -9, a harness's timeout): nothing it started may
    # go on grading, or hold a sandbox, after it
    from tests import grade as grader
    from tests.test_sandbox import processes_of
    task = assignments.select(assignments.load()[0], "9.2")[0]
    tree = tmp_path / "tree"
    assignments.make(tree, ids=["9.2"])
    lines, begin, _ = assignments.fence_of(task, tree)
    indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
    assignments.replace_body(task, tree, [f"{indent}import time\n", f"{indent}time.sleep(10**6)\n"])
    def ours():                                       # (SANDBOX_UIDS is a range of a billion uids: never a list)
        return processes_of(sandbox.SANDBOX_UIDS) | processes_of([grader.GRADER_UID])
    process = subprocess.Popen([sys.executable, str(ROOT / "tests/grade.py"), "--student", str(tree), "--tasks", "9.2",
                                "--timeout", "120"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):                          # until a sandboxed worker is asleep in the body
            if processes_of(sandbox.SANDBOX_UIDS) or process.poll() is not None:
                break
            time.sleep(0.1)
        assert processes_of(sandbox.SANDBOX_UIDS), "the grading never reached the sandbox"
    finally:
        process.kill()
        process.wait()
    for _ in range(100):
        if not ours():
            break
        time.sleep(0.1)
    assert not ours(), "processes of the grading outlived a grade.py killed by SIGKILL"


def test_the_grader_names_a_missing_student_tree_and_what_a_machine_without_a_sandbox_lacks(tmp_path, monkeypatch):
    done = subprocess.run([sys.executable, str(ROOT / "tests/grade.py"), "--student", str(tmp_path / "nowhere"),
                           "--tasks", "1.1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(f"error: no student tree at {tmp_path / 'nowhere'}"), \
        done.stderr
    from tests import grade as grader
    monkeypatch.setattr(grader.shutil, "which", lambda name, **kwargs: None)      # a fresh machine: nothing installed
    monkeypatch.setenv("PATH", str(tmp_path))
    grader.sandbox._namespaces_work.cache_clear()
    assert "apt-get install bubblewrap" in grader.missing_tools() or "needs root" in grader.missing_tools()
    assert grader.main(["--student", str(tmp_path), "--tasks", "1.1"]) == 2


def test_the_submission_is_copied_as_its_regular_files_only_without_following_a_link(tmp_path, monkeypatch):
    # the copy runs as root: a link to the hidden tests or /etc/shadow must not become a file the sandbox
    # reads, a FIFO must not hang it, and a tree too big is refused, not copied
    from tests import grade as grader
    tree, secret = tmp_path / "tree", tmp_path / "secret.txt"
    (tree / "collectives" / "sub").mkdir(parents=True)
    (tree / "collectives" / "ring.py").write_text("# mine\n")
    secret.write_text("the hidden tests")
    (tree / "collectives" / "hidden.txt").symlink_to(secret)
    (tree / "collectives" / "linked").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(tree / "collectives" / "sub" / "pipe")
    (tree / ".git").mkdir()
    (tree / ".git" / "config").write_text("[core]\n\tfsmonitor = /bin/false\n")
    copied = grader.copy_submission(tmp_path / "out", tree)
    assert copied == ["collectives/ring.py"], copied
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*")) == [
        "collectives", "collectives/ring.py"]
    monkeypatch.setattr(grader, "MAX_FILES", 0)
    with pytest.raises(ValueError, match="more than 0 files"):
        grader.copy_submission(tmp_path / "again", tree)


def test_when_the_graders_own_tests_do_not_load_it_says_why_instead_of_scoring_zero():
    # e.g. an interpreter the tests' namespace cannot reach: every task would score 0 of 0 tests, silently
    from tests import grade as grader

    class Broken(grader.Grader):
        def popen(self, argv, env, pass_fds, cwd=ROOT, log=None):
            return super().popen([sys.executable, "-c", "import sys; print('no such interpreter'); sys.exit(3)"],
                                 env, pass_fds, cwd, log)

    with pytest.raises(grader.GradingError, match=r"could not be collected \(pytest exit 3\): no such interpreter"):
        grader.collect(Broken(dict(os.environ)), assignments.select(assignments.load()[0], "1.1"), dict(os.environ))


def test_the_grader_reads_each_tests_rank_count_from_its_marker(tmp_path):
    # a test marked for one size only has no "nprocs=" in its node id: the marker must tell
    (tmp_path / "test_sizes.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parallel(nprocs=4)\ndef test_four():\n    pass\n\n"
        "@pytest.mark.parallel(nprocs=[2, 3])\ndef test_two_three():\n    pass\n\n"
        "def test_serial():\n    pass\n")
    read, write = os.pipe()                       # the grader's listing comes over a pipe it owns
    subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                    "-p", "tests.grade_record", "test_sizes.py"], cwd=tmp_path, capture_output=True, timeout=120,
                   env=dict(os.environ, PYTHONPATH=str(ROOT), MINIDL_GRADE_COLLECT_FD=str(write)), pass_fds=(write,))
    os.close(write)
    with os.fdopen(read) as listing:
        sizes = {line.split("\t")[2]: line.split("\t")[0] for line in listing.read().splitlines()}
    assert sizes == {"test_sizes.py::test_four": "4", "test_sizes.py::test_two_three[nprocs=2]": "2",
                     "test_sizes.py::test_two_three[nprocs=3]": "3", "test_sizes.py::test_serial": "1"}, sizes


# ---- what the grader tells a student and writes for Gradescope ----------------------------------------
FIELDS = {"name", "score", "max_score", "status", "output", "visibility"}


def submission(tmp_path, stubbed, task_id, body, solutions=False):
    """A student tree (``stubbed`` tasks stubbed, or with ``solutions`` every body kept) in which
    task ``task_id``'s body is ``body``: lines with ``{indent}`` for the fence's indentation."""
    tree = tmp_path / "tree"
    assignments.make(tree, ids=stubbed, solutions=solutions)
    task = assignments.select(TASKS, [task_id])[0]
    lines, begin, _ = assignments.fence_of(task, tree)
    indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
    assignments.replace_body(task, tree, [line.format(indent=indent) for line in body])
    return tree


@reference_only
@needs_grader
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
    # the submission: a student tree of both tasks in which 1.1 is done (the reference's) and 1.2 left as the stub
    student = tmp_path / "student"
    assignments.make(student, ids="1.1,1.2")
    done_task = assignments.select(TASKS, ["1.1"])[0]
    assignments.replace_body(done_task, student, assignments.body(done_task))
    (root / "submission").symlink_to(student)
    done = subprocess.run(["bash", str(root / "source/run_autograder")], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "AUTOGRADER": str(root), "MINIDL_PYTHON": sys.executable})
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads((root / "results/results.json").read_text())
    points = {task.id: task.points for task in TASKS}
    assert found["score"] == points["1.1"], found["score"]
    assert all(set(test) >= FIELDS for test in found["tests"])
    assert {test["name"].split()[0] for test in found["tests"] if test["score"] < test["max_score"]} == {"1.2"}


# ---- the sandboxed tasks and the source check -----------------------------------------------------------
# A test file that runs the sandbox (directly, or through tests/grade.py) goes to the one pytest-xdist worker
# that runs all of them (tests/conftest.py's TOGETHER): every job runs as one uid, and tests/test_sandbox.py
# checks that no process of that uid outlives a call, which a job of another worker would break.
SANDBOX_USE = re.compile(r"assignments import (?:[\w, ]*\b)?sandbox\b|assignments\.sandbox\b|[\"/]grade\.py\"")


def test_every_test_file_that_runs_the_sandbox_shares_one_worker():
    from tests.conftest import work_unit
    users = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                   if SANDBOX_USE.search(path.read_text()))
    assert "tests/test_sandbox.py" in users and "tests/test_assignments.py" in users, users   # the pattern sees them
    apart = [file for file in users if work_unit(f"{file}::test") != "sandbox"]
    assert not apart, f"{apart} run the sandbox but are not in TOGETHER['sandbox'] of tests/conftest.py"
def test_the_sandbox_runs_the_graders_test_helpers_not_the_students(tmp_path):
    # a forwarded entry (tests.helpers.drop_silent_scenario) reports what a server did: one the student
    # rewrote to report the expected drops must never be the one that runs
    from tests import grade
    student = tmp_path / "student"
    (student / "tests").mkdir(parents=True)
    (student / "algorithms").mkdir()
    for name in grade.TEST_CODE:
        (student / name).write_text("def drop_silent_scenario(*args, **kwargs):\n    return 'forged'\n")
    (student / "algorithms" / "mine.py").write_text("# the student's code\n")
    out = grade.sandbox_tree(tmp_path / "sandbox" / "tree", student, GENERATOR)
    assert all((out / name).read_text() == (ROOT / name).read_text() for name in grade.TEST_CODE)
    assert (out / "algorithms" / "mine.py").read_text() == "# the student's code\n"


# the old way to full marks: write the grader's record file as "passed", then leave at once
FORGERY = ["{indent}import os\n",
           "{indent}for name in ('MINIDL_GRADE_RECORD', 'MINIDL_GRADE_COLLECT', 'MINIDL_GRADE_RECORD_FD'):\n",
           "{indent}    if os.environ.get(name):\n",
           "{indent}        open(os.environ[name], 'a').write('call\\tpassed\\tforged\\t\\n')\n",
           "{indent}os._exit(0)\n"]
NO_SANDBOX = sandbox.why_not()


@reference_only
@pytest.mark.skipif(bool(NO_SANDBOX), reason=f"the sandbox cannot run here: {NO_SANDBOX}; it needs root and bubblewrap "
                    "(apt-get install bubblewrap; CI installs it)")
@pytest.mark.parametrize("task_id, forwarded, nprocs, nodeid", [
    ("3.9", "tests.helpers.run_calls", 1,
     "tests/test_collectives.py::test_per_rank_costs_reduce_to_the_papers_formulas"),
    ("5.3", "algorithms.downpour_sgd.train", 2,
     "tests/test_downpour.py::test_downpour_with_one_worker_and_fixed_rate_equals_serial_sgd_exactly[nprocs=2]"),
], ids=["batch of calls", "server run"])
def test_a_forgery_inside_a_whole_forwarded_call_records_nothing_and_fails(tmp_path, task_id, forwarded, nprocs,
                                                                           nodeid):
    """Task 3.9's tests hand its function thousands of cases through tests.helpers.run_calls, and task
    5.3's worker step runs inside a whole Downpour run (servers and workers): the grader forwards both
    calls whole (tasks.toml's ``forward``), so the forging body runs there, in the sandbox, ends its
    job, and the test fails. One test, run as tests/grade.py runs each of the task's (a task's whole
    grading takes a minute)."""
    from tests import grade as grader
    task = assignments.select(TASKS, [task_id])[0]
    assert forwarded in task.forward
    tree = submission(tmp_path, task_id, task_id, FORGERY)
    student = grader.sandbox_tree(tmp_path / "sandboxed" / "student", tree, GENERATOR)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), MINIDL_GRADE_PROXY=task_id,
               MINIDL_GRADE_STUDENT=str(student), MINIDL_GRADE_CALL_TIMEOUT="25")
    outcomes, _ = grader.run(ROOT, nprocs, [nodeid], 30, 1, env)
    assert list(outcomes) == [nodeid], outcomes                                   # nothing forged recorded
    status, message = outcomes[nodeid]
    name = forwarded.rpartition(".")[2]
    assert status == "failed" and f"{name} (the student's, in the sandbox)" in message and "ended" in message, \
        outcomes


ONE_RANK_FAILS = '''
import pytest
from mpi4py import MPI


@pytest.mark.parallel(nprocs=2)
def test_rank_1_fails_and_rank_0_passes():
    assert MPI.COMM_WORLD.rank == 0, "only rank 0 is right"


@pytest.mark.parallel(nprocs=2)
def test_rank_1_fails_and_rank_0_waits_for_it():
    comm = MPI.COMM_WORLD
    if comm.rank == 1:
        raise AssertionError("rank 1 says why")
    comm.recv(source=1)                          # never sent: rank 0 waits until the timeout
'''


def test_what_a_rank_other_than_0_said_reaches_the_grade(tmp_path):
    """A stubbed server raises on its own rank while rank 0 waits for it: the test must fail with
    the server's words, not only "timed out"; and a test that fails on rank 1 alone is failed."""
    from tests import grade as grader
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_ranks.py").write_text(ONE_RANK_FAILS)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout_method = thread\n")     # as setup.cfg has it
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    outcomes, elsewhere = grader.run(tmp_path, 2, ["t/test_ranks.py"], 5, 2, env)
    waits, passes = (f"t/test_ranks.py::test_rank_1_fails_and_rank_0_{name}" for name in ("waits_for_it", "passes"))
    assert waits not in outcomes and elsewhere[waits] == ("1", "AssertionError: rank 1 says why"), (outcomes, elsewhere)
    assert outcomes[passes][0] == "failed" and outcomes[passes][1].startswith("rank 1: AssertionError: only rank 0")
