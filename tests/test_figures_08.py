"""Chapter 8's figure script runs (``--quick``, so it never rots), and the chapter quotes the numbers it
wrote (08_training.json, 08_table.md, 08_comparisons.md, 08_pays.json, 08_pays.md).

Tolerance: each number as the chapter prints it (accuracies to 0.1 point with a 95% t interval over
the 5 seeds, t = 2.776; differences paired by seed to 0.01 point; losses to two decimals; bytes
exact; ms to two decimals; rates to the digits printed); the claims made in words ("inside the
noise", "outside the noise") are checked on the measured values: inside when the paired interval
holds 0.
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
STEPS_PER_EPOCH = math.ceil(1438 / (4 * 32))          # the digits' 1438 training images, p = 4, batch 32


def chapter():
    return " ".join((ROOT / "tutorials" / "08_communicating_less.md").read_text().split())


def test_make_08_figures_quick_writes_both_parts(tmp_path):
    done = subprocess.run([sys.executable, str(FIGURES / "make_08_figures.py"), "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("08_training.json", "08_table.md", "08_comparisons.md", "08_feedback.png", "08_pays.json",
                 "08_pays.md", "08_pays.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    training = json.loads((tmp_path / "08_training.json").read_text())
    assert training["seeds"] == [0] and all(runs[0] is not None for runs in training["runs"].values())


def test_the_tables_are_the_generated_ones():
    text = chapter()
    for name in ("08_table.md", "08_comparisons.md", "08_pays.md"):
        assert " ".join((OUT / name).read_text().split()) in text, f"chapter 8's copy of {name} is stale"


T_4 = 2.776                                            # Student t, two-sided 95%, 4 degrees of freedom


def training_runs():
    training = json.loads((OUT / "08_training.json").read_text())
    assert training["seeds"] == [0, 1, 2, 3, 4] and training["epochs"] == 20
    return training


def final(training, label, key="test_accuracy"):
    return [history[-1][key] for history in training["runs"][label]]


def paired(training, a, b):
    """(mean, half-width) of a - b in points, seed by seed: the chapter's test of 'inside the noise'."""
    differences = [100 * (x - y) for x, y in zip(final(training, a), final(training, b))]
    return statistics.mean(differences), T_4 * statistics.stdev(differences) / math.sqrt(len(differences))


def test_the_comparisons_are_the_paired_differences_and_their_verdicts():
    training = training_runs()
    rows = [line.split(" | ") for line in (OUT / "08_comparisons.md").read_text().splitlines()[2:]]
    assert len(rows) >= 15
    for a, b, shown, verdict in ((r[0].strip("| "), r[1], r[2], r[3].strip(" |")) for r in rows):
        mean, half = paired(training, a, b)
        assert shown == f"{mean:+.2f} ± {half:.2f}", (a, b, shown)
        expected = ("the same on every seed" if final(training, a) == final(training, b) else
                    "inside the noise" if abs(mean) <= half else
                    "a higher, outside the noise" if mean > 0 else "a lower, outside the noise")
        assert verdict == expected, (a, b, verdict)


def test_sections_2_4_and_the_summary_quote_the_training_runs():
    training = training_runs()

    def ci(label):
        values = [100 * a for a in final(training, label)]
        return f"{statistics.mean(values):.1f}% ± {T_4 * statistics.stdev(values) / math.sqrt(len(values)):.1f}"

    def per_step(label, batch=32):
        steps = training["epochs"] * math.ceil(1438 / (4 * batch))
        return f"{round(statistics.mean(final(training, label, 'bytes')) / (steps * 4)):,}"

    def seeds(label):
        return [f"{100 * a:.1f}" for a in final(training, label)]

    def listed(label):
        values = seeds(label)
        return f"{', '.join(values[:-1])} and {values[-1]}%"

    def diff(a, b):
        return "{:+.2f} ± {:.2f}".format(*paired(training, a, b)).replace("+-", "-")

    def losses(label):
        values = final(training, label, "train_loss")
        return f"{min(values):.2f} to {max(values):.2f}"
    topk, no_res, none = "topk 1% + residuals", "topk 1%, no residuals", "none"
    loss_ratio = [b / a for a, b in zip(final(training, topk, "train_loss"), final(training, no_res, "train_loss"))]
    lost = [100 * (a - b) for a, b in zip(final(training, topk), final(training, no_res))]
    ef, no_ef = seeds("onebit + EF"), seeds("onebit, no EF")
    worst_none = min(final(training, "none, momentum 0.9"))
    below = sum(a < worst_none for a in final(training, "onebit + EF, momentum 0.9"))
    quoted = [
        f"With residuals: {ci(topk)}, against the uncompressed {ci(none)} (difference {diff(topk, none)} points, "
        f"inside the noise), sending {per_step(topk)} bytes per step and rank instead of {per_step(none)} "
        f"({int(float(per_step(none).replace(',', '')) / float(per_step(topk).replace(',', '')))}x fewer)",
        f"Without: {ci(no_res)}; seed by seed {listed(no_res)} against {listed(topk)} with residuals "
        f"({diff(no_res, topk)} points, outside the noise)",
        f"a final training loss {min(loss_ratio):.0f} to {max(loss_ratio):.0f} times higher "
        f"({losses(no_res)} against {statistics.mean(final(training, topk, 'train_loss')):.2f})",
        f"{ci('onebit + EF')} against {ci('onebit, no EF')}. With 5 seeds the difference, "
        f"{diff('onebit + EF', 'onebit, no EF')} points, is outside the noise",
        "seed by seed " + ", ".join(f"{a}/{b}" for a, b in zip(ef, no_ef)),
        f"{losses('onebit + EF')} with feedback, {losses('onebit, no EF')} without",
        f"QSGD with s = 127 (8 bits an entry, {per_step('qsgd s=127 (8 bits)')} bytes per step and rank",
        f"with s = 1 (2 bits, {per_step('qsgd s=1 (2 bits)')})",
        f"and TernGrad ({per_step('terngrad')})",
        f"from {diff('rounding 2 bits', none)} for rounding with 2 bits to {diff('qsgd s=127 (8 bits)', none)} for "
        f"QSGD with s = 127",
        f"against rounding with 2 bits its difference is {diff('qsgd s=1 (2 bits)', 'rounding 2 bits')} points",
        f"at 10% with residuals it reaches {ci('randomk 10% + residuals')}, inside the noise",
        f"({listed('randomk 1% + residuals')}: {ci('randomk 1% + residuals')}), below top-k at the same density by "
        f"{diff('randomk 1% + residuals', topk)} points, outside the noise",
        f"({ci('topk 1% + residuals, momentum 0.9')} against {ci('none, momentum 0.9')}; "
        f"{diff('topk 1% + residuals, momentum 0.9', 'none, momentum 0.9')} points, just outside the noise)",
        f"ends at {listed('onebit + EF, momentum 0.9').replace(' and ', ' and ')} on the five seeds "
        f"({ci('onebit + EF, momentum 0.9')}: one seed fell so far that the difference, "
        f"{diff('onebit + EF, momentum 0.9', 'none, momentum 0.9')} points, is inside the noise)",
        f"does not learn ({ci('randomk 10% + residuals, momentum 0.9')}, near the 10% of guessing)",
        f"sends {per_step('MLP b=32, server factors (auto)')} bytes per step and rank against the allreduce's "
        f"{per_step('MLP b=32, allreduce')}",
        f"drop from {per_step('MLP b=8, allreduce', 8)} to {per_step('MLP b=8, factors (auto)', 8)}",
        f"accuracy is the same on every seed ({ci('MLP b=8, factors (auto)')}",
        f"without residuals it loses {min(lost):.0f} to {max(lost):.0f} points per seed",
        f"1-bit ends below the uncompressed run's worst seed on {below} of 5 seeds",
    ]
    assert_quoted(quoted, chapter(), "chapter 8")
    # the words: which differences are inside the noise (the paired interval holds 0) and which are not
    inside = [(topk, none), ("qsgd s=127 (8 bits)", none), ("qsgd s=1 (2 bits)", none), ("rounding 8 bits", none),
              ("rounding 2 bits", none), ("terngrad", none), ("qsgd s=1 (2 bits)", "rounding 2 bits"),
              ("randomk 10% + residuals", none), ("onebit + EF, momentum 0.9", "none, momentum 0.9")]
    outside = [(no_res, topk), ("onebit + EF", "onebit, no EF"), ("randomk 1% + residuals", topk),
               ("topk 1% + residuals, momentum 0.9", "none, momentum 0.9")]
    for a, b in inside:
        mean, half = paired(training, a, b)
        assert abs(mean) <= half, (a, b, mean, half)
    for a, b in outside:
        mean, half = paired(training, a, b)
        assert abs(mean) > half, (a, b, mean, half)
    # "all end within 1 point of the uncompressed run"; "does not learn": every seed near chance
    for label in ("qsgd s=127 (8 bits)", "qsgd s=1 (2 bits)", "rounding 8 bits", "rounding 2 bits", "terngrad"):
        assert abs(statistics.mean(final(training, label)) - statistics.mean(final(training, none))) <= 0.01, label
    assert max(final(training, "randomk 10% + residuals, momentum 0.9")) < 0.25
    # "and so is the training loss": 1-bit's losses with and without feedback do not overlap
    assert max(final(training, "onebit + EF", "train_loss")) < min(final(training, "onebit, no EF", "train_loss"))
    assert final(training, "MLP b=8, factors (auto)") == final(training, "MLP b=8, allreduce")


def test_section_5_quotes_the_bytes_and_the_timings():
    result = json.loads((OUT / "08_pays.json").read_text())
    two, four = result["2"], result["4"]
    assert two["launches"] == four["launches"] == 5
    biggest, biggest4 = two["records"][-1], four["records"][-1]
    sent, sent4 = biggest["bytes"], biggest4["bytes"]
    ms = {(p, r["n"], name): r["measured"][name] for p, res in result.items() for r in res["records"]
          for name in r["measured"]}

    def timing(p, n, name):
        mean, half = ms[(p, n, name)]
        return f"{mean * 1e3:.2f} ± {half * 1e3:.2f}"
    # bytes: exact, and the formulas' (k = ceil(n / 100) pairs of 8 bytes per round, lg p rounds at p = 2;
    # QSGD: n bytes of 8-bit codes and 4 bytes per bucket of 512; the ring 2 (p - 1) / p 4 n)
    n = biggest["n"]
    assert sent == {"dense ring": 4 * n, "topk 1% + sparse": 8 * -(-n // 100), "qsgd 8 + allgather": n + 4 * (n // 512)}
    assert sent4["qsgd 8 + allgather"] == 3 * sent["qsgd 8 + allgather"] and sent4["dense ring"] == 6 * n
    topk_ns = biggest["compress_seconds"]["topk"][0] / n * 1e9
    threshold = topk_ns / 6                                   # ns per byte: 6 beta = compression time per entry
    ratios = [r["measured"]["dense ring"][0] / r["model"]["dense ring"][0] for r in two["records"]]
    ratios4 = {r["n"]: r["measured"]["dense ring"][0] / r["model"]["dense ring"][0] for r in four["records"]}
    worst4 = max(ratios4, key=ratios4.get)
    quoted = [f"top-k at 1% sends {sent['topk 1% + sparse']:,} bytes per rank against the ring's "
              f"{sent['dense ring']:,} "
              f"({100 * sent['topk 1% + sparse'] / sent['dense ring']:.0f}%), and QSGD {sent['qsgd 8 + allgather']:,}",
              f"the allgather sends p - 1 = 3 messages, {sent4['qsgd 8 + allgather']:,} bytes, half of the ring's "
              f"{sent4['dense ring']:,}",
              f"the ring's own times spread widely ({timing('4', 16384, 'dense ring')} ms at 16,384 entries)",
              f"({timing('4', 1024, 'topk 1% + sparse')} against {timing('4', 1024, 'dense ring')} ms at 1,024 "
              "entries)",
              f"beta is {two['beta'][0] * 1e9:.2f} ± {two['beta'][1] * 1e9:.2f} ns per byte at p = 2 (shared memory, "
              f"about {1 / two['beta'][0] / 1e9:.1f} GB/s)",
              f"top-k costs about {topk_ns:.0f} ns per entry to compress (a partial sort of 1M entries took "
              f"{biggest['compress_seconds']['topk'][0] * 1e3:.1f} ± "
              f"{biggest['compress_seconds']['topk'][1] * 1e3:.1f} ms)",
              f"QSGD about {round(biggest['compress_seconds']['qsgd'][0] / n * 1e9, -1):.0f} ns per entry in NumPy",
              f"when `6 beta > {topk_ns:.0f} ns`, beta above about {threshold:.1f} ns/B: a link slower than about "
              f"{1 / threshold:.1f} GB/s ({8 / threshold:.0f} Gb/s)",
              f"misses the dense ring by up to {max(ratios):.0f}x at p = 2",
              f"({ratios4[worst4]:.0f}x at {worst4:,} entries)",
              f"(beta ~ {two['beta'][0] * 1e9:.2f} to {four['beta'][0] * 1e9:.2f} ns/B)",
              f"below about {1 / threshold:.1f} GB/s"]
    assert_quoted(quoted, chapter(), "chapter 8")

    # the words, on the intervals: "slower outside the noise" = the intervals do not overlap
    def slower(p, n, name):
        (c, c_half), (d, d_half) = ms[(p, n, name)], ms[(p, n, "dense ring")]
        return c - c_half > d + d_half
    sizes = [r["n"] for r in two["records"]]
    for p, res in result.items():                               # "nowhere does compression pay outside the noise"
        for n in sizes:
            for name in ("topk 1% + sparse", "qsgd 8 + allgather"):
                (c, c_half), (d, d_half) = ms[(p, n, name)], ms[(p, n, "dense ring")]
                assert not c + c_half < d - d_half, (p, n, name)
    assert all(slower("2", n, name) for n in sizes for name in ("topk 1% + sparse", "qsgd 8 + allgather"))
    assert [slower("4", n, "qsgd 8 + allgather") for n in sizes] == [n >= 262144 for n in sizes]
    assert [slower("4", n, "topk 1% + sparse") for n in sizes] == [n >= 1048576 for n in sizes]
    # "it also overestimates QSGD at the larger sizes"
    assert all(r["model"]["qsgd 8 + allgather"][0] > r["measured"]["qsgd 8 + allgather"][0]
               for res in result.values() for r in res["records"] if r["n"] >= 262144)
