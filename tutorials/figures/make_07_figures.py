"""Regenerate chapter 7's figures and tables (about 5 minutes on 2 shared cores; --quick: under a minute).

    python tutorials/figures/make_07_figures.py                 # everything, 3 seeds, into tutorials/figures/out/
    python tutorials/figures/make_07_figures.py --quick         # 1 seed, few epochs, each kind of run once
    python tutorials/figures/make_07_figures.py --quick --out DIR
    python tutorials/figures/make_07_figures.py --part straggler

1. compare: Sandblaster L-BFGS (-n 4: coordinator, 1 shard, 2 workers), Downpour SGD (-n 4: 1 server,
   3 workers, server SGD) and serial L-BFGS (minidl.optim.LBFGS, in process) on the default
   least-squares problem (512 x 32, float64) of seeds 0, 1, 2 (the seed draws the problem too): loss gap to the
   optimum against wall time and
   against bytes sent -> 07_compare.png, 07_compare.json. Sandblaster's bytes are its own
   count (algorithms.sandblaster_lbfgs logs them per epoch); Downpour's are 2 n 8 bytes per
   applied update (one push and one fetch of the n = 32 parameters; small headers left out).
2. straggler: Sandblaster on the MLP and the digits at -n 4 with worker rank 3 made --slow-factor
   100 (and 20) times slower, with --backup-threshold 1 (no backups) and 0.9, and without a straggler; mean
   batch time (one evaluation of f and g over the training set) per seed -> 07_straggler.json,
   07_straggler.md.
3. easgd: synchronous EASGD at -n 3 (3 workers) against asynchronous EASGD at -n 4 (1 server +
   3 workers), MLP on the digits, momentum 0, same lr, tau and beta -> 07_easgd.json, 07_easgd.md.
4. hierarchy: Downpour SGD on the CNN and the digits with 2 workers, flat (-n 3: 1 shard) against
   one group server between them and the shard (-n 4: --groups 1), each with server SGD and with
   server Adagrad, --deterministic, seeds 0, 1, 2: updates the root applied, bytes through the root
   (each update: a push and a fetch of the 6,090 float32 parameters), test accuracy per seed and
   its mean ± 95% t-interval over the seeds -> 07_hierarchy.json, 07_hierarchy.md.
Timings depend on the machine and on what else runs on it; losses and accuracies of the
deterministic runs do not.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "out"                      # what the figure scripts write; the scripts themselves stay in HERE
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
SLOW_FACTOR = 100.0                     # the straggler's compute time, times this
MILD_FACTOR = 20.0


def job(name, p, out, **kwargs):
    """Run ``name`` (below, under --job) on p ranks; rank 0 writes its JSON to ``out``; return it."""
    command = [MPIEXEC, "-n", str(p), sys.executable, __file__, "--job", name, "--out", str(out),
               "--kwargs", json.dumps(kwargs)]
    print("$", name, p, kwargs, flush=True)
    subprocess.run(command, cwd=ROOT, env=ENV, check=True)
    return json.loads(Path(out).read_text())


def run_job(name, out, kwargs):
    """Inside mpiexec: one training run; rank 0 writes {history, report...} to ``out``."""
    sys.path.insert(0, str(ROOT))
    from mpi4py import MPI

    from algorithms import async_easgd, downpour_sgd, easgd, sandblaster_lbfgs
    comm = MPI.COMM_WORLD
    seed = kwargs.pop("seed", 0)
    result = {}
    if name == "sandblaster":
        report = {}
        if kwargs.pop("convex", False):
            kwargs["problem"] = sandblaster_lbfgs.default_problem(seed)
        _, history = sandblaster_lbfgs.train(comm, seed=seed, quiet=True, report=report, **kwargs)
        result = dict(history=history, batch_seconds=report["batch_seconds"], backups=report["backups"],
                      discarded=report["discarded"], computed={str(k): v for k, v in report["computed"].items()})
    elif name == "downpour":
        kwargs["problem"] = sandblaster_lbfgs.default_problem(seed)
        _, history = downpour_sgd.train(comm, seed=seed, quiet=True, **kwargs)
        result = dict(history=history)
    elif name == "hierarchy":
        _, history = downpour_sgd.train(comm, seed=seed, quiet=True, **kwargs)
        result = dict(history=history)
    elif name == "easgd_sync":
        _, history = easgd.train(comm, seed=seed, quiet=True, **kwargs)
        result = dict(history=history)
    elif name == "easgd_async":
        _, history = async_easgd.train(comm, seed=seed, quiet=True, **kwargs)
        result = dict(history=history)
    if comm.Get_rank() == 0:
        Path(out).write_text(json.dumps(result))


def serial_lbfgs(seed, epochs, max_iter):
    """minidl.optim.LBFGS on the same problem, one step(closure) per epoch: (seconds, loss) per epoch."""
    sys.path.insert(0, str(ROOT))
    import numpy

    from algorithms.core.objective import ConvexObjective
    from algorithms.sandblaster_lbfgs import default_problem
    from minidl.optim import LBFGS
    problem = default_problem(seed)
    objective = ConvexObjective(problem)
    optimizer = LBFGS([objective.flat.as_parameter()], lr=1.0, history_size=10, max_iter=max_iter)
    rows, started, history = numpy.arange(problem.n), time.perf_counter(), []
    for epoch in range(epochs):
        optimizer.step(lambda: objective.loss_and_grad(rows))
        history.append({"epoch": epoch + 1, "loss": problem.loss(objective.params),
                        "seconds": time.perf_counter() - started, "bytes": 0})
    return history, problem.loss(problem.w_star)


def compare(out, quick):
    sys.path.insert(0, str(ROOT))
    from algorithms.sandblaster_lbfgs import default_problem
    epochs = 2 if quick else 4
    seeds = [0] if quick else [0, 1, 2]             # the seed draws the problem and the run's own randomness
    labels = ("serial L-BFGS (1 rank)", "Sandblaster L-BFGS (-n 4)", "Downpour SGD (-n 4, sgd)")
    runs, optima = {label: {} for label in labels}, {}
    for seed in seeds:
        serial, optimum = serial_lbfgs(seed, epochs, max_iter=5)
        sandblaster = job("sandblaster", 4, out / "07_job.json", convex=True, seed=seed, epochs=epochs,
                          max_iter=5)["history"]
        for record in sandblaster:                # the coordinator's full-batch loss (a sum of portions')
            record["loss"] = record["train_loss"]
        downpour = job("downpour", 4, out / "07_job.json", seed=seed, epochs=3 if quick else 20, lr=0.05,
                       server_optimizer="sgd")["history"]
        n = default_problem(seed).d
        total = 0
        for record in downpour:                   # one push and one fetch of n float64 values per update
            total += record["updates"] * 2 * n * 8
            record["bytes"] = total
        for label, history in zip(labels, (serial, sandblaster, downpour)):
            for record in history:
                record["gap"] = record["loss"] - optimum
            runs[label][str(seed)] = history
        optima[str(seed)] = optimum
    (out / "07_compare.json").write_text(json.dumps({"seeds": seeds, "optimum_loss": optima, "runs": runs}, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for (label, by_seed), color in zip(runs.items(), ("C0", "C1", "C2")):
        for i, history in enumerate(by_seed.values()):
            gaps = [max(record["gap"], 1e-16) for record in history]
            name = label if i == 0 else None
            axes[0].semilogy([record["seconds"] for record in history], gaps, "o-", color=color, label=name,
                             markersize=3, alpha=0.7)
            if label != labels[0]:                # no bytes: nothing to plot on a log axis
                axes[1].loglog([record["bytes"] for record in history], gaps, "o-", color=color, label=name,
                               markersize=3, alpha=0.7)
    axes[0].set_xlabel("wall time (s, 2 shared cores)")
    axes[1].set_xlabel("bytes sent, all ranks")
    for axis in axes:
        axis.set_ylabel("loss - optimal loss")
        axis.legend(fontsize=8)
    figure.suptitle(f"least squares 512 x 32: loss gap at each epoch's end, one line per seed ({len(seeds)} seeds)")
    figure.tight_layout()
    figure.savefig(out / "07_compare.png", dpi=110)
    for label, by_seed in runs.items():
        for seed, history in by_seed.items():
            print(f"{label}, seed {seed}: final gap {history[-1]['gap']:.3g} after {history[-1]['seconds']:.2f} s, "
                  f"{history[-1]['bytes']} bytes")


def straggler(out, quick):
    seeds = [0] if quick else [0, 1, 2]
    settings = dict(epochs=1, max_iter=3 if quick else 5, portions=16)
    cases = {"no straggler, push every 4": dict(backup_threshold=1.0, push_every=4)}
    for factor, push_every in ((SLOW_FACTOR, 4), (SLOW_FACTOR, 1), (MILD_FACTOR, 4)):
        slow = dict(slow_worker=3, slow_factor=factor, push_every=push_every)
        cases[f"straggler x{factor:g}, push every {push_every}, no backups"] = dict(backup_threshold=1.0, **slow)
        cases[f"straggler x{factor:g}, push every {push_every}, backups at 0.9"] = dict(backup_threshold=0.9, **slow)
    if quick:            # each kind of run once: no straggler, a straggler without backups, one with them
        cases = {label: extra for label, extra in cases.items()
                 if label == "no straggler, push every 4" or f"x{SLOW_FACTOR:g}, push every 4," in label}
    results = {}
    for label, extra in cases.items():
        results[label] = []
        for seed in seeds:
            run = job("sandblaster", 4, out / "07_job.json", seed=seed, **settings, **extra)
            results[label].append(dict(seed=seed, mean_batch_seconds=statistics.mean(run["batch_seconds"]),
                                       batches=len(run["batch_seconds"]), backups=run["backups"],
                                       discarded=run["discarded"], computed=run["computed"],
                                       train_loss=run["history"][-1]["train_loss"]))
    (out / "07_straggler.json").write_text(json.dumps(results, indent=1))
    lines = ["| case | mean batch time per seed (ms) | mean | backups / discarded (sum) | portions computed by rank "
             "2, 3 |",
             "| --- | --- | --- | --- | --- |"]
    for label, rows in results.items():
        times = [row["mean_batch_seconds"] * 1000 for row in rows]
        computed = ", ".join(f"{row['computed']['2']}/{row['computed']['3']}" for row in rows)
        lines.append(f"| {label} | {', '.join(f'{t:.1f}' for t in times)} | {statistics.mean(times):.1f} | "
                     f"{sum(r['backups'] for r in rows)} / {sum(r['discarded'] for r in rows)} | {computed} |")
    (out / "07_straggler.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def easgd_comparison(out, quick):
    seeds = [0] if quick else [0, 1, 2]
    common = dict(model="mlp", epochs=2 if quick else 10, lr=0.05, tau=4, batch_size=32)
    results = {"sync EASGD, 3 workers (-n 3)": [], "async EASGD, 3 workers + 1 server (-n 4)": []}
    for seed in seeds:
        sync = job("easgd_sync", 3, out / "07_job.json", seed=seed, momentum=0.0, **common)["history"][-1]
        results["sync EASGD, 3 workers (-n 3)"].append(sync)
        asynchronous = job("easgd_async", 4, out / "07_job.json", seed=seed, **common)["history"][-1]
        results["async EASGD, 3 workers + 1 server (-n 4)"].append(asynchronous)
    (out / "07_easgd.json").write_text(json.dumps(results, indent=1))
    lines = ["| run | test accuracy per seed | mean | seconds per seed |", "| --- | --- | --- | --- |"]
    for label, rows in results.items():
        accuracies = [row["test_accuracy"] * 100 for row in rows]
        lines.append(f"| {label} | {', '.join(f'{a:.1f}%' for a in accuracies)} | "
                     f"{statistics.mean(accuracies):.1f}% | "
                     f"{', '.join(format(row['seconds'], '.1f') for row in rows)} |")
    (out / "07_easgd.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}     # Student t, two-sided 95%, by degrees of freedom


def interval(values):
    """(mean, half-width of the 95% t-interval) of a list of numbers (nan half-width for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, T_975[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5


def hierarchy(out, quick):
    seeds = [0] if quick else [0, 1, 2]
    common = dict(epochs=2 if quick else 10, lr=0.05, deterministic=True)
    cases = {"flat: 1 shard, 2 workers (-n 3)": (3, {}), "1 group server of 2 workers (-n 4)": (4, dict(groups=1))}
    results, parameters = {}, 6090
    for optimizer in ("sgd", "adagrad"):
        results[optimizer] = {}
        for label, (ranks, extra) in cases.items():
            if quick and (optimizer == "sgd") != ("flat" in label):
                continue         # each optimizer and each server once: sgd flat, adagrad through the group server
            results[optimizer][label] = []
            for seed in seeds:
                history = job("hierarchy", ranks, out / "07_job.json", seed=seed, server_optimizer=optimizer,
                              **common, **extra)["history"]
                updates = sum(record["updates"] for record in history)
                results[optimizer][label].append(dict(seed=seed, updates=updates,
                                                      root_bytes=updates * 2 * 4 * parameters,
                                                      test_accuracy=history[-1]["test_accuracy"]))
    (out / "07_hierarchy.json").write_text(json.dumps(results, indent=1))
    lines = ["| server optimizer | server | root updates (per seed) | bytes through the root | test accuracy per seed "
             "| mean ± 95% t-interval |", "| --- | --- | --- | --- | --- | --- |"]
    for optimizer, by_label in results.items():
        for label, rows in by_label.items():
            mean, half = interval([r["test_accuracy"] * 100 for r in rows])
            lines.append(f"| {optimizer} | {label} | {', '.join(str(r['updates']) for r in rows)} | "
                         f"{rows[0]['root_bytes'] / 1e6:.1f} MB | "
                         f"{', '.join(format(r['test_accuracy'] * 100, '.1f') + '%' for r in rows)} | "
                         f"{mean:.1f}% ± {half:.1f} |")
    (out / "07_hierarchy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, few epochs, into a temporary folder")
    parser.add_argument("--part", choices=["compare", "straggler", "easgd", "hierarchy"], default=None)
    parser.add_argument("--job", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help="output folder (default: tutorials/figures/out; --quick: a "
                        "temporary folder); with --job, the job's JSON file")
    parser.add_argument("--kwargs", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        return run_job(args.job, args.out, json.loads(args.kwargs))
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp()) if args.quick else OUT
    out.mkdir(parents=True, exist_ok=True)
    parts = {"compare": compare, "straggler": straggler, "easgd": easgd_comparison, "hierarchy": hierarchy}
    for name, part in parts.items():
        if args.part in (None, name):
            part(out, args.quick)
    (out / "07_job.json").unlink(missing_ok=True)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
