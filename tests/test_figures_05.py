"""Chapter 5's figure script runs (``--quick``, so it never rots) and writes what the chapter quotes.

Every ± in the chapter is the mean ± the half-width of the 95% t interval over the seeds.
"""
import json
import os

import pytest

from tests.helpers import mpiexec

SCRIPT = os.path.join("tutorials", "figures", "make_05_figures.py")
T_975 = {2: 4.303, 4: 2.776}           # t's 97.5% point for 3 and 5 seeds


def half(cell):
    """The half-width of the 95% t interval of the mean of the cell's n seeds."""
    return T_975[cell["n"] - 1] * cell["std"] / cell["n"] ** 0.5


@pytest.mark.needs("1.1", "1.2", "1.3", "1.5", "5.1", "5.2", "5.3", "5.4", "5.5", "5.6")
def test_make_05_figures_quick_writes_every_part_and_the_figures(tmp_path):
    done = mpiexec(4, SCRIPT, "--quick", "--out", str(tmp_path), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "05_measurements.json").read_text())
    assert set(results) == {"downpour", "warmstart", "nfetch", "ssp", "hogwild", "meta"}
    assert set(results["downpour"]) == {"adagrad", "sgd", "one replica"}
    for row in results["ssp"].values():                   # the bound, from the servers' logs
        assert row["s"] is None or max(row["clock_staleness"]) <= row["s"], row
    assert {row["p"] for row in results["hogwild"].values()} == {1, 2}
    for name in ("05_downpour.png", "05_staleness.png", "05_hogwild.png", "05_table.md"):
        assert (tmp_path / name).stat().st_size > 0, name


def test_chapter_5_quotes_the_numbers_its_script_wrote():
    """Every measured number in chapter 5's tables and sentences, formatted from 05_measurements.json."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "tutorials", "figures", "out", "05_measurements.json")) as file:
        m = json.load(file)
    with open(os.path.join(root, "tutorials", "05_parameter_servers.md")) as file:
        text = file.read()

    def pct(c, spread=True):
        return f"{100 * c['mean']:.1f}% ± {100 * half(c):.1f}" + (
            f" [{100 * c['min']:.1f}, {100 * c['max']:.1f}]" if spread else "")

    def sec(c, spread=True):
        return f"{c['mean']:.2f} ± {half(c):.2f}" + (f" [{c['min']:.2f}, {c['max']:.2f}]" if spread else "")

    quoted = []
    for label, row in m["downpour"].items():
        assert row["reached_90"] == row["final_accuracy"]["n"] == 5, label
        quoted.append(f"| {pct(row['final_accuracy'])} | {sec(row['seconds_to_90'])} |")
    for k, name in (("0", "no warm start"), ("20", "`--warm-start-steps 20`")):
        row = m["warmstart"][k]
        quoted.append(f"| {name} | {pct(row['first_epoch_accuracy'])} | {pct(row['final_accuracy'])} | "
                      f"{sec(row['seconds'])} |")
    for key, name in (("none", "no straggler"), ("straggler", "straggler")):
        for s in ("0", "2", "8", "inf"):
            row = m["ssp"][f"{key} s={s}"]
            quoted.append(f"| {name}, s = {s} | {row['max_clock_staleness']} | {sec(row['wait_fast_workers'])} | "
                          f"{sec(row['seconds'], spread=False)} |")
    nfetch = m["nfetch"]
    for n in ("1", "4", "16"):
        row = nfetch[n]
        assert row["pushes"] == row["fetches"] == [row["pushes"][0]] * 5, row       # "the same on every seed"
        quoted.append(f"| n = {n} | {row['pushes'][0]} | {sec(row['staleness'])} | {pct(row['accuracy'])} |")
    quoted += [f"{nfetch['1']['pushes'][0]}, {nfetch['4']['pushes'][0]} and {nfetch['16']['pushes'][0]} pushes",
               "it stays near 2 (" + ", ".join(f"{nfetch[n]['staleness']['mean']:.2f}" for n in ("1", "4", "16")),
               f"fell from {100 * nfetch['1']['accuracy']['mean']:.1f}% to "
               f"{100 * nfetch['4']['accuracy']['mean']:.1f}% "
               f"and {100 * nfetch['16']['accuracy']['mean']:.1f}%"]
    # apart
    assert all(nfetch[a]["accuracy"]["min"] > nfetch[b]["accuracy"]["max"] for a, b in (("1", "4"), ("4", "16")))
    assert all(abs(nfetch[n]["staleness"]["mean"] - 2) < 0.5 for n in nfetch)                        # "near 2"
    assert [nfetch[n]["pushes"][0] for n in ("1", "4", "16")] == [135, 36, 9]                          # 45 steps each
    for s in ("2", "8"):                                  # "reached even without a straggler"
        assert m["ssp"][f"none s={s}"]["max_clock_staleness"] == int(s)
    quoted += [f"and {m['ssp']['straggler s=inf']['max_clock_staleness']} without a bound",
               f"with no bound was {m['ssp']['none s=inf']['max_clock_staleness']} in these runs",
               f"({pct(m['ssp']['straggler s=0']['accuracy'], spread=False)} both times)"]
    assert m["ssp"]["straggler s=0"]["accuracy"] == m["ssp"]["none s=0"]["accuracy"]      # s = 0: the same bits
    h = m["hogwild"]
    for problem, name in (("sparse", "sparse"), ("dense", "CNN")):
        for p in (1, 2, 4):
            row = h[f"{problem} p={p}"]
            e = row["examples_per_second"]
            quoted.append(f"| {name}, p = {p} | {e['mean']:.0f} ± {half(e):.0f} | "
                          f"{row['examples_per_second_per_process']['mean']:.0f} | {sec(row['seconds_to_target'])} |")

    def speedup(problem, p):
        return h[f"{problem} p={p}"]["examples_per_second"]["mean"] / h[f"{problem} p=1"]["examples_per_second"]["mean"]
    one = h["sparse p=1"]["examples_per_second"]
    quoted += [f"on average {speedup('sparse', 2):.1f} and {speedup('sparse', 4):.1f} times the examples per second",
               f"ranged from {one['min']:.0f} to {one['max']:.0f}",
               f"({h['sparse p=1']['final']['mean'] * 1e4:.1f}e-4 to {h['sparse p=4']['final']['mean'] * 1e4:.1f}e-4)",
               f"{h['dense p=2']['staleness_mean']['mean']:.2f} (p = 2) to "
               f"{h['dense p=4']['staleness_mean']['mean']:.2f}",
               f"({pct(h['dense p=4']['final'], spread=False)} at p = 4 against "
               f"{pct(h['dense p=1']['final'], spread=False)} for one process)",
               f"({m['ssp']['straggler s=0']['wait_fast_workers']['mean']:.2f} s against "
               f"{m['ssp']['none s=0']['wait_fast_workers']['mean']:.2f} s without a straggler)",
               f"the ranges only touch ({100 * m['warmstart']['0']['final_accuracy']['max']:.1f}%)"]
    # the claims made in words: the times to 90% within a few hundredths, every accuracy range overlapping
    times = [row["seconds_to_90"]["mean"] for row in m["downpour"].values()]
    quoted.append(f"differ by {max(times) - min(times):.2f} s")
    finals = [row["final_accuracy"] for row in m["downpour"].values()]
    assert all(a["min"] <= b["max"] and b["min"] <= a["max"] for a in finals for b in finals)
    assert m["downpour"]["adagrad"]["final_accuracy"]["mean"] == max(f["mean"] for f in finals)
    assert round(m["warmstart"]["0"]["final_accuracy"]["max"],
                 3) == round(m["warmstart"]["20"]["final_accuracy"]["min"], 3)
    walls = {s: m["ssp"][f"straggler s={s}"]["seconds"] for s in ("0", "2", "8", "inf")}
    assert walls["0"]["min"] > max(walls[s]["max"] for s in ("2", "8", "inf"))           # "clearly slower"
    waits = {setting: m["ssp"][setting]["wait_fast_workers"]["mean"] for setting in ("straggler s=inf", "none s=inf")}
    assert waits["straggler s=inf"] <= waits["none s=inf"]
    missing = [q for q in quoted if q not in text]
    assert not missing, f"chapter 5 does not quote these (regenerate or fix the prose): {missing}"
