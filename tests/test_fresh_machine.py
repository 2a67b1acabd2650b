"""The fresh machine: where a system tool the suite can use is missing, its tests skip, saying what to
install, and none fails.

CI installs bubblewrap, Chromium and iproute2 and runs every test as root (.ci/run). A new user's
machine has only Python: no bubblewrap, no Chromium, perhaps no iproute2, perhaps no root, and
another CPU, whose BLAS kernel rounds otherwise. Here that machine is made out of this one, in a
subprocess that runs the test files that need those tools:

- "no tools, another kernel": a PATH from which ``bwrap``, ``chromium`` (and ``chromium-browser``),
  ``ip`` and ``tc`` are hidden (a folder of links to everything else on PATH), and OPENBLAS_CORETYPE
  set to another kernel (tests/machine.py). Every test of the sandbox, the grader, the emulated hosts
  and the book's browser test must pass or skip with an ``apt-get install`` line, and the bits pinned
  for one machine's fingerprint skip, naming the fingerprint the other kernel gives.
- "tools, not root" (where this runs as root, with setpriv): the same tools on PATH, an unprivileged
  uid of its own; the tests that need root skip, saying what to install and run as root.

Either way: exit status 0, no failure, no error, and at least one skip of each kind (the tools were
really hidden). A test that needs a tool and does not check for it fails here, since the tool is gone;
a check that skips without saying what to install fails the reason's test.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from tests import machine

ROOT = Path(__file__).resolve().parent.parent
HIDDEN = ("bwrap", "chromium", "chromium-browser", "ip", "tc")
BROWSER = "tests/test_book.py::test_every_page_of_the_book_loads_in_chromium_from_disk_with_nothing_broken"
PINNED = "tests/test_shape.py::test_serial_sgd_gives_the_bits_pinned_for_this_machine"
# the files whose tests need a tool, and the install line each tool's skip must give
NEEDS = {"tests/test_sandbox.py": "apt-get install bubblewrap",
         "tests/test_assignments.py": "apt-get install bubblewrap",
         "tests/test_cluster.py": "apt-get install iproute2",
         BROWSER: "apt-get install chromium"}
# a skip that gives one of these as its reason is about a tool or a privilege, and must say what to install
ABOUT_A_TOOL = re.compile(r"bwrap|bubblewrap|sandbox|namespace|\broot\b|chromium|iproute|`ip`|`tc`|setpriv|"
                          r"not on PATH", re.I)
UNPRIVILEGED = 54321          # a uid of its own: not the sandbox's (65534), not one a process here uses


def path_without(names, folder):
    """A PATH of one folder holding a link to every program on this PATH except ``names``."""
    folder.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = folder / entry.name
            if entry.name not in names and not link.exists() and not link.is_symlink():
                link.symlink_to(entry.path)
    return str(folder)


def results(xml):
    """{node id: (outcome, message)} from pytest's JUnit XML: outcome passed, skipped, failure or error."""
    found = {}
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name")
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("skipped", "failure", "error"):
                outcome, message = child.tag, child.get("message", "")
                break
        found[node] = (outcome, message)
    return found


def run_pytest(tmp_path, targets, env, user=()):
    """``pytest -rs`` on ``targets`` in a subprocess: (exit status, its output, {node id: (outcome, message)})."""
    xml = tmp_path / "fresh.xml"
    command = [*user, sys.executable, "-m", "pytest", "-rs", "-q", "-p", "no:cacheprovider", "-m", "parallel[1]",
               f"--junitxml={xml}", *targets]
    # a session of its own: on a timeout every process the run started goes with it, sandboxes and mpiexec too
    run = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        stdout, stderr = run.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        stdout, stderr = run.communicate()
        pytest.fail(f"the run did not end within 240 s (its tests should skip or pass in seconds):\n"
                    f"{stdout[-3000:]}{stderr[-2000:]}")
    output = stdout[-6000:] + stderr[-3000:]
    assert xml.exists(), f"pytest wrote no report (exit {run.returncode}):\n{output}"
    return run.returncode, output, results(xml)


def which_file(node):
    return next((target for target in NEEDS if node.startswith(target)), None)


def check(returncode, output, found, expected):
    """No failure or error, exit status 0; every skip of a file in NEEDS that is about a tool or a privilege
    gives that file's install line (a skip for another reason, a student tree's, may say what it says), and
    each file of ``expected`` has at least one skip with its install line."""
    bad = {node: outcome for node, (outcome, _) in found.items() if outcome in ("failure", "error")}
    assert returncode == 0 and not bad, f"exit {returncode}, failed: {sorted(bad)}\n{output}"
    skips = {node: message for node, (outcome, message) in found.items() if outcome == "skipped" and which_file(node)}
    silent = {node: message for node, message in skips.items()
              if ABOUT_A_TOOL.search(message) and NEEDS[which_file(node)] not in message}
    assert not silent, f"skips that do not say what to install: {silent}"
    told = {which_file(node) for node, message in skips.items() if NEEDS[which_file(node)] in message}
    assert set(expected) <= told, f"no skip that says what to install in {sorted(set(expected) - told)}: " \
                                  f"was the tool hidden?\n{output}"


def test_with_no_bubblewrap_chromium_or_iproute2_and_another_blas_kernel_every_test_passes_or_says_what_to_install(
        tmp_path):
    kernel = machine.another_kernel()
    env = dict(os.environ, PATH=path_without(HIDDEN, tmp_path / "bin"), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("OPENBLAS_CORETYPE", None)
    if kernel:
        env["OPENBLAS_CORETYPE"] = kernel
    assert all(shutil.which(name, path=env["PATH"]) is None for name in HIDDEN)
    returncode, output, found = run_pytest(tmp_path, [*list(NEEDS)[:3], BROWSER, PINNED], env)
    check(returncode, output, found, NEEDS)
    outcome, message = found.get(PINNED, ("absent", ""))
    if kernel:           # the other kernel's fingerprint has no digest pinned: the skip names it
        assert outcome == "skipped" and re.search(rf"no digest pinned for this machine \({kernel}\b", message, re.I), \
            f"{PINNED}: {outcome} {message!r}"


@pytest.fixture
def home_of_its_own():
    """A folder the unprivileged uid owns: its HOME, TMPDIR and the report's place (pytest's tmp_path
    lies under root's private folder, which that uid cannot enter)."""
    if os.geteuid() != 0:
        pytest.skip("already not root: this run is the suite itself (the test makes a non-root user out of root)")
    folder = Path(tempfile.mkdtemp(prefix="minidl-fresh-"))
    os.chown(folder, UNPRIVILEGED, UNPRIVILEGED)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_as_a_user_who_is_not_root_every_test_passes_or_says_what_to_install(home_of_its_own):
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("no setpriv to run as another uid: apt-get install util-linux")
    home = str(home_of_its_own)
    env = dict(os.environ, HOME=home, TMPDIR=home, USER="fresh", LOGNAME="fresh", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("OPENBLAS_CORETYPE", None)
    user = [setpriv, f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups", "--inh-caps=-all"]
    # the tests start Python again themselves: the uid must reach the interpreter, the checkout and the
    # environment by their paths (a Python under root's home, /root mode 700, is out of its reach)
    probe = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import minidl, pytest'], check=True)"
    readable = subprocess.run([*user, sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=60)
    if readable.returncode != 0:
        pytest.skip(f"uid {UNPRIVILEGED} cannot run this Python or read this checkout (make both readable to all "
                    f"to run this test): {readable.stderr.strip().splitlines()[-1:]}")
    returncode, output, found = run_pytest(home_of_its_own, list(NEEDS)[:3], env, user=user)
    check(returncode, output, found, list(NEEDS)[:3])
