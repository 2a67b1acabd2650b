"""The book never reads a user's tuning file: every figure script runs on the shipped defaults.

A reader who ran ``python -m minidl.tune`` has ~/.config/minidl/tuning.json (or MINIDL_TUNING set):
a figure script that read it would print another machine's block size, layouts and thresholds into
the chapter's numbers, with other last bits, and a broken one would stop the script. The test suite
runs with MINIDL_TUNING=none (conftest.py); these tests take it away, as a reader's shell has it.
"""
import json
import os
import re
import subprocess
import sys

from tests.helpers import ROOT

FIGURES = ROOT / "tutorials" / "figures"
PROJECT = re.compile(r"^(?:from|import) (?:minidl|collectives|algorithms|make_\w+)\b", re.M)
SET = 'os.environ["MINIDL_TUNING"] = "none"'


def test_every_figure_script_sets_the_shipped_defaults_before_it_imports_the_project():
    """Before its first import of minidl, collectives, algorithms or another figure script (which read
    the file at import), and so for every process it starts (they inherit the environment)."""
    for script in sorted(FIGURES.glob("make_*.py")):
        text = script.read_text()
        first = PROJECT.search(text)
        assert SET in text, f"{script.name} does not set {SET}"
        assert first is None or text.index(SET) < first.start(), f"{script.name} imports the project before {SET}"


def test_a_figure_script_runs_on_the_shipped_defaults_under_a_users_broken_tuning_file(tmp_path):
    config = tmp_path / "config"
    (config / "minidl").mkdir(parents=True)
    (config / "minidl" / "tuning.json").write_text("{oops")
    env = {key: value for key, value in os.environ.items() if key != "MINIDL_TUNING"}
    env.update(XDG_CONFIG_HOME=str(config), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(FIGURES / "make_01_figures.py"), "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "tuning" not in done.stderr, done.stderr[-2000:]
    assert any(json.loads(path.read_text()) for path in tmp_path.glob("*.json"))
