"""Run the whole test suite: serial tests on every core, then MPI tests on real ranks.

    python tests/run.py                 # everything (serial + 2..8 ranks)
    python tests/run.py --max-ranks 4   # fewer rank counts
    python tests/run.py --workers 1     # the serial tests in one pytest process, in file order
    python tests/run.py -- -k ring      # extra arguments go to every pytest

Why one ``mpiexec`` per rank count instead of mpi-pytest's forking mode: forking starts a new
``mpiexec`` (and p Python interpreters importing numpy, hypothesis, ...) for every single test,
which costs about a second a test on 2 cores. Here each rank count pays that once:

    pytest -m "parallel[1]" -n W                         serial tests and p = 1 cases, on W workers
    mpiexec -n 1 pytest -m "parallel[N]" : -n N-1 pytest  every test marked for N ranks, together

The serial run spreads its tests over W workers (pytest-xdist, from the test extra; W = the cores
this process may use; without pytest-xdist, one process), a test file at a time: tests/conftest.py
keeps the tests that must not run beside each other in one unit of work (its ``TOGETHER``), and
hands those long units out first. It also notes which files hold tests for each rank count
(``--rank-files``), and each ``mpiexec`` collects only those files (all of them where the extra
arguments name tests themselves), so that p ranks do not each import every test module; a rank
count no test is marked for starts no ``mpiexec``.
Rank 0 prints the report; the other ranks run quietly. Every test has pytest-timeout's
thread-method timeout (setup.cfg), which kills the process on a deadlock, so mpiexec takes the
whole run down: a deadlock is a failed run, never a stuck one. Each run has an outer timeout too.
The last line is the total over all runs, and the exit status is non-zero if anything failed,
any run died, or no test ran at all.
"""
import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def junit_counts(path):
    """(passed, failed, skipped) from a pytest JUnit XML file."""
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = failed = skipped = 0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return tests - failed - skipped, failed, skipped


def cores():
    """How many cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                  # not Linux
        return os.cpu_count() or 1


def names_tests(args):
    """Whether the extra pytest arguments name test files or node ids themselves."""
    return any(not arg.startswith("-") and ("::" in arg or (ROOT / arg).exists()) for arg in args)


def rank_files(prefix):
    """{p: [test files]} from the serial run's ``--rank-files`` notes (None if it collected nothing)."""
    notes = sorted(prefix.parent.glob(prefix.name + ".*"))
    if not notes:
        return None
    files = {}
    for note in notes:
        for line in note.read_text().splitlines():
            nprocs, file = line.split("\t")
            files.setdefault(int(nprocs), set()).add(file)
    return {nprocs: sorted(names) for nprocs, names in files.items()}


def run(command, timeout, env):
    print("\n$ " + " ".join(command), flush=True)
    started = time.perf_counter()
    try:
        returncode = subprocess.run(command, cwd=ROOT, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"!! timed out after {timeout} s", flush=True)
        returncode = -1
    print(f"   ({time.perf_counter() - started:.0f} s, exit {returncode})", flush=True)
    return returncode


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-ranks", type=int, default=int(os.environ.get("MINIDL_TEST_MAX_RANKS", 8)))
    parser.add_argument("--timeout", type=int, default=1500, help="seconds for each pytest run")
    parser.add_argument("--workers", type=int, default=cores(),
                        help="processes for the serial tests (pytest-xdist; default: the cores this process may use)")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)

    env = dict(os.environ)
    # One BLAS thread per rank: with p ranks on 2 cores, more threads only fight each other.
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    pytest = [sys.executable, "-m", "pytest"]
    # the mpiexec that the mpich wheel put beside this Python, even if the venv is not activated
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    if not Path(mpiexec).exists():
        mpiexec = shutil.which("mpiexec") or "mpiexec"
    totals = [0, 0, 0]
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        notes = Path(tmp) / "rank_files"
        files = None
        for nprocs in range(1, args.max_ranks + 1):
            xml = Path(tmp) / f"p{nprocs}.xml"
            selected = ["-m", f"parallel[{nprocs}]", *args.pytest_args]
            if nprocs == 1:
                workers = ["-n", str(args.workers), "--dist", "loadfile", "--no-loadscope-reorder"] \
                    if args.workers > 1 and importlib.util.find_spec("xdist") else []
                command = [*pytest, *selected, *workers, f"--rank-files={notes}", f"--junitxml={xml}"]
            else:
                if files is not None and not files.get(nprocs):
                    continue                   # no test is marked for this many ranks
                if files is not None and not names_tests(args.pytest_args):
                    selected += files[nprocs]
                quiet = ["-q", "--tb=no", "--no-summary", "--no-header", "--disable-warnings",
                         "--show-capture=no", "-p", "tests.quiet_rank"]
                command = [mpiexec, "-n", "1", *pytest, *selected, f"--junitxml={xml}", ":",
                           "-n", str(nprocs - 1), *pytest, *selected, *quiet]
            returncode = run(command, args.timeout, env)
            if nprocs == 1:
                files = rank_files(notes)
            if returncode == 5:            # pytest: no test carries this marker
                continue
            if xml.exists():
                counts = junit_counts(xml)
                totals = [t + c for t, c in zip(totals, counts)]
            if returncode != 0:
                problems.append(f"p={nprocs}: exit {returncode}")
    print()
    for problem in problems:
        print("FAILED run " + problem)
    if totals[0] == 0:
        problems.append("no test passed")
    print(f"total: {totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if problems or totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
