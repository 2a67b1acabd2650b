"""Chapter 5's figure script runs (``--quick``, so it never rots) and writes what the chapter quotes."""
import json
import os

from tests.test_downpour import mpiexec

SCRIPT = os.path.join("tutorials", "figures", "make_05_figures.py")


def test_make_05_figures_quick_writes_every_part_and_the_figures(tmp_path):
    done = mpiexec(4, SCRIPT, "--quick", "--out", str(tmp_path), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "05_measurements.json").read_text())
    assert set(results) == {"downpour", "warmstart", "ssp", "hogwild"}
    assert set(results["downpour"]) == {"adagrad", "sgd", "one replica"}
    for row in results["ssp"].values():                   # the bound, from the servers' logs
        assert row["s"] is None or max(row["clock_staleness"]) <= row["s"], row
    assert {row["p"] for row in results["hogwild"].values()} == {1, 2}
    for name in ("05_downpour.png", "05_staleness.png", "05_hogwild.png", "05_table.md"):
        assert (tmp_path / name).stat().st_size > 0, name
