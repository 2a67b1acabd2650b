"""Run the whole test suite: serial tests in one process, then MPI tests on real ranks.

    python tests/run.py                 # everything (serial + 2..8 ranks)
    python tests/run.py --max-ranks 4   # fewer rank counts
    python tests/run.py -- -k ring      # extra arguments go to every pytest

Why one ``mpiexec`` per rank count instead of mpi-pytest's forking mode: forking starts a new
``mpiexec`` (and p Python interpreters importing numpy, hypothesis, ...) for every single test,
which costs about a second a test on 2 cores. Here each rank count pays that once:

    pytest -m "parallel[1]"                              serial tests and p = 1 cases, in process
    mpiexec -n 1 pytest -m "parallel[N]" : -n N-1 pytest  every test marked for N ranks, together

Rank 0 prints the report; the other ranks run quietly. Every test has pytest-timeout's
thread-method timeout (setup.cfg), which kills the process on a deadlock, so mpiexec takes the
whole run down: a deadlock is a failed run, never a stuck one. Each run has an outer timeout too.
The last line is the total over all runs, and the exit status is non-zero if anything failed,
any run died, or no test ran at all.
"""
import argparse
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
        for nprocs in range(1, args.max_ranks + 1):
            xml = Path(tmp) / f"p{nprocs}.xml"
            selected = ["-m", f"parallel[{nprocs}]", *args.pytest_args]
            if nprocs == 1:
                command = [*pytest, *selected, f"--junitxml={xml}"]
            else:
                quiet = ["-q", "--tb=no", "--no-summary", "--no-header", "--disable-warnings",
                         "--show-capture=no", "-p", "tests.quiet_rank"]
                command = [mpiexec, "-n", "1", *pytest, *selected, f"--junitxml={xml}", ":",
                           "-n", str(nprocs - 1), *pytest, *selected, *quiet]
            returncode = run(command, args.timeout, env)
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
