"""Simulated allreduce times at any p: the real hearts on a LogGP network (collectives.sim).

    python -m collectives.simulate --ranks 1024 --bytes 1M --sizes-only
    python -m collectives.simulate --ranks 64 --ranks-per-node 8 --nics-per-node 2 --bytes 4M \\
        --algorithms ring,hierarchical
    python -m collectives.simulate --ranks 256 --bytes 1M --json sim.json      # with data: sums checked

For each algorithm, one allreduce of --bytes bytes (float32) on --ranks simulated ranks, each rank
running the algorithm's heart unchanged as a coroutine (collectives.sim.engine). Printed, as
collectives.bench prints its measurements: the simulated seconds, the closed form beside it
(collectives.model.two_level.predict_on_nodes at L = alpha, G = beta: each algorithm on nodes of c
ranks whose K NICs the ranks share; on one node, collectives.model.cost's forms), the alpha-beta
lower bound (at the fastest link's alpha and beta: no message costs less), the messages, the
engine's events, its wall and CPU time and events per CPU second, and a target column:

    =model    with o = g = 0 and the shapes where two_level.exact_on_nodes holds (blocks of equal size;
              c dividing p and powers of two where the algorithm's form needs them), the simulated
              time equals the closed form to float rounding
    >=200k/s  from p = 1024, at least 200,000 events per CPU second of the engine and the hearts
              together (CPU time: a busy machine stretches it less than the wall time; both printed)
    <600s     from p = 1024, each algorithm's simulation in under ten minutes of one core

Without --sizes-only every rank holds real float32 values (rank r, element i: r mod 7 + i mod 5,
small integers whose sum is exact), and every rank's result is compared with the exact sum; a
wrong one stops the run with `error:`. With --sizes-only the ranks hold collectives.sim.Sized
stand-ins: no element is stored, copied or added, so p = 16,384 at 1 MiB needs no GiB of memory.

Links: --alpha and --beta (the network between nodes), --intra-alpha and --intra-beta (inside a
node; default: the network's), --overhead o and --gap g (both links). --ranks-per-node c and
--nics-per-node K: c ranks per node sharing K network ports (default 1; K >= c gives every rank its
own). --nodes-per-switch S and --uplinks U: a two-level fat tree whose leaf switches let at most U
messages out (and in) at once (collectives.sim.FatTree; the =model target is then checked only at
full bisection, U >= S K). The defaults are round numbers of the right order for a cluster (2 us
and 10 GB/s), not measured here.

JSON (--json OUT): a list of objects with algorithm, ranks, bytes, seconds (simulated),
closed_form_seconds, lower_bound_seconds, model (the closed form's algorithm), ranks_per_node,
nics_per_node, sizes_only, messages, events, wall_seconds, cpu_seconds, events_per_second (per CPU
second), target, met. Bad flags stop with one line `error: ...` and exit status 2.
"""
import json
import time

import numpy as np

from .. import auto
from ..cli import Parser, fail, human, number, output_path, parse_size
from ..model import cost, two_level
from ..table import ALGORITHMS, HEARTS
from .comm import SimComm
from .engine import Engine
from .fattree import FatTree
from .network import LogGP, Topology
from .sized import Sized

DTYPE = np.dtype(np.float32)
EVENTS_PER_SECOND, CPU_SECONDS = 200_000, 600       # the targets from p = 1024 (see the header)


def values(rank, count):
    """Rank `rank`'s input: r mod 7 + i mod 5 (small integers: every order of addition is exact)."""
    return (rank % 7 + np.arange(count) % 5).astype(DTYPE)


def exact_sum(ranks, count):
    """The sum of every rank's `values`, from the formula, not from any algorithm."""
    return (sum(rank % 7 for rank in range(ranks)) + ranks * (np.arange(count) % 5)).astype(DTYPE)


def simulate(algorithm, topology, nbytes, sizes_only=False, record=False, fabric=None):
    """Run `algorithm`'s heart on every rank of `topology` once; returns (seconds, engine, wrong ranks).

    wrong ranks: the ranks whose result differs from the exact sum ([] in sizes-only mode).
    fabric: None (every rank's ports straight onto the network) or {"nodes_per_switch": S,
    "uplinks": K}, a two-level fat tree (collectives.sim.FatTree)."""
    heart, count = HEARTS[algorithm], nbytes // DTYPE.itemsize
    p = topology.ranks
    expected = None if sizes_only else exact_sum(p, count)
    wrong = []

    def program(comm):
        rank = comm.Get_rank()
        data = Sized(count, DTYPE) if sizes_only else values(rank, count)
        if p > 1 and count > 0:
            heart(comm, data, "sum")
        if expected is not None and not np.array_equal(data, expected):
            wrong.append(rank)

    engine = (FatTree(topology, **fabric, move_data=not sizes_only, record=record) if fabric
              else Engine(topology, move_data=not sizes_only, record=record))
    seconds = engine.run(program, SimComm)
    return seconds, engine, wrong


def closed_form(algorithm, topology, nbytes):
    """(seconds, model name): the closed form on nodes (two_level.predict_on_nodes) at L = alpha, G = beta."""
    p, c, nics = topology.ranks, topology.ranks_per_node, topology.nics_per_node
    model = auto.choose_name(nbytes, p) if algorithm == "auto" else algorithm
    intra, inter = (topology.intra.L, topology.intra.G), (topology.inter.L, topology.inter.G)
    return two_level.predict_on_nodes(model, p, nbytes, c, intra, inter, nics if nics < c else None), model


def exact_expected(model, topology, nbytes):
    """Whether the closed form should equal the simulation to rounding (see the header's =model)."""
    intra, inter = topology.intra, topology.inter
    if intra.o or intra.g or inter.o or inter.g:
        return False
    return two_level.exact_on_nodes(model, topology.ranks, nbytes // DTYPE.itemsize, topology.ranks_per_node)


def row(algorithm, topology, nbytes, sizes_only, fabric=None):
    """One simulated allreduce as a JSON object (see the header)."""
    start, start_cpu = time.perf_counter(), time.process_time()
    seconds, engine, wrong = simulate(algorithm, topology, nbytes, sizes_only, fabric=fabric)
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if wrong:
        raise RuntimeError(f"{algorithm} on {topology.ranks} simulated ranks gave a wrong sum on ranks {wrong[:8]}")
    model_seconds, model = closed_form(algorithm, topology, nbytes)
    links = (topology.intra, topology.inter) if topology.nodes > 1 else (topology.intra,)
    fastest_alpha, fastest_beta = min(link.L for link in links), min(link.G for link in links)
    checks = []
    ports = min(topology.nics_per_node, topology.ranks_per_node)
    limited = fabric and fabric["uplinks"] < fabric["nodes_per_switch"] * ports
    if not limited and exact_expected(model, topology, nbytes):
        checks.append(("=model", abs(seconds - model_seconds) <= 1e-9 * max(model_seconds, 1e-300)))
    if topology.ranks >= 1024:
        checks.append((f">={EVENTS_PER_SECOND // 1000}k/s", cpu > 0 and engine.events / cpu >= EVENTS_PER_SECOND))
        checks.append((f"<{CPU_SECONDS}s", cpu < CPU_SECONDS))
    return {"algorithm": algorithm, "ranks": topology.ranks, "bytes": nbytes, "seconds": seconds,
            "closed_form_seconds": model_seconds, "model": model,
            "lower_bound_seconds": cost.predict("lower bound", topology.ranks, nbytes, fastest_alpha, fastest_beta),
            "ranks_per_node": topology.ranks_per_node, "nics_per_node": topology.nics_per_node,
            "sizes_only": sizes_only,
            "messages": engine.messages, "events": engine.events, "wall_seconds": wall, "cpu_seconds": cpu,
            "events_per_second": engine.events / cpu if cpu > 0 else None,
            "target": ",".join(text for text, _ in checks) or "-",
            "met": all(ok for _, ok in checks) if checks else None}


# ---- the command line ----------------------------------------------------------------------------

def settings(argv):
    """The parsed and checked flags: (topology, nbytes, algorithms, sizes_only, json path)."""
    parser = Parser(prog="python -m collectives.simulate", description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", required=True, help="simulated ranks p (>= 1)")
    parser.add_argument("--bytes", required=True, help="bytes per rank, e.g. 4096, 64K, 1M (a multiple of 4)")
    parser.add_argument("--ranks-per-node", help="ranks per node c (default: every rank on one node)")
    parser.add_argument("--nics-per-node", default="1", help="network ports K per node, shared by its ranks "
                                                            "(default 1; K >= c: one per rank)")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS),
                        help="comma-separated, from: " + ", ".join(ALGORITHMS))
    parser.add_argument("--sizes-only", action="store_true", help="no data: buffers are stand-ins (large p)")
    parser.add_argument("--json", help="write the rows as a JSON list here")
    parser.add_argument("--alpha", default="2e-6", help="network latency L, seconds")
    parser.add_argument("--beta", default="1e-10", help="network seconds per byte G")
    parser.add_argument("--intra-alpha", help="latency L inside a node (default: --alpha)")
    parser.add_argument("--intra-beta", help="seconds per byte G inside a node (default: --beta)")
    parser.add_argument("--overhead", default="0", help="LogGP o, seconds of CPU per message at each end")
    parser.add_argument("--gap", default="0", help="LogGP g, least seconds between two messages on a port")
    parser.add_argument("--nodes-per-switch", help="a two-level fat tree: nodes under each leaf switch "
                                                  "(default: no switches, full bisection)")
    parser.add_argument("--uplinks", help="with --nodes-per-switch: links from each leaf to the spine "
                                          "(default: one per network port under it, full bisection)")
    args = parser.parse_args(argv)
    ranks = number("--ranks", args.ranks, 1, integer=True)
    try:
        nbytes = parse_size(args.bytes)
    except (ValueError, KeyError, IndexError):
        fail(f"--bytes must be a size such as 4096, 64K or 1M, got {args.bytes!r}")
    if nbytes < 0 or nbytes % DTYPE.itemsize:
        fail(f"--bytes must be >= 0 and a multiple of {DTYPE.itemsize} (float32 elements), got {args.bytes!r}")
    per_node = ranks if args.ranks_per_node is None else number("--ranks-per-node", args.ranks_per_node, 1, True)
    nics = number("--nics-per-node", args.nics_per_node, 1, integer=True)
    names = [name.strip() for name in args.algorithms.split(",") if name.strip()]
    unknown = [name for name in names if name not in ALGORITHMS]
    if unknown or not names:
        fail(f"unknown --algorithms {', '.join(unknown) or repr(args.algorithms)}; choose from {', '.join(ALGORITHMS)}")
    alpha, beta = number("--alpha", args.alpha), number("--beta", args.beta)
    intra_alpha = alpha if args.intra_alpha is None else number("--intra-alpha", args.intra_alpha)
    intra_beta = beta if args.intra_beta is None else number("--intra-beta", args.intra_beta)
    o, g = number("--overhead", args.overhead), number("--gap", args.gap)
    output_path("--json", args.json)
    topology = Topology(ranks, per_node, LogGP(L=intra_alpha, o=o, g=g, G=intra_beta), LogGP(L=alpha, o=o, g=g, G=beta),
                        nics)
    fabric = None
    if args.nodes_per_switch is not None:
        switch = number("--nodes-per-switch", args.nodes_per_switch, 1, integer=True)
        uplinks = (switch * min(nics, per_node) if args.uplinks is None
                   else number("--uplinks", args.uplinks, 1, integer=True))
        fabric = {"nodes_per_switch": switch, "uplinks": uplinks}
    elif args.uplinks is not None:
        fail("--uplinks needs --nodes-per-switch (the fat tree's leaf switches)")
    return topology, nbytes, names, args.sizes_only, args.json, fabric


def main(argv=None):
    topology, nbytes, names, sizes_only, path, fabric = settings(argv)
    print(f"# p = {topology.ranks} simulated ranks, {topology.ranks_per_node} per node ({topology.nodes} nodes, "
          f"{topology.nics_per_node} NIC{'s' if topology.nics_per_node > 1 else ''} each); "
          f"{human(nbytes)} per rank; {'sizes only' if sizes_only else 'with data, sums checked'}")
    for label, link in (("inside a node", topology.intra), ("between nodes", topology.inter)):
        print(f"# {label}: L = {link.L * 1e6:g} us, G = {link.G * 1e9:g} ns/B, o = {link.o * 1e6:g} us, "
              f"g = {link.g * 1e6:g} us")
    if fabric:
        print(f"# fat tree: {fabric['nodes_per_switch']} nodes per leaf switch, {fabric['uplinks']} uplinks each "
              f"(at most that many messages leave or enter a leaf at once)")
    print(f"{'algorithm':<22} {'ranks':>6} {'bytes':>9} {'simulated us':>13} {'closed us':>11} {'sim/closed':>10} "
          f"{'bound us':>10} {'messages':>9} {'events':>9} {'wall s':>7} {'cpu s':>7} {'events/s':>9}  "
          f"{'target':<12} met")
    rows = []
    for name in names:
        try:
            record = row(name, topology, nbytes, sizes_only, fabric)
        except RuntimeError as error:
            fail(str(error))
        rows.append(record)
        label = f"{name}({record['model']})" if name == "auto" else name
        ratio = record["seconds"] / record["closed_form_seconds"] if record["closed_form_seconds"] else 1.0
        met = record["met"]
        print(f"{label:<22} {record['ranks']:>6} {human(nbytes):>9} {record['seconds'] * 1e6:13.2f} "
              f"{record['closed_form_seconds'] * 1e6:11.2f} {ratio:10.4f} {record['lower_bound_seconds'] * 1e6:10.2f} "
              f"{record['messages']:>9} {record['events']:>9} {record['wall_seconds']:7.2f} "
              f"{record['cpu_seconds']:7.2f} "
              f"{record['events_per_second'] or 0:9.0f}  {record['target']:<12} "
              f"{'-' if met is None else 'met' if met else 'NO'}", flush=True)
    if path:
        with open(path, "w") as file:
            json.dump(rows, file, indent=1)
    return rows
