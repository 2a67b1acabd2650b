"""Regenerate chapter 4's figures, tables and numbers (about 30 minutes on 2 loaded cores; --quick: seconds):

    python tutorials/figures/make_04_figures.py [--quick] [--seeds 0,1,2,3,4] [--out FOLDER] [--only compare|noniid]
    python tutorials/figures/make_04_figures.py --render      # tables and figures again from the JSON, no training

1. compare: `python -m algorithms.compare --ranks p --seed s` for p = 1, 2, 4 and seeds 0 to 4
   (every algorithm, its default settings, 20 epochs) -> 04_compare.json (every history; per p and
   algorithm the final test accuracy of each seed, its mean, standard deviation and 95% t
   interval, the mean of every logged quantity, bytes per rank, examples processed), 04_table.md
   (accuracy as mean ± the half-width of the 95% t interval over the seeds, examples, bytes), 04_differences.md
   (each method minus allreduce SGD, paired by seed, with a
   95% t interval) and 04_compare_p4.png (p = 4: test accuracy against the examples processed by
   all ranks and against the bytes one rank sent; mean line, band from the lowest to the highest
   seed).
2. noniid: model averaging at p = 4 with H = 1, 8, end on iid and on label-sorted shards, seeds
   0, 1, 2 -> 04_noniid.json ({label: {seed: history}}) and 04_noniid.png (mean and band).
Every ± in the chapter is that: mean ± 95% t interval over the n seeds (t with n - 1 degrees of
freedom times s / sqrt n), and so is every ± this script prints.
The seed also draws the train/test split (1438/359 images of the digits), so each seed is a
different test set. Accuracies and bytes do not depend on the machine (same seed, same bits); the
logged seconds do, and on what else runs: they stay in the histories but are not tabulated.
--quick trains in this process on its own MPI ranks (`mpiexec -n 2 python
tutorials/figures/make_04_figures.py --quick`, as a block in chapter 4's section 6 does), 2 seeds,
1 epoch, output to --out (default a temporary folder): a check that the script runs, not numbers
to quote.
"""
import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "out"                   # what the figure scripts write; the scripts themselves stay in HERE
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
sys.path.insert(0, str(ROOT))

from mpi4py import MPI  # noqa: E402

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from algorithms import compare, model_averaging  # noqa: E402
from algorithms.core.objective import load_data  # noqa: E402

TRAIN_ROWS = 1438            # digits: 1797 images, 359 held out for the test set (algorithms/core/objective.py)
TEST_ROWS = 359
REPLICATED = {"ensemble"}    # every member reads the whole training set each epoch (partition "replicated")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mpirun(p, *args):
    command = [MPIEXEC, "-n", str(p), sys.executable, *args]
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, cwd=ROOT, env=ENV, check=True, stdout=subprocess.DEVNULL)


def compare_runs(p, seed, epochs, quick):
    """{algorithm: history} of `algorithms.compare` at p ranks (quick: each algorithm's train on this
    process's ranks, the same settings)."""
    if quick:
        comm, data = MPI.COMM_WORLD, load_data("digits", seed)
        return {name: importlib.import_module(f"algorithms.{name}").train(
                    comm, data=data, dataset="digits", model="cnn", epochs=epochs, lr=0.05, momentum=0.9,
                    batch_size=32, seed=seed, quiet=True)[1]
                for name in compare.compared()}
    path = Path(tempfile.gettempdir()) / f"04_compare_p{p}_s{seed}.json"
    command = [sys.executable, "-m", "algorithms.compare", "--ranks", str(p), "--seed", str(seed), "--epochs",
               str(epochs), "--out", str(path.with_suffix(".png")), "--json", str(path)]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, env=ENV, check=True, stdout=subprocess.DEVNULL)
    return json.loads(path.read_text())["histories"]


def averaging_run(partition, period, seed, epochs, quick):
    """The history of `algorithms.model_averaging` at p = 4 (quick: this process's ranks)."""
    if quick:
        return model_averaging.train(MPI.COMM_WORLD, period=None if period == "end" else int(period),
                                     partition=partition, seed=seed, epochs=epochs, quiet=True)[1]
    log = Path(tempfile.gettempdir()) / f"04_noniid_{partition}_{period}_s{seed}.jsonl"
    mpirun(4, "-m", "algorithms.model_averaging", "--partition", partition, "--period", period,
           "--seed", str(seed), "--epochs", str(epochs), "--quiet", "--log", str(log))
    return [json.loads(line) for line in log.read_text().splitlines()]


def spread(values):
    """(mean, sample standard deviation) of a list; sd 0 for one value."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def mean_interval(values):
    """(mean, half-width of its 95% t interval) of a list."""
    return statistics.mean(values), interval(values)


def interval(values):
    """Half-width of the 95% t interval of the mean of ``values`` (nan for fewer than two)."""
    if len(values) < 2:
        return float("nan")
    return T_975[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5


def examples(name, p, epoch):
    """Training examples processed by all ranks after ``epoch`` epochs."""
    return epoch * TRAIN_ROWS * (p if name in REPLICATED else 1)


def comparison(out, seeds, sizes, epochs, quick):
    histories = {}                                    # p -> name -> seed -> history
    for p in sizes:
        histories[p] = {}
        for seed in seeds:
            for name, history in compare_runs(p, seed, epochs, quick).items():
                histories[p].setdefault(name, {})[seed] = history
    if MPI.COMM_WORLD.rank == 0:
        summarise(out, histories, seeds, sizes, epochs)


def summarise(out, histories, seeds, sizes, epochs):
    """04_compare.json, 04_table.md, 04_differences.md and the figure from {p: {name: {seed: history}}}."""
    summary = {}
    for p, by_name in histories.items():
        summary[p] = {}
        for name, runs in by_name.items():
            accuracy = [runs[seed][-1]["test_accuracy"] for seed in seeds]
            mean, sd = spread(accuracy)
            finals = {key: statistics.mean(runs[seed][-1][key] for seed in seeds) for key in runs[seeds[0]][-1]}
            summary[p][name] = {"accuracy": accuracy, "mean": mean, "sd": sd, "interval": interval(accuracy),
                                "low": min(accuracy), "high": max(accuracy),
                                "final_means": finals,      # every logged quantity, mean over seeds
                                "bytes_per_rank": runs[seeds[0]][-1]["bytes"] / p,
                                "examples": examples(name, p, epochs)}
    differences = {}
    for p, by_name in summary.items():
        base = by_name["allreduce_sgd"]["accuracy"]
        differences[p] = {}
        for name, row in by_name.items():
            if name != "allreduce_sgd":
                paired = [a - b for a, b in zip(row["accuracy"], base)]
                differences[p][name] = {"paired": paired, "mean": statistics.mean(paired),
                                        "interval": interval(paired)}
    result = {"seeds": seeds, "epochs": epochs, "train_rows": TRAIN_ROWS, "test_rows": TEST_ROWS,
              "one_image": 1 / TEST_ROWS, "summary": summary, "differences": differences,
              "histories": histories}
    (out / "04_compare.json").write_text(json.dumps(result))
    names = sorted(summary[sizes[0]], key=lambda name: name != "allreduce_sgd")   # the base first
    last = sizes[-1]
    lines = ["| algorithm | " + " | ".join(f"p = {p}" for p in sizes)
             + f" | p = {last}: examples processed, all ranks"
             + f" | p = {last}: kB sent per rank (1 kB = 1000 bytes) |",
             "| --- | " + " | ".join("---" for _ in sizes) + " | --- | --- |"]
    for name in names:
        cells = [f"{summary[p][name]['mean'] * 100:.1f} ± {summary[p][name]['interval'] * 100:.1f}%" for p in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {summary[last][name]['examples']:,}"
                     + f" | {summary[last][name]['bytes_per_rank'] / 1000:,.0f} |")
    (out / "04_table.md").write_text("\n".join(lines) + "\n")
    rows = ["| algorithm | " + " | ".join(f"p = {p}: minus allreduce_sgd, 95% interval" for p in sizes) + " |",
            "| --- | " + " | ".join("---" for _ in sizes) + " |"]
    for name in names[1:]:
        rows.append(f"| {name} | " + " | ".join(
            f"{differences[p][name]['mean'] * 100:+.2f} ± {differences[p][name]['interval'] * 100:.2f}%"
            for p in sizes) + " |")
    (out / "04_differences.md").write_text("\n".join(rows) + "\n")
    print("\n".join(lines))
    print("\n".join(rows))
    plot_comparison(out / f"04_compare_p{sizes[-1]}.png", histories[sizes[-1]], sizes[-1], seeds)


def band(axis, xs, runs, seeds, **style):
    """Mean line over the seeds and a band from the lowest to the highest seed."""
    columns = list(zip(*[[record["test_accuracy"] for record in runs[seed]] for seed in seeds]))
    line, = axis.plot(xs, [statistics.mean(column) for column in columns], marker=".", **style)
    axis.fill_between(xs, [min(column) for column in columns], [max(column) for column in columns],
                      color=line.get_color(), alpha=0.15, linewidth=0)


def plot_comparison(path, by_name, p, seeds):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for name, runs in by_name.items():
        history = runs[seeds[0]]
        epochs = [record["epoch"] for record in history]
        band(axes[0], [examples(name, p, epoch) for epoch in epochs], runs, seeds, label=name)
        band(axes[1], [record["bytes"] / p for record in history], runs, seeds, label=name)
    axes[0].set_xlabel("training examples processed, all ranks together")
    axes[1].set_xlabel("bytes sent per rank (log scale)")
    axes[1].set_xscale("log")
    axes[0].set_ylabel("test accuracy (359 images; one image = 0.28%)")
    for axis in axes:
        axis.set_ylim(0.85, 1.0)
        axis.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="lower right")
    figure.suptitle(f"small CNN on the digits, p = {p}: mean of {len(seeds)} seeds, band lowest to highest")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def noniid(out, seeds, epochs, periods, quick):
    runs = {}
    for partition in ("shards", "sorted"):
        for period in periods:
            label = f"{partition}, H = {period}"
            runs[label] = {seed: averaging_run(partition, period, seed, epochs, quick) for seed in seeds}
    if MPI.COMM_WORLD.rank != 0:
        return
    (out / "04_noniid.json").write_text(json.dumps(runs))
    plot_noniid(out, runs, seeds)


def plot_noniid(out, runs, seeds):
    """04_noniid.png from {label: {seed: history}}; prints each label's final accuracy, mean ± 95% t interval."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for label, by_seed in runs.items():
        history = by_seed[seeds[0]]
        band(axis, [record["epoch"] for record in history], by_seed, seeds,
             linestyle="-" if label.startswith("shards") else "--",
             label=label.replace("shards", "iid shards").replace("sorted", "label-sorted shards"))
    axis.set_xlabel("epoch")
    axis.set_ylabel("test accuracy of the averaged model")
    axis.set_title(f"model averaging, p = 4: mean of {len(seeds)} seeds, band lowest to highest")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "04_noniid.png", dpi=110)
    plt.close(figure)
    for label, by_seed in runs.items():
        mean, half = mean_interval([by_seed[seed][-1]["test_accuracy"] for seed in seeds])
        print(f"{label:<20} final accuracy {mean:.4f} ± {half:.4f}  bytes {by_seed[seeds[0]][-1]['bytes']}")


def render(out, only=None):
    """Tables and figures from the stored JSON (every seed's history is in it), without training."""
    if only in (None, "compare"):
        stored = json.loads((out / "04_compare.json").read_text())
        seeds = [int(seed) for seed in stored["seeds"]]
        histories = {int(p): {name: {int(seed): history for seed, history in runs.items()}
                              for name, runs in by_name.items()} for p, by_name in stored["histories"].items()}
        summarise(out, histories, seeds, sorted(histories), stored["epochs"])
    if only in (None, "noniid"):
        runs = {label: {int(seed): history for seed, history in by_seed.items()}
                for label, by_seed in json.loads((out / "04_noniid.json").read_text()).items()}
        plot_noniid(out, runs, sorted(next(iter(runs.values()))))
    print(f"rendered into {out}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="this process's ranks, 2 seeds, 1 epoch: a smoke test")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds for both parts "
                        "(default 0,1,2,3,4 for compare and 0,1,2 for noniid; quick 0,1)")
    parser.add_argument("--out", default=None,
                        help="output folder (default: tutorials/figures/out; quick: a temporary one)")
    parser.add_argument("--only", choices=["compare", "noniid"], default=None, help="one part only")
    parser.add_argument("--render", action="store_true",
                        help="write the tables and figures again from 04_compare.json and 04_noniid.json (in --out, "
                             "default tutorials/figures/out): no training")
    args = parser.parse_args(argv)
    if args.render:
        render(Path(args.out) if args.out else OUT, args.only)
        return
    try:
        seeds = [int(seed) for seed in (args.seeds or ("0,1" if args.quick else "0,1,2,3,4")).split(",")]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, not {args.seeds!r}")
    averaging_seeds = seeds if args.seeds or args.quick else seeds[:3]
    if MPI.COMM_WORLD.size > 1 and not args.quick:
        parser.error("run the full script as one process: it starts its own mpiexec runs "
                     "(--quick uses these ranks)")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp()) if args.quick else OUT
    out.mkdir(parents=True, exist_ok=True)
    epochs = 1 if args.quick else 20
    if args.only in (None, "compare"):
        comparison(out, seeds, (MPI.COMM_WORLD.size,) if args.quick else (1, 2, 4), epochs, args.quick)
    if args.only in (None, "noniid"):
        noniid(out, averaging_seeds, epochs, ("1", "end") if args.quick else ("1", "8", "end"), args.quick)
    if MPI.COMM_WORLD.rank == 0:
        print(f"wrote into {out}")


if __name__ == "__main__":
    main()
