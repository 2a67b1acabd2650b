"""ZeRO's Figure 1 measured on real ranks, and DistBelief's locally connected split, for chapter 11.

    python tutorials/figures/make_11_zero.py [--quick] [--out DIR]      # runs mpiexec itself; minutes on 2 cores

11_zero_p<P>.json    ``mpiexec -n P python -m algorithms.memory --ranks P --model wide-mlp --optimizer adam
                     --batch-size 8 --json``, P = 1, 2, 4, 8: data parallelism and ZeRO's three stages on the
                     wide MLP (5,324,810 parameters) with Adam, predicted and measured on P real ranks
11_zero.json         the predicted per-rank model states and totals for P = 1 .. 64 (the plot's lines)
11_zero.png          the plot: bytes per rank against P, model states (left) and the step's peak (right)
11_local_p<P>.json   ``mpiexec -n P python -m algorithms.memory --ranks P --model cnn --json``, P = 1, 2: the
                     rows of the small CNN and of its locally connected twin (spatial local)
11_local_runs.json   ``mpiexec -n 2 python -m algorithms.spatial_parallel --layer local`` against
                     ``python -m algorithms.serial_sgd --model local-cnn``, 10 epochs, seeds 0, 1, 2: the final
                     test accuracy of each, the largest difference of their final weights (relative to the
                     largest weight), the bytes the split's log counted per step
11_zero_tables.md    the chapter's tables of these, as generated
--quick: P = 1, 2 and one seed of one epoch: a check that the script runs, not numbers for the chapter.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from algorithms.memory import accounts  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
METHODS = ("data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3")
ROWS, MIB = 8, 2 ** 20


def run(ranks, *arguments):
    """``mpiexec -n ranks python arguments`` from the repository root, one BLAS thread a rank."""
    command = ([MPIEXEC, "-n", str(ranks)] if ranks else []) + [sys.executable, *arguments]
    subprocess.run(command, cwd=ROOT, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL)


def memory(out, name, ranks, *flags):
    path = os.path.join(out, f"{name}_p{ranks}.json")
    run(ranks, "-m", "algorithms.memory", "--ranks", str(ranks), *flags, "--json", path)
    with open(path) as handle:
        return {record["method"]: record for record in json.load(handle)["rows"] if not record["recompute"]}


def states(parts):
    return parts["params"] + parts["grads"] + parts["optimizer"]


def predicted_sweep(out, largest):
    sweep = {}
    for p in range(1, largest + 1):
        for method, parts in accounts.predicted_rows("wide-mlp", p, ROWS, 8, 2, False, "adam"):
            sweep.setdefault(method, {})[p] = {"states": states(parts), "total": sum(parts.values())}
    with open(os.path.join(out, "11_zero.json"), "w") as handle:
        json.dump(sweep, handle, indent=1)
    return sweep


def plot(sweep, measured, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, panels = plt.subplots(1, 2, figsize=(11, 4.2))
    for column, (part, title) in enumerate((("states", "model states: weights + gradient + Adam's m, v"),
                                            ("total", "the step's most bytes (predicted: the parts' sum)"))):
        axes = panels[column]
        for colour, method in enumerate(METHODS):
            ps = sorted(sweep[method])
            axes.plot(ps, [sweep[method][p][part] / MIB for p in ps], color=f"C{colour}", label=method)
            for p, record in measured.items():
                value = states(record[method]["measured"]) if part == "states" else record[method]["peak"]
                axes.plot(p, value / MIB, "o", color=f"C{colour}", markerfacecolor="none", markersize=8)
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("ranks p")
        axes.set_ylabel("MiB per rank")
        axes.set_title(f"the wide MLP, Adam, 8 rows: {title}", fontsize=9)
    panels[0].legend(frameon=False, fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def zero_markdown(measured):
    lines = ["| p | method | model states, predicted | measured | peak, measured | sent per step, predicted | "
             "measured |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for p, records in measured.items():
        for method in METHODS:
            record = records[method]
            lines.append(f"| {p} | {method} | {states(record['predicted']) / MIB:.2f} | "
                         f"{states(record['measured']) / MIB:.2f} | {record['peak'] / MIB:.2f} | "
                         f"{record['sent']['predicted'] / MIB:.2f} | {record['sent']['measured'] / MIB:.2f} |")
    return lines


def local_runs(out, seeds, epochs):
    from algorithms.core.objective import load_data
    steps = -(-len(load_data("digits", seed=0).x_train) // 32)          # the default batch of 32, the last shorter
    runs = []
    for seed in seeds:
        split, serial = (os.path.join(out, f"11_local_{kind}_{seed}.npz") for kind in ("split", "serial"))
        logs = [os.path.join(out, f"11_local_{kind}_{seed}.jsonl") for kind in ("split", "serial")]
        common = ["--seed", str(seed), "--epochs", str(epochs), "--quiet"]
        run(2, "-m", "algorithms.spatial_parallel", "--layer", "local", *common, "--save", split, "--log", logs[0])
        run(0, "-m", "algorithms.serial_sgd", "--model", "local-cnn", *common, "--save", serial, "--log", logs[1])
        last = []
        for log in logs:
            with open(log) as handle:
                last.append([json.loads(line) for line in handle][-1])
        a, b = np.load(split)["params"], np.load(serial)["params"]
        runs.append({"seed": seed, "epochs": epochs, "split_accuracy": last[0]["test_accuracy"],
                     "serial_accuracy": last[1]["test_accuracy"],
                     "weights_apart": float(np.max(np.abs(a - b)) / np.max(np.abs(b))),
                     "bytes_per_step": last[0]["bytes"] / (epochs * steps)})
        for path in (split, serial, *logs):
            os.remove(path)
    with open(os.path.join(out, "11_local_runs.json"), "w") as handle:
        json.dump(runs, handle, indent=1)
    return runs


def local_markdown(local, runs):
    lines = ["| p | params per rank, predicted | measured | the whole model's |", "| --- | --- | --- | --- |"]
    whole = local[1]["spatial local"]["predicted"]["params"]
    for p, records in local.items():
        record = records["spatial local"]
        lines.append(f"| {p} | {record['predicted']['params'] / 1024:.1f} KiB | "
                     f"{record['measured']['params'] / 1024:.1f} KiB | {whole / 1024:.1f} KiB |")
    lines += ["", "<!-- local runs -->", "| seed | serial SGD's test accuracy | the split's (p = 2) | weights apart, "
              "relative | bytes per step |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['seed']} | {r['serial_accuracy'] * 100:.2f}% | {r['split_accuracy'] * 100:.2f}% | "
              f"{r['weights_apart']:.1e} | {r['bytes_per_step']:.0f} |" for r in runs]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="p = 1, 2 and one seed of one epoch")
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    flags = ("--model", "wide-mlp", "--optimizer", "adam", "--batch-size", str(ROWS))
    measured = {p: memory(args.out, "11_zero", p, *flags) for p in ((1, 2) if args.quick else (1, 2, 4, 8))}
    sweep = predicted_sweep(args.out, 8 if args.quick else 64)
    plot(sweep, measured, os.path.join(args.out, "11_zero.png"))
    local = {p: memory(args.out, "11_local", p, "--model", "cnn") for p in (1, 2)}
    runs = local_runs(args.out, [0] if args.quick else [0, 1, 2], 1 if args.quick else 10)
    lines = ["<!-- zero wide-mlp -->"] + zero_markdown(measured) + ["", "<!-- local -->"] + local_markdown(local, runs)
    with open(os.path.join(args.out, "11_zero_tables.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
