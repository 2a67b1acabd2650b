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


def excerpt_rows(text):
    """(p, bytes, algorithm, x MPI, model/meas) for every row of section 5's bench excerpt."""
    import re
    block = text[text.index("p = 2  # ping-pong fit"):]
    rows, p = [], None
    for line in block[:block.index("```")].splitlines():
        header = re.match(r"p = (\d+)", line)
        if header:
            p = int(header.group(1))
        row = re.match(r"\s+(\d+) (KiB|MiB) (\S+)\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+([\d.]+)$", line)
        if row:
            size = int(row.group(1)) << (10 if row.group(2) == "KiB" else 20)
            rows.append((p, size, row.group(3), float(row.group(4)), float(row.group(5))))
    return rows


def test_chapter_3_sentences_about_the_bench_excerpt_agree_with_its_rows():
    """The ranges the prose and the summary give are the min and max of the excerpt printed on the
    same page (two decimals, as printed); the excerpt itself is bench output pasted by hand."""
    text = " ".join((ROOT / "tutorials" / "03_collectives.md").read_text().split())
    rows = excerpt_rows((ROOT / "tutorials" / "03_collectives.md").read_text())
    assert len(rows) == 64                                   # 2 p x 8 sizes x 4 rows

    def span(selected, column):
        values = [row[column] for row in selected]
        return f"{min(values):.2f}-{max(values):.2f}"
    ours = [row for row in rows if row[2] != "mpi"]
    mpi = [row for row in rows if row[2] == "mpi"]
    mib = 1 << 20
    large = [row for row in ours if row[1] >= mib and row[2] in ("ring", "rabenseifner")]
    quoted = [f"ring and Rabenseifner run at {span(large, 3)}x MPI_Allreduce's time",
              f"clearly slower ({span([row for row in large if row[1] == 64 * mib], 3)}x",
              f"At 1 MiB it predicts {span([r for r in ours if r[1] == mib], 4)} of the measured time of our "
              f"algorithms ({span([r for r in mpi if r[1] == mib], 4)} of MPI's)",
              f"From 4 MiB up it predicts only {span([r for r in ours if r[1] >= 4 * mib], 4)} of ours "
              f"({span([r for r in mpi if r[1] >= 4 * mib], 4)} of MPI's)",
              f"predicts {span(rows, 4)} of the times measured in section 5's excerpt"]
    missing = [sentence for sentence in quoted if sentence not in text]
    assert not missing, missing


def test_chapter_3_quotes_the_mpich_measurement_its_script_wrote():
    """Section 5's MPICH paragraph against figures/03_mpich_p2.json (collectives.mpich_choice), in ms
    to one decimal as printed; the differences are taken before rounding."""
    runs = {run["setting"]: run for run in json.loads((ROOT / "tutorials" / "figures" / "03_mpich_p2.json").read_text())}
    text = " ".join((ROOT / "tutorials" / "03_collectives.md").read_text().split())

    def ms(seconds):
        return f"{seconds * 1000:.1f}"
    default, rsag = runs["default (auto)"], runs["reduce_scatter_allgather"]
    temporary = default["fresh_temporary"] - default["reused_temporary"]
    reduction = default["mpi_reduce_local"] - default["numpy_add"]
    quoted = [f"its default {ms(default['mpi_seconds'])} ms against {ms(default['ring_seconds'])} ms "
              f"({default['mpi_seconds'] / default['ring_seconds']:.2f}x)",
              f"reduce_scatter_allgather (Rabenseifner's algorithm, section 2) {ms(rsag['mpi_seconds'])} against "
              f"{ms(rsag['ring_seconds'])}",
              f"its ring {ms(runs['ring']['mpi_seconds'])} against {ms(runs['ring']['ring_seconds'])}",
              f"recursive doubling {ms(runs['recursive_doubling']['mpi_seconds'])} against "
              f"{ms(runs['recursive_doubling']['ring_seconds'])}",
              f"took {ms(default['fresh_temporary'])} ms against {ms(default['reused_temporary'])} ms for a reused one "
              f"(the cost of touching new memory, {ms(temporary)} ms)",
              f"took {ms(default['mpi_reduce_local'])} ms against numpy's add's {ms(default['numpy_add'])} ms on the "
              f"same 32 MiB ({ms(reduction)} ms)",
              f"Together {ms(temporary + reduction)} ms",
              f"of the {ms(rsag['mpi_seconds'] - rsag['ring_seconds'])} ms between MPICH's reduce_scatter_allgather"]
    missing = [sentence for sentence in quoted if sentence not in text]
    assert not missing, missing
    assert all(run["mpi_seconds"] > run["ring_seconds"] for run in runs.values())   # "every one ... slower"
    assert 0.6 < (temporary + reduction) / (rsag["mpi_seconds"] - rsag["ring_seconds"]) < 0.72   # "two thirds"
