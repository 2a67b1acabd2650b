"""Chapter 4's overlap numbers: step time of allreduce SGD with and without ``--buckets``, and the
alpha-beta-gamma model's prediction with one core per rank (about 3 minutes on 2 shared cores;
--quick: seconds):

    python tutorials/figures/make_04_overlap.py [--quick] [--repeats 5] [--out FOLDER]

1. measured: for p = 2 and 4 (`mpiexec -n p` of this script with --worker), the small CNN and the
   MLP on the digits, batch 32 per rank, one epoch (45 steps at p = 2, 23 at p = 4) per repeat;
   ``--allreduce butterfly`` without and with ``--buckets 0.004`` (about one bucket per layer),
   the two alternating, each step timed on rank 0 inside the one training loop (``run.Run.loop``).
   A repeat's figure is the median step; the table gives the minimum and the median over repeats.
2. model: forward + backward of one rank's batch is timed in this process (one rank, median of
   30), with the time from each bucket's hook to the end of backward; alpha and beta come from
   collectives.bench.calibrate's ping-pong fit and gamma from its add fit (measured in the p = 2 run), and
   ``collectives.nonblocking.overlap_prediction`` gives the step's forward + backward + sum
   without and with overlap, as if every rank had its own core.
Writes 04_overlap.json and 04_overlap.md to --out (default tutorials/figures/out). --quick: runs in
this process's ranks (`mpiexec -n 2 python tutorials/figures/make_04_overlap.py --quick`), one
short repeat, output to a temporary folder: a check that the script runs, not numbers to quote.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from algorithms import allreduce_sgd  # noqa: E402
from algorithms.core import checkpoint, run  # noqa: E402
from algorithms.core.objective import build, load_data  # noqa: E402
from collectives.bench import calibrate  # noqa: E402
from collectives.nonblocking import overlap_prediction  # noqa: E402

OUT = HERE / "out"                   # what the figure scripts write; the scripts themselves stay in HERE
MODELS = ("cnn", "mlp")
MEGABYTES = 0.004
BATCH = 32


def step_times(comm, model, buckets, data, epochs=1):
    """Seconds of each step on this rank: one training run of allreduce SGD (butterfly)."""
    settings = run.Settings.of(dict(model=model, data=data, epochs=epochs, batch_size=BATCH, quiet=True),
                               momentum=0.9, partition="global")
    job = run.Run.start(comm, settings, writer=checkpoint.Writer("make_04_overlap"))
    seconds = []
    if buckets is None:
        summed = run.allreduce_function("butterfly")

        def step(batch):
            return allreduce_sgd.data_parallel_step(job.counting, job.objective, job.optimizer, batch, summed)
    else:
        overlapped = allreduce_sgd.overlapped_allreduce(job.counting, job.objective, buckets)

        def step(batch):
            return allreduce_sgd.bucketed_step(job.counting, job.objective, job.optimizer, batch, overlapped)

    def timed(batch):
        start = time.perf_counter()
        loss = step(batch)
        seconds.append(time.perf_counter() - start)
        return loss
    job.loop(timed)
    return seconds


def measure(comm, repeats, epochs):
    """{model: {"without": [median step per repeat], "with": [...]}} (rank 0's clock)."""
    data = load_data("digits", 0)
    out = {}
    for model in MODELS:
        out[model] = {"without": [], "with": []}
        for _ in range(repeats):
            for label, buckets in (("without", None), ("with", MEGABYTES)):
                times = step_times(comm, model, buckets, data, epochs)
                out[model][label].append(statistics.median(times[1:] or times))
    return out


def profile(model, runs=30):
    """One rank's forward + backward (seconds, median) and each bucket's time from its hook to the
    end of backward, with the bucket sizes in bytes, in the order the buckets become ready."""
    data = load_data("digits", 0)
    objective = build(model=model, dataset="digits", seed=0, data=data)
    plan = objective.flat.buckets(MEGABYTES * 1e6)
    ready = {}
    for bucket, (_, _, members) in enumerate(plan):
        for index in members:
            objective.flat.parameters[index].register_accumulate_hook(
                lambda _, bucket=bucket: ready.__setitem__(bucket, time.perf_counter()))
    totals, afters = [], []
    rows = np.arange(BATCH)
    for _ in range(runs):
        start = time.perf_counter()
        objective.loss_and_grad(rows)
        end = time.perf_counter()
        totals.append(end - start)
        afters.append([end - ready[bucket] for bucket in range(len(plan))])
    itemsize = objective.grad.dtype.itemsize
    return {"forward_backward": statistics.median(totals),
            "backward_after": [statistics.median(a[b] for a in afters) for b in range(len(plan))],
            "bucket_bytes": [(stop - start) * itemsize for start, stop, _ in plan]}


def worker(args):
    comm = MPI.COMM_WORLD
    result = {"p": comm.size, "steps": measure(comm, args.repeats, args.epochs)}
    if comm.size >= 2:
        alpha, beta, _ = calibrate.fit_alpha_beta(comm, 0.002 if args.quick else 0.02)
        gamma = calibrate.fit_gamma(comm, 0.002 if args.quick else 0.02)
        result.update(alpha=alpha, beta=beta, gamma=gamma)
    if comm.rank == 0 and args.worker:
        Path(args.worker).write_text(json.dumps(result))
    return result


def table(measured, profiles, fit):
    lines = ["| model | p | step without overlap (min / median of repeats) | with --buckets 0.004 | "
             "model, one core per rank: without | with | gain |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for model in MODELS:
        for result in measured:
            p, steps = result["p"], result["steps"][model]
            without, with_ = overlap_prediction(p, profiles[model]["bucket_bytes"], profiles[model]["backward_after"],
                                                profiles[model]["forward_backward"], *fit)
            lines.append(f"| {model} | {p} | {min(steps['without']) * 1e3:.2f} / "
                         f"{statistics.median(steps['without']) * 1e3:.2f} ms | {min(steps['with']) * 1e3:.2f} / "
                         f"{statistics.median(steps['with']) * 1e3:.2f} ms | {without * 1e3:.3f} ms | "
                         f"{with_ * 1e3:.3f} ms | {(without - with_) * 1e6:.1f} us |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.repeats = 1
        measured = [worker(args)]
        if MPI.COMM_WORLD.rank != 0:
            return
        out = Path(args.out or tempfile.mkdtemp())
    else:
        out = Path(args.out or OUT)
        measured = []
        load = [os.getloadavg()[0]]
        for p in (2, 4):
            path = Path(tempfile.gettempdir()) / f"04_overlap_p{p}.json"
            command = [MPIEXEC, "-n", str(p), sys.executable, __file__, "--worker", str(path),
                       "--repeats", str(args.repeats), "--epochs", str(args.epochs)]
            print("$", " ".join(command[2:]), flush=True)
            subprocess.run(command, cwd=ROOT, env=ENV, check=True)
            measured.append(json.loads(path.read_text()))
        load.append(os.getloadavg()[0])
    fitted = next((m for m in measured if "alpha" in m), {"alpha": 0.0, "beta": 0.0, "gamma": 0.0})
    fit = (fitted["alpha"], fitted["beta"], fitted["gamma"])
    profiles = {model: profile(model, 5 if args.quick else 30) for model in MODELS}
    text = table(measured, profiles, fit)
    if not args.quick:                            # how busy the 2 cores were: the timings depend on it
        text += (f"\nLoad average (1 min) before and after the measured runs: {load[0]:.1f}, {load[1]:.1f} "
                 f"(2 cores). Model: alpha = {fit[0] * 1e6:.2f} us, beta = {fit[1] * 1e9:.3f} ns/B, "
                 f"gamma = {fit[2] * 1e9:.3f} ns/B; forward + backward of one rank's batch: "
                 + ", ".join(f"{model} {profiles[model]['forward_backward'] * 1e3:.2f} ms" for model in MODELS) + ".\n")
    print(f"alpha = {fit[0] * 1e6:.2f} us, beta = {fit[1] * 1e9:.4f} ns/B, gamma = {fit[2] * 1e9:.4f} ns/B")
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "04_overlap.md").write_text(text)
    (out / "04_overlap.json").write_text(json.dumps({"megabytes": MEGABYTES, "batch": BATCH, "measured": measured,
                                                     "profiles": profiles, "alpha_beta_gamma": fit}, indent=1))
    print(f"wrote {out / '04_overlap.md'} and {out / '04_overlap.json'}")


if __name__ == "__main__":
    main()
