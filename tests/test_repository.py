"""What the repository holds speaks of the repository: no path of the machine that wrote a file, and
no citation of a file the repository does not contain.

A machine's path is an absolute path that exists only where one person ran something: a home folder
(``/home/NAME``, ``/Users/NAME``, ``/root/``), a workspace or mount (``/work/``, ``/mnt/``, ``/scratch/``,
macOS's ``/private/var/folders/``), a temporary folder pytest or ``mkdtemp`` named (``/tmp/pytest-of-USER``,
``/tmp/tmpXXXXXXXX``), or any absolute path through a virtual environment or installed packages
(``.../.venv/...``, ``.../site-packages/...``). Paths that are the same on every machine are not a
machine's: a program's place in the system (``/usr/bin/chromium``, ``/proc``, ``/dev/shm``), a place a
tool defines (Gradescope's ``/autograder/``, the sandbox's own ``/io/in``), a script's documented
default (``/tmp/minidl_01_quick``). A figure script that records the command it ran writes it as a
reader types it (``mpiexec -n 2 python -m ...``), not with the interpreter's path.

A citation is a project document by its capitalised name (``README.md``, ``DIGITS_LICENSE.txt``) or a
path inside one of the packages (``tests/helpers.py``, ``tutorials/figures/out/10_calibrated.json``): it
must be a committed file, or a generated one that .gitignore names (the notebooks, the built book); a
relative path never climbs out of the repository. A path with a wildcard or a capitalised placeholder
(``tutorials/NN_name.md``) is a pattern, not a citation.

The files are git's list (``git ls-files``); text files only, as grep reads them.
"""
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from tutorials import assignments

ROOT = Path(__file__).resolve().parent.parent

MACHINE_PATH = re.compile(
    r"(?<![\w.~$}/-])/(?:"                                   # an absolute path, not the tail of another word or path
    r"(?:home|Users|root|work|mnt|scratch)/[^\s'\"`)\]]*"     # home folders, workspaces, mounts
    r"|private/var/folders/[^\s'\"`)\]]*"                     # macOS's temporary folders
    r"|tmp/(?:pytest-of-[^\s'\"`)\]]*|tmp[a-z0-9_]{8}\b[^\s'\"`)\]]*)"   # pytest's and mkdtemp's temporary folders
    r"|(?:[^\s'\"`/]+/)+?(?:\.venv|venv|site-packages)/[^\s'\"`)\]]*"  # through a virtual environment
    r")|\b[A-Za-z]:\\(?:Users|Documents and Settings)\\")     # Windows home folders

PACKAGES = ("minidl", "collectives", "algorithms", "tests", "tutorials")
CITED_PATH = re.compile(r"(?<![\w./-])((?:\.\./)*(?:%s)/[\w./*-]*[\w*]\.[a-z]{2,5})\b" % "|".join(PACKAGES))
DOCUMENT = re.compile(r"(?<![\w.-])([A-Z][A-Z0-9_]*\.(?:md|txt|rst|toml|cfg))\b")
PATTERN = re.compile(r"\*|(?:^|/)[A-Z]{1,3}(?:_|\.|/)")           # tutorials/NN_*.md, figures/out/P/...
CLIMBS = re.compile(r"(?<![\w.])((?:\.\./)+)[\w.-]")

# Citations known to be stale, in the grader's files, whose rewrite drops them: each must still be
# stale (the test says so once one is fixed, and its entry goes).
KNOWN_STALE = set()
# Paths that name no file of this tree on purpose, each with why: a file the project writes into another
# tree, or an attack's path that a test hands the grader to refuse.
ELSEWHERE = {("tutorials/assignments/README.md", "tutorials/assignments/assignment.toml"):
             "make writes it into every student tree, never into the reference's",
             ("tutorials/assignments/__init__.py", "tutorials/assignments/assignment.toml"): "the same",
             ("tests/test_contributing.py", "tests/test_toy_sgd.py"):
             "the toy algorithm's test, written into the copy that CONTRIBUTING.md's walk adds it to",
             ("tests/test_sandbox.py", "../../e"): "a frame's entry named to climb out, which the parser refuses"}


def committed_text_files():
    """{relative path: text} of every committed file that is text (no NUL byte in it), but this one, which
    holds the examples of what it looks for."""
    if not assignments.is_git_checkout(ROOT):
        pytest.skip("not a git checkout: the committed files are git's list (git ls-files)")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = {}
    for name in names.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and path != Path(__file__).resolve():
            data = path.read_bytes()
            if b"\0" not in data[:8192]:
                files[name] = data.decode("utf-8", errors="replace")
    return files


def machine_paths(text):
    """[(line number, the path)] of every machine's path in ``text``."""
    return [(number, match.group(0)) for number, line in enumerate(text.splitlines(), 1)
            for match in MACHINE_PATH.finditer(line)]


def test_a_machines_paths_are_seen_and_the_paths_every_machine_shares_are_not():
    home, venv = "/" + "home/ada/minidl", "/" + "work/main/.venv/bin/python"
    for text in (f"-n 2 {venv} -m collectives.bench", f'"{home}/out.json"', "/" + "root/.cache/x",
                 "/" + "tmp/pytest-of-root/pytest-0/t0/x.npz", "/" + "tmp/tmpa1b2c3d4/ck.npz",
                 "/" + "opt/conda/envs/x/lib/python3.11/site-packages/numpy", "/" + "Users/ada/x.py",
                 "/" + "private/var/folders/xy/T/tmp", "C:" + "\\Users\\ada\\x.py", f"PATH={home}/bin:$PATH"):
        assert machine_paths(text), text
    for text in ("/usr/bin/chromium", "/proc/self/status", "/dev/shm", "/autograder/results/results.json",
                 "/io/in/driver.py", "/tmp/minidl_01_quick", ".venv/bin/python tests/run.py",
                 "$root/source/project/.venv/bin/python", "https://example.org/home/page", "a/root/of/it",
                 "~/.venv/bin/python", "/tmp/make_09_quick", "rank/root/", "ranks/work/"):
        assert not machine_paths(text), text


def test_no_committed_file_holds_a_path_of_the_machine_that_wrote_it():
    found = [f"{name}:{number}: {path}" for name, text in committed_text_files().items()
             for number, path in machine_paths(text)]
    assert not found, "paths of one machine in committed files:\n" + "\n".join(found[:30])


def test_the_calibration_script_records_its_command_as_a_reader_types_it():
    """make_10_calibration.py writes the bench's command into 10_calibrated.json: without this machine's
    interpreter, mpiexec or output folder in it (the figure is measured rarely; its writer is checked here)."""
    sys.path.insert(0, str(ROOT / "tutorials" / "figures"))
    try:
        import make_10_calibration as script
    finally:
        sys.path.remove(str(ROOT / "tutorials" / "figures"))
    out = script.HERE / "out"
    command = [script.MPIEXEC, "-n", "2", sys.executable, "-m", "collectives.bench", "--calibration",
               str(out / "10_calibration_0.json"), "--rounds", "9", "--json", str(out / "10_calibrated_bench.json")]
    assert script.as_typed(command, out) == ("mpiexec -n 2 python -m collectives.bench --calibration "
                                             "OUT/10_calibration_0.json --rounds 9 --json OUT/10_calibrated_bench.json")


def ignored(paths):
    """The paths among ``paths`` that .gitignore covers (generated files: the notebooks, the built book)."""
    if not paths:
        return set()
    done = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT, input="\n".join(paths),
                          capture_output=True, text=True)
    return set(done.stdout.split())


def citations(name, text):
    """[(line number, cited path, what is wrong)] of ``text`` (the committed file ``name``)."""
    depth = len(PurePosixPath(name).parts) - 1
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in CLIMBS.finditer(line):
            if match.group(1).count("../") > depth:
                found.append((number, match.group(0), "climbs out of the repository"))
        for match in CITED_PATH.finditer(line):
            cited = match.group(1)
            if not PATTERN.search(cited):
                found.append((number, cited, "cited"))
        for match in DOCUMENT.finditer(line):
            found.append((number, match.group(1), "document"))
    return found


def test_the_project_cites_only_files_it_contains():
    files = committed_text_files()
    basenames = {PurePosixPath(name).name for name in files}
    cited = [(name, number, path, kind) for name, text in files.items() for number, path, kind in citations(name, text)]
    paths = {path for _, _, path, kind in cited if kind == "cited" and not path.startswith("../")}
    generated = ignored(sorted(path for path in paths if not (ROOT / path).exists()))
    missing = []
    for name, number, path, kind in cited:
        if (name, path) in ELSEWHERE:
            continue
        if kind == "climbs out of the repository":
            missing.append(f"{name}:{number}: {path} climbs out of the repository")
        elif kind == "document" and path not in basenames:
            missing.append(f"{name}:{number}: {path} is not in the repository")
        elif kind == "cited" and not path.startswith("../") and not (ROOT / path).exists() and path not in generated:
            if (name, path) not in KNOWN_STALE:
                missing.append(f"{name}:{number}: {path} is not in the repository")
    assert not missing, "citations of files the project does not contain:\n" + "\n".join(missing[:30])
    fixed = [entry for entry in KNOWN_STALE if entry[1] not in files[entry[0]] or (ROOT / entry[1]).exists()]
    assert not fixed, f"no longer stale, remove from KNOWN_STALE: {fixed}"


def test_a_citation_of_a_missing_document_or_a_path_out_of_the_repository_is_seen():
    text = ("architecture: DESIGN.md\nsee ../elsewhere/LAYOUT.md\nsee `tests/no_such_test.py`\n"
            "tutorials/NN_name.md is a pattern; see ../references.md\n")
    at_the_top = [(number, kind) for number, _, kind in citations("README.md", text)]
    assert (1, "document") in at_the_top and (2, "document") in at_the_top and (3, "cited") in at_the_top
    assert (2, "climbs out of the repository") in at_the_top and (4, "climbs out of the repository") in at_the_top
    one_down = [(number, kind) for number, _, kind in citations("tutorials/x.md", text)]
    assert (2, "climbs out of the repository") not in one_down and not [row for row in one_down if row[0] == 4]
