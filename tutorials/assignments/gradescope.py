"""A Gradescope autograder for chosen tasks: one zip the instructor uploads.

    python -m tutorials.assignments gradescope --tasks 3.4,3.5,3.6 --out autograder.zip

Gradescope unzips it into ``/autograder/source``, runs ``setup.sh`` once when it builds the image,
and ``run_autograder`` for each submission, which lies in ``/autograder/submission`` (the student's
files at their paths in the tree, e.g. ``collectives/ring.py``) and must leave
``/autograder/results/results.json``. The zip holds:

    setup.sh          installs Debian's python3-venv and bubblewrap, then the project into a venv
    run_autograder    grades the submission with the reference tree (tests/grade.py --student
                      /autograder/submission --tasks IDS --gradescope .../results.json)
    project/          the reference tree (hidden tests included: they stay on the grader's side)

``AUTOGRADER`` (default /autograder) and ``MINIDL_PYTHON`` (default the venv's python) let the same
script run on another machine, which is how the tests run it.
"""
import stat
import zipfile
from pathlib import Path

from tutorials import assignments

SETUP = """#!/usr/bin/env bash
# Gradescope image set-up: Debian's python3-venv and bubblewrap, then minidl with its test extras.
set -euo pipefail
apt-get update
apt-get install -y python3-venv bubblewrap
cd "${AUTOGRADER:-/autograder}/source/project"
python3 -m venv .venv
.venv/bin/pip install -q -e ".[test]"
"""

RUN = """#!/usr/bin/env bash
# Grades /autograder/submission against the reference tree; writes /autograder/results/results.json.
set -uo pipefail
root="${{AUTOGRADER:-/autograder}}"
cd "$root/source/project"
mkdir -p "$root/results"
python="${{MINIDL_PYTHON:-$root/source/project/.venv/bin/python}}"
OMP_NUM_THREADS=1 "$python" tests/grade.py --student "$root/submission" --tasks {tasks} \\
    --gradescope "$root/results/results.json"
"""


def build(out, ids=None, root=assignments.ROOT):
    """Write the autograder zip for tasks ``ids`` (default: all) to ``out``; returns the tasks."""
    tasks, _ = assignments.load()
    chosen = assignments.select(tasks, ids)
    executable = (stat.S_IFREG | 0o755) << 16
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in (("setup.sh", SETUP), ("run_autograder", RUN.format(tasks=",".join(t.id for t in chosen)))):
            entry = zipfile.ZipInfo(name)
            entry.external_attr, entry.compress_type = executable, zipfile.ZIP_DEFLATED
            archive.writestr(entry, text)
        for name in assignments.tracked_files(root):
            archive.write(Path(root) / name, f"project/{name}")
    return chosen


def unpack(archive_path, source):
    """Unzip an autograder into ``source`` keeping the scripts' execute bits (as Gradescope does)."""
    with zipfile.ZipFile(archive_path) as archive:
        for entry in archive.infolist():
            path = Path(archive.extract(entry, source))
            mode = entry.external_attr >> 16 & 0o777
            if mode:
                path.chmod(mode)
