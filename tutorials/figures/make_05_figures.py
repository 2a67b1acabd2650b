"""The figures and tables of chapter 5 (parameter servers and consistency); about 6 minutes on 2 shared cores.

    mpiexec -n 4 python tutorials/figures/make_05_figures.py [--quick] [--seeds N] [--only PART] [--out DIR]

Every part runs on 4 ranks (1 server + 3 workers for the parameter-server parts) with the digits
loaded once (seed 0's split); the seed changes the initialisation and the batch order.

downpour   Dean et al.'s figure 4, small: Downpour + Adagrad, fixed-rate Downpour, one replica
           (serial SGD), lr 0.05, 10 epochs, 5 seeds: the final test accuracy and the seconds to
           reach 90%                                                             -> 05_downpour.png
warmstart  Downpour + Adagrad with and without --warm-start-steps 20, 10 epochs, 5 seeds
ssp        SSP with s = 0, 2, 8, inf, 3 epochs, 3 seeds, without and with a straggler (worker rank
           3 sleeps 20 ms before each step): the clock staleness of every update, and each
           worker's seconds spent waiting inside its step (push + fetch, less the gradient) -> 05_staleness.png
nfetch     Downpour + Adagrad with n_fetch = n_push = 1, 4, 16, 3 epochs, 5 seeds: pushes and fetches
           (server 0's log), the mean staleness of the applied pushes, the final test accuracy
hogwild    Hogwild on 1, 2 and 4 processes (the first p ranks), sparse and CNN, 5 seeds: updates
           (examples) per second in all and per process, the seconds to a target (loss gap 1e-3, test
           accuracy 90%)                                                         -> 05_hogwild.png

Everything is written to out/05_measurements.json (one key per part; --only replaces that key and
keeps the others; "meta" says, per part, the seeds, the command and the machine's load average
before it ran) and 05_table.md; the prose of tutorials/05_parameter_servers.md quotes them.
--replot redraws the figures from the JSON. --quick (for CI, about 10 s): one seed, one epoch,
two settings per part, output under a temporary folder.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from algorithms import downpour_sgd, hogwild, serial_sgd, ssp_sgd  # noqa: E402
from algorithms.core import objective  # noqa: E402

comm = MPI.COMM_WORLD
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")   # what the figure scripts write
PARTS = ("downpour", "warmstart", "nfetch", "ssp", "hogwild")
LR = 0.05
TARGET_ACCURACY, TARGET_GAP = 0.90, 1e-3
STRAGGLER_DELAY = 0.02


def wait():
    """A barrier that sleeps, so idle ranks leave the cores to the working ones."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.005)


def spread(values):
    """Mean, sample standard deviation, min and max of one number over seeds (None values dropped)."""
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1
            else 0.0, "min": float(min(values)), "max": float(max(values)), "values": [float(v) for v in values]}


def time_to(history, key, reached):
    """The seconds of the first epoch whose ``key`` passes ``reached`` (None: never)."""
    return next((h["seconds"] for h in history if reached(h[key])), None)


def downpour(data, seeds, epochs):
    runs = {"adagrad": [], "sgd": [], "one replica": []}
    for seed in seeds:
        for optimizer in ("adagrad", "sgd"):
            _, history = downpour_sgd.train(comm, epochs=epochs, lr=LR, seed=seed, server_optimizer=optimizer,
                                            quiet=True, data=data)
            runs[optimizer].append(history)
        if comm.rank == 0:
            _, history = serial_sgd.train(epochs=epochs, lr=LR, momentum=0.0, seed=seed, quiet=True, data=data)
            runs["one replica"].append(history)
        wait()
    return {label: {"final_accuracy": spread([h[-1]["test_accuracy"] for h in histories]),
                    "seconds": spread([h[-1]["seconds"] for h in histories]),
                    "seconds_to_90": spread([time_to(h, "test_accuracy", lambda a: a >= TARGET_ACCURACY)
                                             for h in histories]),
                    "reached_90": sum(time_to(h, "test_accuracy", lambda a: a >= TARGET_ACCURACY) is not None
                                      for h in histories),
                    "curves": [[(r["seconds"], r["test_accuracy"]) for r in h] for h in histories]}
            for label, histories in runs.items()}


def warmstart(data, seeds, epochs, steps=20):
    result, runs = {}, {0: [], steps: []}
    for seed in seeds:                     # both inside each seed: a busy spell of the machine hits both alike
        for k in runs:
            runs[k].append(downpour_sgd.train(comm, epochs=epochs, lr=LR, seed=seed, warm_start_steps=k, quiet=True,
                                              data=data)[1])
    for k, histories in runs.items():
        result[str(k)] = {"first_epoch_accuracy": spread([h[0]["test_accuracy"] for h in histories]),
                          "final_accuracy": spread([h[-1]["test_accuracy"] for h in histories]),
                          "seconds": spread([h[-1]["seconds"] for h in histories])}
    return result


def nfetch(data, seeds, epochs, periods):
    """Downpour (Adagrad) with n_fetch = n_push = n: messages against staleness and accuracy."""
    result = {}
    for n in periods:
        runs = []
        for seed in seeds:
            report = {}
            _, history = downpour_sgd.train(comm, epochs=epochs, lr=LR, seed=seed, n_fetch=n, n_push=n, quiet=True,
                                            data=data, report=report)
            log = report["logs"][0]
            pushes = [event[1] for event in log if event[0] == "push"]
            runs.append({"pushes": len(pushes), "fetches": sum(1 for event in log if event[0] == "fetch"),
                         "staleness": float(np.mean([update.staleness for update in pushes])),
                         "accuracy": history[-1]["test_accuracy"]})
        result[str(n)] = {"n": n, "epochs": epochs, "pushes": [r["pushes"] for r in runs],
                          "fetches": [r["fetches"] for r in runs], "staleness": spread([r["staleness"] for r in runs]),
                          "accuracy": spread([r["accuracy"] for r in runs])}
    return result


class StepClock:
    """Wraps ``ssp_sgd.ssp_step`` to measure, per worker, the seconds inside the step (gradient, push,
    and the wait for the next fetch at the servers' gate) and the seconds in the gradient alone."""

    def __init__(self):
        self.heart, self.inside, self.gradient = ssp_sgd.ssp_step, 0.0, 0.0

    def step(self, replica, rows, i, end_of_epoch, last_step):
        objective_ = replica.objective
        if not getattr(objective_, "timed", False):
            inner = objective_.loss_and_grad

            def loss_and_grad(rows_):
                start = time.perf_counter()
                loss = inner(rows_)
                self.gradient += time.perf_counter() - start
                return loss
            objective_.loss_and_grad, objective_.timed = loss_and_grad, True
        start = time.perf_counter()
        loss = self.heart(replica, rows, i, end_of_epoch, last_step)
        self.inside += time.perf_counter() - start
        return loss


def ssp(data, seeds, epochs, bounds):
    result = {}
    for straggler in (None, comm.size - 1):
        for s in bounds:
            runs = []
            for seed in seeds:
                clock, report = StepClock(), {}
                ssp_sgd.ssp_step = clock.step                    # train looks the step up when called
                try:
                    wait()
                    start = time.perf_counter()
                    _, history = ssp_sgd.train(comm, staleness=s, epochs=epochs, lr=LR, seed=seed, quiet=True,
                                               data=data, report=report, straggler=straggler,
                                               straggler_delay=STRAGGLER_DELAY if straggler else 0.0)
                    seconds = time.perf_counter() - start
                finally:
                    ssp_sgd.ssp_step = clock.heart
                waits = comm.allgather(clock.inside - clock.gradient)
                pushes = [event[1] for event in report["logs"][0] if event[0] == "push"]
                runs.append({"seconds": seconds, "accuracy": history[-1]["test_accuracy"],
                             "clock_staleness": [u.clock_staleness for u in pushes],
                             "wait_fast": float(np.mean(waits[1:comm.size - 1])), "wait_last": waits[-1]})
            result[f"{'straggler' if straggler else 'none'} s={'inf' if s is None else s}"] = {
                "straggler": straggler, "s": s,
                "max_clock_staleness": max(max(r["clock_staleness"]) for r in runs),
                "clock_staleness": sum((r["clock_staleness"] for r in runs), []),
                "seconds": spread([r["seconds"] for r in runs]), "accuracy": spread([r["accuracy"] for r in runs]),
                "wait_fast_workers": spread([r["wait_fast"] for r in runs]),
                "wait_last_worker": spread([r["wait_last"] for r in runs])}
    return result


def hogwild_part(data, seeds, processes, dense_epochs, sparse):
    result = {}
    for problem in ("sparse", "dense"):
        runs = {p: [] for p in processes}
        for seed in seeds:                 # p inside the seeds: a busy spell of the machine hits every p alike
            for p in processes:
                sub = comm.Split(0 if comm.rank < p else MPI.UNDEFINED, comm.rank)
                if sub != MPI.COMM_NULL:
                    extra = dict(sparse) if problem == "sparse" else dict(epochs=dense_epochs, data=data)
                    _, history = hogwild.train(sub, problem=problem, seed=seed, quiet=True, **extra)
                    runs[p].append(history)
                    sub.Free()
                wait()
        for p, histories in runs.items():
            if comm.rank == 0:
                n = sparse.get("n_samples", 5000) if problem == "sparse" else len(data.x_train)
                per_second = [n * len(history) / history[-1]["seconds"] for history in histories]   # examples
                key, reached = (("loss_gap", lambda g: g <= TARGET_GAP) if problem == "sparse" else
                                ("test_accuracy", lambda a: a >= TARGET_ACCURACY))
                result[f"{problem} p={p}"] = {
                    "problem": problem, "p": p, "examples_per_epoch": n, "epochs": len(histories[0]),
                    "examples_per_second": spread(per_second),
                    "examples_per_second_per_process": spread([e / p for e in per_second]),
                    "seconds": spread([h[-1]["seconds"] for h in histories]),
                    "seconds_to_target": spread([time_to(h, key, reached) for h in histories]),
                    "reached_target": sum(time_to(h, key, reached) is not None for h in histories),
                    "final": spread([h[-1][key] for h in histories]),
                    "staleness_mean": spread([float(np.mean([r["staleness_mean"] for r in h])) for h in histories]),
                    "curves": [[(r["seconds"], r[key]) for r in h] for h in histories]}
    return comm.bcast(result, root=0)


T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def half_width(cell):
    """Half-width of the 95% t interval of the mean over the cell's n seeds (0 for one seed)."""
    return T_975[cell["n"] - 1] * cell["std"] / cell["n"] ** 0.5 if cell["n"] > 1 else 0.0


def fmt(cell, digits=3):
    if cell.get("n", 0) == 0:
        return "never"
    return (f"{cell['mean']:.{digits}f} ± {half_width(cell):.{digits}f} "
            f"[{cell['min']:.{digits}f}, {cell['max']:.{digits}f}]")


def section(lines, heading, columns, rows):
    """A markdown table under ``heading``, one row per list of cells, then a blank line."""
    lines += [heading, "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    lines.append("")


def table(results):
    lines = ["# Chapter 5 measurements (make_05_figures.py): mean ± 95% t interval [min, max] over seeds", ""]
    for part, about in results.get("meta", {}).items():
        lines.append(f"- {part}: {about['seeds']} seeds, load average {about['load_average']:.1f} before it "
                     f"(2 cores), `{about['command'].strip()}`")
    lines.append("")
    if "downpour" in results:
        section(lines, "## Downpour (1 server + 3 workers) against one replica",
                ["method", "final test accuracy", "seconds", "seconds to 90% (runs reaching it)"],
                [[label, fmt(r["final_accuracy"]), fmt(r["seconds"], 2),
                  f"{fmt(r['seconds_to_90'], 2)} ({r['reached_90']}/{r['final_accuracy']['n']})"]
                 for label, r in results["downpour"].items()])
    if "warmstart" in results:
        section(lines, "## Warm start (Downpour + Adagrad)",
                ["--warm-start-steps", "accuracy after epoch 1", "final accuracy", "seconds"],
                [[k, fmt(r["first_epoch_accuracy"]), fmt(r["final_accuracy"]), fmt(r["seconds"], 2)]
                 for k, r in results["warmstart"].items()])
    if "nfetch" in results:
        section(lines, "## n_fetch = n_push = n (Downpour + Adagrad, 1 server + 3 workers)",
                ["n", "pushes per seed", "fetches per seed", "mean staleness (versions)", "final test accuracy"],
                [[k, ", ".join(map(str, r["pushes"])), ", ".join(map(str, r["fetches"])), fmt(r["staleness"], 2),
                  fmt(r["accuracy"])] for k, r in results["nfetch"].items()])
    if "ssp" in results:
        section(lines, f"## SSP, without and with a straggler (rank 3 sleeps {STRAGGLER_DELAY} s per step)",
                ["run", "max clock staleness", "seconds", "wait per fast worker (s)", "wait of rank 3 (s)", "accuracy"],
                [[label, str(r["max_clock_staleness"]), fmt(r["seconds"], 2), fmt(r["wait_fast_workers"], 2),
                  fmt(r["wait_last_worker"], 2), fmt(r["accuracy"])] for label, r in results["ssp"].items()])
    if "hogwild" in results:
        section(lines, "## Hogwild (the first p of 4 ranks on 2 shared cores)",
                ["problem, p", "examples/s in all", "examples/s per process", "seconds", "seconds to target (runs)",
                 "final", "mean staleness"],
                [[label, fmt(r["examples_per_second"], 0), fmt(r["examples_per_second_per_process"], 0),
                  fmt(r["seconds"], 2), f"{fmt(r['seconds_to_target'], 2)} ({r['reached_target']}/{r['seconds']['n']})",
                  fmt(r["final"], 5 if r["problem"] == "sparse" else 3), fmt(r["staleness_mean"], 2)]
                 for label, r in results["hogwild"].items()])
        lines.pop()                                # the file ends at the last row
    return "\n".join(lines) + "\n"


def figures(results, out):
    import matplotlib  # rank 0 only: the other ranks need not pay for the import
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if "downpour" in results:
        figure, axis = plt.subplots(figsize=(6.4, 4))
        names = {"adagrad": "Downpour, Adagrad", "sgd": "Downpour, fixed rate", "one replica": "one replica (serial "
                                                                                               "SGD)"}
        for color, (label, r) in zip(colors, results["downpour"].items()):
            for i, curve in enumerate(r["curves"]):
                axis.plot(*zip(*curve), color=color, marker="o", markersize=3, alpha=0.7,
                          label=f"{names[label]}: {100 * r['final_accuracy']['mean']:.1f}% mean" if i == 0 else None)
        axis.axhline(TARGET_ACCURACY, color="grey", linewidth=0.8, linestyle=":")
        axis.set_xlabel("seconds (2 shared cores; Downpour: 1 server + 3 workers)")
        axis.set_ylabel("test accuracy")
        axis.set_ylim(0.5, 1.0)
        axis.legend(loc="lower right")
        axis.set_title(f"Downpour on the digits CNN, lr {LR}: one line per seed")
        figure.tight_layout()
        figure.savefig(os.path.join(out, "05_downpour.png"), dpi=100)
    if "ssp" in results:
        figure, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        rows = {label: r for label, r in results["ssp"].items() if r["straggler"] is not None}
        for label, r in rows.items():
            values = r["clock_staleness"]
            bins = np.arange(0, max(max(values), 1) + 2) - 0.5
            axes[0].hist(values, bins=bins, histtype="step", linewidth=1.5, label=label.split()[-1])
        axes[0].set_xlabel("clock staleness c - min(clocks) at the read")
        axes[0].set_ylabel("updates (all seeds)")
        axes[0].set_yscale("log")
        axes[0].set_title(f"with a straggler (rank 3 +{1000 * STRAGGLER_DELAY:.0f} ms per step)")
        axes[0].legend()
        labels = [label.split()[-1] for label in rows]
        x = np.arange(len(labels))
        for offset, (name, prefix) in zip((-0.2, 0.2), (("no straggler", "none"), ("straggler", "straggler"))):
            cells = [results["ssp"][f"{prefix} {label}"]["wait_fast_workers"] for label in labels]
            means = np.array([c["mean"] for c in cells])
            axes[1].bar(x + offset, means, width=0.4, label=name,
                        yerr=[means - [c["min"] for c in cells], [c["max"] for c in cells] - means])
        axes[1].set_xticks(x, labels)
        axes[1].set_ylabel("seconds per fast worker")
        axes[1].set_title("in push + fetch (the gate's wait), min-max over seeds", fontsize=10)
        axes[1].legend()
        figure.tight_layout()
        figure.savefig(os.path.join(out, "05_staleness.png"), dpi=100)
    if "hogwild" in results:
        figure, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for axis, problem in zip(axes, ("sparse", "dense")):
            rows = [r for r in results["hogwild"].values() if r["problem"] == problem]
            for color, r in zip(colors, rows):
                for i, curve in enumerate(r["curves"]):
                    axis.plot(*zip(*curve), color=color, marker="o", markersize=2, alpha=0.7,
                              label=f"p = {r['p']}: mean {r['examples_per_second']['mean']:.0f} examples/s"
                              if i == 0 else None)
            axis.set_xlabel("seconds (2 shared cores)")
            axis.legend()
        axes[0].set_yscale("log")
        axes[0].set_ylabel("F(w) - F(w*)")
        axes[0].set_title("sparse logistic regression (10 of 500 features)")
        axes[1].set_ylabel("test accuracy")
        axes[1].set_ylim(0.5, 1.0)
        axes[1].set_title("small CNN on the digits (dense gradients)")
        figure.tight_layout()
        figure.savefig(os.path.join(out, "05_hogwild.png"), dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, one epoch, few settings (CI)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per setting (default 3 for ssp, 5 else)")
    parser.add_argument("--only", choices=PARTS, default=None, help="measure one part only")
    parser.add_argument("--replot", action="store_true",
                        help="rewrite 05_table.md and redraw the figures from the JSON, measure nothing")
    parser.add_argument("--out", default=None, help="output folder (default: tutorials/figures/out; --quick: a temp "
                                                    "folder)")
    args = parser.parse_args(argv)
    if comm.size != 4:
        raise SystemExit("error: run on 4 ranks: mpiexec -n 4 python tutorials/figures/make_05_figures.py")
    out = args.out or (comm.bcast(tempfile.mkdtemp(prefix="make05-") if comm.rank == 0 else None)
                       if args.quick else OUT)
    if args.replot:
        if comm.rank == 0:
            with open(os.path.join(out, "05_measurements.json")) as file:
                saved = json.load(file)
            with open(os.path.join(out, "05_table.md"), "w") as file:
                file.write(table(saved))
            figures(saved, out)
        return
    data = objective.load_data("digits", 0)
    if args.quick:                                   # a slice: the check that it runs, not a measurement
        data = objective.Data(data.x_train[:192], data.y_train[:192], data.x_test[:60], data.y_test[:60])
    n = 1 if args.quick else args.seeds
    seeds = {part: list(range(n or (3 if part == "ssp" else 5))) for part in PARTS}
    epochs = 1 if args.quick else 10
    results, meta = {}, {}
    for part in PARTS if args.only is None else (args.only,):
        started = time.perf_counter()
        meta[part] = {"seeds": len(seeds[part]), "quick": args.quick, "load_average": os.getloadavg()[0],
                      "command": "mpiexec -n 4 python tutorials/figures/make_05_figures.py " + " ".join(
                          argv if argv is not None else sys.argv[1:])}
        if part == "downpour":
            results[part] = downpour(data, seeds[part], epochs)
        elif part == "warmstart":
            results[part] = warmstart(data, seeds[part], epochs, steps=2 if args.quick else 20)
        elif part == "nfetch":
            results[part] = nfetch(data, seeds[part], 1 if args.quick else 3, (1, 4) if args.quick else (1, 4, 16))
        elif part == "ssp":
            results[part] = ssp(data, seeds[part], 1 if args.quick else 3, (0, None) if args.quick else (0, 2, 8, None))
        else:
            sparse = dict(n_samples=200, epochs=1) if args.quick else {}
            results[part] = hogwild_part(data, seeds[part], (1, 2) if args.quick else (1, 2, 4), epochs, sparse)
        if comm.rank == 0:
            print(f"{part}: {time.perf_counter() - started:.1f} s", flush=True)
    if comm.rank == 0:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "05_measurements.json")
        saved = {}
        if args.only and os.path.exists(path):
            with open(path) as file:
                saved = json.load(file)
        saved.update(results)
        saved["meta"] = {**saved.get("meta", {}), **meta}
        with open(path, "w") as file:
            json.dump(saved, file, indent=1)
        with open(os.path.join(out, "05_table.md"), "w") as file:
            file.write(table(saved))
        figures(results, out)
        print(table(saved))
        print("written to", out)


if __name__ == "__main__":
    main()
