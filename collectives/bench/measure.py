"""Benchmark: every allreduce here against MPI's own Allreduce, and against the cost model.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m collectives.bench [--json out.json] [--plot out.png]
    mpiexec -n 2 python -m collectives.bench --quick             # a few seconds, for a smoke test
    mpiexec -n 4 python -m collectives.bench --sizes 4K,1M,64M --algorithms ring,auto
    mpiexec -n 4 python -m collectives.bench --sizes 4K,16K,64K --persistent   # + allreduce_init rows
    mpiexec -n 2 python -m collectives.bench --calibrate --median     # fit the calibrated model first

1. the machine's rates, from micro-benchmarks that are not allreduces (collectives.bench.calibrate):
   alpha and beta from a ping-pong between ranks 0 and 1, gamma from numpy's element-wise add
   into a float32 vector, every rank at once;
2. for each size (float32 vectors, 4 KiB .. 64 MiB by default) and each algorithm, the time
   of one call, check=False (no agreement check), compared with comm.Allreduce on the same
   buffers, and with cost.predict(...) at the fitted alpha, beta, gamma;
3. the refined model (cost.predict_refined) at the rates calibrate.fit_rates measures at that
   size (pairwise, one-way, lone, gather, send-back and ring-shift sends; in-place add, add into
   a third vector, copy; each on the allreduce's three-vector footprint, since per-byte rates
   change as it leaves the cache);
4. the performance targets, a column per row with "met" or "NO": auto <= 1.5x MPI at every size;
   ring and Rabenseifner <= 1.0x MPI from 1 MiB; refined model / measured within 25% for every
   algorithm from 1 MiB, each judged on the row's median over the rounds. And auto's table: at each
   size, the point-to-point algorithm measured fastest; --write-selection stores it for this p in
   the user's tuning file (collectives.model.tuned), which collectives.auto reads at import (so
   auto's row is only as good as the last such run on this machine: python -m minidl.tune runs one).
5. the calibrated model (cost.predict_calibrated, collectives.model.calibration): each kind of step's
   latency and per-byte rates at the allreduce's own size, a hot step's (one that sends what a
   reduction just wrote) apart, and a per-call overhead, measured by --calibrate (written to the
   tuning file, or to --calibration PATH) and read from --calibration (default: this machine's from
   the tuning file, else the shipped collectives/model/calibration.json, fitted on another machine);
   target: within 25% of the measured time at every size >= 4 KiB (the median over rounds),
   at the p it was fitted at. Bad flags, a bad calibration or tuning file: `error: ...`, exit 2, every rank;
6. with --persistent, two more rows: MPI's persistent Allreduce_init (Start + Wait per call, "mpi_init")
   and collectives.persistent's auto (allreduce_init once, start() per call, "auto_init"), whose
   ratio and <= 1.5x target are against mpi_init: both sides check their arguments once.

A time is the slowest rank's mean over a batch of calls between barriers (batches of >= 0.02 s),
taken in seven rounds (--rounds) over every size and algorithm, MPI's Allreduce among them, so that
noise from other processes on the machine hits all of them alike, and a state of the machine that
lasts seconds (chapter 10, section 9) reaches only some rounds. Each figure is the median over the
rounds; a ratio (to MPI's time, or a model's to the measured) is taken round by round, and its
median is printed with the smallest and largest round beside it (rows.py). Every vector is on
4 KiB pages (`small_pages`, Linux): on huge pages or not by malloc's history, an allreduce at 1 MiB
took up to 2x longer in one run than in the next. --median: the slowest rank's median of
single calls, each after a barrier (calibration and table alike), for a loaded machine.

Each rank's BLAS thread variables are set to 1 below, for what loads after this module (the
package, ``collectives/__init__.py``, has loaded numpy already; the collectives themselves use no
BLAS, only element-wise ufuncs).
"""
import os

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"

import json  # noqa: E402  (after the thread pinning on purpose)

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from .. import auto, butterfly, naive, persistent, rabenseifner, ring, tree  # noqa: E402
from ..cli import human  # noqa: E402
from ..model import calibration, tuned  # noqa: E402
from . import rows  # noqa: E402
from .calibrate import LADDER, cores, fit_alpha_beta, fit_gamma, fit_rates, measure_calibration, timed  # noqa: E402
from .flags import describe, settings  # noqa: E402

ALGORITHMS = {"naive": naive.allreduce, "tree": tree.allreduce, "butterfly": butterfly.allreduce,
              "ring": ring.allreduce, "rabenseifner": rabenseifner.allreduce, "auto": auto.allreduce}


def calibrate(comm, args, between=None):
    """Measure, fit and (rank 0) write the calibrated model; returns it on every rank. between():
    run after each of the calibration's rounds (calibrate.measure_calibration)."""
    ladder, small = measure_calibration(comm, args.min_time, args.rounds, median=args.median, between=between)
    model = calibration.fit(ladder, small, comm.Get_size())
    if comm.Get_rank() == 0:
        calibration.save(model, args.calibration, {"ladder": ladder, "allreduce_8_bytes": small,
                                                   "load_average": os.getloadavg(), "median": args.median})
        ends = (model.sizes[0], 1 << 20, model.sizes[-1])
        print(f"# calibrated (p = {model.p}, load {os.getloadavg()[0]:.2f}): o = "
              + ", ".join(f"{name} {o * 1e6:.1f}" for name, o in model.overhead.items()) + " us; step times at "
              + ", ".join(human(n) for n in ends) + ", us: "
              + "; ".join(f"{name} " + "/".join(f"{model.seconds(name, n) * 1e6:.1f}" for n in ends)
                          for name in calibration.TABLES)
              + f"; {args.model_source}", flush=True)
    return model


ALL = object()                     # bench's table_round: every row


def size_calls(comm, count, names, persistent_rows):
    """(recvbuf, {row name: call}, persistent requests) for one size of float32 vectors: MPI's
    Allreduce and every algorithm of `names` on the same sendbuf (rank + 1) and recvbuf."""
    rank = comm.Get_rank()
    sendbuf = np.full(count, rank + 1, dtype=np.float32)
    recvbuf = np.empty_like(sendbuf)
    calls = {"mpi": lambda: comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM)}
    for name in names:
        calls[name] = (lambda f: lambda: f(comm, sendbuf, recvbuf, op="sum", check=False))(ALGORITHMS[name])
    requests = []
    if persistent_rows:                        # both sides' arguments bound once (MPI 4.0 persistent collectives)
        try:
            requests.append(comm.Allreduce_init(sendbuf, recvbuf, op=MPI.SUM))
            calls["mpi_init"] = lambda: requests[0].Start() or requests[0].Wait()
        except (NotImplementedError, MPI.Exception):
            pass                               # an MPI without them: auto_init is compared with Allreduce
        calls["auto_init"] = persistent.allreduce_init(comm, sendbuf, recvbuf, check=False).start
    return recvbuf, calls, requests


def small_pages():
    """Transparent huge pages off for this process (Linux: prctl PR_SET_THP_DISABLE); True if
    that took effect. Otherwise whether a vector sits on 2 MiB pages depends on malloc's history:
    numpy advises huge pages for arrays from 4 MiB, and a smaller array may reuse memory once so
    advised. A single-copy message pins its sender's pages one by one, so that changed an
    allreduce's time at 1 MiB by up to 2x between runs of this bench (chapter 10, section 9)."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


PR_SET_THP_DISABLE = 41                      # linux/prctl.h


def main(argv=None):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    args = settings(argv, size)
    pages = "4 KiB pages (transparent huge pages off)" if small_pages() else "pages as the system gives them"
    sizes, min_time, rounds, names = args.sizes, args.min_time, args.rounds, args.names

    if size > 1:
        alpha, beta, points = fit_alpha_beta(comm, min_time, args.median)
    else:
        alpha, beta, points = 0.0, 0.0, []
    gamma = fit_gamma(comm, min_time, median=args.median)
    if rank == 0:
        print(f"# p = {size}; {MPI.Get_library_version().splitlines()[0].strip()}; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores; {pages}")
        print(f"# ping-pong fit: alpha = {alpha * 1e6:.2f} us, beta = {beta * 1e9:.4f} ns/B "
              f"({1 / beta / 1e9 if beta > 0 else float('inf'):.2f} GB/s); gamma = {gamma * 1e9:.4f} ns/B")
        for nbytes, seconds in points:
            print(f"#   ping-pong {human(nbytes):>9}: {seconds * 1e6:10.2f} us  "
                  f"(fit {(alpha + beta * nbytes) * 1e6:10.2f} us)")
        print(f"# refined model: rates per size from exchange/add/add3/copy micro-benchmarks at that size, "
              f"every rank at once; share = max(1, p / {cores()} cores) = {max(1.0, size / cores()):g}")

    records, setups = [], []
    for nbytes in sizes:
        count = max(nbytes // 4, 1)
        rates = fit_rates(comm, min_time, count * 4, alpha, rounds, args.median)     # best of as many batches as below
        if rank == 0:
            print(f"# {human(count * 4)}: exchange beta_x = {rates.beta_x * 1e9:.4f} ns/B, one-way beta_1 = "
                  f"{rates.beta_1 * 1e9:.4f} ns/B, alone beta_solo = {rates.beta_solo * 1e9:.4f} ns/B, gather "
                  f"beta_gather = {rates.beta_gather * 1e9:.4f} ns/B, send-back beta_scatter = "
                  f"{rates.beta_scatter * 1e9:.4f} ns/B, ring shift "
                  f"beta_ring = {rates.beta_ring * 1e9:.4f} ns/B, add gamma_m = "
                  f"{rates.gamma_m * 1e9:.4f} ns/B, add into a third gamma_3 = "
                  f"{rates.gamma_3 * 1e9:.4f} ns/B, copy = {rates.copy * 1e9:.4f} ns/B", flush=True)
        setups.append((count, rates, *size_calls(comm, count, names, args.persistent)))
    expected = np.float32(size * (size + 1) / 2)
    rounds_of = [{} for _ in setups]                    # per size: row name -> [seconds of each round]

    def table_round(nbytes=ALL):
        """One batch of every row; of the rows of nbytes; or (None) of the rows whose size is off the
        calibration's ladder. Every round's time kept (rows.py takes the medians): noise from other
        processes hits all rows alike, and a state of the machine that lasts seconds reaches only some rounds."""
        for (count, _, recvbuf, calls, _), times in zip(setups, rounds_of):
            row_bytes = count * 4
            if nbytes is ALL or row_bytes == nbytes or (nbytes is None and row_bytes not in LADDER):
                for name, call in calls.items():
                    times.setdefault(name, []).append(timed(comm, call, min_time, args.median))
                    if not np.all(recvbuf == expected):
                        raise SystemExit(f"rank {rank}: {name} gave a wrong sum at {row_bytes} bytes")
    if args.calibrate:             # the calibration's rounds and the table's in turn, size by size
        model_cal = calibrate(comm, args, between=table_round)
    else:
        model_cal = args.model
        for _ in range(rounds):
            table_round()
    if rank == 0:
        print(f"# calibrated model: {args.model_source}" + (f" (fitted at p = {model_cal.p}; its target only at "
              f"that p)" if model_cal else ""))
        print(f"# each figure the median over {rounds} interleaved rounds, a ratio's [min, max] over them beside it")
        print(rows.HEADER)
    for (count, rates, _, calls, requests), times in zip(setups, rounds_of):
        for request in requests:
            request.Free()
        for name in calls:
            records.append(rows.record(name, size, count * 4, times, rates, (alpha, beta, gamma), model_cal))
            records[-1].update(calibration=args.model_source, selection=auto.source(size))   # what they read
            if rank == 0:
                print(rows.line(records[-1]), flush=True)

    measured = auto.fastest_table(records)
    if rank == 0 and measured:
        print(f"# fastest measured at p = {size}: {describe(measured)}")
        print(f"# auto uses at p = {size}: {describe(auto.table(size))} ({auto.source(size)})")
    if rank == 0 and args.write_selection:
        if not measured:
            print("# --write-selection: nothing measured")
        else:
            tables = {str(p): [list(row) for row in table] for p, table in tuned.selection().items()}
            tuned.store(tuned.location(), "selection", {**tables, str(size): measured})
            print(f"# wrote p = {size} to {tuned.location()} (auto reads it at its next import)")
    if rank == 0:
        judged = [r for r in records if r["met"] is not None]
        print(f"# targets met (on the medians): {sum(r['met'] for r in judged)} of {len(judged)} rows")

    if rank == 0 and args.json:
        with open(args.json, "w") as file:
            json.dump(records, file, indent=1)
    if rank == 0 and args.plot:
        from .plot import plot_bench
        plot_bench(records, args.plot, size)
    return records
