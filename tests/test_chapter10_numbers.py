"""Chapter 10 quotes the numbers that tutorials/figures/make_10_figures.py wrote, and no others.

The generated tables (10_scaling.md, 10_reproduction.md, 10_emulated.md, 10_strong.md) must appear in
the chapter verbatim. Each number quoted in the prose is formatted here from the JSON the script
wrote (and, for the links, from quiet/10_link.json and 03_bench_p2.json, which it read: the quiet
machine's link fit is the chapter's one fit; the loaded run's 10_link.json and 10_allreduce.json are
quoted only where the chapter compares the two runs), with the rounding the prose uses, and must
appear in the chapter (whitespace-insensitive). The simulated times are
deterministic, so these fail only when the chapter or the script changes without the other; the
compute times of section 7 are measured, and the claims made about them (one row costs more than
two, the MLP's speed-up below one from p = 32) are checked against the JSON as well.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from collectives.sim import LogGP, Topology
from collectives.sim.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "tutorials" / "figures" / "out"
MIB = 1 << 20
LINK = "quiet/10_link.json"                      # the link fit every simulated section uses
ALGORITHMS = ("ring", "tree", "butterfly", "rabenseifner", "auto", "hierarchical")


def chapter():
    return " ".join((ROOT / "tutorials" / "10_scaling.md").read_text().split())


def load(name):
    return json.loads((FIGURES / name).read_text())


def ms(seconds):
    return seconds * 1e3


def missing(expected):
    text = chapter()
    return [phrase for phrase in expected if " ".join(phrase.split()) not in text]


def test_the_generated_tables_are_in_the_chapter_verbatim():
    text = chapter()
    for name in ("10_scaling.md", "10_reproduction.md", "10_emulated.md", "10_strong.md", "10_hierarchy.md",
                 "10_calibrated.md"):
        assert " ".join((FIGURES / name).read_text().split()) in text, f"{name} is not in chapter 10 as generated"


def test_section_1_quotes_the_links_the_script_used():
    links = load("10_scaling.json")["links"]
    inter = load(LINK)["link"]
    runs = load("03_bench_p2.json")
    for name in ("10_sizes.json", "10_reproduction.json", "10_emulated.json", "10_data_parallel.json",
                 "10_pipeline.json"):
        assert load(name)["links"] == links, f"{name} was written with other links than 10_scaling.json"
    loaded = load("10_link.json")["link"]
    first = runs[0][0] if isinstance(runs[0], list) else runs[0]
    assert (links["inter"]["alpha"], links["inter"]["beta"]) == (inter["alpha"], inter["beta"])
    assert (links["intra"]["alpha"], links["intra"]["beta"]) == (first["alpha"], first["beta"])
    a_i, b_i, a_e, b_e = first["alpha"], first["beta"], inter["alpha"], inter["beta"]
    assert not missing([f"alpha = {a_i * 1e6:.2f} us and beta = {b_i * 1e9:.3f} ns/B",
                        f"alpha = {a_e * 1e6:.1f} us and beta = {b_e * 1e9:.2f} ns/B",
                        f"{a_e / a_i:.0f} times slower to start a message and {b_e / b_i:.0f} times slower per byte",
                        "(`quiet/10_link.json`, from `make_10_cluster.py --out tutorials/figures/out/quiet`)",
                        f"load average at 13 fitted alpha = {loaded['alpha'] * 1e6:.1f} us, `10_link.json`",
                        # section 3's block and section 5's prose use the same links, rounded
                        f"LogGP(L={a_i * 1e6:.2f}e-6, G={b_i * 1e9:.3f}e-9), LogGP(L={a_e * 1e6:.1f}e-6, "
                        f"G={b_e * 1e9:.2f}e-9)",
                        f"network's: {a_e * 1e6:.1f} us, {b_e * 1e9:.2f} ns/B)"])


def test_sections_2_and_3_quote_the_scaling_run():
    result = load("10_scaling.json")
    rows = {row["ranks"]: row for row in result["scaling"]}
    a_e, b_e = result["links"]["inter"]["alpha"], result["links"]["inter"]["beta"]
    top, half = rows[1024], rows[512]
    loaded = load("10_link.json")["link"]["alpha"]
    growth = [rows[16][name] / rows[8][name] for name in ALGORITHMS]
    expected = [
        f"every algorithm's time grows {min(growth):.0f} to {max(growth):.0f} times",
        f"`2 n beta` = {ms(2 * MIB * b_e):.1f} ms of network time",
        f"`2 (p-1) alpha` = {ms(2 * 1023 * a_e):.1f} ms of latency alone, "
        f"{2 * 1023 * a_e / top['ring'] * 100:.0f}% of the {ms(top['ring']):.2f} ms",
        f"(alpha = {loaded * 1e6:.1f} us, section 1) the same 2046 steps would cost {ms(2 * 1023 * loaded):.1f} ms",
        f"about {ms(top['tree'] - half['tree']):.1f} ms at 1 MiB (from {ms(half['tree']):.2f} to "
        f"{ms(top['tree']):.2f} ms",
        f"{ms(top['rabenseifner']):.2f} ms at p = 1024, within "
        f"{(top['rabenseifner'] / top['network_bound'] - 1) * 100:.1f}% of the bound",
        f"the butterfly, which sends the whole vector `lg p` times, takes {ms(top['butterfly']):.2f} ms",
        f"which took {top['ring_wall']:.0f} s of wall time",
        f"{ms(top['hierarchical']):.2f} ms against the ring's {ms(top['ring']):.2f}",
        f"{ms(top['hierarchical']):.2f} against {ms(top['rabenseifner']):.2f} ms",
        f"grows to {ms(top['rabenseifner_one_port']):.2f} ms at p = 1024",
        f"keeps {ms(top['hierarchical_one_port']):.2f} ms",
    ]
    assert not missing(expected), missing(expected)
    assert min(ALGORITHMS, key=lambda n: growth[ALGORITHMS.index(n)]) == "hierarchical"   # "the hierarchy's least,
    assert max(ALGORITHMS, key=lambda n: growth[ALGORITHMS.index(n)]) == "ring"           # the ring's most"
    # the claims around them: Rabenseifner the fastest flat algorithm from p = 16; with one port per node the
    # hierarchy is faster than every flat one; the ring is the same with one port (checked up to p = 128)
    flat = ("ring", "tree", "butterfly", "rabenseifner")
    assert all(min(flat, key=lambda name: row[name]) == "rabenseifner" for p, row in rows.items() if p >= 16)
    assert all(row["hierarchical_one_port"] < min(row.get(f"{n}_one_port", row[n]) for n in flat)
               for p, row in rows.items() if p >= 16)
    assert all(row["ring_one_port"] == row["ring"] for p, row in rows.items() if p <= 128)
    assert all(row["hierarchical_one_port"] == row["hierarchical"] for row in rows.values())
    assert all(row["rabenseifner"] < row["hierarchical"] for p, row in rows.items() if p >= 16)


def test_section_4_quotes_the_size_sweep():
    sweep = load("10_sizes.json")["sizes"]
    times, a_e = sweep["seconds"], load("10_scaling.json")["links"]["inter"]["alpha"]
    assert [change["from"] + ">" + change["to"] for change in sweep["changes"]] == ["butterfly>rabenseifner"]
    # "the butterfly is fastest up to 1 KiB, Rabenseifner from 4 KiB on"; the ring and the tree never
    assert sweep["fastest"] == ["butterfly" if size <= 1024 else "rabenseifner" for size in sweep["bytes"]]
    expected = [
        "The butterfly is fastest up to 1 KiB", "Rabenseifner from 4 KiB on",
        f"at 256 B it takes {ms(times['butterfly'][0]):.3f} ms",
        f"about {sweep['changes'][0]['bytes'] / 1024:.1f} KiB, interpolated",
        f"still {(times['ring'][-1] / times['rabenseifner'][-1] - 1) * 100:.0f}% slower than Rabenseifner",
        f"only {ms(126 * a_e):.2f} ms of that",
        f"Rabenseifner's {ms(times['rabenseifner'][-1]):.1f} ms is within "
        f"{(times['rabenseifner'][-1] / sweep['bound'][-1] - 1) * 100:.1f}% of the bound",
    ]
    assert not missing(expected), missing(expected)


def test_section_5_quotes_the_reproduction():
    result = load("10_reproduction.json")["reproduction"]
    low, high = result["simulated_crossover_bytes"]
    m_star = result["table_crossover_bytes"]
    expected = [f"= {m_star:,.0f} bytes", f"between {low:,} and {high:,} bytes, {(low / m_star - 1) * 100:.1f}% "
                                          "above m*",
                f"(about {m_star / 4 / result['ranks']:.1f} elements per rank)",
                f"butterfly below about {m_star / 1024:.1f} KiB"]
    assert not missing(expected), missing(expected)
    assert m_star <= low and high <= m_star * 1.03                                  # "near m*", above it
    # "between two multiples of P elements it takes the table's time for the next multiple"
    L, G, P = result["alpha"], result["beta"], result["ranks"]
    step = 4 * P
    above = -(-high // step) * step
    flat = Topology(P, P, LogGP(L=L, G=G), LogGP(L=L, G=G))
    table = 2 * L * math.log2(P) + 2 * above * G * (P - 1) / P
    assert f"(here of {step} bytes)" in chapter()
    assert math.isclose(simulate("rabenseifner", flat, high, sizes_only=True)[0], table, rel_tol=1e-12)
    for row in result["rows"]:                       # "every row agrees to the printed digit"
        if row["simulated"] is not None:
            assert f"{row['simulated'] * 1e3:.3f}" == f"{row['table'] * 1e3:.3f}", row


def emulated_phrases():
    """Section 6's comparison of the simulator with the quiet run's measured allreduces, and of that run
    with the loaded one (10_allreduce.json), from the JSON."""
    rows = load("10_emulated.json")["emulated"]
    quiet, loaded = load("quiet/10_allreduce.json")["rows"], load("10_allreduce.json")["rows"]
    key = lambda r: (r["hosts"], r["ranks_per_host"], r["algorithm"], r["bytes"])   # noqa: E731
    # the table is the quiet run's measurements, beside the simulator on the chapter's links
    measured = {key(r): r["seconds"] for r in quiet}
    assert all(r["measured"] == measured[key(r)] for r in rows) and len(rows) == 20
    ring = [r["simulated_over_measured"] for r in rows if r["algorithm"] == "ring"]
    rab = [r["simulated_over_measured"] for r in rows if r["algorithm"] == "rabenseifner"]
    slower = {key(r): r["seconds"] / measured[key(r)] for r in loaded if r["algorithm"] != "mpi"}
    small = max((k for k in slower if k[3] < MIB), key=slower.get)
    large = [v for k, v in slower.items() if k[3] >= 4 * MIB]
    before = {key(r): r["seconds"] for r in loaded}
    return {"RING": f"{min(ring):.2f} to {max(ring):.2f}", "RAB": f"{min(rab):.2f} to {max(rab):.2f}",
            "SLOWER": f"{slower[small]:.1f}", "SMALL": small, "SMALL_MS": (ms(before[small]), ms(measured[small])),
            "LARGE": f"{min(large):.2f} to {max(large):.2f}",
            "LOAD": f"{load('10_allreduce.json')['load_average']['before'][0]:.0f}", "rab": rab}


def test_section_6_quotes_the_emulated_hosts():
    phrases = emulated_phrases()
    cluster = load("quiet/10_allreduce.json")["rows"]
    within = sum(1 for r in cluster if r["algorithm"] == "rabenseifner" and r["bytes"] >= MIB
                 and abs(r["model_over_measured"] - 1) <= 0.25)
    hosts, ranks, algorithm, nbytes = phrases["SMALL"]
    before, after = phrases["SMALL_MS"]
    expected = [f"The ring at every size**: simulated / measured {phrases['RING']}",
                f"predicts {phrases['RAB']} of the measured time, about half",
                f"predicts {['none', 'one', 'two', 'three', 'four', 'five', 'all'][within]} of the six Rabenseifner "
                "rows",
                f"load average at {phrases['LOAD']} (`10_allreduce.json`",
                f"at up to {phrases['SLOWER']} times these times below 1 MiB (the {algorithm} at {nbytes >> 10} KiB on "
                f"{hosts} x {ranks}: {before:.2f} against {after:.2f} ms), and at {phrases['LARGE']} times them from "
                "4 MiB up"]
    assert not missing(expected), missing(expected)
    assert all(0.3 <= ratio <= 0.6 for ratio in phrases["rab"])                          # "about half"


def test_section_7_quotes_the_data_parallel_steps():
    result = load("10_data_parallel.json")["data_parallel"]
    strong = {model: {row["ranks"]: row for row in by["strong"]} for model, by in result.items()}
    weak = {model: {row["ranks"]: row for row in by["weak"]} for model, by in result.items()}
    lenet, mlp = strong["lenet5"], strong["mlp"]
    best = {model: max(by["strong"], key=lambda row: row["speedup"]) for model, by in result.items()}
    expected = [
        f"{result['lenet5']['gradient_bytes']:,} bytes for LeNet-5 and {result['mlp']['gradient_bytes']:,} for the MLP",
        f"at batch 1024 take {ms(lenet[1]['compute']):.1f} ms of one core",
        f"(p = 8: {ms(lenet[8]['compute']):.1f} ms, speed-up {lenet[8]['speedup']:.1f}, efficiency "
        f"{lenet[8]['efficiency']:.2f})",
        f"jumps from {ms(lenet[8]['allreduce']):.2f} to {ms(lenet[16]['allreduce']):.2f} ms",
        f"{lenet[64]['speedup']:.1f} at p = 64, at most {best['lenet5']['speedup']:.1f} (p = "
        f"{best['lenet5']['ranks']}), "
        f"{lenet[1024]['speedup']:.1f} at p = 1024",
        f"one row for {ms(lenet[1024]['compute']):.2f} ms and then waits {ms(lenet[1024]['allreduce']):.2f} ms",
        f"as two rows' {ms(lenet[512]['compute']):.2f} ms",
        f"{result['mlp']['gradient_bytes'] / result['lenet5']['gradient_bytes']:.1f} times LeNet-5's parameters",
        f"({ms(mlp[1]['compute']):.1f} ms at batch 1024)",
        f"peaks at {best['mlp']['speedup']:.1f} at p = {best['mlp']['ranks']}",
        f"falls to {mlp[16]['speedup']:.1f} at p = 16",
        f"({mlp[1024]['speedup']:.1f} at p = 1024)",
        f"computes for {ms(weak['lenet5'][2]['compute']):.2f} ms at any p",
        f"adds {ms(weak['lenet5'][2]['allreduce']):.2f} ms at p = 2",
        f"from {weak['lenet5'][8]['efficiency']:.2f} at p = 8 to {weak['lenet5'][16]['efficiency']:.2f} at p = 16 "
        f"and {weak['lenet5'][1024]['efficiency']:.2f} at p = 1024",
        f"({ms(weak['mlp'][2]['compute']):.2f} ms of computation against a {ms(weak['mlp'][1024]['allreduce']):.2f} ms "
        f"allreduce at p = 1024) it is {weak['mlp'][1024]['efficiency']:.2f}",
    ]
    assert not missing(expected), missing(expected)
    assert abs(lenet[1024]["compute"] / lenet[512]["compute"] - 1) < 0.15, \
        "the chapter says one row takes about as long as two"
    assert all(row["speedup"] < 1 for p, row in mlp.items() if p >= 32), "the chapter says below one from p = 32"


def test_section_8_quotes_the_pipeline():
    rows = {(row["stages"], row["micro_batches"]): row for row in load("10_pipeline.json")["pipeline"]}
    links = load("10_scaling.json")["links"]["inter"]
    error = max(abs(row[f"{kind}_free"] - row["formula"]) for row in rows.values() for kind in ("gpipe", "1f1b"))
    two, sixty_four = rows[2, 64], rows[64, 64]

    def hidden(row):                                 # 1F1B's bubble above the formula, over GPipe's
        return (row["1f1b_network"] - row["formula"]) / (row["gpipe_network"] - row["formula"])
    many = [hidden(row) for (stages, m), row in rows.items() if stages >= 4 and m >= 2]
    assert 0.4 <= hidden(two) <= 0.6                 # "about half"
    expected = [
        f"over the network link: {ms(links['alpha'] + 32768 * links['beta']):.2f} ms each",
        f"({error:.0e} at most)",
        f"the formula says {two['formula']:.3f}, GPipe takes {two['gpipe_network']:.3f} and 1F1B "
        f"{two['1f1b_network']:.3f}",
        f"{sixty_four['formula']:.3f} against {sixty_four['gpipe_network']:.3f} and {sixty_four['1f1b_network']:.3f}",
        f"at most P for 1F1B ({two['1f1b_held']} at P = 2, m = 64)",
        f"(its bubble above the formula's is {hidden(two):.2f} of GPipe's)",
        f"hardly any ({min(many):.2f} to {max(many):.2f} of GPipe's, at m >= 2)",
    ]
    assert not missing(expected), missing(expected)
    assert error < 1e-12 and all(row["gpipe_held"] == row["micro_batches"] for row in rows.values())
    # "at P = 2 every one does": GPipe's span grows by 2 m messages (1 - bubble = busy / span, busy = m 30 ms)
    message = links["alpha"] + 32768 * links["beta"]
    span, free = 64 * 0.030 / (1 - two["gpipe_network"]), 64 * 0.030 / (1 - two["gpipe_free"])
    assert abs(span - free - 2 * 64 * message) < 1e-6, (span - free, 2 * 64 * message)
    assert all(row["1f1b_held"] <= min(row["stages"], row["micro_batches"]) for row in rows.values())


def test_the_summary_quotes_the_sections_above():
    text = chapter()
    summary = text[text.index("## Summary"):text.index("## Exercises")]
    scaling = {row["ranks"]: row for row in load("10_scaling.json")["scaling"]}
    links, top = load("10_scaling.json")["links"]["inter"], scaling[1024]
    parallel = load("10_data_parallel.json")["data_parallel"]
    best = {model: max(row["speedup"] for row in by["strong"]) for model, by in parallel.items()}
    weak = {model: by["weak"][-1] for model, by in parallel.items()}
    pipe = {(row["stages"], row["micro_batches"]): row for row in load("10_pipeline.json")["pipeline"]}[2, 64]
    quiet, loaded = load(LINK)["link"], load("10_link.json")["link"]["alpha"]
    phrases = emulated_phrases()
    expected = [
        f"at its quiet-machine fit: alpha = {quiet['alpha'] * 1e6:.1f} us, beta = {quiet['beta'] * 1e9:.2f} ns/B)",
        f"stay under {ms(2 * MIB * links['beta']):.1f} ms of network time at any p",
        f"latencies add {ms(2 * 1023 * links['alpha']):.1f} ms at p = 1024, where it takes {ms(top['ring']):.2f} ms "
        f"(at the loaded machine's alpha of {loaded * 1e6:.1f} us they would add {ms(2 * 1023 * loaded):.1f} ms); "
        f"the tree grows by {ms(top['tree'] - scaling[512]['tree']):.1f} ms",
        f"within {(top['rabenseifner'] / top['network_bound'] - 1) * 100:.1f}% of the lower bound "
        f"({ms(top['rabenseifner']):.2f} ms)",
        f"{ms(top['hierarchical_one_port']):.2f} ms against flat Rabenseifner's "
        f"{ms(top['rabenseifner_one_port']):.2f} ms",
        f"for the ring at every size ({phrases['RING']} of the measured time) and not for Rabenseifner "
        f"({phrases['RAB']})",
        f"allreduces below 1 MiB took up to {phrases['SLOWER']} times as long",
        f"a speed-up of {best['lenet5']:.1f} (strong scaling, batch 1024), the MLP {best['mlp']:.1f}",
        f"at p = 1024 is {weak['lenet5']['efficiency']:.2f} for LeNet-5 and {weak['mlp']['efficiency']:.2f} for the "
        "MLP",
        f"GPipe's is {pipe['gpipe_network']:.3f} against the formula's {pipe['formula']:.3f}",
    ]
    absent = [phrase for phrase in expected if phrase not in summary]
    assert not absent, f"chapter 10's summary does not quote these as generated: {absent}"
    assert weak["lenet5"]["ranks"] == weak["mlp"]["ranks"] == 1024


def test_make_10_figures_quick_runs(tmp_path):
    """The script's quick mode (p <= 16, a few sizes, one repeat, no figures), so that it does not rot;
    and its error contract for an --out it cannot make."""
    script = str(ROOT / "tutorials" / "figures" / "make_10_figures.py")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, script, "--quick", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    scaling = json.loads((tmp_path / "10_scaling.json").read_text())["scaling"]
    assert [row["ranks"] for row in scaling] == [2, 4, 8, 16] and scaling[-1]["hierarchical_one_port"] > 0
    pipeline = json.loads((tmp_path / "10_pipeline.json").read_text())["pipeline"]
    assert all(abs(row["gpipe_free"] - row["formula"]) < 1e-12 for row in pipeline)
    for name in ("10_sizes.json", "10_reproduction.md", "10_emulated.md", "10_data_parallel.json", "10_strong.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    bad = subprocess.run([sys.executable, script, "--quick", "--out", str(tmp_path / "10_scaling.json" / "x")],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --out") and len(bad.stderr.splitlines()) == 1


def hierarchy_phrases():
    """The numbers the hierarchy subsection of section 6 quotes, from 10_hierarchy.json."""
    rows = load("10_hierarchy.json")["rows"]
    losses = [f"{r['hosts']} x {r['ranks_per_host']} at {r['bytes'] >> 20} MiB" if r["bytes"] >= MIB else
              f"{r['hosts']} x {r['ranks_per_host']} at {r['bytes'] >> 10} KiB" for r in rows
              if r["measured_speedup"] <= 1]
    fits = load("10_hierarchy.json")["fits"].values()
    slower = sorted(fit["link"]["beta"] / fit["shared_memory"]["beta"] for fit in fits)
    return {"SLOWER_RANGE": f"{slower[0]:.0f} to {slower[-1]:.0f}",
            "HIER_MODEL_WINS": f"{sum(r['model_speedup'] > 1 for r in rows)} of {len(rows)}",
            "HIER_MEASURED_WINS": f"{sum(r['measured_speedup'] > 1 for r in rows)}",
            "HIER_LOSSES": ", ".join(losses) or "none"}


def human(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= MIB else f"{nbytes >> 10} KiB"


ORDINAL = ("first", "second", "third", "fourth", "fifth")


def calibration_phrases():
    """The numbers the calibrated-model subsection of section 9 quotes, from 10_calibrated.json and
    10_calibration.json (the first launch's model and the step times it was measured on)."""
    calibrated = load("10_calibrated.json")
    rows, launches = calibrated["rows"], calibrated["launches"]
    worst = max(rows, key=lambda r: abs(math.log(r["calibrated_ratio"])))
    plain = [r["model_seconds"] / r["seconds"] for r in rows]
    ladder = {row["bytes"]: row for row in load("10_calibration.json")["measurements"]["ladder"]}
    met = [str(launch["within"]) for launch in launches]
    misses = [f"the {ORDINAL[k]} launch missed {launch['rows'] - launch['within']}, the worst "
              f"{launch['worst_algorithm']} at {human(launch['worst_bytes'])} ({launch['worst_ratio']:.2f})"
              for k, launch in enumerate(launches) if launch["within"] < launch["rows"]]
    heat = [launch["heat_256k"] for launch in launches]
    return {"CAL_MET": f"{sum(r['within'] for r in rows)} of {len(rows)}",
            "PLAIN_MET": f"{sum(0.75 <= ratio <= 1.25 for ratio in plain)}",
            "CAL_WORST": f"{worst['algorithm']} at {human(worst['bytes'])} "
                         f"(calibrated / measured {worst['calibrated_ratio']:.2f})",
            "PLAIN_RANGE": f"{min(plain):.2f} to {max(plain):.2f}",
            "LAUNCH_MET": ", ".join(met[:-1]) + f" and {met[-1]}",
            "LAUNCH_MISS": "; ".join(misses) if misses else "no launch missed a row",
            "HEAT_RANGE": f"{min(heat):.2f} to {max(heat):.2f}",
            "HOT_PAIR": f"{ladder[256 << 10]['pair_1'] * 1e6:.1f}",
            "COLD_PAIR": f"{ladder[256 << 10]['pair_1_cold'] * 1e6:.1f}",
            "ADD_ALONE": f"{ladder[4 * MIB]['add_into'] * 1e6:.1f}", "REDUCE": f"{ladder[4 * MIB]['reduce'] * 1e6:.1f}"}


def test_section_6_quotes_the_hierarchy_on_slow_links():
    phrases = hierarchy_phrases()
    rows = load("10_hierarchy.json")["rows"]
    two = [r for r in rows if r["hosts"] == 2]
    large = [r for r in rows if r["bytes"] >= 64 << 10]
    # "at 2 x 2 ... within 3% of the model's at every size, and both times within 5% of their models from 64 KiB up"
    deviation = max(abs(r["measured_speedup"] / r["model_speedup"] - 1) for r in two)
    assert all(abs(r[f"{kind}_seconds"] / r[f"{kind}_model_seconds"] - 1) <= 0.05
               for r in large if r["hosts"] == 2 for kind in ("ring", "hierarchical"))
    # "at 4 x 2 the ring stays within 5% of its model from 256 KiB up, but the hierarchy takes X to Y times its model's"
    assert all(abs(r["ring_seconds"] / r["ring_model_seconds"] - 1) <= 0.05
               for r in rows if r["hosts"] == 4 and r["bytes"] >= 256 << 10)
    lost = [r["hierarchical_seconds"] / r["hierarchical_model_seconds"] for r in rows
            if r["hosts"] == 4 and r["measured_speedup"] <= 1]
    assert lost and all(r["hosts"] == 4 for r in rows if r["measured_speedup"] <= 1)
    assert not missing([f"({phrases['SLOWER_RANGE']} times slower per byte than shared memory",
                        f"The model expects the hierarchy to win in {phrases['HIER_MODEL_WINS']} rows",
                        f"It won in {phrases['HIER_MEASURED_WINS']} of them. Where it did not "
                        f"({phrases['HIER_LOSSES']})",
                        f"within {deviation * 100:.0f}% of the model's at every size",
                        f"hierarchy takes {min(lost):.2f} to {max(lost):.2f} times its model's time"])


def test_section_9_quotes_the_calibrated_model():
    phrases = calibration_phrases()
    assert not missing([f"it was met in {phrases['CAL_MET']} rows, the plain model within 25% in "
                        f"{phrases['PLAIN_MET']}",
                        f"the largest miss was {phrases['CAL_WORST']}",
                        f"The plain model's ratios run from {phrases['PLAIN_RANGE']}",
                        f"met the target in {phrases['LAUNCH_MET']} rows of 40; {phrases['LAUNCH_MISS']}.",
                        f"cost {phrases['HEAT_RANGE']} times the cold one at 256 KiB",
                        f"at 256 KiB (send, add, send the sum back) took {phrases['HOT_PAIR']} us, and "
                        f"{phrases['COLD_PAIR']} us when it sent `sendbuf` back instead",
                        f"at 4 MiB the add alone took {phrases['ADD_ALONE']} us, the add after the butterfly's "
                        f"exchange {phrases['REDUCE']} us"])
    launches = load("10_calibrated.json")["launches"]
    # "All three launches ran hot": the tree's send-back of the sum well above the cold one in each
    assert len(launches) == 3 and all(launch["heat_256k"] >= 1.5 for launch in launches)
    # "The table is the first of the three launches": its rows are the first launch's summary
    rows = load("10_calibrated.json")["rows"]
    assert sum(r["within"] for r in rows) == launches[0]["within"]
    # "nine rounds" and "a ladder from 512 B to 64 MiB"
    command = load("10_calibrated.json")["command"]
    assert "--rounds 9" in command and "--calibrate" in command and "--median" in command
    sizes = [row["bytes"] for row in load("10_calibration.json")["measurements"]["ladder"]]
    assert sizes[0] == 512 and sizes[-1] == 64 * MIB


def test_the_summary_quotes_the_hierarchy_and_the_calibration():
    hierarchy, calibrated = hierarchy_phrases(), calibration_phrases()
    assert not missing([f"the hierarchy beat the flat ring in {hierarchy['HIER_MEASURED_WINS']} of the "
                        f"{len(load('10_hierarchy.json')['rows'])} measured rows, where the model expected it in "
                        f"{hierarchy['HIER_MODEL_WINS']}",
                        f"came within 25% of {calibrated['CAL_MET']} measured allreduces at p = 2, the plain "
                        f"one of {calibrated['PLAIN_MET']}, and of {calibrated['LAUNCH_MET']} of 40 in three launches"])


def test_section_6_quotes_the_quiet_machines_run():
    """The quiet-machine table (make_10_cluster.py --out tutorials/figures/out/quiet) and what the prose says of it."""
    table = (FIGURES / "quiet" / "10_allreduce.md").read_text()
    assert " ".join(table.split()) in chapter(), "quiet/10_allreduce.md is not in chapter 10 as generated"
    quiet, loaded = load("quiet/10_allreduce.json"), load("10_allreduce.json")
    rows = [r for r in quiet["rows"] if r["algorithm"] != "mpi"]
    within = [r["model_over_measured"] for r in rows if 0.75 <= r["model_over_measured"] <= 1.25]
    misses = [r for r in rows if not 0.75 <= r["model_over_measured"] <= 1.25]
    assert [(m["hosts"], m["algorithm"], m["bytes"]) for m in misses] == [(4, "rabenseifner", 16 * MIB)]
    twin = next(r for r in loaded["rows"] if (r["hosts"], r["algorithm"], r["bytes"]) == (4, "rabenseifner", 16 * MIB))
    # "missed the same row by about as much"
    assert abs(twin["model_over_measured"] - misses[0]["model_over_measured"]) < 0.1
    assert not missing([f"within 25% of the measured time in {len(within)} of {len(rows)} rows from 64 KiB up "
                        f"({min(within):.2f} to {max(within):.2f})",
                        f"(model / measured {misses[0]['model_over_measured']:.2f})",
                        f"missed the same row by about as much ({twin['model_over_measured']:.2f})"])
    quiet_alpha, loaded_alpha = (load(name)["link"]["alpha"] * 1e6 for name in ("quiet/10_link.json", "10_link.json"))
    assert round(loaded_alpha / quiet_alpha) == 8                                          # "an eighth"
    assert not missing([f"The alpha of the link fitted here, {quiet_alpha:.1f} us, is an eighth of the loaded fit's "
                        f"{loaded_alpha:.1f} us"])
