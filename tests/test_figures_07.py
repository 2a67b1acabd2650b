"""Chapter 7's figure script runs (``--quick``, so it never rots), and the chapter quotes the numbers it
wrote (07_straggler.*, 07_easgd.*, 07_hierarchy.*, 07_compare.json).

Tolerance: each number as the chapter prints it (ms to 0.1, gaps to two significant figures, bytes
exact, percentages to the unit, accuracy means ± 95% t-intervals to 0.1); the claims made in words
("below every seed's", "the ranges overlap", "the intervals overlap", "the same iterates") are checked
on the measured values.
"""
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from tests.quoting import assert_quoted

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "tutorials" / "figures"
OUT = FIGURES / "out"                    # what the figure scripts wrote
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")


def chapter():
    return " ".join((ROOT / "tutorials" / "07_sandblaster_and_asynchrony.md").read_text().split())


def e(value):
    """2 significant figures as the chapter prints them: 1.5e-11, 6.0e-15."""
    return f"{value:.1e}".replace("e-0", "e-")


def test_make_07_figures_quick_writes_every_part(tmp_path):
    done = subprocess.run([sys.executable, str(FIGURES / "make_07_figures.py"), "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("07_compare.json", "07_compare.png", "07_straggler.md", "07_easgd.md", "07_hierarchy.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    compare = json.loads((tmp_path / "07_compare.json").read_text())
    assert compare["seeds"] == [0] and set(compare["runs"]) == {
        "serial L-BFGS (1 rank)", "Sandblaster L-BFGS (-n 4)", "Downpour SGD (-n 4, sgd)"}


def test_the_tables_are_the_generated_ones():
    text = chapter()
    for name in ("07_straggler.md", "07_easgd.md", "07_hierarchy.md"):
        assert " ".join((OUT / name).read_text().split()) in text, f"chapter 7's copy of {name} is stale"


def test_section_2_quotes_the_straggler_runs():
    runs = json.loads((OUT / "07_straggler.json").read_text())

    def ms(label):
        return [row["mean_batch_seconds"] * 1000 for row in runs[label]]

    def mean(label):
        return sum(ms(label)) / len(ms(label))
    none = mean("no straggler, push every 4")
    pairs = [(f"straggler x100, push every {k}, backups at 0.9", f"straggler x100, push every {k}, no backups")
             for k in (4, 1)]
    for backups, without in pairs:                                  # "every seed ... below every seed's"
        assert max(ms(backups)) < min(ms(without)), (backups, without)
    slow = [row["computed"]["3"] for label in runs if label.startswith("straggler x100") and "no backups" in label
            for row in runs[label]]
    mild = ms("straggler x20, push every 4, no backups"), ms("straggler x20, push every 4, backups at 0.9")
    assert min(mild[1]) > max(mild[0])                  # "every seed's batch with backups is slower"

    def percent_above(labels):                          # "lo to hi% longer than without a straggler"
        lo, hi = sorted(100 * (mean(label) / none - 1) for label in labels)
        return f"{lo:.0f} to {hi:.0f}%"
    straggling = f"{min(slow)} to {max(slow)}" if min(slow) < max(slow) else f"{min(slow)}"
    quoted = [f"(at most {max(ms(pairs[0][0])):.1f} ms against at least {min(ms(pairs[0][1])):.1f} ms, and "
              f"{max(ms(pairs[1][0])):.1f} against {min(ms(pairs[1][1])):.1f})",
              f"with backups a batch takes {percent_above([b for b, _ in pairs])} longer than without a straggler, "
              f"against {percent_above([w for _, w in pairs])} longer without backups",
              f"here to {percent_above([b for b, _ in pairs])} above no straggler",
              f"kept the straggler to {straggling} of the "
              f"{sum(runs['no straggler, push every 4'][0]['computed'].values())} portions",
              f"({min(mild[1]):.1f} to {max(mild[1]):.1f} ms with backups, {min(mild[0]):.1f} to {max(mild[0]):.1f} "
              "without)"]
    assert_quoted(quoted, chapter(), "chapter 7")


def test_section_3_claims_hold_on_the_runs():
    easgd = json.loads((OUT / "07_easgd.json").read_text())
    sync, async_ = (easgd[label] for label in easgd)
    accuracy = [[run["test_accuracy"] for run in runs] for runs in (sync, async_)]
    assert min(accuracy[0]) <= max(accuracy[1]) and min(accuracy[1]) <= max(accuracy[0])   # ranges overlap
    assert max(run["seconds"] for run in async_) < min(run["seconds"] for run in sync)     # "finished sooner"


def interval(accuracies):
    """mean ± half-width of the 95% t-interval, in %, as the chapter prints it (t = 4.303 for 3 seeds)."""
    values = [100 * a for a in accuracies]
    return statistics.mean(values), 4.303 * statistics.stdev(values) / math.sqrt(len(values))


def test_section_5_quotes_the_hierarchy_runs_and_its_claims_hold():
    hierarchy = json.loads((OUT / "07_hierarchy.json").read_text())
    assert set(hierarchy) == {"sgd", "adagrad"}
    quoted = []
    for optimizer, phrase in (("sgd", "and the grouped runs reach {g} against {f} flat"),
                              ("adagrad", "With Adagrad the grouped runs reach {g} against {f} flat")):
        flat, grouped = (hierarchy[optimizer][label] for label in hierarchy[optimizer])
        assert [r["seed"] for r in flat] == [r["seed"] for r in grouped] == [0, 1, 2]
        assert all(2 * g["updates"] == f["updates"] and 2 * g["root_bytes"] == f["root_bytes"]
                   for f, g in zip(flat, grouped))                                        # "halves exactly"
        assert flat[0]["root_bytes"] == flat[0]["updates"] * 2 * 4 * 6090
        (fm, fh), (gm, gh) = (interval([r["test_accuracy"] for r in rows]) for rows in (flat, grouped))
        assert fm - fh <= gm + gh and gm - gh <= fm + fh, optimizer                       # "the intervals overlap"
        quoted.append(phrase.format(g=f"{gm:.1f}% ± {gh:.1f}", f=f"{fm:.1f}% ± {fh:.1f}"))
    assert_quoted(quoted, chapter(), "chapter 7")


def test_section_4_quotes_the_comparison():
    result = json.loads((OUT / "07_compare.json").read_text())
    serial, sandblaster, downpour = (result["runs"][label] for label in
                                     ("serial L-BFGS (1 rank)", "Sandblaster L-BFGS (-n 4)", "Downpour SGD (-n 4, "
                                                                                             "sgd)"))
    seeds = [str(seed) for seed in result["seeds"]]
    assert seeds == ["0", "1", "2"]
    for seed in seeds:                                              # "the same iterates, to rounding"
        for a, b in zip(serial[seed], sandblaster[seed]):
            assert abs(a["gap"] - b["gap"]) <= 1e-3 * a["gap"] + 1e-17, (seed, a, b)

    def span(values, fmt):
        return f"{fmt(min(values))} to {fmt(max(values))}"
    below = [next(r["seconds"] for r in downpour[s] if r["gap"] < 1e-3) for s in seeds]
    tail = [r["gap"] for s in seeds for r in downpour[s][-10:]]
    quoted = [f"seed 0's optimal loss is {result['optimum_loss']['0']:.6f}",
              "seed 0's gaps " + ", ".join(e(r["gap"]) for r in serial["0"][:-1]) + f", {e(serial['0'][-1]['gap'])} "
                                                                                    "for both",
              f"its 4 epochs took {span([h[-1]['seconds'] for h in sandblaster.values()], lambda v: f'{v:.2f}')} s "
              f"against at most {max(h[-1]['seconds'] for h in serial.values()):.3f} s serially",
              f"below a gap of 1e-3 in {span(below, lambda v: f'{v:.2f}')} s",
              f"stay between {e(min(tail))} and {e(max(tail))} on every seed",
              f"after {span([h[-1]['bytes'] for h in sandblaster.values()], lambda v: f'{v:,}')} bytes Sandblaster "
              "is at "
              f"{span([h[-1]['gap'] for h in sandblaster.values()], e)}",
              f"Downpour after {downpour['0'][-1]['bytes']:,} bytes",
              f"at {span([h[-1]['gap'] for h in downpour.values()], e)}"]
    assert len({h[-1]["bytes"] for h in downpour.values()}) == 1
    assert min(h[-1]["gap"] for h in downpour.values()) > 1e9 * max(h[-1]["gap"] for h in sandblaster.values())
    assert_quoted(quoted, chapter(), "chapter 7")
