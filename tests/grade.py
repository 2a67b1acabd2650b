"""Grade course-assignment tasks: each task's tests, run in isolation, scored by the registry's points.

    python tests/grade.py                                  # grade this tree (a student's, or the reference)
    python tests/grade.py --student DIR                    # grade DIR against this (reference) tree, as root
    python tests/grade.py --tasks 3.4,3.5 --json out.json  # some tasks; the table as JSON too
    python tests/grade.py --student DIR --gradescope results.json   # Gradescope's results format

A task's tests are the ones marked ``@pytest.mark.task("<id>")`` (tests/hidden/ holds the hidden
ones; a student tree has none). With ``--student DIR`` nothing the student wrote runs outside the
sandbox, and nothing it hands back is more than data:

- **The tests run here, the function there.** Every task's tests run in this checkout, with the
  hidden tests and their answers, as an unprivileged uid of their own (``--grader-uid``, not root,
  not the sandbox's) in a namespace that sees this checkout read-only and has no network. Each call
  of the task's function goes to a sandboxed copy of DIR (tutorials/assignments/sandbox.py: without
  the solution-only files, with this tree's tests/helpers.py and tests/handed.py), which hands back
  data only (tests/grade_proxy.py; tutorials/assignments/replies.py). The sandboxes are started by
  this process (root), which lends the tests a socket to ask for them and gives back only the
  pipes' ends. **Prerequisites run as the student wrote them**: a task whose code calls another
  task's function (``requires``) fails if that one is unfinished or wrong, and says so first.
- **Outcomes come over pipes** this process made (grade_record.py), never a file a process could
  find; **every process of a grading run** is in one PID namespace whose first process is this one's,
  so nothing outlives ``grade.py``; **a deadlock costs one call's timeout** (``--timeout``, 30 s),
  after which the task stops (its tests not yet run are "not run").
- A body that reaches one of its task's ``forbid`` methods (``comm.Allreduce`` in a ring task, however
  spelled: tutorials/assignments's ``forbidden_calls`` reads the whole submitted file) scores 0.
- It needs root, bubblewrap with namespaces and util-linux's ``unshare`` and ``setpriv``: where one
  is missing, ``--student`` stops with ``error:`` saying what to install.

Without ``--student`` the tree is graded as it is (a student checking their own work: there,
unfinished prerequisites do cascade).

Each rank count runs once for every task together, in its own ``mpiexec`` (one pytest per rank, as
tests/run.py does), visible tests first and hidden ones last, with a per-test timeout
(pytest-timeout); a task's function is swapped in only while a test of that task runs, so every
oracle is the reference's. A task's points are its registry points times the fraction of
its tests that pass (skipped tests, e.g. GPU ones without a GPU, do not count; nor do tests on more
ranks than ``--max-ranks``). ``--time-limit`` bounds the whole submission: tasks not reached score 0.

Feedback: every failed test says what failed, in the words of its assertion (which rank, which
index, expected against got), printed under the task's line and kept in the JSON; ``--gradescope``
writes Gradescope's ``results.json`` (``score``, and per test ``name``, ``score``, ``max_score``,
``status``, ``output``, ``visibility``: hidden tests ``after_published``); a task's tests'
``max_score``s add up to its points exactly.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tutorials import assignments  # noqa: E402
from tutorials.assignments import sandbox  # noqa: E402

GRADER_UID = 65533
NAMESPACE = "MINIDL_GRADE_NAMESPACE"
# The tests' own code that runs in the sandbox: a forwarded entry (tasks.toml's ``forward``) sets up a
# server run and reports what happened, and the objects tests hand over are built from these files.
TEST_CODE = ("tests/helpers.py", "tests/handed.py")


def test_files(tree, ids):
    """The test files that mark a test for one of ``ids`` (so pytest collects only those: much faster)."""
    mark = re.compile(r"""task\(\s*["'](""" + "|".join(re.escape(i) for i in ids) + r""")["']""")
    return sorted(str(path.relative_to(tree)) for path in (Path(tree) / "tests").rglob("test_*.py")
                  if mark.search(path.read_text()))


class Pipe:
    """A pipe whose write end a child inherits and whose read end a thread here drains into ``text``."""

    def __init__(self):
        self.read, self.write = os.pipe()
        os.set_inheritable(self.write, True)
        self.chunks = []
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self):
        while chunk := os.read(self.read, 1 << 16):
            self.chunks.append(chunk)
        os.close(self.read)

    def close_writer(self):
        os.close(self.write)

    def text(self):
        self.thread.join(timeout=10)
        return b"".join(self.chunks).decode(errors="replace")


class Grader:
    """How this run starts its pytest processes: in place (a tree graded as it is), or as the grader's
    uid in a namespace of their own, lent the sandbox broker (``--student``)."""

    def __init__(self, env, scratch=None, broker=None, uid=GRADER_UID):
        self.env, self.scratch, self.broker, self.uid = env, scratch, broker, uid

    def popen(self, argv, env, pass_fds, cwd=ROOT, log=None):
        if log is None:
            named = os.environ.get("MINIDL_GRADE_LOG")
            log = open(named, "ab") if named else subprocess.DEVNULL
        if self.scratch is None:
            return subprocess.Popen(argv, cwd=cwd, env=env, pass_fds=pass_fds, stdout=log, stderr=log,
                                    start_new_session=True)
        binds = [(str(ROOT), str(ROOT), "--ro-bind"), (str(self.scratch), str(self.scratch), "--bind")]
        prefix = [*sandbox.bwrap_arguments(binds, sandbox.Limits(tmp=1 << 30), chdir=str(ROOT)),
                  "setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--no-new-privs",
                  "--inh-caps=-all", "--bounding-set=-all", "--"]
        env = {**env, "HOME": str(self.scratch), "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1",
               sandbox.BROKER: str(self.broker)}
        return subprocess.Popen([*prefix, *argv], cwd="/", env=env, pass_fds=(*pass_fds, self.broker),
                                stdout=log, stderr=log, start_new_session=True)


class GradingError(Exception):
    """The grader itself cannot go on (its own tests do not load): nothing is scored, and it says why."""


def collect(grader, tasks, env):
    """{task id: {rank count: [node ids]}} of the tasks' tests (the sizes from their markers)."""
    ids = [task.id for task in tasks]
    listing = Pipe()
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p",
            "tests.grade_record", "--task", ",".join(ids), *test_files(ROOT, ids)]
    with tempfile.TemporaryFile() as log:
        process = grader.popen(argv, dict(env, MINIDL_GRADE_COLLECT_FD=str(listing.write)), (listing.write,), log=log)
        listing.close_writer()
        try:
            process.wait(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if process.returncode not in (0, 5):             # 5: no test selected, which the grade then says
            log.seek(0)                                  # the grader's own tests did not load: say why, score nothing
            said = log.read().decode(errors="replace").strip().splitlines()[-6:]
            raise GradingError(f"the grader's tests could not be collected (pytest exit {process.returncode}): "
                               + " / ".join(said))
    groups = {task_id: {} for task_id in ids}
    for line in listing.text().splitlines():
        nprocs, marked, nodeid = line.split("\t")
        for task_id in marked.split(","):
            if task_id in groups:
                groups[task_id].setdefault(int(nprocs), []).append(nodeid)
    return groups


def command(nprocs, selection, timeout, proxy=False):
    """The pytest command for ``selection`` (a --task option and files, or node ids) on ``nprocs`` ranks."""
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.grade_record",
              *(["-p", "tests.grade_proxy"] if proxy else []),
              "-m", f"parallel[{nprocs}]", f"--timeout={timeout}", "-q", "--no-header", "--tb=short", *selection]
    if nprocs == 1:
        return pytest
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    return [mpiexec, "-n", "1", *pytest, ":", "-n", str(nprocs - 1), *pytest, "-p", "tests.quiet_rank"]


def run(tree, nprocs, selection, timeout, count, env, grader=None, deadline=None):
    """Run and return ({node id: ('passed' | 'failed' | 'skipped', message)} for the tests rank 0
    reported, {node id: (rank, message)}: the first failure another rank reported)."""
    grader = grader or Grader(env)
    record = Pipe()
    process = grader.popen(command(nprocs, selection, timeout, "MINIDL_GRADE_PROXY" in env),
                           dict(env, MINIDL_GRADE_RECORD_FD=str(record.write)), (record.write,), cwd=tree)
    record.close_writer()
    try:
        wait = timeout * count + 300                     # + a test's own longer timeout mark
        process.wait(timeout=wait if deadline is None else max(1.0, min(wait, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:                    # pytest-timeout should have ended it first
        os.killpg(process.pid, signal.SIGKILL)           # mpiexec and every rank: one process group
        process.wait()
    outcomes, elsewhere, notes = {}, {}, {}
    for line in record.text().splitlines():
        when, outcome, nodeid, message, rank = (line.split("\t") + ["", "0"])[:5]
        if when == "note":                       # the sandbox's words on some rank: a stub's first
            if nodeid not in notes or ("NotImplementedError" in message and "NotImplementedError" not in notes[nodeid]):
                notes[nodeid] = f"rank {rank}: {message}"
            continue
        if rank != "0":                          # the root cause first: the sandbox's words
            said = (rank, message if when == "call" else f"{when}: {message}")
            sandboxed = "in the sandbox" in message and "in the sandbox" not in elsewhere.get(nodeid, ("", ""))[1]
            if nodeid not in elsewhere or sandboxed:
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
        elif nodeid not in outcomes and "timed out after" in message:
            outcomes[nodeid] = ("failed", f"rank {rank} of p = {nprocs}: {message}")
    for nodeid, said in notes.items():                 # a failure that is not the sandbox's own: its words first
        if outcomes.get(nodeid, ("",))[0] == "failed" and "in the sandbox" not in outcomes[nodeid][1]:
            outcomes[nodeid] = ("failed", f"{said} (then: {outcomes[nodeid][1]})")
        if nodeid in elsewhere and "in the sandbox" not in elsewhere[nodeid][1]:
            elsewhere[nodeid] = (said.split(":")[0].removeprefix("rank "), f"{said.split(': ', 1)[1]} (then, on rank "
                                 f"{elsewhere[nodeid][0]}: {elsewhere[nodeid][1]})")
    return outcomes, elsewhere


def grade_tasks(tree, groups, timeout, env, max_ranks=8, grader=None, deadline=None, proxied=False):
    """{task id: {node id: (outcome, message)}} of the tasks' tests in ``tree`` (``groups``: {task id:
    {rank count: [node ids]}}).

    One run per rank count for every task together (starting p pytest processes, and p sandboxed
    workers, costs seconds: once per rank count, not once per task), first the visible tests at every
    rank count, then the hidden ones: nothing the student's code sees in a hidden test can reach a
    visible test's feedback, whatever channel between sandboxed jobs it found (the kernel's page cache
    of the shared read-only files is one no namespace separates). With ``proxied`` each run grades its
    tasks through tests/grade_proxy.py.
    If a run dies before every test reported (a deadlock, or a crash), the test that hung fails with
    a timeout message, its task stops there (every test of it not yet run is "not run", at this and
    the larger rank counts), and a new run goes on with the other tasks' tests.
    """
    task_of = {nodeid: task_id for task_id, sizes in groups.items() for ids in sizes.values() for nodeid in ids}
    outcomes, stopped = {task_id: {} for task_id in groups}, {}

    def done(nodeid, outcome):
        outcomes[task_of[nodeid]][nodeid] = outcome
    rounds = [(hidden, nprocs) for hidden in (False, True)
              for nprocs in sorted({nprocs for sizes in groups.values() for nprocs in sizes}) if nprocs <= max_ranks]
    for hidden, nprocs in rounds:
        pending = [nodeid for task_id in groups for nodeid in groups[task_id].get(nprocs, [])
                   if nodeid.startswith("tests/hidden/") == hidden]
        while pending:
            for nodeid in [nodeid for nodeid in pending if task_of[nodeid] in stopped]:
                done(nodeid, ("not run", stopped[task_of[nodeid]]))
            pending = [nodeid for nodeid in pending if task_of[nodeid] not in stopped]
            if not pending:
                break
            if deadline is not None and time.monotonic() > deadline:
                for nodeid in pending:
                    done(nodeid, ("not run", "not run: the submission's --time-limit ran out"))
                break
            run_env = dict(env, MINIDL_GRADE_PROXY=",".join(dict.fromkeys(task_of[n] for n in pending))) \
                if proxied else env
            got, elsewhere = run(tree, nprocs, pending, timeout, len(pending), run_env, grader, deadline)
            for nodeid in pending:
                if nodeid in got:
                    done(nodeid, got[nodeid])
            silent = [nodeid for nodeid in pending if nodeid not in got]
            if not silent:
                break
            hung = [nodeid for nodeid in pending if "timed out after" in got.get(nodeid, ("", ""))[1]]
            culprit = hung[-1] if hung else silent[0]
            if culprit == silent[0] and culprit in elsewhere:    # one rank failed, the others waited for it
                rank, message = elsewhere[culprit]
                done(culprit, ("failed", f"rank {rank} of p = {nprocs}: {message} (the other ranks then waited for "
                                         f"it until the timeout, {timeout} s)"))
            elif culprit == silent[0]:                          # the run died in it
                done(culprit, ("failed", f"timed out after {timeout} s at p = {nprocs} (or the run crashed): "
                                         "probably a receive that no rank's send matches, or a rank that stopped "
                                         "sending"))
            stopped[task_of[culprit]] = f"not run: an earlier test of this task timed out at p = {nprocs}"
            pending = [nodeid for nodeid in silent if nodeid != culprit]
    return outcomes


SKIPPED = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "node_modules"}
MAX_FILES, MAX_BYTES = 20_000, 512 << 20


def copy_submission(out, student, leave_out=()):
    """Copy the student's tree as root, trusting nothing in it: its regular files only, read without
    following a link (a symlink to the hidden tests, /etc/shadow or /proc/self/environ is left out, and
    so are FIFOs and devices), at most MAX_FILES files and MAX_BYTES bytes; no git is run in it (its
    configuration could name programs for git to run). Returns the relative paths copied."""
    out, student, copied, total = Path(out), Path(student), [], 0
    skip = [Path(item) for item in leave_out]
    for folder, folders, files in os.walk(student, followlinks=False):
        folders[:] = sorted(name for name in folders if name not in SKIPPED)
        for name in sorted(files):
            source = Path(folder) / name
            relative = source.relative_to(student)
            if any(relative == item or item in relative.parents for item in skip):
                continue
            try:
                handle = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:                           # a symlink (ELOOP), or unreadable: left out
                continue
            with os.fdopen(handle, "rb") as file:
                if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                    continue                          # a FIFO, a device, a socket: left out
                data = file.read(MAX_BYTES - total + 1)
            total += len(data)
            if total > MAX_BYTES or len(copied) >= MAX_FILES:
                raise ValueError(f"the submission holds more than {MAX_FILES} files or {MAX_BYTES >> 20} MiB")
            target = out / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            os.utime(target, ns=(os.stat(source, follow_symlinks=False).st_mtime_ns,) * 2)
            copied.append(str(relative))
    return copied


def sandbox_tree(out, student, generator):
    """A world-readable copy of the student's tree for the sandbox (``copy_submission``), without the
    solution-only files (a student tree has none; ``--student .`` on the reference checkout must not
    hand them over), and with this tree's ``TEST_CODE`` in place of the student's copies: those are the
    grader's, not the student's (a helper that reports what a run did must not be one the student rewrote)."""
    copy_submission(out, student, leave_out=generator.get("remove", ()))
    for name in TEST_CODE:
        (Path(out) / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, Path(out) / name)
    # compiled once here (compiling runs nothing): every sandboxed process then loads the bytecode
    # instead of compiling the tree again, read-only as the sandbox sees it
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(out)], capture_output=True, timeout=600)
    for folder, _, files in os.walk(out):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    os.chmod(Path(out).parent, 0o755)
    return out


def shares(points, count):
    """``count`` shares of ``points`` in millionths that add up to ``points`` exactly (the last takes the rest)."""
    if count == 0:
        return []
    total = round(points * 1_000_000)
    each = total // count
    return [each / 1_000_000] * (count - 1) + [(total - each * (count - 1)) / 1_000_000]


def score(task, outcomes):
    """The task's row: points pro rata over its counted tests, and every test's outcome and message."""
    counted = {nodeid: result for nodeid, result in outcomes.items() if result[0] != "skipped"}
    passed = sum(result[0] == "passed" for result in counted.values())
    points = sum(share for share, result in zip(shares(task.points, len(counted)), sorted(counted.items()))
                 if result[1][0] == "passed")
    return {"id": task.id, "title": task.title, "passed": passed, "total": len(counted),
            "skipped": len(outcomes) - len(counted), "points": round(min(points, task.points), 6),
            "max_points": task.points,
            "failed": sorted(nodeid for nodeid, result in counted.items() if result[0] != "passed"),
            "tests": [{"name": nodeid, "status": result[0], "message": result[1]}
                      for nodeid, result in sorted(outcomes.items())]}


def gradescope(results, seconds):
    """Gradescope's results.json: one entry per test, its share of the task's points."""
    tests = []
    for row in results:
        counted = [test for test in row["tests"] if test["status"] != "skipped"]
        given = iter(shares(row["max_points"], len(counted) or 1))
        for test in row["tests"] or [{"name": f"task {row['id']}", "status": "failed",
                                      "message": "; ".join(row["failed"]) or "no tests ran"}]:
            share = 0.0 if test["status"] == "skipped" else next(given)  # a skipped test (no GPU) counts for nothing
            tests.append({"name": f"{row['id']} {row['title']}: {test['name']}", "max_score": share,
                          "score": share if test["status"] == "passed" else 0.0,
                          "status": "passed" if test["status"] in ("passed", "skipped") else "failed",
                          "output": test["message"] or test["status"],
                          "visibility": "after_published" if "tests/hidden/" in test["name"] else "visible"})
    return {"score": round(sum(row["points"] for row in results), 6), "execution_time": round(seconds, 1),
            "tests": tests}


def in_namespace(argv):
    """Run this grading again as the first process of a new PID namespace (util-linux's unshare): when it
    ends, the kernel ends every process it started, wherever they went. Returns its exit status."""
    done = subprocess.run(["unshare", "--pid", "--mount", "--mount-proc", "--fork", "--kill-child", sys.executable,
                           __file__, *argv],
                          env=dict(os.environ, **{NAMESPACE: "1"}), preexec_fn=_die_with_parent)
    return done.returncode


def _die_with_parent():
    """(In the child, before unshare starts.) SIGKILL it when this grade.py dies, even by SIGKILL: unshare
    then kills the namespace's init, and the kernel every process in the namespace."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)          # 1: PR_SET_PDEATHSIG


def reap_as_init(child):
    """As process 1 of the namespace: reap every orphan until ``child`` (the grading) ends; its status."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            return child.returncode


def missing_tools():
    """What --student needs that this machine lacks, with the line that installs it ("" if nothing)."""
    why = sandbox.why_not()
    if why:
        return why
    for tool, package in (("unshare", "util-linux"), ("setpriv", "util-linux"), ("prlimit", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package})"
    return ""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--student", default=None, help="a student tree to grade against this one")
    parser.add_argument("--tasks", default=None, help="comma-separated task ids (default: all)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--timeout", type=int, default=30,
                        help="seconds for a test, and for one sandboxed call (a deadlock costs one)")
    parser.add_argument("--time-limit", type=int, default=1800,
                        help="seconds for the whole submission; tasks not reached by then score 0")
    parser.add_argument("--gradescope", default=None, help="also write Gradescope's results.json here")
    parser.add_argument("--max-ranks", type=int, default=8, help="leave out tests on more ranks (not counted)")
    parser.add_argument("--tests", default=None,
                        help="grade only these of the tasks' tests (comma-separated node ids); the others are left "
                             "out and not counted (to look again at one test)")
    parser.add_argument("--grader-uid", type=int, default=GRADER_UID,
                        help="the uid the tests run as with --student (not root, not the sandbox's 65534)")
    args = parser.parse_args(argv)
    tasks, generator = assignments.load()
    try:
        chosen = assignments.select(tasks, args.tasks)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    student = Path(args.student).resolve() if args.student else None
    if student is not None:
        if not student.is_dir():
            print(f"error: no student tree at {student} (--student names the folder to grade)", file=sys.stderr)
            return 2
        why = missing_tools()
        if why:
            print(f"error: grading a submission runs it in a sandbox, which cannot run here: {why}", file=sys.stderr)
            return 2
        if args.grader_uid in (0, sandbox.SANDBOX_UID) or args.grader_uid in sandbox.SANDBOX_UIDS:
            print(f"error: --grader-uid {args.grader_uid}: the tests need a uid of their own", file=sys.stderr)
            return 2
        if os.environ.get(NAMESPACE) not in ("1", "2"):
            return in_namespace(argv)
        if os.environ.get(NAMESPACE) == "1":      # the namespace's init: grade in a child, reap orphans here
            # this checkout's own bytecode, once, as the tests' uid cannot write it in its read-only view
            subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *(str(ROOT / part) for part in
                            ("minidl", "collectives", "algorithms", "tests", "tutorials"))], capture_output=True)
            return reap_as_init(subprocess.Popen([sys.executable, __file__, *argv],
                                                 env=dict(os.environ, **{NAMESPACE: "2"})))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    for name in (NAMESPACE, sandbox.BROKER):
        env.pop(name, None)
    started, results = time.monotonic(), []
    with tempfile.TemporaryDirectory() as scratch:
        grader = Grader(env)
        if student is not None:
            try:
                sandboxed = sandbox_tree(Path(scratch) / "sandbox" / "student", student, generator)
            except ValueError as error:
                print(f"error: {student}: {error}", file=sys.stderr)
                return 2
            home = Path(scratch) / "grader"
            home.mkdir()
            os.chown(home, args.grader_uid, args.grader_uid)
            lent, kept = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            os.set_inheritable(lent.fileno(), True)
            threading.Thread(target=sandbox.serve_broker, args=(kept, sandboxed), daemon=True).start()
            grader = Grader(env, home, lent.fileno(), args.grader_uid)
        try:
            groups = collect(grader, chosen, env)
        except GradingError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if args.tests is not None:
            wanted = {nodeid.strip() for nodeid in args.tests.split(",") if nodeid.strip()}
            groups = {task_id: {nprocs: [nodeid for nodeid in ids if nodeid in wanted] for nprocs, ids in sizes.items()}
                      for task_id, sizes in groups.items()}
        graded = {}
        for task in chosen:
            if student is not None:
                try:
                    forbidden = assignments.forbidden_calls(task, root=sandboxed)
                except (ValueError, OSError, SyntaxError) as error:
                    graded[task.id] = {**score(task, {}), "failed": [f"no gradable fence: {error}"]}
                    continue
                if forbidden:
                    graded[task.id] = {**score(task, {}), "failed": [f"not graded: {forbidden}"]}
                    continue
        env = dict(env, MINIDL_GRADE_STUDENT="/student", MINIDL_GRADE_CALL_TIMEOUT=str(max(1, args.timeout - 5))) \
            if student is not None else env
        sizes = {task.id: {nprocs: ids for nprocs, ids in groups[task.id].items() if nprocs <= args.max_ranks}
                 for task in chosen if task.id not in graded}
        everything = grade_tasks(ROOT, sizes, args.timeout, env, args.max_ranks, grader, started + args.time_limit,
                                 proxied=student is not None)
        for task in chosen:
            row = graded.get(task.id) or score(task, everything[task.id])
            results.append(row)
            print(f"{task.id:<5} {task.title[:44]:<44} {row['passed']:>3}/{row['total']:<3} "
                  f"{row['points']:>5g}/{task.points:g}", flush=True)
            for test in row["tests"]:
                if test["status"] not in ("passed", "skipped"):
                    print(f"      {test['name']}: {test['message'] or test['status']}"[:400], flush=True)
            for why in row["failed"] if not row["tests"] else ():
                print(f"      {why}"[:400], flush=True)
    seconds = time.monotonic() - started
    earned, possible = sum(r["points"] for r in results), sum(r["max_points"] for r in results)
    print(f"{'total':<50} {earned:>9g}/{possible:g}   ({seconds:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"tasks": results, "points": round(earned, 6), "max_points": possible,
                                               "seconds": round(seconds, 1)}, indent=1))
    if args.gradescope:
        Path(args.gradescope).write_text(json.dumps(gradescope(results, seconds), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
