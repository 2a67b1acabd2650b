"""The book never reads a user's tuning file, and the benchmarks record the tuning their workers ran with.

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


def test_the_benches_record_the_tuning_their_workers_ran_with_not_the_parents(tmp_path):
    """--blas native starts the workers without a forced OpenBLAS kernel, so a file tuned under the forced
    one is refused there (another BLAS kernel): the JSON says the shipped defaults ran, as they did,
    not the tuning the parent process (which keeps the forced kernel) would accept."""
    forced = dict(os.environ, OPENBLAS_CORETYPE="Haswell", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    code = "import json; from minidl import tuning; print(json.dumps(tuning.machine()))"
    machine = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=forced, capture_output=True,
                                        text=True, timeout=60).stdout)
    assert machine["blas_core"] == "Haswell"
    path = tmp_path / "tuning.json"
    from minidl import tuning
    tuning.write_section(path, "minidl", {"machine": machine, "settings": {
        "block_bytes": 256 << 10, "column_bytes": 5 << 20, "layouts": {}, "winograd_min_channels": 32,
        "fft_min_kernel": 9}})
    env = dict(forced, MINIDL_TUNING=str(path))
    done = subprocess.run([sys.executable, "-m", "minidl.bench", "sweep", "--quick", "--no-torch", "--blas", "native",
                           "--rounds", "1", "--repeats", "1", "--json", str(tmp_path / "sweep.json")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    machine = json.loads((tmp_path / "sweep.json").read_text())[-1]["machine"]
    assert machine["tuning"].startswith("the shipped defaults") and machine["settings"]["block_bytes"] != 256 << 10
    done = subprocess.run([sys.executable, "-m", "algorithms.bench", "--quick", "--no-torch", "--blas", "native",
                           "--cases", "mlp:32", "--json", str(tmp_path / "ddp.json")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "ddp.json").read_text())
    assert all(row["tuning"].startswith("the shipped defaults") and row["settings"]["fft_min_kernel"] == 7
               for row in rows), rows
