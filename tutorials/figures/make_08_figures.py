"""Regenerate chapter 8's tables and figures (about 15 minutes on 2 idle cores; --quick: about a minute).

    python tutorials/figures/make_08_figures.py
    python tutorials/figures/make_08_figures.py --part pays  # only part 2 (or --part training)
    python tutorials/figures/make_08_figures.py --part tables  # part 1's tables again from 08_training.json
    python tutorials/figures/make_08_figures.py --quick      # 1 seed, 2 epochs, 2 sizes, into a temporary folder
    python tutorials/figures/make_08_figures.py --quick --out DIR

1. Every compressor on the digits CNN at p = 4 (algorithms.compressed_sgd, 20 epochs, seeds 0-4,
   plain SGD at lr 0.2), top-k and 1-bit with and without error feedback, error feedback under the
   default momentum 0.9, and sufficient factors on the MLP (peer to peer at batch 8, through the
   sharded server at batch 32) against allreduce SGD on the same MLP -> 08_training.json,
   08_table.md (accuracy mean with a 95% t interval over the seeds, bytes sent per step and rank,
   seconds), 08_comparisons.md (differences paired by seed, and whether they are inside the
   noise), 08_feedback.png (accuracy per epoch).
2. When compression pays: on p = 2 and 4 ranks, one dense ring allreduce of n float32 entries
   against top-k (1%) compression + the sparse allreduce and QSGD (s = 127, 8 bits an entry) + the
   direct allgather: the bytes each rank sends, counted on the wire (the same every run), and the
   seconds, measured in REPEATS separate launches (each the fastest of 3 timings) and given as
   mean ± 95% t interval over the launches, beside the alpha-beta model with each launch's fitted
   alpha, beta, gamma plus the measured compression time -> 08_pays.json, 08_pays.md, 08_pays.png.
Timings depend on the machine and on what else runs on it; accuracies and bytes do not (same seeds).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
OUT = HERE / "out"                                    # --quick writes to a temporary folder instead
RANKS, BATCH, TRAIN_ROWS = 4, 32, 1438                 # the digits split: 1438 training images
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447}   # Student t, two-sided 95%, by d.o.f.
SEEDS, REPEATS = [0, 1, 2, 3, 4], 5

SGD = ["--momentum", "0", "--lr", "0.2"]           # compressed_sgd's defaults: plain SGD
MOMENTUM = ["--momentum", "0.9", "--lr", "0.05"]   # chapter 4's allreduce_sgd defaults
CONFIGS = {   # label -> (module, flags)
    "none": ("compressed_sgd", ["--compressor", "none", *SGD]),
    "qsgd s=127 (8 bits)": ("compressed_sgd", ["--compressor", "qsgd", "--levels", "127", *SGD]),
    "qsgd s=1 (2 bits)": ("compressed_sgd", ["--compressor", "qsgd", "--levels", "1", *SGD]),
    "rounding 8 bits": ("compressed_sgd", ["--compressor", "rounding", "--bits", "8", *SGD]),
    "rounding 2 bits": ("compressed_sgd", ["--compressor", "rounding", "--bits", "2", *SGD]),
    "terngrad": ("compressed_sgd", ["--compressor", "terngrad", *SGD]),
    "onebit + EF": ("compressed_sgd", ["--compressor", "onebit", *SGD]),
    "onebit, no EF": ("compressed_sgd", ["--compressor", "onebit", "--no-error-feedback", *SGD]),
    "topk 1% + residuals": ("compressed_sgd", ["--compressor", "topk", "--density", "0.01", *SGD]),
    "topk 1%, no residuals": ("compressed_sgd", ["--compressor", "topk", "--density", "0.01",
                                                 "--no-error-feedback", *SGD]),
    "randomk 10% + residuals": ("compressed_sgd", ["--compressor", "randomk", "--density", "0.1", *SGD]),
    "randomk 1% + residuals": ("compressed_sgd", ["--compressor", "randomk", "--density", "0.01", *SGD]),
    "MLP b=8, allreduce": ("sufficient_factors", ["--factors", "never", "--batch-size", "8"]),
    "MLP b=8, factors (auto)": ("sufficient_factors", ["--factors", "auto", "--batch-size", "8"]),
    "MLP b=32, allreduce": ("sufficient_factors", ["--factors", "never"]),
    "MLP b=32, server factors (auto)": ("sufficient_factors", ["--factors", "auto", "--exchange", "server"]),
    # chapter 4's settings, momentum 0.9 and lr 0.05: error feedback meets momentum
    "none, momentum 0.9": ("compressed_sgd", ["--compressor", "none", *MOMENTUM]),
    "onebit + EF, momentum 0.9": ("compressed_sgd", ["--compressor", "onebit", *MOMENTUM]),
    "topk 1% + residuals, momentum 0.9": ("compressed_sgd", ["--compressor", "topk", "--density", "0.01",
                                                             *MOMENTUM]),
    "randomk 10% + residuals, momentum 0.9": ("compressed_sgd", ["--compressor", "randomk", "--density", "0.1",
                                                                 *MOMENTUM]),
}
# --quick: each module and path once (dense, a compressor with its flags, sufficient factors); its one seed
# pairs nothing, so no comparison would be drawn from more runs
QUICK = ["none", "topk 1%, no residuals", "MLP b=8, factors (auto)"]


def run_once(module, flags, seed, epochs):
    """One run at p = RANKS; its per-epoch history, or None if it stopped with an error (diverged)."""
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "log.jsonl"
        command = [MPIEXEC, "-n", str(RANKS), sys.executable, "-m", f"algorithms.{module}", *flags,
                   "--seed", str(seed), "--epochs", str(epochs), "--quiet", "--log", str(log)]
        print("$", " ".join(command[4:]), flush=True)
        done = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
        if done.returncode != 0:
            print("  ", done.stderr.strip().splitlines()[0] if done.stderr.strip() else f"exit {done.returncode}")
            return None
        return [json.loads(line) for line in log.read_text().splitlines()]


def interval(values):
    """(mean, half-width of the 95% t interval) of a list of numbers."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, T_975[len(values) - 1] * sd / math.sqrt(len(values))


def training(seeds, epochs, labels):
    runs = {label: [run_once(*CONFIGS[label], seed, epochs) for seed in seeds] for label in labels}
    (OUT / "08_training.json").write_text(json.dumps({"seeds": seeds, "epochs": epochs, "ranks": RANKS,
                                                       "runs": runs}))
    tables(runs, len(seeds), epochs)


def tables(runs, seeds, epochs):
    """08_table.md, 08_comparisons.md and 08_feedback.png from the runs (--part tables: from 08_training.json)."""
    lines = [f"| run (p = 4) | test accuracy, mean ± 95% CI over {seeds} seeds | bytes per step per rank | seconds | "
             "diverged |",
             "| --- | --- | --- | --- | --- |"]
    for label, histories in runs.items():
        finished = [h for h in histories if h is not None]
        diverged = f"{len(histories) - len(finished)} of {len(histories)}"
        if not finished:
            lines.append(f"| {label} | - | - | - | {diverged} |")
            continue
        batch = 8 if "b=8" in label else BATCH
        steps = epochs * math.ceil(TRAIN_ROWS / (RANKS * batch))
        accuracy, half = interval([h[-1]["test_accuracy"] * 100 for h in finished])
        per_step = sum(h[-1]["bytes"] for h in finished) / len(finished) / (steps * RANKS)
        seconds = sum(h[-1]["seconds"] for h in finished) / len(finished)
        lines.append(f"| {label} | {accuracy:.1f}% ± {half:.1f} | {per_step:,.0f} | {seconds:.1f} | {diverged} |")
    (OUT / "08_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    comparisons(runs, seeds)
    plot_feedback(runs, epochs)


COMPARISONS = [   # (a, b): is a's final test accuracy different from b's, seed by seed?
    ("topk 1% + residuals", "none"), ("topk 1%, no residuals", "topk 1% + residuals"),
    ("onebit + EF", "onebit, no EF"), ("qsgd s=127 (8 bits)", "none"), ("qsgd s=1 (2 bits)", "none"),
    ("rounding 8 bits", "none"), ("rounding 2 bits", "none"), ("terngrad", "none"),
    ("qsgd s=1 (2 bits)", "rounding 2 bits"), ("qsgd s=1 (2 bits)", "terngrad"),
    ("randomk 10% + residuals", "none"), ("randomk 1% + residuals", "topk 1% + residuals"),
    ("MLP b=8, factors (auto)", "MLP b=8, allreduce"),
    ("topk 1% + residuals, momentum 0.9", "none, momentum 0.9"), ("onebit + EF, momentum 0.9", "none, momentum 0.9"),
    ("randomk 10% + residuals, momentum 0.9", "none, momentum 0.9")]


def comparisons(runs, seeds):
    """08_comparisons.md: a - b in test accuracy paired by seed (both runs share the seed's initial
    weights and batches), mean ± 95% t interval over the seeds; inside the noise if it holds 0."""
    lines = [f"| a | b | a - b in test accuracy (points), paired by seed, mean ± 95% CI over {seeds} seeds | verdict |",
             "| --- | --- | --- | --- |"]
    for a, b in COMPARISONS:
        pairs = [(x, y) for x, y in zip(runs.get(a, []), runs.get(b, [])) if x is not None and y is not None]
        if len(pairs) < 2:
            continue
        differences = [100 * (x[-1]["test_accuracy"] - y[-1]["test_accuracy"]) for x, y in pairs]
        mean, half = interval(differences)
        if max(map(abs, differences)) == 0:
            verdict = "the same on every seed"
        elif abs(mean) <= half:
            verdict = "inside the noise"
        else:
            verdict = "a higher, outside the noise" if mean > 0 else "a lower, outside the noise"
        lines.append(f"| {a} | {b} | {mean:+.2f} ± {half:.2f} | {verdict} |")
    (OUT / "08_comparisons.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot_feedback(runs, epochs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for label in ("none", "topk 1% + residuals", "topk 1%, no residuals", "onebit + EF", "onebit, no EF"):
        finished = [h for h in runs.get(label, []) if h is not None]
        if finished:
            curve = [sum(h[e]["test_accuracy"] for h in finished) / len(finished) * 100 for e in range(epochs)]
            axis.plot(range(1, epochs + 1), curve, label=label, linestyle="--" if ", no " in label else "-")
    axis.set_xlabel("epoch")
    axis.set_ylabel("test accuracy (%), mean over seeds")
    axis.set_ylim(50, 100)
    axis.set_title("digits CNN, p = 4, SGD lr 0.2: what error feedback keeps")
    axis.legend()
    figure.tight_layout()
    figure.savefig(OUT / "08_feedback.png", dpi=80)
    plt.close(figure)


# ---- when does compression pay? (runs under mpiexec: --measure) -------------------------------------

EXCHANGES = ("dense ring", "topk 1% + sparse", "qsgd 8 + allgather")


def measure(sizes, out):
    """On every rank: bytes sent and seconds of dense ring allreduce, top-k + sparse allreduce, qsgd + allgather."""
    import numpy as np
    from mpi4py import MPI

    import collectives
    from collectives.bench import calibrate
    from collectives.compression import compress, sparse
    from collectives.model import cost
    from collectives.trace import CountingComm
    comm = MPI.COMM_WORLD
    p, rank = comm.Get_size(), comm.Get_rank()
    alpha, beta, _ = calibrate.fit_alpha_beta(comm, 0.02)
    gamma = calibrate.fit_gamma(comm, 0.02)
    records = []
    for n in sizes:
        grad = np.random.default_rng([n, rank]).normal(size=n).astype(np.float32)
        topk, qsgd = compress.make("topk", density=0.01, dtype=np.float32), compress.make("qsgd", levels=127,
                                                                                         dtype=np.float32)
        rng = np.random.default_rng(rank)

        def dense(on=comm):
            collectives.allreduce(on, grad.copy(), op="sum", algorithm="ring", check=False)

        def sparse_topk(on=comm):
            message = topk.compress(grad)
            sparse.sparse_allreduce(on, message.index, message.values, n, check=False)

        def quantized(on=comm):
            blocks = sparse.allgather(on, qsgd.pack(qsgd.compress(grad, rng)), check=False)
            sum(qsgd.decompress(qsgd.unpack(block, n)) for block in blocks)
        calls = dict(zip(EXCHANGES, (dense, sparse_topk, quantized)))
        sent = {}
        for name, call in calls.items():                 # bytes: one exchange, counted on the wire
            counting = CountingComm(comm)
            call(counting)
            sent[name] = comm.allreduce(counting.bytes_sent, op=MPI.MAX)
        measured = {name: min(calibrate.timed(comm, call, 0.05) for _ in range(3)) for name, call in calls.items()}
        compress_topk = min(calibrate.timed(comm, lambda: topk.compress(grad), 0.02) for _ in range(2))
        compress_qsgd = min(calibrate.timed(comm, lambda: qsgd.pack(qsgd.compress(grad, rng)), 0.02) for _ in range(2))
        wire = qsgd.wire_bytes(n)
        model = {"dense ring": cost.predict("ring", p, 4 * n, alpha, beta, gamma),
                 "topk 1% + sparse": compress_topk + sparse.expected_cost(p, n, 0.01, 4, alpha, beta, gamma),
                 # gather p - 1 messages, then decode and add p of them (decoding ~ compressing)
                 "qsgd 8 + allgather": compress_qsgd + (p - 1) * (alpha + wire * beta) + p * compress_qsgd}
        records.append({"n": n, "bytes": sent, "measured": measured, "model": model,
                        "compress_seconds": {"topk": compress_topk, "qsgd": compress_qsgd}})
    if rank == 0:
        Path(out).write_text(json.dumps({"p": p, "alpha": alpha, "beta": beta, "gamma": gamma, "records": records}))


def summary(launches):
    """One p's launches -> the same layout, every number replaced by [mean, 95% half-width] over them."""
    def combine(values):
        if isinstance(values[0], dict):
            return {key: combine([v[key] for v in values]) for key in values[0]}
        if isinstance(values[0], list):
            return [combine(list(column)) for column in zip(*values)]
        return list(interval(values))
    result = combine(launches)
    for record, *same in zip(result["records"], *(launch["records"] for launch in launches)):
        record["n"] = same[0]["n"]
        record["bytes"] = same[0]["bytes"]
        assert all(r["bytes"] == record["bytes"] for r in same), "the bytes differ between launches"
    result["p"], result["launches"] = launches[0]["p"], len(launches)
    return result


def pays(ranks, sizes, repeats):
    results = {}
    for p in ranks:
        launches = []
        for repeat in range(repeats):
            path = Path(tempfile.gettempdir()) / f"08_pays_p{p}_{repeat}.json"
            command = [MPIEXEC, "-n", str(p), sys.executable, str(Path(__file__).resolve()), "--measure", str(path),
                       "--sizes", ",".join(map(str, sizes))]
            print("$", " ".join(command[2:]), flush=True)
            subprocess.run(command, cwd=ROOT, env=ENV, check=True)
            launches.append(json.loads(path.read_text()))
        results[p] = summary(launches)
    (OUT / "08_pays.json").write_text(json.dumps(results))
    lines = ["| p | n (float32) | bytes sent per rank: dense ring / top-k 1% + sparse / qsgd 8 bits | dense ring "
             "| top-k 1% + sparse allreduce | qsgd 8 bits + allgather |",
             "| --- | --- | --- | --- | --- | --- |"]
    for p, result in results.items():
        for record in result["records"]:
            cells = [f"{record['measured'][k][0] * 1e3:.2f} ± {record['measured'][k][1] * 1e3:.2f} ms "
                     f"(model {record['model'][k][0] * 1e3:.2f})" for k in EXCHANGES]
            sent = " / ".join(f"{record['bytes'][k]:,}" for k in EXCHANGES)
            lines.append(f"| {p} | {record['n']:,} | {sent} | " + " | ".join(cells) + " |")
    (OUT / "08_pays.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for p, result in results.items():
        print(f"p = {p}: alpha {result['alpha'][0] * 1e6:.1f} us, beta {result['beta'][0] * 1e9:.3f} ns/B, "
              f"gamma {result['gamma'][0] * 1e9:.3f} ns/B (means over {result['launches']} launches)")
    plot_pays(results)


def plot_pays(results):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for axis, (p, result) in zip(axes[0], results.items()):
        sizes_n = [r["n"] for r in result["records"]]
        for key, colour in zip(EXCHANGES, ("C0", "C1", "C2")):
            axis.errorbar(sizes_n, [r["measured"][key][0] for r in result["records"]],
                          yerr=[r["measured"][key][1] for r in result["records"]], fmt="o", color=colour, label=key)
            axis.plot(sizes_n, [r["model"][key][0] for r in result["records"]], "-", color=colour, alpha=0.6)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("gradient entries (float32)")
        axis.set_ylabel("seconds per step (dots measured, lines model)")
        axis.set_title(f"p = {p}{' (4 ranks on 2 cores)' if p == 4 else ''}")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(OUT / "08_pays.png", dpi=80)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="1024,16384,262144,1048576")
    parser.add_argument("--part", default="all", choices=["all", "training", "tables", "pays"],
                        help="tables: 08_table.md, 08_comparisons.md, 08_feedback.png again from 08_training.json")
    parser.add_argument("--out", default=None, help="output folder (default: tutorials/figures/out; --quick: a "
                        "temporary folder)")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    if args.measure:
        measure(sizes, args.measure)
        return
    global OUT
    if args.out:
        OUT = Path(args.out)
        OUT.mkdir(parents=True, exist_ok=True)
    if args.quick:
        OUT = OUT if args.out else Path(tempfile.mkdtemp(prefix="make_08_quick_"))
        print(f"--quick: outputs in {OUT}")
        training(seeds=[0], epochs=2, labels=QUICK)
        pays(ranks=[2], sizes=[1024, 65536], repeats=2)
    else:
        if args.part in ("all", "training"):
            training(seeds=SEEDS, epochs=20, labels=list(CONFIGS))
        if args.part == "tables":
            saved = json.loads((OUT / "08_training.json").read_text())
            tables(saved["runs"], len(saved["seeds"]), saved["epochs"])
        if args.part in ("all", "pays"):
            pays(ranks=[2, 4], sizes=sizes, repeats=REPEATS)


if __name__ == "__main__":
    main()
