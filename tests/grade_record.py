"""pytest plugin for tests/grade.py: what was collected, and each test's outcome as it happens.

$MINIDL_GRADE_COLLECT: after collection, one line ``nprocs<TAB>nodeid`` per test, the rank count
taken from mpi-pytest's ``parallel[N]`` marker (a test marked for one size only has no
``nprocs=`` in its node id, so the id alone cannot tell).

$MINIDL_GRADE_RECORD: written line by line (``when<TAB>outcome<TAB>nodeid<TAB>message<TAB>rank``),
so that a run killed by a timeout (a deadlocked student function) still tells the grader which tests
had finished. ``message`` is what a failure said, on one line (the assertion and its values, or the
exception), cut to MESSAGE_CHARS; empty for a pass. Rank 0 writes every report, the other ranks
only their failures: when one rank fails and the others then wait for it until the timeout, the
grader can say what that rank said.
"""
import os
import re

SIZE = re.compile(r"parallel\[(\d+)\]$")
MESSAGE_CHARS = 600


def pytest_collection_finish(session):
    path = os.environ.get("MINIDL_GRADE_COLLECT")
    if not path:
        return
    with open(path, "w") as file:
        for item in session.items:
            sizes = [int(m.group(1)) for m in (SIZE.match(mark.name) for mark in item.iter_markers()) if m]
            file.write(f"{sizes[0] if sizes else 1}\t{item.nodeid}\n")


def pytest_runtest_logreport(report):
    path = os.environ.get("MINIDL_GRADE_RECORD")
    if not path:
        return
    rank = 0
    try:
        from mpi4py import MPI
        if MPI.Is_initialized():
            rank = MPI.COMM_WORLD.Get_rank()
    except ImportError:
        pass
    if rank != 0 and not report.failed:
        return
    with open(path, "a") as file:                 # one short append per line: ranks' lines do not mix
        file.write(f"{report.when}\t{report.outcome}\t{report.nodeid}\t{message(report)}\t{rank}\n")


def message(report):
    """A failed report's crash message (pytest's one-line summary of the assertion or exception)."""
    if not report.failed:
        return ""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS - 3] + "..."
