"""Data-parallel training against PyTorch DistributedDataParallel: milliseconds per step.

    python -m algorithms.bench [--ranks 2] [--steps 30] [--runs 3] [--json OUT] [--markdown OUT] [--quick] \
        [--no-torch] [--blas native]
    python -m algorithms.bench --blas native --cases lenet5:128     # only these cases (model:batch, comma-separated)

Each case (model, per-rank batch, side) runs in its own ``mpiexec -n R`` job, one BLAS thread per
rank, on random MNIST-shaped data (1 x 28 x 28, 10 classes) with SGD (lr 0.01, momentum 0.9) and
the same model on both sides: LeNet-5 (ReLU, max pooling) or the MLP 784-256-256-10. A step is
forward, backward, the gradient's allreduce and the update. minidl takes it with
``core.step.data_parallel_step`` (the step of allreduce SGD) and ``--allreduce ring`` or
``mpi`` (MPI's own Allreduce); PyTorch with ``DistributedDataParallel`` and the gloo backend,
started by this benchmark on loopback (rank and size from MPI, the port from rank 0). A step's
time is the slowest rank's; a run gives the minimum over the timed steps after the warm-up ones,
the least disturbed by other work on the machine. ``--runs`` repeats every job: the table gives the
median of the runs and, for each ratio, [min, max] over them (how far one run can be off). Both sides import
minidl, so both run with the malloc thresholds minidl sets at import (``minidl.backend.keep_freed_memory``). Some
machines force OpenBLAS's kernel (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE); ``--blas native`` runs both
sides' jobs without them, as ``python -m minidl.bench --blas native`` does (PyTorch brings its own
BLAS, so it mainly changes minidl's side); the table's first line and the JSON say which ran, and which tuning
(``minidl/tuning.py``: the conv settings every job reads; a broken tuning file stops the bench before its first job).

Where the time goes: for minidl's ring side the benchmark also times the step's phases one by
one (forward, backward, the allreduce, the update; rank 0, each phase's minimum), so a row can be
read: at LeNet-5's batch 128 the backward and forward of the convolutions, not the allreduce.

Target: minidl <= 0.9x DDP in every row, judged on the median of the runs' ratios (both minidl sides).
Numbers, not tests: nothing here is asserted.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy
from mpi4py import MPI

from algorithms.core import cli, run
from algorithms.core.objective import Data, NetworkObjective
from algorithms.core.step import data_parallel_step
from collectives.model import tuned
from minidl import Tensor, backend, functional as F, models, tuning
from minidl.bench.cli import settings_in_force
from minidl.bench.measure import blas_environment
from minidl.data.sharding import Batch
from minidl.optim import SGD

CASES = [(model, batch) for model in ("lenet5", "mlp") for batch in (32, 128)]
SIDES = ("ring", "mpi", "ddp")
TARGET = 0.9
LR, MOMENTUM = 0.01, 0.9


def parse_cases(text):
    """``--cases``: "lenet5:128,mlp:32" -> [("lenet5", 128), ("mlp", 32)]; a case outside CASES is a SettingError."""
    cases = []
    for item in text.split(","):
        model, _, batch = item.strip().partition(":")
        if (model, int(batch) if batch.isdigit() else None) not in CASES:
            raise cli.SettingError(f"--cases {text}: {item.strip()!r} is not one of "
                                   + ", ".join(f"{m}:{b}" for m, b in CASES))
        cases.append((model, int(batch)))
    return cases


def timed(comm, step, warmup, steps):
    """The minimum over ``steps`` timed steps (after ``warmup``) of the slowest rank's time, in ms."""
    best = float("inf")
    for number in range(warmup + steps):
        comm.Barrier()
        start = time.perf_counter()
        step()
        slowest = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if number >= warmup:
            best = min(best, slowest)
    return best * 1e3


def minidl_worker(comm, model, batch, allreduce, warmup, steps):
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = numpy.random.default_rng(0)
    net = models.lenet5(rng) if model == "lenet5" else models.mlp(rng, in_features=784, hidden=(256, 256))
    total = batch * size
    x = rng.standard_normal((total, 1, 28, 28)).astype(numpy.float32)
    y = rng.integers(0, 10, total)
    objective = NetworkObjective(net, Data(x, y, x[:1], y[:1]))
    optimizer = SGD([objective.flat.as_parameter()], lr=LR, momentum=MOMENTUM)
    rows = Batch(index=numpy.arange(rank * batch, (rank + 1) * batch), total=total)
    summed = run.allreduce_function(allreduce)
    ms = timed(comm, lambda: data_parallel_step(comm, objective, optimizer, rows, summed), warmup, steps)
    return ms, phases(comm, objective, optimizer, rows, summed, warmup, steps)


def phases(comm, objective, optimizer, rows, summed, warmup, steps):
    """Where a step's time goes on this rank: the step of ``data_parallel_step`` cut into forward,
    backward, allreduce and update, each phase's minimum over the timed steps, in ms."""
    best = dict.fromkeys(("forward", "backward", "allreduce", "update"), float("inf"))
    x, y = objective.data.x_train[rows.index], objective.data.y_train[rows.index]
    for number in range(warmup + steps):
        comm.Barrier()
        marks = [time.perf_counter()]
        objective.flat.zero_grad()
        loss = F.softmax_cross_entropy(objective.net(Tensor(backend.asarray(x))), backend.asarray(y))
        marks.append(time.perf_counter())
        loss.backward()
        objective.grad *= len(rows.index) / rows.total
        marks.append(time.perf_counter())
        summed(comm, objective.grad)
        marks.append(time.perf_counter())
        optimizer.step()
        marks.append(time.perf_counter())
        if number >= warmup:
            for phase, start, end in zip(best, marks, marks[1:]):
                best[phase] = min(best[phase], (end - start) * 1e3)
    return {phase: round(ms, 4) for phase, ms in best.items()}


def torch_model(torch, model):
    nn = torch.nn
    if model == "lenet5":
        return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84),
                             nn.ReLU(), nn.Linear(84, 10))
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def ddp_worker(comm, model, batch, warmup, steps):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    rank, size = comm.Get_rank(), comm.Get_size()
    port = None
    if rank == 0:
        with socket.socket() as probe:                 # a free port on loopback for gloo's rendezvous
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    try:
        torch.manual_seed(0)
        net = DistributedDataParallel(torch_model(torch, model))
        optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
        x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

        def step():
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
        return timed(comm, step, warmup, steps)
    finally:
        dist.destroy_process_group()


def run_case(side, model, batch, args):
    """ms per step of one side on one case (a job of its own), or None if it could not run."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    blas_environment(env, args.blas)
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    command = [mpiexec, "-n", str(args.ranks), sys.executable, "-m", "algorithms.bench", "--worker", side,
               "--model", model, "--batch", str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(f"[bench] {side} on {model} at batch {batch} failed:\n{done.stderr[-1500:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows):
    lines = ["| model | batch per rank | minidl ring, ms | minidl mpi, ms | DDP gloo, ms | ring / DDP [min, max] "
             "| mpi / DDP [min, max] | target | met |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [row["model"], row["batch"]] + [f"{row[key]:.3g}" if row[key] is not None else "-"
                                                for key in ("ring_ms", "mpi_ms", "ddp_ms")]
        for side in ("ring", "mpi"):
            low_high = row[f"{side}_ratio_range"]
            cells.append("-" if row[f"{side}_ratio"] is None else
                         f"{row[f'{side}_ratio']:.2f} [{low_high[0]:.2f}, {low_high[1]:.2f}]")
        met = "-" if row["met"] is None else ("yes" if row["met"] else "NO")
        lines.append("| " + " | ".join(str(cell) for cell in cells) + f" | <= {TARGET}x DDP | {met} |")
    return "\n".join(lines)


def torch_installed():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m algorithms.bench", description=__doc__.split("\n\n")[0])
    parser.error = cli.fail                            # a bad flag: one error line, exit 2
    parser.add_argument("--ranks", type=int, default=2, help="ranks per job (compare ranks <= cores)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per case; the minimum is reported")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--runs", type=int, default=3, help="runs of every job; the table gives their median")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--quick", action="store_true", help="3 steps, batch 4 (a smoke test of the benchmark)")
    parser.add_argument("--no-torch", action="store_true", help="leave DDP out")
    parser.add_argument("--blas", choices=["as-set", "native"], default="as-set",
                        help="native: both sides' jobs run without a forced OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE "
                             "(as minidl.bench --blas native; default: the environment as it is)")
    parser.add_argument("--cases", help="only these cases, model:batch comma-separated (default: every case)")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=["lenet5", "mlp"], help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:                                               # every flag and path before the first job
        for flag, low in (("ranks", 1), ("steps", 1), ("runs", 1), ("warmup", 0)):
            cli.require(f"--{flag}", getattr(args, flag), integer=True, low=low)
        if args.worker is None and (args.model is not None or args.batch is not None):
            raise cli.SettingError("--model and --batch are the benchmark's own, for one job: it runs every case")
        if args.worker is not None:
            cli.require("--batch", args.batch, integer=True, low=1)
        cases = CASES if args.cases is None else parse_cases(args.cases)
        cli.check_output("--json", args.json)
        cli.check_output("--markdown", args.markdown)
        settings = settings_in_force()                 # the tuning file and MINIDL_CONV_COLUMN_BYTES, as each
        tuned.current()                                # job reads them: a bad one stops the bench, not each job
    except (cli.SettingError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    comm = MPI.COMM_WORLD
    if args.worker:                                    # one rank of one case's job
        if args.worker == "ddp":
            ms, split = ddp_worker(comm, args.model, args.batch, args.warmup, args.steps), None
        else:
            ms, split = minidl_worker(comm, args.model, args.batch, args.worker, args.warmup, args.steps)
        if comm.Get_rank() == 0:                       # and the tuning this job ran on (its environment's)
            print(json.dumps({"ms": ms, "phases": split, "tuning": tuning.ACTIVE.source, "settings": settings}))
        return 0
    if args.quick:
        args.steps, args.warmup, args.runs = 3, 1, 1
        cases = [(model, 4) for model in ("lenet5", "mlp")]
    with_torch = not args.no_torch and torch_installed()
    rows = []
    for model, batch in cases:
        answers = [{side: run_case(side, model, batch, args) if side != "ddp" or with_torch else None
                    for side in SIDES} for _ in range(args.runs)]
        runs = [{side: None if answer[side] is None else answer[side]["ms"] for side in SIDES} for answer in answers]
        row = {"model": model, "batch": batch, "ranks": args.ranks, "runs": args.runs, "blas": args.blas,
               "blas_forced": blas_environment(dict(os.environ), args.blas),
               "tuning": (answers[0]["ring"] or {}).get("tuning", tuning.ACTIVE.source),
               "settings": (answers[0]["ring"] or {}).get("settings", settings),
               "ring_phases": (answers[0]["ring"] or {}).get("phases")}      # rank 0's, first run
        for side in SIDES:
            measured = [times[side] for times in runs if times[side] is not None]
            row[f"{side}_ms"] = round(statistics.median(measured), 3) if len(measured) == args.runs else None
        for side in ("ring", "mpi"):
            each = [times[side] / times["ddp"] for times in runs if times[side] and times["ddp"]]
            complete = len(each) == args.runs
            row[f"{side}_ratio"] = round(statistics.median(each), 3) if complete else None
            row[f"{side}_ratio_range"] = [round(min(each), 3), round(max(each), 3)] if complete else None
        ratios = [row[f"{side}_ratio"] for side in ("ring", "mpi")]
        row["target"] = f"<= {TARGET}x DDP"
        row["met"] = None if None in ratios else all(ratio <= TARGET for ratio in ratios)
        rows.append(row)
    print(f"algorithms.bench: {args.ranks} ranks, 1 thread each, minimum of {args.steps} steps after "
          f"{args.warmup} warm-up, median of {args.runs} run(s); BLAS "
          + (", ".join(f"{k}={v}" for k, v in blas_environment(dict(os.environ), args.blas).items()) or "native")
          + "; "
          + ("PyTorch DDP (gloo)" if with_torch else "no PyTorch: DDP not measured")
          + f"; tuning: {tuning.ACTIVE.source}")
    text = table(rows)
    print(text)
    print("\nwhere the time goes (minidl, --allreduce ring, rank 0, each phase's minimum, ms):")
    for row in rows:
        if row["ring_phases"]:
            print(f"  {row['model']:<7} batch {row['batch']:<4} " + "  ".join(f"{phase} {ms:.3g}"
                                                                       for phase, ms in row["ring_phases"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
