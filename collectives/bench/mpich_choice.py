"""Which algorithm MPICH's own MPI_Allreduce runs, and what each of its algorithms costs here.

MPICH picks its allreduce algorithm from a tuning table (MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=auto,
the default; the CH4 device may override it per collective, MPIR_CVAR_ALLREDUCE_DEVICE_COLLECTIVE=1
by default). Forcing each algorithm in turn (MPICH's `mpivars` lists the names) and timing
MPI_Allreduce beside this package's ring on the same vector says where MPICH's default lands
and why: no guessing about its internals.

    python -m collectives.bench.mpich_choice -n 2 --size 64M        # launches mpiexec once per setting
    python -m collectives.bench.mpich_choice -n 4 --size 64M --repeats 5
    python -m collectives.bench.mpich_choice -n 4 --size 16K --ours auto   # small: MPICH's shared-memory collective

Inside one launch (the `--worker` mode) every rank times `repeats` calls of comm.Allreduce and
of this package's `--ours` algorithm (default ring; float32, check=False, interleaved, slowest rank
per call, minimum kept; below 1 MiB each "call" is a batch of calls lasting >= 20 ms, its mean, as
collectives.bench times them, since one small call is shorter than the barrier's skew) and
then the pieces that are not messages (numpy's add against MPI's own MPI.SUM.Reduce_local on
(p-1)/p n bytes, a fresh n-byte temporary against a reused one), and rank 0 prints one line of
JSON. The launcher prints a table: setting, MPI time, ring time, ratio, and the pieces.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from collectives import cli

SETTINGS = [("default (auto)", {}),
            ("device collective off, auto", {"MPIR_CVAR_ALLREDUCE_DEVICE_COLLECTIVE": "0"})] + [
    (name, {"MPIR_CVAR_ALLREDUCE_DEVICE_COLLECTIVE": "0", "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": name})
    for name in ("recursive_doubling", "reduce_scatter_allgather", "ring", "tree", "smp")]


def worker(nbytes, repeats, ours="ring"):
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[variable] = "1"
    import numpy as np
    from mpi4py import MPI

    import collectives

    from .calibrate import timed
    comm = MPI.COMM_WORLD
    send = np.full(nbytes // 4, comm.rank + 1, dtype=np.float32)
    receive = np.empty_like(send)
    calls = {"mpi": lambda: comm.Allreduce(send, receive, op=MPI.SUM),
             ours: lambda: collectives.allreduce(comm, send, receive, op="sum", algorithm=ours, check=False)}
    best = {name: float("inf") for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            if nbytes < 1 << 20:
                seconds = timed(comm, call, 0.02)
            else:
                comm.Barrier()
                start = time.perf_counter()
                call()
                seconds = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            best[name] = min(best[name], seconds)
            expected = comm.size * (comm.size + 1) / 2
            if not np.all(receive == expected):
                raise SystemExit(f"{name} gave a wrong sum")
    # the pieces of a reduce-scatter + allgather that are not messages, timed alone on every rank
    # at once: numpy's add against MPI's own reduction (MPI.SUM.Reduce_local, what MPICH's
    # algorithms call) over (p-1)/p n bytes, and a fresh n-byte temporary written once (what a
    # per-call malloc costs: page faults) against writing a reused one
    part = send[:len(send) * (comm.size - 1) // comm.size]
    into = np.ones_like(part)
    reused = np.empty_like(send)
    pieces = {"numpy_add": lambda: np.add(into, part, out=into),
              "mpi_reduce_local": lambda: MPI.SUM.Reduce_local(part, into),
              "fresh_temporary": lambda: np.copyto(np.empty_like(send), send),
              "reused_temporary": lambda: np.copyto(reused, send)}
    for _ in range(repeats):
        for name, call in pieces.items():
            comm.Barrier()
            start = time.perf_counter()
            call()
            seconds = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            best[name] = min(best.get(name, float("inf")), seconds)
    if comm.rank == 0:
        print(json.dumps(best), flush=True)


def main(argv=None):
    parser = cli.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2, help="ranks")
    parser.add_argument("--size", default="64M", help="bytes per rank, e.g. 64M")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ours", default="ring", help="this package's algorithm to time beside MPI (e.g. auto)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the table as JSON here")
    args = parser.parse_args(argv)
    from collectives.cli import human, parse_size
    nbytes = parse_size(args.size)
    if args.worker:
        worker(nbytes, args.repeats, args.ours)
        return None
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    rows = []
    print(f"p = {args.n}, {human(nbytes)} float32, min of {args.repeats} calls")
    ours = args.ours
    scale, unit = (1e3, "ms") if nbytes >= 1 << 20 else (1e6, "us")
    print(f"{'MPICH setting':<32} {'MPI ' + unit:>9} {ours + ' ' + unit:>9} {'MPI/' + ours:>9}")
    for label, extra in SETTINGS:
        environment = dict(os.environ, **extra)
        command = [mpiexec, "-n", str(args.n), sys.executable, "-m", "collectives.bench.mpich_choice",
                   "--worker", "--size", str(nbytes), "--repeats", str(args.repeats), "--ours", ours]
        done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            print(f"{label:<32} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        best = json.loads(lines[-1])
        rows.append({"setting": label, "env": extra, "p": args.n, "bytes": nbytes, "ours": ours,
                     "mpi_seconds": best["mpi"], f"{ours}_seconds": best[ours]})
        print(f"{label:<32} {best['mpi'] * scale:9.2f} {best[ours] * scale:9.2f} "
              f"{best['mpi'] / best[ours]:9.2f}", flush=True)
        rows[-1].update({name: best[name] for name in best if name not in ("mpi", ours)})
    if rows:
        pieces = rows[0]
        print(f"pieces (every rank at once, first launch): numpy add {pieces['numpy_add'] * 1e3:.2f} ms, "
              f"MPI.SUM.Reduce_local {pieces['mpi_reduce_local'] * 1e3:.2f} ms on (p-1)/p n; "
              f"fresh n-byte temporary {pieces['fresh_temporary'] * 1e3:.2f} ms, "
              f"reused {pieces['reused_temporary'] * 1e3:.2f} ms")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)
    return rows


if __name__ == "__main__":
    main()
