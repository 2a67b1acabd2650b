"""Chapter 10, sections 2 to 4: flat allreduce against both hierarchies on nodes that share their
network ports, p = 2 to 16,384, from the simulator itself.

    python tutorials/figures/make_10_scaling.py            # about 20 minutes on 2 loaded cores
    python tutorials/figures/make_10_scaling.py --quick    # p <= 64, a few sizes: seconds, into --out
    python tutorials/figures/make_10_scaling.py --out DIR
    python tutorials/figures/make_10_scaling.py --crossovers   # only part 2's crossovers, into 10_sizes.json

Every allreduce runs its real heart on collectives.sim's simulated ranks (sizes only: no data), timed
by LogGP with o = g = 0, on nodes of 8 ranks and the chapter's two links (make_10_figures.links():
chapter 3's ping-pong fit inside a node, the emulated 1 Gbit/s link's quiet fit between nodes). A
node reaches the network through K NICs that its ranks share (collectives.sim.Topology.nics_per_node):

1. scaling: p = 2 .. 16,384 at 1 MiB. One NIC per node: the ring (to p = 4096: 2 p (p - 1)
   messages), tree, butterfly, Rabenseifner, the two-level allreduce (hierarchical) and the tree form
   (hierarchical_tree), beside the lower bound over the nodes. Butterfly, Rabenseifner and the
   two-level again on two NICs per node and on a port per rank (K = 8, the simulator's old network),
   and Rabenseifner and both hierarchies on a fat tree (16 nodes per leaf switch, 4 uplinks: 4:1 at
   one NIC per node). The ring, the tree and the tree form are left out there: in block order one rank
   per node crosses at a time, so K does not change their time (two_level's forms; tests/test_two_level.py).
   Each simulated time beside collectives.model.two_level's closed form where that is exact, and each
   run's events per CPU second              -> 10_scaling.json/.md/.png, 10_ports.md, 10_speed.md
2. sizes: p = 1024 from 256 B to 64 MiB, one NIC per node and a port per rank: every algorithm, the
   fastest at each size, and where the fastest changes: bisected on simulated times between the two
   sizes run either side, to a pair of sizes 4 bytes apart (--crossovers: only this, from the
   times already in 10_sizes.json, which it rewrites)                        -> 10_sizes.json/.md/.png
3. sixteen: p = 1024 in nodes of 16 ranks, one NIC each, 1 MiB: every algorithm -> 10_sixteen.json/.md

The chapter quotes the .md tables verbatim and its other numbers from the JSON
(tests/test_chapter10_numbers.py). The simulated times are deterministic; the events per second
are CPU time on this shared machine, so they move from run to run with its load (in 10_speed.md).
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from make_10_figures import OUT, bisect_crossover, crossings, fail, links, network_bound, write  # noqa: E402

from collectives.model import two_level  # noqa: E402
from collectives.sim import Topology  # noqa: E402
from collectives.sim.simulate import simulate  # noqa: E402

PER_NODE = 8
NBYTES = 1 << 20
FLAT = ("ring", "tree", "butterfly", "rabenseifner")
ALGORITHMS = FLAT + ("hierarchical", "hierarchical_tree")
RING_UP_TO = 4096                                 # the ring's 2 p (p - 1) messages: 33.5 million at p = 4096
FABRIC = {"nodes_per_switch": 16, "uplinks": 4}
# (label, NICs per node, fabric, algorithms): the runs of part 1 beyond one NIC per node
PORTS = (("2 NICs", 2, None, ("butterfly", "rabenseifner", "hierarchical")),
         ("a port per rank", PER_NODE, None, ("butterfly", "rabenseifner", "hierarchical")),
         ("fat tree", 1, FABRIC, ("rabenseifner", "hierarchical", "hierarchical_tree")))
SIZES_P = 1024
TARGET_EVENTS, TARGET_SECONDS = 200_000, 600


def run(algorithm, topology, nbytes, fabric=None):
    """One simulated allreduce: its seconds, the closed form where exact (else None), and its cost to run."""
    start, cpu = time.perf_counter(), time.process_time()
    seconds, engine, _ = simulate(algorithm, topology, nbytes, sizes_only=True, fabric=fabric)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    p, c, nics = topology.ranks, topology.ranks_per_node, topology.nics_per_node
    intra, inter = (topology.intra.L, topology.intra.G), (topology.inter.L, topology.inter.G)
    closed = None
    if fabric is None and two_level.exact_on_nodes(algorithm, p, nbytes // 4, c):
        closed = two_level.predict_on_nodes(algorithm, p, nbytes, c, intra, inter, nics if nics < c else None)
    return {"seconds": seconds, "closed_form": closed, "messages": engine.messages, "events": engine.events,
            "wall": wall, "cpu": cpu}


def scaling(ps, intra, inter):
    rows = []
    for p in ps:
        row = {"ranks": p, "bytes": NBYTES, "network_bound": network_bound(p, NBYTES, inter), "runs": {}}
        one_nic = Topology(p, PER_NODE, intra, inter, 1)
        for name in ALGORITHMS:
            if name != "ring" or p <= RING_UP_TO:
                row["runs"][name] = run(name, one_nic, NBYTES)
        for label, nics, fabric, names in PORTS:
            for name in names:
                row["runs"][f"{name}, {label}"] = run(name, Topology(p, PER_NODE, intra, inter, nics), NBYTES, fabric)
        rows.append(row)
        print(f"scaling p = {p:5d}: " + ", ".join(f"{name} {row['runs'][name]['seconds'] * 1e3:.2f} ms"
                                                  for name in ALGORITHMS if name in row["runs"]), flush=True)
    return rows


def size_sweep(p, sizes, intra, inter):
    result = {"ranks": p, "bytes": sizes, "ports": {}}
    for label, nics in (("one NIC", 1), ("a port per rank", PER_NODE)):
        topology = Topology(p, PER_NODE, intra, inter, nics)
        times = {name: [run(name, topology, n)["seconds"] for n in sizes] for name in ALGORITHMS}
        best, changes = crossings(sizes, times)
        result["ports"][label] = {"seconds": times, "fastest": best, "changes": refined(topology, changes)}
        print(f"sizes at p = {p}, {label}: fastest " + ", ".join(best), flush=True)
    return result


def refined(topology, changes):
    """Each change of the fastest, bisected: bytes = [low, high], the old one faster at low, the new at high;
    at high both simulated times and the new one's closed form (its blocks taken as equal: not exact there)."""
    p, c, nics = topology.ranks, topology.ranks_per_node, topology.nics_per_node
    intra, inter = (topology.intra.L, topology.intra.G), (topology.inter.L, topology.inter.G)
    for change in changes:
        change["bytes"] = list(bisect_crossover(topology, *change["sizes"], change["from"], change["to"]))
        high, names = change["bytes"][1], (change["from"], change["to"])
        change["seconds_at_high"] = {name: run(name, topology, high)["seconds"] for name in names}
        change["closed_form_at_high"] = two_level.predict_on_nodes(change["to"], p, high, c, intra, inter,
                                                                   nics if nics < c else None)
    return changes


def crossovers(out, intra, inter):
    """Only part 2's crossovers, from the simulated times already in out/10_sizes.json (rewritten)."""
    with open(out / "10_sizes.json") as handle:
        saved = json.load(handle)
    sweep = saved["sizes"]
    for label, by in sweep["ports"].items():
        topology = Topology(sweep["ranks"], PER_NODE, intra, inter, 1 if label == "one NIC" else PER_NODE)
        by["fastest"], changes = crossings(sweep["bytes"], by["seconds"])
        by["changes"] = refined(topology, changes)
        print(f"sizes at p = {sweep['ranks']}, {label}: " + ", ".join(
            f"{c['from']} -> {c['to']} between {c['bytes'][0]} and {c['bytes'][1]} B" for c in changes), flush=True)
    with open(out / "10_sizes.json", "w") as handle:
        json.dump(saved, handle, indent=1)


def sixteen(intra, inter, p=SIZES_P):
    topology = Topology(p, 16, intra, inter, 1)
    return {"ranks": p, "ranks_per_node": 16, "nics_per_node": 1, "bytes": NBYTES,
            "seconds": {name: run(name, topology, NBYTES)["seconds"] for name in ALGORITHMS}}


# ---- tables and figures ---------------------------------------------------------------------------

def human(nbytes):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes:.0f} B"


def cell(row, name):
    found = row["runs"].get(name)
    return "-" if found is None else f"{found['seconds'] * 1e3:.2f}"


def markdown(result):
    rows = result["scaling"]
    lines = ["| p | " + " | ".join(ALGORITHMS) + " | bound |", "| --- " * (len(ALGORITHMS) + 2) + "|"]
    lines += [f"| {row['ranks']} | " + " | ".join(cell(row, name) for name in ALGORITHMS)
              + f" | {row['network_bound'] * 1e3:.2f} |" for row in rows]
    scaling = "\n".join(lines)
    columns = [f"{name}{label}" for name in ("rabenseifner", "hierarchical", "butterfly", "hierarchical_tree")
               for label in ("", ", 2 NICs", ", a port per rank", ", fat tree") if f"{name}{label}" in rows[-1]["runs"]]
    lines = ["| p | " + " | ".join(name.replace(", ", ": ") if ", " in name else f"{name}: one NIC"
                                   for name in columns) + " |", "| --- " * (len(columns) + 1) + "|"]
    lines += [f"| {row['ranks']} | " + " | ".join(cell(row, name) for name in columns) + " |"
              for row in rows if row["ranks"] > PER_NODE]
    ports = "\n".join(lines)
    lines = ["| algorithm | p | messages | events | wall s | cpu s | events per cpu s | target | met |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        if row["ranks"] < 1024:
            continue
        for name, done in row["runs"].items():
            if ", " in name:
                continue
            rate = done["events"] / done["cpu"] if done["cpu"] > 0 else float("inf")
            met = rate >= TARGET_EVENTS and done["cpu"] < TARGET_SECONDS
            lines.append(f"| {name} | {row['ranks']} | {done['messages']:,} | {done['events']:,} | "
                         f"{done['wall']:.1f} | {done['cpu']:.1f} | {rate:,.0f} | >= {TARGET_EVENTS:,}/s, "
                         f"< {TARGET_SECONDS} s | {'yes' if met else 'no'} |")
    speed = "\n".join(lines)
    sweep = result["sizes"]
    lines = ["| bytes | " + " | ".join(f"fastest, {label}" for label in sweep["ports"]) + " |",
             "| --- " * (len(sweep["ports"]) + 1) + "|"]
    for i, nbytes in enumerate(sweep["bytes"]):
        cells = []
        for by in sweep["ports"].values():
            name = by["fastest"][i]
            cells.append(f"{name} ({by['seconds'][name][i] * 1e3:.3f} ms)")
        lines.append(f"| {human(nbytes)} | " + " | ".join(cells) + " |")
    sizes = "\n".join(lines)
    six = result["sixteen"]
    lines = ["| algorithm | ms |", "| --- | --- |"]
    lines += [f"| {name} | {seconds * 1e3:.3f} |" for name, seconds in six["seconds"].items()]
    return {"10_scaling.md": scaling, "10_ports.md": ports, "10_speed.md": speed, "10_sizes.md": sizes,
            "10_sixteen.md": "\n".join(lines)}


def plots(result, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = result["scaling"]
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for name in ALGORITHMS:
        points = [(row["ranks"], row["runs"][name]["seconds"] * 1e3) for row in rows if name in row["runs"]]
        axes[0].plot(*zip(*points), marker="o", ms=3, label=name)
    for axis in axes:
        axis.plot([row["ranks"] for row in rows], [row["network_bound"] * 1e3 or math.nan for row in rows], "k--",
                  label="lower bound (one port per node)")
    for name, style in (("rabenseifner", "-"), ("hierarchical", "--")):
        for label, marker in (("", "o"), (", 2 NICs", "s"), (", a port per rank", "^"), (", fat tree", "x")):
            points = [(row["ranks"], row["runs"][name + label]["seconds"] * 1e3) for row in rows
                      if name + label in row["runs"]]
            axes[1].plot(*zip(*points), style, marker=marker, ms=4, label=f"{name}{label or ', one NIC'}")
    axes[0].set(xscale="log", yscale="log", xlabel="ranks p (8 per node)", ylabel="ms",
                title="allreduce of 1 MiB, one NIC per node, simulated")
    axes[1].set(xscale="log", xlabel="ranks p (8 per node)", title="the same on other networks")
    for axis in axes:
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out / "10_scaling.png", dpi=110)
    plt.close(figure)
    sweep = result["sizes"]
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for axis, (label, by) in zip(axes, sweep["ports"].items()):
        for name, times in by["seconds"].items():
            axis.plot(sweep["bytes"], [t * 1e3 for t in times], marker="o", ms=3, label=name)
        axis.set(xscale="log", yscale="log", xlabel="bytes per rank", title=f"p = {sweep['ranks']}, {label}")
        axis.legend(fontsize=7)
    axes[0].set(ylabel="ms")
    figure.tight_layout()
    figure.savefig(out / "10_sizes.png", dpi=110)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="p <= 64, few sizes, p = 64 for the sizes, no figures")
    parser.add_argument("--out", default=str(OUT), help="folder for the outputs (default tutorials/figures/out)")
    parser.add_argument("--crossovers", action="store_true", help="only part 2's crossovers, into 10_sizes.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        fail(f"--out {args.out}: {error.strerror}")
    intra, inter, sources = links()
    if args.crossovers:
        return crossovers(out, intra, inter)
    top = 64 if args.quick else 16384
    ps = [1 << k for k in range(1, int(math.log2(top)) + 1)]
    sizes = [1 << k for k in (range(8, 27, 9) if args.quick else range(8, 27, 2))]
    start, load = time.perf_counter(), os.getloadavg()
    result = {"links": {"intra": {"alpha": intra.L, "beta": intra.G}, "inter": {"alpha": inter.L, "beta": inter.G},
                        "sources": sources, "ranks_per_node": PER_NODE}}
    result["scaling"] = scaling(ps, intra, inter)
    result["sizes"] = size_sweep(64 if args.quick else SIZES_P, sizes, intra, inter)
    result["sixteen"] = sixteen(intra, inter, 64 if args.quick else SIZES_P)
    result["wall_seconds"] = time.perf_counter() - start
    result["load_average"] = {"before": load, "after": os.getloadavg(), "cores": os.cpu_count()}
    result["quick"] = args.quick
    return write(result, out, {"10_scaling.json": "scaling", "10_sizes.json": "sizes", "10_sixteen.json": "sixteen"},
                 markdown, None if args.quick else plots, kept=("links", "load_average"))


if __name__ == "__main__":
    main()
