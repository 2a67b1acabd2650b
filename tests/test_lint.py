"""The lint: ``ruff check`` (pyproject.toml's ``[tool.ruff]``: pyflakes, pycodestyle, import order, 120
columns) passes on the whole tree. CI runs it too (.ci/run); here it skips, saying so, where ruff is not
installed (it comes with the test extra: ``pip install -e ".[test]"``)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def ruff():
    """The ruff beside this Python (the virtual environment's), else the one on PATH, else None."""
    beside = Path(sys.executable).parent / "ruff"
    return str(beside) if beside.exists() else shutil.which("ruff")


def test_ruff_finds_nothing_in_the_tree():
    if ruff() is None:
        pytest.skip('ruff is not installed (pip install -e ".[test]" installs it)')
    done = subprocess.run([ruff(), "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_lint_sees_a_long_line_and_an_unsorted_import(tmp_path):
    if ruff() is None:
        pytest.skip('ruff is not installed (pip install -e ".[test]" installs it)')
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "module.py").write_text("import sys\nimport os\n\nprint(os, sys, '" + "x" * 120 + "')\n")
    done = subprocess.run([ruff(), "check", "--no-cache", "--output-format", "concise", "."], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "E501" in done.stdout and "I001" in done.stdout, done.stdout + done.stderr
