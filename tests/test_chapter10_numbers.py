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


def scaling_rows():
    """10_scaling.json's rows by p: {p: {run name: simulated seconds}} and {p: the network bound}."""
    rows = load("10_scaling.json")["scaling"]
    return ({row["ranks"]: {name: run["seconds"] for name, run in row["runs"].items()} for row in rows},
            {row["ranks"]: row["network_bound"] for row in rows}, {row["ranks"]: row["runs"] for row in rows})


def test_section_2_quotes_the_scaling_run():
    times, bound, runs = scaling_rows()
    links = load("10_scaling.json")["links"]
    (a_e, b_e), b_i = (links["inter"]["alpha"], links["inter"]["beta"]), links["intra"]["beta"]
    loaded = load("10_link.json")["link"]["alpha"]
    names = ("ring", "tree", "butterfly", "rabenseifner", "hierarchical", "hierarchical_tree")
    growth = {name: times[16][name] / times[8][name] for name in names}
    top, ring = times[16384], times[4096]["ring"]
    expected = [
        f"every algorithm's time grows {min(growth.values()):.0f} to {max(growth.values()):.0f} times (the tree "
        "form's least, flat Rabenseifner's most)",
        f"never exceeds `2 n beta` = {ms(2 * MIB * b_e):.1f} ms of network time",
        f"`2 (p-1) alpha` = {ms(2 * 4095 * a_e):.1f} ms of latency alone, {2 * 4095 * a_e / ring * 100:.0f}% of the "
        f"{ms(ring):.2f} ms the ring takes (at p = 1024, {ms(2 * 1023 * a_e):.1f} ms of "
        f"{ms(times[1024]['ring']):.2f} ms)",
        f"(alpha = {loaded * 1e6:.1f} us, section 1) the 2046 steps of p = 1024 would cost "
        f"{ms(2 * 1023 * loaded):.1f} ms",
        f"about {ms(top['tree'] - times[8192]['tree']):.1f} ms at 1 MiB (from {ms(times[8192]['tree']):.2f} to "
        f"{ms(top['tree']):.2f} ms between p = 8192 and 16,384)",
        f"at p = 16,384 it takes {ms(top['rabenseifner']):.2f} ms, "
        f"{top['rabenseifner'] / top['rabenseifner, a port per rank']:.1f} times its "
        f"{ms(top['rabenseifner, a port per rank']):.2f} ms with a port per rank (section 3), and the butterfly, which "
        f"sends the whole vector at every step, {ms(top['butterfly']):.2f} ms",
        f"at p = 16,384 the two-level allreduce takes {ms(top['hierarchical']):.2f} ms, within "
        f"{(top['hierarchical'] / bound[16384] - 1) * 100:.1f}% of the bound's {ms(bound[16384]):.2f} ms, and the tree "
        f"form {ms(top['hierarchical_tree']):.2f} ms, "
        f"{(top['hierarchical_tree'] / bound[16384] - 1) * 100:.1f}% above it",
        f"{runs[4096]['ring']['messages']:,} messages, which took {runs[4096]['ring']['cpu']:.0f} s of CPU time "
        f"({runs[4096]['ring']['wall']:.0f} s of wall time",
    ]
    assert not missing(expected), missing(expected)
    assert min(growth, key=growth.get) == "hierarchical_tree" and max(growth, key=growth.get) == "rabenseifner"
    # "every algorithm at p = 16,384 took under 10 s of CPU"; the ring in block order never waits for the NIC
    assert all(run["cpu"] < 10 for name, run in runs[16384].items())
    # "Both hierarchies stay at the bound": within 7% of it from p = 16 on, every flat algorithm above them
    for p, row in times.items():
        if p >= 16:
            assert row["hierarchical"] <= row["hierarchical_tree"] < 1.07 * bound[p]
            assert min(row[name] for name in names[:4] if name in row) > row["hierarchical_tree"]
    assert b_e / b_i > 80                                                   # "90 times slower per byte"


def test_section_3_quotes_the_ports():
    times, bound, runs = scaling_rows()
    links = load("10_scaling.json")["links"]
    b_i, c = links["intra"]["beta"], links["ranks_per_node"]
    a_i, a_e = links["intra"]["alpha"], links["inter"]["alpha"]
    top, p1024 = times[16384], times[1024]
    # the two hierarchies' difference less their difference inside the node: what the port's overlap saves
    inside = 2 * math.log2(c) * (a_i + MIB * b_i) - 2 * (c - 1) * (a_i + MIB / c * b_i)
    overlap = top["hierarchical_tree"] - top["hierarchical"] - inside
    assert 0 < overlap <= 21 * a_e
    sixteen = load("10_sixteen.json")["sixteen"]["seconds"]
    exact = [abs(run["seconds"] / run["closed_form"] - 1) for row in runs.values() for run in row.values()
             if run["closed_form"]]
    expected = [
        f"{ms(top['hierarchical']):.2f} against {ms(top['hierarchical_tree']):.2f} ms at p = 16,384",
        f"and {ms(overlap):.2f} ms on the network, where",
        f"`(S-1) alpha_e` = 21 alpha_e = {ms(21 * a_e):.2f} ms over Rabenseifner's S = 22 steps across 2048 nodes",
        f"`2 (c-1)/c n beta_i` = {ms(2 * (c - 1) / c * MIB * b_i):.2f} ms against the tree's `2 lg c n beta_i` = "
        f"{ms(2 * math.log2(c) * MIB * b_i):.2f} ms",
        f"{ms(top['hierarchical, 2 NICs']):.2f} ms on two NICs and {ms(top['hierarchical, a port per rank']):.2f} ms "
        "with a port per rank at p = 16,384",
        f"keeps its {ms(top['hierarchical_tree']):.2f} ms",
        f"({ms(top['rabenseifner, 2 NICs']):.2f} ms on two NICs)",
        f"reaches {ms(top['rabenseifner, a port per rank']):.2f} ms",
        f"({ms(p1024['hierarchical_tree']):.2f} ms at p = 1024, against flat Rabenseifner's "
        f"{ms(p1024['rabenseifner, a port per rank']):.2f})",
        f"flat Rabenseifner takes {ms(top['rabenseifner, fat tree']):.2f} ms at p = 16,384, the two-level form "
        f"{ms(top['hierarchical, fat tree']):.2f} ms and the tree form {ms(top['hierarchical_tree, fat tree']):.2f} ms",
        f"{top['hierarchical, fat tree'] / top['hierarchical_tree, fat tree']:.1f} times the tree form's time",
        f"{len(exact)} runs with a relative difference below {math.ceil(max(exact) * 1e13)}e-13",
        f"the two-level form takes {ms(sixteen['hierarchical']):.3f} ms against flat Rabenseifner's "
        f"{ms(sixteen['rabenseifner']):.3f}",
    ]
    assert not missing(expected), missing(expected)
    assert p1024["hierarchical_tree"] > p1024["rabenseifner, a port per rank"]      # "lost to flat Rabenseifner"
    # "the two-level form beats flat Rabenseifner on every network here"; the fat tree "changes nothing" up to p = 128
    assert all(row[f"hierarchical{net}"] < row[f"rabenseifner{net}"] for p, row in times.items() if p >= 16
               for net in ("", ", 2 NICs", ", a port per rank", ", fat tree"))
    assert all(row["rabenseifner, fat tree"] == row["rabenseifner"] for p, row in times.items() if p <= 128)
    assert all(row["rabenseifner, fat tree"] > row["rabenseifner"] for p, row in times.items() if p >= 256)
    # p = 1024 in nodes of 16 ranks, one NIC each, 1 MiB: the two-level form beats flat Rabenseifner
    assert sixteen["hierarchical"] < sixteen["rabenseifner"] and min(sixteen, key=sixteen.get) == "hierarchical"


def test_section_4_quotes_the_size_sweep():
    sweep = load("10_sizes.json")["sizes"]
    one, own = sweep["ports"]["one NIC"], sweep["ports"]["a port per rank"]
    sizes = sweep["bytes"]
    assert one["fastest"] == ["hierarchical_tree"] * 2 + ["hierarchical"] * 8
    assert own["fastest"] == ["butterfly"] * 2 + ["hierarchical"] * 8
    assert [change["to"] for change in one["changes"] + own["changes"]] == ["hierarchical", "hierarchical"]
    assert "ring" not in one["fastest"] + own["fastest"] and "butterfly" not in one["fastest"]
    ring, two = one["seconds"]["ring"][-1], one["seconds"]["hierarchical"][-1]
    flat = ("ring", "tree", "butterfly", "rabenseifner")
    assert all(min(flat, key=lambda n: own["seconds"][n][k]) == "rabenseifner" for k in range(2, len(sizes)))
    links = load("10_sizes.json")["links"]
    a_i, a_e = links["intra"]["alpha"], links["inter"]["alpha"]
    (one_low, one_high), (own_low, own_high) = one["changes"][0]["bytes"], own["changes"][0]["bytes"]
    assert one_high - one_low == own_high - own_low == 8 and 2048 < one_low and 1024 < own_low < 2048
    at = one["changes"][0]
    simulated, closed = at["seconds_at_high"]["hierarchical"], at["closed_form_at_high"]
    assert simulated < at["seconds_at_high"]["hierarchical_tree"]
    expected = [
        f"two-level form takes over between {one_low} and {one_high} B on one NIC and between {own_low} and "
        f"{own_high} B with a port per rank",
        f"the gap at 256 B, {ms(own['seconds']['hierarchical'][0] - own['seconds']['butterfly'][0]):.3f} ms",
        f"(7 alpha_e = {7 * a_e * 1e6:.1f} us)",
        f"cost only {11 * a_i * 1e6:.1f} us more",
        f"at {one_high} B the two-level form's simulated time is {(simulated / closed - 1) * 100:.0f}% above its "
        f"closed form on one NIC ({ms(simulated):.3f} against {ms(closed):.3f} ms)",
        f"({ms(one['seconds']['hierarchical_tree'][0]):.3f} and {ms(one['seconds']['hierarchical_tree'][1]):.3f} ms)",
        f"the butterfly ({ms(own['seconds']['butterfly'][0]):.3f} and {ms(own['seconds']['butterfly'][1]):.3f} ms)",
        f"({ms(one['seconds']['butterfly'][0]):.3f} ms at 256 B",
        f"within {(ring / two - 1) * 100:.1f}% of the two-level form at 64 MiB ({ms(ring):.3f} against "
        f"{ms(two):.3f} ms)",
        f"is {one['seconds']['rabenseifner'][-1] / own['seconds']['rabenseifner'][-1]:.1f} times slower on one NIC at "
        "64 MiB",
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
    rows = load("10_emulated.json")["emulated"]
    cluster = {(r["hosts"], r["algorithm"], r["bytes"]): r for r in load("quiet/10_allreduce.json")["rows"]}
    # the simulator, one NIC per host, against make_10_cluster.py's two-level model of the same job: "within 1.1%"
    apart = max(abs(r["simulated"] / cluster[r["hosts"], r["algorithm"], r["bytes"]]["model_seconds"] - 1)
                for r in rows)
    assert apart <= 0.011, apart
    misses = [(r["hosts"], r["algorithm"], r["bytes"]) for r in rows if abs(r["simulated_over_measured"] - 1) > 0.25]
    assert misses == [(4, "rabenseifner", 16 * MIB)]                       # "Both miss the one row"
    hosts, ranks, algorithm, nbytes = phrases["SMALL"]
    before, after = phrases["SMALL_MS"]
    worst = min(phrases["rab"])
    expected = [f"The ring at every size**: simulated / measured {phrases['RING']}",
                f"**Rabenseifner at every size**: {phrases['RAB']}.",
                f"gives the same times to within {math.ceil(apart * 1000) / 10:.1f}%",
                f"Both miss the one row, 4 x 2 at 16 MiB ({worst:.2f})",
                f"load average at {phrases['LOAD']} (`10_allreduce.json`",
                f"at up to {phrases['SLOWER']} times these times below 1 MiB (the {algorithm} at {nbytes >> 10} KiB on "
                f"{hosts} x {ranks}: {before:.2f} against {after:.2f} ms), and at {phrases['LARGE']} times them from "
                "4 MiB up"]
    assert not missing(expected), missing(expected)


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
    below = min(p for p in mlp if all(row["speedup"] < 1 for q, row in mlp.items() if q >= p))
    assert mlp[below // 2]["speedup"] >= 1 and f"below one from p = {below} on" in chapter()


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
    times, bound, runs = scaling_rows()
    links, top = load("10_scaling.json")["links"]["inter"], times[16384]
    speed = [run["events"] / run["cpu"] for p, row in runs.items() if p >= 1024 for name, run in row.items()
             if "," not in name]
    sixteen = load("10_sixteen.json")["sixteen"]["seconds"]
    parallel = load("10_data_parallel.json")["data_parallel"]
    best = {model: max(row["speedup"] for row in by["strong"]) for model, by in parallel.items()}
    weak = {model: by["weak"][-1] for model, by in parallel.items()}
    pipe = {(row["stages"], row["micro_batches"]): row for row in load("10_pipeline.json")["pipeline"]}[2, 64]
    quiet, loaded = load(LINK)["link"], load("10_link.json")["link"]["alpha"]
    phrases, hierarchy = emulated_phrases(), hierarchy_phrases()
    expected = [
        f"{min(speed):,.0f} to {max(speed):,.0f} events per CPU second",
        f"at its quiet-machine fit: alpha = {quiet['alpha'] * 1e6:.1f} us, beta = {quiet['beta'] * 1e9:.2f} ns/B)",
        f"stay under {ms(2 * MIB * links['beta']):.1f} ms of network time at any p",
        f"latencies add {ms(2 * 1023 * links['alpha']):.1f} ms at p = 1024, where it takes "
        f"{ms(times[1024]['ring']):.2f} ms (at the loaded machine's alpha of {loaded * 1e6:.1f} us they would add "
        f"{ms(2 * 1023 * loaded):.1f} ms)",
        f"flat Rabenseifner takes {ms(top['rabenseifner']):.2f} ms at p = 16,384, "
        f"{top['rabenseifner'] / top['rabenseifner, a port per rank']:.1f} times its time with a port per rank",
        f"the two-level allreduce (task 10.1) takes {ms(top['hierarchical']):.2f} ms, within "
        f"{(top['hierarchical'] / bound[16384] - 1) * 100:.1f}% of the bound, the tree form "
        f"{ms(top['hierarchical_tree']):.2f}",
        f"{ms(top['hierarchical, 2 NICs']):.2f} ms on two NICs per node and "
        f"{ms(top['hierarchical, a port per rank']):.2f} "
        "ms with a port per rank",
        f"{ms(sixteen['hierarchical']):.3f} ms against flat Rabenseifner's {ms(sixteen['rabenseifner']):.3f}",
        f"for the ring at every size ({phrases['RING']} of the measured time) and for Rabenseifner ({phrases['RAB']})",
        f"allreduces below 1 MiB took up to {phrases['SLOWER']} times as long",
        f"the two-level allreduce beat the flat ring in {hierarchy['HIER_MEASURED_WINS']} of the 12 measured rows, "
        f"where the model expected it in {hierarchy['HIER_MODEL_WINS']}",
        f"{hierarchy['HIER_MIB_TWO']} against {hierarchy['HIER_MIB_RING']} ms at 4 x 2 and 1 MiB, its model "
        f"{hierarchy['HIER_MIB_FIT']} of the measurement",
        f"a speed-up of {best['lenet5']:.1f} (strong scaling, batch 1024), the MLP {best['mlp']:.1f}",
        f"at p = 1024 is {weak['lenet5']['efficiency']:.2f} for LeNet-5 and {weak['mlp']['efficiency']:.2f} for the "
        "MLP",
        f"GPipe's is {pipe['gpipe_network']:.3f} against the formula's {pipe['formula']:.3f}",
    ]
    absent = [phrase for phrase in expected if " ".join(phrase.split()) not in summary]
    assert not absent, f"chapter 10's summary does not quote these as generated: {absent}"
    assert weak["lenet5"]["ranks"] == weak["mlp"]["ranks"] == 1024
    assert max(speed) < 200_000                          # the summary says the target is not met on this machine


def test_make_10_figures_quick_runs(tmp_path):
    """make_10_figures.py and make_10_scaling.py --quick write every file the chapter reads (a few seconds),
    and keep the error contract for an --out they cannot make."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for name, files in (("make_10_figures.py", ("10_reproduction.md", "10_emulated.md", "10_data_parallel.json",
                                                "10_strong.md", "10_pipeline.json")),
                        ("make_10_scaling.py", ("10_scaling.json", "10_scaling.md", "10_ports.md", "10_speed.md",
                                                "10_sizes.json", "10_sixteen.md"))):
        script = str(ROOT / "tutorials" / "figures" / name)
        done = subprocess.run([sys.executable, script, "--quick", "--out", str(tmp_path)], capture_output=True,
                              text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        for file in files:
            assert (tmp_path / file).stat().st_size > 0, file
        bad = subprocess.run([sys.executable, script, "--quick", "--out", str(tmp_path / files[0] / "x")],
                             capture_output=True, text=True, timeout=60, env=env)
        assert bad.returncode == 2 and bad.stderr.startswith("error: --out") and len(bad.stderr.splitlines()) == 1
    pipeline = json.loads((tmp_path / "10_pipeline.json").read_text())["pipeline"]
    assert all(abs(row["gpipe_free"] - row["formula"]) < 1e-12 for row in pipeline)
    scaling = json.loads((tmp_path / "10_scaling.json").read_text())["scaling"]
    assert all(abs(run["seconds"] / run["closed_form"] - 1) < 1e-12 for row in scaling
               for run in row["runs"].values() if run["closed_form"])


def hierarchy_phrases():
    """The numbers the hierarchy subsection of section 6 quotes, from 10_hierarchy.json."""
    rows = load("10_hierarchy.json")["rows"]
    fits = load("10_hierarchy.json")["fits"]
    lost = [r for r in rows if r["measured_speedup"] <= 1]
    fit = {(r["hosts"], r["bytes"]): r["hierarchical_model_seconds"] / r["hierarchical_seconds"] for r in rows}
    large = [value for (hosts, nbytes), value in fit.items() if nbytes >= 256 << 10]
    small = [value for (hosts, nbytes), value in fit.items() if nbytes < 256 << 10]
    slower = sorted(f["link"]["beta"] / f["shared_memory"]["beta"] for f in fits.values())
    mib = next(r for r in rows if r["hosts"] == 4 and r["bytes"] == MIB)
    tree = sorted(r["hierarchical_tree_seconds"] / r["hierarchical_seconds"] for r in rows)
    faster, slower_tree = [v for v in tree if v < 1], [v for v in tree if v >= 1]
    models = [abs(r["hierarchical_tree_model_seconds"] / r["hierarchical_model_seconds"] - 1) for r in rows]
    close = min(nbytes for nbytes in {r["bytes"] for r in rows}
                if all(abs(r["hierarchical_tree_model_seconds"] / r["hierarchical_model_seconds"] - 1) <= 0.03
                       for r in rows if r["bytes"] >= nbytes))
    alphas = " and ".join(f"{f['link']['alpha'] * 1e6:.0f} us ({hosts} x 2)" for hosts, f in fits.items())
    return {"HIER_SLOWER": f"{slower[0]:.0f} to {slower[-1]:.0f}", "HIER_ALPHAS": alphas,
            "HIER_MODEL_WINS": f"{sum(r['model_speedup'] > 1 for r in rows)} of {len(rows)}",
            "HIER_MEASURED_WINS": f"{sum(r['measured_speedup'] > 1 for r in rows)}",
            "HIER_MIB_TWO": f"{ms(mib['hierarchical_seconds']):.2f}", "HIER_MIB_RING": f"{ms(mib['ring_seconds']):.2f}",
            "HIER_MIB_MODEL": f"{ms(mib['hierarchical_model_seconds']):.2f}",
            "HIER_MIB_FIT": f"{mib['hierarchical_model_seconds'] / mib['hierarchical_seconds']:.2f}",
            "HIER_FIT_RANGE": f"{min(large):.2f} to {max(large):.2f}",
            "HIER_FIT_SMALL": f"{min(small):.2f}",
            "HIER_LOSSES": ", ".join(f"{r['hosts']} x 2 at {human(r['bytes'])}" for r in lost) or "none",
            "HIER_LOSS_FIT": ", ".join(f"{r['hierarchical_model_seconds'] / r['hierarchical_seconds']:.2f}"
                                       for r in lost),
            "HIER_LOSS_RING": ", ".join(f"{r['ring_model_seconds'] / r['ring_seconds']:.2f}" for r in lost),
            "HIER_TREE_CLOSE": human(close), "HIER_TREE_MODELS": f"{max(models) * 100:.0f}%",
            "HIER_TREE_FASTER": f"{len(faster)} of {len(rows)} rows ({faster[0]:.2f} to {faster[-1]:.2f}",
            "HIER_TREE_SLOWER": f"{len(slower_tree)} ({slower_tree[0]:.2f} to {slower_tree[-1]:.2f} times"}


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
    mib = next(r for r in rows if r["hosts"] == 4 and r["bytes"] == MIB)
    # the acceptance: at 4 x 2 and 1 MiB the two-level form beats the flat ring, its model within 25%
    assert mib["hierarchical_seconds"] < mib["ring_seconds"]
    assert abs(mib["hierarchical_model_seconds"] / mib["hierarchical_seconds"] - 1) <= 0.25
    assert all(abs(r["hierarchical_model_seconds"] / r["hierarchical_seconds"] - 1) <= 0.25
               for r in rows if r["bytes"] >= 256 << 10)                   # "within 25% in every row"
    tree = {r["bytes"]: r["hierarchical_tree_seconds"] / r["hierarchical_seconds"] for r in rows if r["hosts"] == 4}
    assert max(tree, key=tree.get) == 16 * MIB                           # "the most at 4 x 2 and 16 MiB"
    text = chapter()
    for name, value in phrases.items():
        assert value in text, f"{name}: {value!r} is not in chapter 10"
    assert not missing([f"({phrases['HIER_SLOWER']} times slower per byte than shared memory",
                        f"fitted alphas, {phrases['HIER_ALPHAS']}, are the scheduler's",
                        f"beat the flat ring in {phrases['HIER_MODEL_WINS']} rows; it did in "
                        f"{phrases['HIER_MEASURED_WINS']} of them",
                        f"it took {phrases['HIER_MIB_TWO']} ms against the ring's {phrases['HIER_MIB_RING']} ms, and "
                        f"its model {phrases['HIER_MIB_MODEL']} ms, {phrases['HIER_MIB_FIT']} of the measurement",
                        f"is {phrases['HIER_FIT_RANGE']} of the measurement, within 25% in every row",
                        f"({phrases['HIER_FIT_SMALL']} at 4 KiB)",
                        f"Where the two-level form lost ({phrases['HIER_LOSSES']}), its model was "
                        f"{phrases['HIER_LOSS_FIT']} of its time, and the ring's {phrases['HIER_LOSS_RING']}",
                        f"within 3% of each other from {phrases['HIER_TREE_CLOSE']} up (and at most "
                        f"{phrases['HIER_TREE_MODELS']} apart below)",
                        f"the tree form was faster in {phrases['HIER_TREE_FASTER']} of the two-level form's time)",
                        f"slower in {phrases['HIER_TREE_SLOWER']}"])


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


def test_the_summary_quotes_the_calibration():
    calibrated = calibration_phrases()
    assert not missing([f"came within 25% of {calibrated['CAL_MET']} measured allreduces at p = 2, the plain "
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
