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
   algorithm from 1 MiB. And auto's table: at each size, the point-to-point algorithm measured
   fastest; --write-selection stores it for this p in collectives/selection.json, which
   collectives.auto reads (so auto's row is only as good as the last such run on this machine).
5. the calibrated model (cost.predict_calibrated, collectives.model.calibration): each kind of step's
   latency and per-byte rates at the allreduce's own size, a hot step's (one that sends what a
   reduction just wrote) apart, and a per-call overhead, measured once by --calibrate and read
   from --calibration (default collectives/model/calibration.json);
   target: within 25% of the measured time at every size >= 4 KiB,
   at the p it was fitted at. Bad flags or a bad calibration file: `error: ...`, exit 2, every rank;
6. with --persistent, two more rows: MPI's persistent Allreduce_init (Start + Wait per call, "mpi_init")
   and collectives.persistent's auto (allreduce_init once, start() per call, "auto_init"), whose
   ratio and <= 1.5x target are against mpi_init: both sides check their arguments once.

A time is the slowest rank's mean over a batch of calls between barriers (batches of >= 0.02 s),
and the best of seven batches (--rounds), taken in rounds over every size and algorithm so that
noise from other processes on the machine hits all of them alike, and a state of the machine
that lasts seconds (chapter 10, section 9) reaches fewer of one row's batches. Every vector is on
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
from ..cli import Parser, fail, human, number, output_path, parse_size  # noqa: E402
from ..model import calibration, cost  # noqa: E402
from .calibrate import LADDER, cores, fit_alpha_beta, fit_gamma, fit_rates, measure_calibration, timed  # noqa: E402

ALGORITHMS = {"naive": naive.allreduce, "tree": tree.allreduce, "butterfly": butterfly.allreduce,
              "ring": ring.allreduce, "rabenseifner": rabenseifner.allreduce, "auto": auto.allreduce}
DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4 << 10, 256 << 10]


def target(name, nbytes, ratio, refined_ratio, calibrated_ratio=None):
    """(text, met) for the performance targets on this row: met is True, False or None (no target).
    calibrated_ratio: calibrated model / measured, None where no calibration for this p applies."""
    checks = []
    if name in ("auto", "auto_init"):               # auto_init: against MPI's persistent Allreduce_init
        checks.append(("<=1.5x", ratio <= 1.5))
    if name in ("ring", "rabenseifner") and nbytes >= 1 << 20:
        checks.append(("<=1.0x", ratio <= 1.0))
    if refined_ratio is not None and nbytes >= 1 << 20:
        checks.append(("model+-25%", 0.75 <= refined_ratio <= 1.25))
    if calibrated_ratio is not None and nbytes >= 4 << 10:
        checks.append(("cal+-25%", 0.75 <= calibrated_ratio <= 1.25))
    if not checks:
        return "-", None
    return ",".join(text for text, _ in checks), all(ok for _, ok in checks)


def describe(rows):
    return ", ".join(f"{name} from {human(nbytes)}" for nbytes, name in rows)


def settings(argv, size):
    """The checked flags (each rank checks its own argv before its first message: error: and exit 2)."""
    parser = Parser(prog="python -m collectives.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", help="comma-separated message sizes, e.g. 4K,1M,64M")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--quick", action="store_true", help="two small sizes, short batches")
    parser.add_argument("--min-time", default="0.02", help="seconds per timed batch")
    parser.add_argument("--rounds", default="7", help="batches per measurement (best kept)")
    parser.add_argument("--json", help="write one JSON object per measurement to this file")
    parser.add_argument("--plot", help="write a PNG of time against size")
    parser.add_argument("--persistent", action="store_true",
                        help="also time collectives.persistent's auto (allreduce_init once, start() per call, "
                             "row auto_init) against MPI's persistent Allreduce_init (row mpi_init)")
    parser.add_argument("--write-selection", action="store_true",
                        help="store, for this p, the algorithm measured fastest at each size in "
                             "collectives/selection.json, which collectives.auto reads")
    calibrated = ("the calibrated model's JSON, read for the 'calibrated' column, written by --calibrate; "
                  "none: no column")
    parser.add_argument("--calibration", default=str(calibration.CALIBRATION_FILE), help=calibrated + " (%(default)s)")
    parser.add_argument("--calibrate", action="store_true", help="fit the calibrated model first (see the header)")
    parser.add_argument("--median", action="store_true", help="median of single calls (a loaded machine)")
    args = parser.parse_args(argv)
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else (
            QUICK_SIZES if args.quick else DEFAULT_SIZES)
    except (ValueError, KeyError, IndexError):
        fail(f"--sizes {args.sizes}: expected sizes such as 4K,1M,64M")
    if any(n < 4 or n % 4 for n in args.sizes):
        fail(f"--sizes: every size must be a multiple of 4 bytes (float32), >= 4; got {args.sizes}")
    args.names = [name.strip() for name in args.algorithms.split(",") if name.strip()]
    unknown = [name for name in args.names if name not in ALGORITHMS]
    if unknown:
        fail(f"--algorithms: unknown {', '.join(unknown)}; choose from {', '.join(ALGORITHMS)}")
    args.min_time, args.rounds = number("--min-time", args.min_time, 1e-6), number("--rounds", args.rounds, 1, True)
    if args.quick:
        args.min_time, args.rounds = 0.002, 1
    for flag in ("json", "plot"):
        output_path("--" + flag, getattr(args, flag))
    if args.calibration == "none":                  # no calibrated column (chapter 3's tables)
        if args.calibrate:
            fail("--calibrate needs a --calibration file to write, not none")
        args.model = None
    elif args.calibrate:
        output_path("--calibration", args.calibration)
        if size < 2:
            fail("--calibrate needs at least 2 ranks (it times messages between them)")
        args.model = None
    else:
        try:
            args.model = calibration.load(args.calibration,
                                          required=args.calibration != str(calibration.CALIBRATION_FILE))
        except ValueError as error:
            fail(str(error))
    return args


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
              + f"; wrote {args.calibration}", flush=True)
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
    bests = [{} for _ in setups]

    def table_round(nbytes=ALL):
        """One batch of every row; of the rows of nbytes; or (None) of the rows whose size is off the
        calibration's ladder. Best batch kept, rounds interleaved: noise from other processes hits
        all rows alike, and a state of the machine that lasts seconds reaches fewer of a row's rounds."""
        for (count, _, recvbuf, calls, _), best in zip(setups, bests):
            row_bytes = count * 4
            if nbytes is ALL or row_bytes == nbytes or (nbytes is None and row_bytes not in LADDER):
                for name, call in calls.items():
                    best[name] = min(best.get(name, np.inf), timed(comm, call, min_time, args.median))
                    if not np.all(recvbuf == expected):
                        raise SystemExit(f"rank {rank}: {name} gave a wrong sum at {row_bytes} bytes")
    if args.calibrate:             # the calibration's rounds and the table's in turn, size by size
        model_cal = calibrate(comm, args, between=table_round)
    else:
        model_cal = args.model
        for _ in range(rounds):
            table_round()
    if rank == 0:
        print(f"# calibrated model: {args.calibration}" + (f" (fitted at p = {model_cal.p}; its target only at "
              f"that p)" if model_cal else " (none: `--calibrate` writes it)"))
        print(f"{'bytes':>9} {'algorithm':<18} {'measured us':>12} {'x MPI':>7} {'model us':>10} {'model/meas':>10}"
              f" {'refined us':>10} {'ref/meas':>8} {'cal us':>10} {'cal/meas':>8}  {'target':<27} met")
    for (count, rates, _, calls, requests), best in zip(setups, bests):
        for request in requests:
            request.Free()
        for name in calls:
            if name in ("mpi", "mpi_init"):
                model_name = "lower bound"
            elif name in ("auto", "auto_init"):
                model_name = auto.choose_name(count * 4, size)
            else:
                model_name = name
            model = cost.predict(model_name, size, count * 4, alpha, beta, gamma)
            refined = (cost.predict_refined(model_name, size, count * 4, rates)
                       if model_name != "lower bound" else None)     # MPI's own: no refined model
            refined_ratio = None if refined is None else refined / best[name]
            # the persistent auto against MPI's persistent allreduce
            reference = best.get("mpi_init", best["mpi"]) if name == "auto_init" else best["mpi"]
            calibrated = (cost.predict_calibrated(model_name, size, count * 4, model_cal)
                          if model_cal and model_name != "lower bound" else None)
            calibrated_ratio = None if calibrated is None else calibrated / best[name]
            goal, met = target(name, count * 4, best[name] / reference, refined_ratio,
                               calibrated_ratio if model_cal and model_cal.p == size else None)
            record = {"algorithm": name, "p": size, "bytes": count * 4, "seconds": best[name],
                      "mpi_seconds": reference, "ratio": best[name] / reference,
                      "model_seconds": model, "model": model_name,
                      "alpha": alpha, "beta": beta, "gamma": gamma,
                      "refined_seconds": refined, "refined_ratio": refined_ratio,
                      "calibrated_seconds": calibrated, "calibrated_ratio": calibrated_ratio,
                      "load_average": os.getloadavg()[0],
                      "rates": {"alpha": alpha, "beta_x": rates.beta_x, "beta_1": rates.beta_1,
                                "beta_solo": rates.beta_solo, "beta_ring": rates.beta_ring,
                                "beta_gather": rates.beta_gather, "beta_scatter": rates.beta_scatter,
                                "gamma_m": rates.gamma_m, "gamma_3": rates.gamma_3,
                                "copy": rates.copy, "share": rates.share},
                      "target": goal, "met": met}
            records.append(record)
            if rank == 0:
                label = f"{name}({model_name})" if name in ("auto", "auto_init") else name
                print(f"{human(count * 4):>9} {label:<18} {best[name] * 1e6:12.1f} {record['ratio']:7.2f} "
                      f"{model * 1e6:10.1f} {model / best[name]:10.2f} "
                      f"{'-' if refined is None else f'{refined * 1e6:.1f}':>10} "
                      f"{'-' if refined is None else f'{refined_ratio:.2f}':>8} "
                      f"{'-' if calibrated is None else f'{calibrated * 1e6:.1f}':>10} "
                      f"{'-' if calibrated is None else f'{calibrated_ratio:.2f}':>8}  {goal:<27} "
                      f"{'-' if met is None else 'met' if met else 'NO'}", flush=True)

    measured = auto.fastest_table(records)
    if rank == 0 and measured:
        print(f"# fastest measured at p = {size}: {describe(measured)}")
        print(f"# auto uses at p = {size}: {describe(auto.table(size))}"
              f"{'' if size in auto.SELECTION else ' (the textbook default: no entry in selection.json)'}")
    if rank == 0 and args.write_selection:
        if not measured:
            print("# --write-selection: nothing measured")
        else:
            auto.write_selection(size, measured)
            print(f"# wrote p = {size} to {auto.SELECTION_FILE} (auto reads it at its next import)")
    if rank == 0:
        rows = [r for r in records if r["met"] is not None]
        print(f"# targets met: {sum(r['met'] for r in rows)} of {len(rows)} rows")

    if rank == 0 and args.json:
        with open(args.json, "w") as file:
            json.dump(records, file, indent=1)
    if rank == 0 and args.plot:
        from .plot import plot_bench
        plot_bench(records, args.plot, size)
    return records
