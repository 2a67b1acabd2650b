"""Chapter 8's figure script runs (``--quick``, so it never rots), and the chapter quotes the numbers it
wrote (08_training.json, 08_table.md, 08_pays.json, 08_pays.md).

Tolerance: each number as the chapter prints it (accuracies to 0.1 point with a 95% t interval over
the 3 seeds, t = 4.303; losses to two decimals; bytes exact; ms to two decimals; rates to the digits
printed); the claims made in words are checked on the measured values.
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
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")
STEPS_PER_EPOCH = math.ceil(1438 / (4 * 32))          # the digits' 1438 training images, p = 4, batch 32


def chapter():
    return " ".join((ROOT / "tutorials" / "08_communicating_less.md").read_text().split())


def test_make_08_figures_quick_writes_both_parts(tmp_path):
    done = subprocess.run([sys.executable, str(FIGURES / "make_08_figures.py"), "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("08_training.json", "08_table.md", "08_feedback.png", "08_pays.json", "08_pays.md", "08_pays.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    training = json.loads((tmp_path / "08_training.json").read_text())
    assert training["seeds"] == [0] and all(runs[0] is not None for runs in training["runs"].values())


def test_the_tables_are_the_generated_ones():
    text = chapter()
    for name in ("08_table.md", "08_pays.md"):
        assert " ".join((FIGURES / name).read_text().split()) in text, f"chapter 8's copy of {name} is stale"


def test_sections_2_4_and_the_summary_quote_the_training_runs():
    training = json.loads((FIGURES / "08_training.json").read_text())
    assert training["seeds"] == [0, 1, 2] and training["epochs"] == 20
    runs = training["runs"]

    def final(label, key="test_accuracy"):
        return [history[-1][key] for history in runs[label]]

    def ci(label):
        values = [100 * a for a in final(label)]
        return f"{statistics.mean(values):.1f}% ± {4.303 * statistics.stdev(values) / math.sqrt(3):.1f}"

    def per_step(label, batch=32):
        steps = training["epochs"] * math.ceil(1438 / (4 * batch))
        return f"{round(statistics.mean(final(label, 'bytes')) / (steps * 4)):,}"

    def seeds(label):
        return [f"{100 * a:.1f}" for a in final(label)]
    topk, no_res, none = "topk 1% + residuals", "topk 1%, no residuals", "none"
    loss_ratio = [b / a for a, b in zip(final(topk, "train_loss"), final(no_res, "train_loss"))]
    lost = [100 * (a - b) for a, b in zip(final(topk), final(no_res))]
    ef, no_ef = seeds("onebit + EF"), seeds("onebit, no EF")
    quoted = [
        f"With residuals: {ci(topk)}, the same mean as the uncompressed {ci(none)}, sending {per_step(topk)} bytes per "
        f"step and rank instead of {per_step(none)} ({int(float(per_step(none).replace(',', '')) / float(per_step(topk).replace(',', '')))}x fewer)",
        f"Without: {ci(no_res)}; seed by seed {', '.join(seeds(no_res)[:2])} and {seeds(no_res)[2]}% against "
        f"{', '.join(seeds(topk)[:2])} and {seeds(topk)[2]}% with residuals",
        f"a final training loss {min(loss_ratio):.0f} to {max(loss_ratio):.0f} times higher "
        f"({min(final(no_res, 'train_loss')):.2f} to {max(final(no_res, 'train_loss')):.2f} against "
        f"{statistics.mean(final(topk, 'train_loss')):.2f})",
        f"{ci('onebit + EF')} against {ci('onebit, no EF')}",
        "seed by seed " + ", ".join(f"{a}/{b}" for a, b in zip(ef, no_ef)),
        f"{min(final('onebit + EF', 'train_loss')):.2f} to {max(final('onebit + EF', 'train_loss')):.2f} with feedback, "
        f"{min(final('onebit, no EF', 'train_loss')):.2f} to {max(final('onebit, no EF', 'train_loss')):.2f} without",
        f"qsgd with 8 bits ({per_step('qsgd 8 bits')} bytes per step and rank",
        f"with 2 bits ({per_step('qsgd 2 bits')}) and TernGrad ({per_step('terngrad')})",
        f"at 10% with residuals it reaches {ci('randomk 10% + residuals')}; at 1% it does not learn in 20 epochs "
        f"({ci('randomk 1% + residuals')})",
        f"({ci('topk 1% + residuals, momentum 0.9')} against {ci('none, momentum 0.9')}, inside the noise)",
        f"ends at {', '.join(seeds('onebit + EF, momentum 0.9')[:2])} and {seeds('onebit + EF, momentum 0.9')[2]}%",
        f"does not learn ({ci('randomk 10% + residuals, momentum 0.9')})",
        f"sends {per_step('MLP b=32, server factors (auto)')} bytes per step and rank against the allreduce's "
        f"{per_step('MLP b=32, allreduce')}",
        f"drop from {per_step('MLP b=8, allreduce', 8)} to {per_step('MLP b=8, factors (auto)', 8)}",
        f"accuracy is the same on every seed ({ci('MLP b=8, factors (auto)')}",
        f"without residuals it loses {min(lost):.0f} to {max(lost):.0f} points per seed",
    ]
    assert_quoted(quoted, chapter(), "chapter 8")
    # words: qsgd and TernGrad within 0.5 points of the uncompressed mean; factors give the same accuracy
    for label in ("qsgd 8 bits", "qsgd 2 bits", "terngrad"):
        assert abs(statistics.mean(final(label)) - statistics.mean(final(none))) <= 0.005, label
    assert final("MLP b=8, factors (auto)") == final("MLP b=8, allreduce")
    momentum = final("onebit + EF, momentum 0.9")
    assert sum(a < min(final("none, momentum 0.9")) - 0.05 for a in momentum) == 2      # "unstable on 2 seeds of 3"


def test_section_5_quotes_the_timings():
    result = json.loads((FIGURES / "08_pays.json").read_text())
    two, four = result["2"], result["4"]
    small = four["records"][0]
    biggest = two["records"][-1]
    ratios = [r["measured"]["dense ring"] / r["model"]["dense ring"] for r in two["records"]]
    quoted = [f"({small['measured']['topk 1% + sparse'] * 1e3:.2f} against {small['measured']['dense ring'] * 1e3:.2f} ms "
              f"at {small['n']:,} entries)",
              f"beta is {two['beta'] * 1e9:.2f} ns per byte at p = 2 (shared memory, about {1 / two['beta'] / 1e9:.1f} GB/s)",
              f"top-k costs about {biggest['compress_seconds']['topk'] / biggest['n'] * 1e9:.0f} ns per entry to compress "
              f"(a partial sort of 1M entries took {biggest['compress_seconds']['topk'] * 1e3:.1f} ms)",
              f"about {round(biggest['compress_seconds']['qsgd'] / biggest['n'] * 1e9, -1):.0f} ns per entry in NumPy",
              f"misses the dense ring by up to {max(ratios):.0f}x at p = 2",
              f"(beta ~ {two['beta'] * 1e9:.1f} to {four['beta'] * 1e9:.1f} ns/B)"]
    assert_quoted(quoted, chapter(), "chapter 8")
    # "does not pay, except at p = 4 for small vectors": the dense ring is fastest wherever it is not small p = 4
    for p, r in ((p, r) for p, res in result.items() for r in res["records"]):
        best = min(r["measured"], key=r["measured"].get)
        assert best == "dense ring" or (p == "4" and r["n"] <= 16384), (p, r["n"], best)
