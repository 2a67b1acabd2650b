"""Chapter 3's figure script runs (``--quick``, so it never rots), and the chapter quotes the
wall-clock numbers it wrote (tutorials/figures/03_spacetime_wall.json), to the digits quoted."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tutorials" / "figures" / "make_03_figures.py"
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def test_make_03_figures_quick_writes_every_figure_and_its_json(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("naive", "tree", "butterfly", "ring", "rabenseifner", "ring_wall"):
        assert (tmp_path / f"03_spacetime_{name}.png").stat().st_size > 0, name
    wall = json.loads((tmp_path / "03_spacetime_wall.json").read_text())
    assert wall["bytes"] == 1 << 20 and wall["p"] == 4
    assert len(wall["warm_after_barrier"]) == len(wall["p2_warm_after_barrier"]) == 5
    for row in [wall["first_call_no_barrier"], *wall["warm_after_barrier"], *wall["p2_warm_after_barrier"]]:
        assert 0 <= row["start_skew_us"] <= row["span_us"], row
    for p in (2, 4):
        runs = json.loads((tmp_path / f"03_bench_p{p}.json").read_text())
        assert len(runs) == 1                               # --quick: one launch
        records = runs[0]
        assert {r["p"] for r in records} == {p}
        for nbytes in {r["bytes"] for r in records}:       # every size has MPI's row, the ratios' base
            assert {r["algorithm"] for r in records if r["bytes"] == nbytes} >= {"mpi", "ring", "rabenseifner"}
        assert (tmp_path / f"03_bench_p{p}.png").stat().st_size > 0


def test_chapter_3_quotes_the_wall_clock_numbers_its_script_wrote():
    """Tolerance: each number as the chapter prints it, rounded to 0.1 ms from the JSON's microseconds."""
    wall = json.loads((ROOT / "tutorials" / "figures" / "03_spacetime_wall.json").read_text())
    text = " ".join((ROOT / "tutorials" / "03_collectives.md").read_text().split())

    def ms(us):
        return f"{us / 1000:.1f}"

    def spread(rows, key):
        values = [row[key] for row in rows]
        return f"{ms(min(values))}-{ms(max(values))} ms"

    cold = wall["first_call_no_barrier"]
    quoted = [f"spans {spread(wall['warm_after_barrier'], 'span_us')}",
              f"first sends {spread(wall['warm_after_barrier'], 'start_skew_us')} apart",
              f"and {ms(wall['untraced_median_us'])} ms untraced",
              f"spans {spread(wall['p2_warm_after_barrier'], 'span_us')} with first sends "
              f"{spread(wall['p2_warm_after_barrier'], 'start_skew_us')} apart",
              f"({ms(wall['p2_untraced_median_us'])} ms untraced)",
              f"it spanned {ms(cold['span_us'])} ms, {ms(cold['start_skew_us'])} ms of it start skew"]
    missing = [sentence for sentence in quoted if sentence not in text]
    assert not missing, missing
