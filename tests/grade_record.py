"""pytest plugin for tests/grade.py: what was collected, and each test's outcome as it happens.

Both go to pipes that tests/grade.py made and reads, inherited by the pytest processes it starts
(their numbers in ``$MINIDL_GRADE_COLLECT_FD`` and ``$MINIDL_GRADE_RECORD_FD``): no file that a
process could find by its path and write. Nothing a student wrote runs in these processes (their
calls of the student's code go to the sandbox, tests/grade_proxy.py), and no sandboxed process holds
either pipe.

Collection: after collection, one line ``nprocs<TAB>nodeid`` per test, the rank count taken from
mpi-pytest's ``parallel[N]`` marker (a test marked for one size only has no ``nprocs=`` in its node
id, so the id alone cannot tell).

Outcomes: one line per report (``when<TAB>outcome<TAB>nodeid<TAB>message<TAB>rank``), written as
it happens, each in one write of under 4096 bytes (so the lines of several ranks never mix), so
that a run killed by a timeout still tells the grader which tests had finished. ``message`` is what
a failure said, on one line (the assertion and its values, or the exception), cut to
MESSAGE_CHARS; empty for a pass. Rank 0 writes every report, the other ranks only their failures:
when one rank fails and the others then wait for it until the timeout, the grader can say what that
rank said. ``hang(message)`` fails the running test with ``message`` and ends this process at once
(a sandboxed call that did not come back in time: the grader stops the task there).
"""
import os
import re

SIZE = re.compile(r"parallel\[(\d+)\]$")
MESSAGE_CHARS = 600
LINE_BYTES = 4000
RUNNING = {"nodeid": None}


def pytest_collection_finish(session):
    fd = os.environ.get("MINIDL_GRADE_COLLECT_FD")
    if not fd:
        return
    lines = []
    for item in session.items:
        sizes = [int(m.group(1)) for m in (SIZE.match(mark.name) for mark in item.iter_markers()) if m]
        tasks = ",".join(sorted({str(task) for mark in item.iter_markers("task") for task in mark.args}))
        lines.append(f"{sizes[0] if sizes else 1}\t{tasks}\t{item.nodeid}\n")
    data = "".join(lines).encode()
    while data:
        data = data[os.write(int(fd), data):]


def _rank():
    try:
        from mpi4py import MPI
        if MPI.Is_initialized():
            return MPI.COMM_WORLD.Get_rank()
    except ImportError:
        pass
    return 0


def write(when, outcome, nodeid, message, rank):
    fd = os.environ.get("MINIDL_GRADE_RECORD_FD")
    if not fd:
        return
    line = f"{when}\t{outcome}\t{nodeid}\t{' '.join(message.split())}\t{rank}\n".encode()
    if len(line) > LINE_BYTES:                    # one write of under PIPE_BUF bytes is never split
        keep = LINE_BYTES - len(f"\t{rank}\n".encode()) - 4
        line = line[:keep].decode(errors="ignore").encode() + f"...\t{rank}\n".encode()
    os.write(int(fd), line)


def pytest_runtest_setup(item):
    RUNNING["nodeid"] = item.nodeid


def pytest_runtest_logreport(report):
    rank = _rank()
    if rank != 0 and not report.failed:
        return
    write(report.when, report.outcome, report.nodeid, message(report), rank)


def note(text):
    """What the sandbox said in the running test (the student's code raised there), noted at once: if the
    test then fails for another reason on another rank (a worker's ``Stopped`` after a server's stub
    raised, a timeout), tests/grade.py puts these words first, as the cause."""
    write("note", "noted", RUNNING["nodeid"] or "?", text[:MESSAGE_CHARS], _rank())


def hang(text):
    """The running test failed with ``text`` (a sandboxed call that never came back): say so, then end
    this process at once, so that the task stops here (tests/grade.py marks its later tests "not run")."""
    write("call", "failed", RUNNING["nodeid"] or "?", text[:MESSAGE_CHARS], _rank())
    os._exit(3)


def message(report):
    """A failed report's crash message (pytest's one-line summary of the assertion or exception)."""
    if not report.failed:
        return ""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 3] + "..."
