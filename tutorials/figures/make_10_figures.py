"""The figures and tables of chapter 10 (scaling past one machine), from the simulated network: sections
5, 6 (beside the emulated hosts), 7 and 8; sections 2 to 4 come from make_10_scaling.py.

    python tutorials/figures/make_10_figures.py            # about 3 minutes on 2 loaded cores
    python tutorials/figures/make_10_figures.py --quick    # p <= 16, a few sizes: seconds, into --out
    python tutorials/figures/make_10_figures.py --out DIR

Every allreduce runs its real heart on collectives.sim's simulated ranks (sizes only: no data),
timed by LogGP with o = g = 0, on a two-level topology of 8 ranks per node sharing one NIC:

    inside a node   alpha and beta of chapter 3's ping-pong fit on this machine (03_bench_p2.json)
    between nodes   alpha and beta of the emulated link, make_10_cluster.py's fit on a quiet machine
                    (quiet/10_link.json: the one link fit of the whole chapter; the loaded run's
                    10_link.json, whose alpha is the scheduler's, is not used here)

1. reproduction: Ben-Nun & Hoefler's allreduce table (Tree, Butterfly, Pipeline, RedScat+Gat,
   lower bound), its formulas written out here from the survey, beside our simulated times on a
   flat network (one link: the emulated one) at p = 64, and the table's "butterfly for small vectors,
   RedScat+Gat for large" crossover against the simulated one (found by bisection)
                                                                         -> 10_reproduction.json/.md
2. emulated hosts: the measured allreduces of make_10_cluster.py's quiet run (quiet/10_allreduce.json,
   the same job as the link fit) beside the simulator's time for the same hosts x ranks and sizes,
   each host one NIC (its one link)                                      -> 10_emulated.json/.md
3. data parallelism: one step = forward + backward of LeNet-5 or the MLP, measured with minidl
   on one core at the batch each rank gets (the best of a few repeats, in CPU seconds), + the simulated
   two-level allreduce of the gradient (float32, one NIC per node); strong scaling (global batch 1024,
   p up to 1024) and weak scaling (32 rows per rank), speed-up and efficiency
                                                                         -> 10_data_parallel.json/.png
4. pipeline: GPipe and 1F1B on P = 2 .. 64 stages, one stage per node, m micro-batches; each
   stage runs algorithms.pipeline_parallel.schedule (the chapter 6 heart) as a simulated rank:
   forward 10 ms, backward 20 ms (chapter 6's), activations and gradients of 32 x 256 float32
   between stages over the network link. Bubble = 1 - busy / (P x span), against
   (P - 1) / (m + P - 1), with messages costed and free                 -> 10_pipeline.json/.png

The chapter quotes 10_reproduction.md, 10_emulated.md and 10_strong.md verbatim and its other numbers
from the JSON (tests/test_chapter10_numbers.py). The simulated times are deterministic (the same
inputs give the same seconds); the compute times of part 3 are measured, so they move a little from
run to run.
"""
import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")     # BLAS on one thread: section 7 times one core
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from algorithms.core.objective import Data, NetworkObjective  # noqa: E402
from algorithms.pipeline_parallel import schedule  # noqa: E402
from collectives.model import cost  # noqa: E402
from collectives.sim import Engine, LogGP, SimComm, Sized, Topology  # noqa: E402
from collectives.sim.simulate import simulate  # noqa: E402
from minidl import functional as F, models  # noqa: E402
from minidl.tensor import Tensor  # noqa: E402

OUT = HERE / "out"
LINK = OUT / "quiet" / "10_link.json"             # make_10_cluster.py --out tutorials/figures/out/quiet
MEASURED = OUT / "quiet" / "10_allreduce.json"    # the same job's measured allreduces
PER_NODE = 8
GLOBAL_BATCH, WEAK_BATCH = 1024, 32
FORWARD, BACKWARD = 0.010, 0.020                 # seconds per micro-batch and stage (chapter 6's Work layer)
ACTIVATION_BYTES = 32 * 256 * 4                   # one micro-batch's activations (and gradients) between stages
TABLE = {                                         # Ben-Nun & Hoefler 2019, the allreduce table: T(P, m) with L, G
    "Tree": lambda P, m, L, G: 2 * L * math.log2(P) + 2 * m * G * math.log2(P),
    "Butterfly": lambda P, m, L, G: L * math.log2(P) + m * G * math.log2(P),
    "Pipeline": lambda P, m, L, G: 2 * L * (P - 1) + 2 * m * G * (P - 1) / P,
    "RedScat+Gat": lambda P, m, L, G: 2 * L * math.log2(P) + 2 * m * G * (P - 1) / P,
    "lower bound": lambda P, m, L, G: L * math.log2(P) + 2 * m * G * (P - 1) / P,
}
OURS = {"Tree": "tree", "Butterfly": "butterfly", "Pipeline": "ring", "RedScat+Gat": "rabenseifner"}


def fail(message):
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(2)


def links():
    """(intra, inter, sources): LogGP links from chapter 3's fit and the emulated link's fit."""
    with open(OUT / "03_bench_p2.json") as handle:
        runs = json.load(handle)
    first = runs[0][0] if isinstance(runs[0], list) else runs[0]
    intra = LogGP(L=first["alpha"], G=first["beta"])
    with open(LINK) as handle:
        link = json.load(handle)["link"]
    inter = LogGP(L=link["alpha"], G=link["beta"])
    return intra, inter, {"intra": "03_bench_p2.json (chapter 3's ping-pong fit)",
                          "inter": "quiet/10_link.json (make_10_cluster.py's ping-pong fit on a quiet machine, tbf "
                                   "1gbit)"}


def seconds(algorithm, topology, nbytes):
    return simulate(algorithm, topology, nbytes, sizes_only=True)[0]


def network_bound(p, nbytes, inter):
    """The alpha-beta lower bound over the nodes at the network's parameters (each node one process)."""
    nodes = -(-p // PER_NODE)
    return cost.predict("lower bound", nodes, nbytes, inter.L, inter.G) if nodes > 1 else 0.0


def crossings(sizes, times):
    """The fastest algorithm at each size, and where it changes: [{from, to, sizes: the two sizes run either side}]."""
    best = [min(times, key=lambda name: times[name][i]) for i in range(len(sizes))]
    changes = [{"from": best[i - 1], "to": best[i], "sizes": [sizes[i - 1], sizes[i]]}
               for i in range(1, len(sizes)) if best[i - 1] != best[i]]
    return best, changes


def bisect_crossover(topology, low, high, first="butterfly", second="rabenseifner", steps=30):
    """(low, high), multiples of 4 bytes: `first` simulated faster than `second` at low, not at high."""
    def gap(n):
        return seconds(first, topology, n) - seconds(second, topology, n)
    for _ in range(steps):
        middle = int(math.sqrt(low * high)) // 4 * 4
        if middle in (low, high):
            break
        low, high = (middle, high) if gap(middle) < 0 else (low, middle)
    return low, high


def reproduction(inter, p=64, nbytes=1 << 20):
    """Ben-Nun & Hoefler's table at p ranks on one link, beside the simulated times."""
    flat = Topology(p, p, inter, inter)
    rows = []
    for row, formula in TABLE.items():
        ours = seconds(OURS[row], flat, nbytes) if row in OURS else None
        rows.append({"row": row, "algorithm": OURS.get(row, "lower bound"),
                     "table": formula(p, nbytes, inter.L, inter.G),
                     "simulated": ours})
    L, G, lg = inter.L, inter.G, math.log2(p)
    table_crossover = L * lg / (G * (lg - 2 * (p - 1) / p))       # Butterfly = RedScat+Gat in the table
    low, high = bisect_crossover(flat, 4, 64 << 20)
    return {"ranks": p, "bytes": nbytes, "alpha": L, "beta": G, "rows": rows,
            "table_crossover_bytes": table_crossover, "simulated_crossover_bytes": [low, high]}


def emulated(intra, inter):
    with open(MEASURED) as handle:
        measured = json.load(handle)["rows"]
    rows = []
    for row in measured:
        if row["algorithm"] not in ("ring", "rabenseifner"):
            continue
        p = row["hosts"] * row["ranks_per_host"]
        simulated = seconds(row["algorithm"], Topology(p, row["ranks_per_host"], intra, inter), row["bytes"])
        rows.append({"hosts": row["hosts"], "ranks_per_host": row["ranks_per_host"], "algorithm": row["algorithm"],
                     "bytes": row["bytes"], "measured": row["seconds"], "simulated": simulated,
                     "model": row["model_seconds"], "simulated_over_measured": simulated / row["seconds"]})
    return rows


def build(model):
    rng = np.random.default_rng(0)
    return models.lenet5(rng) if model == "lenet5" else models.mlp(rng, in_features=784, hidden=(256, 256))


def compute_seconds(model, batches, repeats):
    """Forward + backward of `model` at each batch size, on this core: the best of `repeats`, in CPU
    seconds of this process (time.process_time: the time other processes take the core does not count)."""
    net = build(model)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((max(batches), 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, max(batches))
    objective = NetworkObjective(net, Data(x, y, x[:1], y[:1]))
    out = {}
    for batch in batches:
        best = float("inf")
        for _ in range(repeats):
            start = time.process_time()
            objective.flat.zero_grad()
            loss = F.softmax_cross_entropy(objective.net(Tensor(x[:batch])), y[:batch])
            loss.backward()
            best = min(best, time.process_time() - start)
        out[batch] = best
    nbytes = int(objective.grad.nbytes)
    return out, nbytes


def data_parallel(ps, intra, inter, repeats):
    result = {}
    for model in ("lenet5", "mlp"):
        batches = sorted({GLOBAL_BATCH // p for p in [1, *ps]} | {WEAK_BATCH})
        compute, nbytes = compute_seconds(model, batches, repeats)
        gradient = nbytes // 4 * 4
        reduce = {p: seconds("hierarchical", Topology(p, PER_NODE, intra, inter), gradient) for p in ps}
        strong = [{"ranks": 1, "compute": compute[GLOBAL_BATCH], "allreduce": 0.0}]
        strong += [{"ranks": p, "compute": compute[GLOBAL_BATCH // p], "allreduce": reduce[p]} for p in ps]
        weak = [{"ranks": 1, "compute": compute[WEAK_BATCH], "allreduce": 0.0}]
        weak += [{"ranks": p, "compute": compute[WEAK_BATCH], "allreduce": reduce[p]} for p in ps]
        for rows, kind in ((strong, "strong"), (weak, "weak")):
            one = rows[0]["compute"]
            for row in rows:
                row["step"] = row["compute"] + row["allreduce"]
                row["speedup"] = (one / row["step"]) * (row["ranks"] if kind == "weak" else 1)
                row["efficiency"] = row["speedup"] / row["ranks"]
        result[model] = {"gradient_bytes": gradient, "compute": {str(b): s for b, s in compute.items()},
                         "strong": strong, "weak": weak}
        best = max(strong, key=lambda row: row["speedup"])
        print(f"{model}: {gradient} gradient bytes; strong scaling best at p = {best['ranks']} "
              f"({best['speedup']:.1f}x)", flush=True)
    return result


def pipeline_span(kind, stages, micro_batches, link):
    """Simulated time of one global batch through `stages` stages (one per node) on `link`, and the
    most micro-batches any stage held at once."""
    held = [0] * stages

    def program(comm):
        me, engine = comm.Get_rank(), comm.engine
        buffer = Sized(ACTIVATION_BYTES // 4, np.float32)
        sends, holding = [], 0

        def compute(seconds_):
            engine.idle(me, engine.clock[me] + seconds_)
        for step, i in schedule(kind, me, stages, micro_batches):
            if step == "forward":
                if me > 0:
                    comm.Recv(buffer, me - 1, 2 * i)
                compute(FORWARD)
                holding += 1
                held[me] = max(held[me], holding)
                if me < stages - 1:
                    sends.append(comm.Isend(buffer, me + 1, 2 * i))
            else:
                if me < stages - 1:
                    comm.Recv(buffer, me + 1, 2 * i + 1)
                compute(BACKWARD)
                holding -= 1
                if me > 0:
                    sends.append(comm.Isend(buffer, me - 1, 2 * i + 1))
        for request in sends:
            request.Wait()
    engine = Engine(Topology(stages, 1, link, link), move_data=False)
    return engine.run(program, SimComm), max(held)


def pipeline(stage_counts, micro_batch_counts, inter):
    rows = []
    for stages in stage_counts:
        for m in micro_batch_counts:
            row = {"stages": stages, "micro_batches": m, "formula": (stages - 1) / (m + stages - 1)}
            for kind in ("gpipe", "1f1b"):
                for label, link in (("free", LogGP()), ("network", inter)):
                    span, held = pipeline_span(kind, stages, m, link)
                    row[f"{kind}_{label}"] = 1 - m * (FORWARD + BACKWARD) / span
                    row[f"{kind}_held"] = held
            rows.append(row)
        print(f"pipeline P = {stages}: bubble at m = {micro_batch_counts[-1]}: "
              f"{rows[-1]['gpipe_network']:.3f} (formula {rows[-1]['formula']:.3f})", flush=True)
    return rows


# ---- tables and figures ---------------------------------------------------------------------------

def human(nbytes):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes:.0f} B"


def markdown(result):
    rep = result["reproduction"]
    lines = ["| Ben-Nun & Hoefler's row | formula | table ms | minidl | simulated ms |", "| --- | --- | --- | --- | "
                                                                                         "--- |"]
    forms = {"Tree": "2 L lg P + 2 m G lg P", "Butterfly": "L lg P + m G lg P", "Pipeline": "2 L (P-1) + 2 m G (P-1)/P",
             "RedScat+Gat": "2 L lg P + 2 m G (P-1)/P", "lower bound": "L lg P + 2 m G (P-1)/P"}
    for row in rep["rows"]:
        ours = "-" if row["simulated"] is None else f"{row['simulated'] * 1e3:.3f}"
        lines.append(f"| {row['row']} | {forms[row['row']]} | {row['table'] * 1e3:.3f} | {row['algorithm']} | {ours} |")
    reproduction = "\n".join(lines)
    lines = ["| hosts x ranks | algorithm | bytes | measured ms | simulated ms | simulated / measured |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in result["emulated"]:
        lines.append(f"| {row['hosts']} x {row['ranks_per_host']} | {row['algorithm']} | {human(row['bytes'])} | "
                     f"{row['measured'] * 1e3:.2f} | {row['simulated'] * 1e3:.2f} | "
                     f"{row['simulated_over_measured']:.2f} |")
    emulated_ = "\n".join(lines)
    lines = ["| model | p | compute ms | allreduce ms | step ms | speed-up | efficiency |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for model, by in result["data_parallel"].items():
        for row in by["strong"]:
            if row["ranks"] in (1, 8, 64, 1024) or row is max(by["strong"], key=lambda r: r["speedup"]):
                lines.append(f"| {model} | {row['ranks']} | {row['compute'] * 1e3:.3f} | "
                             f"{row['allreduce'] * 1e3:.3f} | "
                             f"{row['step'] * 1e3:.3f} | {row['speedup']:.1f} | {row['efficiency']:.2f} |")
    strong = "\n".join(lines)
    return {"10_reproduction.md": reproduction, "10_emulated.md": emulated_,
            "10_strong.md": strong}


def plots(result, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for model, by in result["data_parallel"].items():
        for kind, style in (("strong", "-"), ("weak", "--")):
            rows_ = by[kind]
            axes[0].plot([r["ranks"] for r in rows_], [r["speedup"] for r in rows_], style, marker="o", ms=3,
                         label=f"{model} {kind}")
            axes[1].plot([r["ranks"] for r in rows_], [r["efficiency"] for r in rows_], style, marker="o", ms=3,
                         label=f"{model} {kind}")
    axes[0].set(xscale="log", yscale="log", xlabel="ranks p", ylabel="speed-up over one rank", title="data parallelism")
    axes[1].set(xscale="log", xlabel="ranks p", ylabel="efficiency", title="speed-up / p")
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "10_data_parallel.png", dpi=110)
    plt.close(figure)
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for stages in sorted({row["stages"] for row in result["pipeline"]}):
        rows_ = [row for row in result["pipeline"] if row["stages"] == stages]
        m = [row["micro_batches"] for row in rows_]
        line, = axis.plot(m, [row["formula"] for row in rows_], "-", label=f"P = {stages}: (P-1)/(m+P-1)")
        axis.plot(m, [row["gpipe_network"] for row in rows_], "o", color=line.get_color(), ms=4)
        axis.plot(m, [row["1f1b_network"] for row in rows_], "x", color=line.get_color(), ms=5)
    axis.set(xscale="log", xlabel="micro-batches m", ylabel="bubble fraction",
             title="pipeline bubble: formula (lines), simulated GPipe (o) and 1F1B (x)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out / "10_pipeline.png", dpi=110)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="p <= 16, few sizes, one repeat, no figures")
    parser.add_argument("--out", default=str(OUT), help="folder for the outputs (default tutorials/figures/out)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        fail(f"--out {args.out}: {error.strerror}")
    missing = [str(path.relative_to(OUT)) for path in (OUT / "03_bench_p2.json", LINK, MEASURED) if not path.exists()]
    if missing:
        fail(f"{', '.join(missing)} not in {OUT}: run make_03_figures.py and "
             f"make_10_cluster.py --out {OUT / 'quiet'} first")
    intra, inter, sources = links()
    top = 16 if args.quick else 1024
    ps = [1 << k for k in range(1, int(math.log2(top)) + 1)]
    start = time.perf_counter()
    result = {"links": {"intra": {"alpha": intra.L, "beta": intra.G}, "inter": {"alpha": inter.L, "beta": inter.G},
                        "sources": sources, "ranks_per_node": PER_NODE}}
    result["reproduction"] = reproduction(inter, p=16 if args.quick else 64)
    result["emulated"] = emulated(intra, inter)
    result["data_parallel"] = data_parallel(ps, intra, inter, 1 if args.quick else 5)
    result["pipeline"] = pipeline([2, 4] if args.quick else [2, 4, 8, 16, 32, 64],
                                  [1, 4] if args.quick else [1, 2, 4, 8, 16, 32, 64], inter)
    result["wall_seconds"] = time.perf_counter() - start
    result["quick"] = args.quick
    return write(result, out, {"10_reproduction.json": "reproduction", "10_emulated.json": "emulated",
                               "10_data_parallel.json": "data_parallel", "10_pipeline.json": "pipeline"},
                 markdown, None if args.quick else plots)


def write(result, out, parts, markdown, plots=None, kept=("links",)):
    """Each part of ``result`` to its JSON file (with the ``kept`` fields), its tables, then its plots."""
    for name, part in parts.items():
        with open(out / name, "w") as handle:
            json.dump({**{key: result[key] for key in kept}, part: result[part]}, handle, indent=1)
    for name, text in markdown(result).items():
        (out / name).write_text(text + "\n")
    if plots is not None:
        plots(result, out)
    print(f"wrote {out}: {result['wall_seconds']:.0f} s")
    return result


if __name__ == "__main__":
    main()
