"""Benchmarks (numbers, not tests): minidl beside PyTorch CPU and beside the machine's GEMM rate.

The command line of ``python -m minidl.bench`` (see ``minidl/bench/__init__.py`` for what each
suite measures and how it is timed).
"""
import argparse
import json
import os
import sys

import numpy

from minidl import tuning
from minidl.bench.breakdown import explain_breakdown
from minidl.bench.cases import SUITES
from minidl.bench.measure import FORCING, add_costs, conv_summary, measure
from minidl.bench.steps import minidl_worker, settings_in_force
from minidl.bench.table import CONV_COLUMNS, LAYERS_COLUMNS, MAIN_COLUMNS, SWEEP_COLUMNS, plot, print_table
from minidl.bench.timing import CLOCK
from minidl.bench.yardstick import torch_worker
from minidl.conv import budget


def fail(message):
    """The project's error contract: one line `error: <what>` on stderr, exit status 2 (no usage text)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check(args):
    """Refuse what would stop the run midway (or after it): counts below 1, an output path that cannot be written."""
    for flag, value in (("--threads", args.threads), ("--repeats", args.repeats), ("--rounds", args.rounds),
                        ("--launches", args.launches)):
        if value < 1:
            fail(f"{flag} must be at least 1, got {value}")
    try:                                          # the workers read them at their first convolution
        budget.from_environment()
        tuning.current()
    except ValueError as error:
        fail(str(error))
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder) or not os.access(folder, os.W_OK) or os.path.isdir(path):
                fail(f"{flag} {path}: cannot write there (no such folder, not writable, or a folder)")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m minidl.bench", description=__doc__.split("\n\n")[0])
    parser.error = fail                           # a bad flag: one error line, no usage text
    parser.add_argument("suite", nargs="?", default="main", choices=sorted(SUITES))
    parser.add_argument("--json", help="write the rows as a JSON list of objects to this path")
    parser.add_argument("--plot", help="write a PNG plot (conv and layers suites) to this path")
    parser.add_argument("--threads", type=int, default=1, help="threads for NumPy's BLAS and for PyTorch (default 1)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="interleaved rounds per case (minidl, PyTorch, the floor in turn); the median is reported")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case and round; their minimum counts")
    parser.add_argument("--launches", type=int, default=1,
                        help="run the whole benchmark this many times (fresh worker processes each) and count, per "
                             "target, the launches whose median met it")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test of the benchmark itself)")
    parser.add_argument("--clock", choices=sorted(CLOCK), default=None,
                        help="'wall' time, or this process's 'cpu' time (default: cpu for 1 thread, else wall)")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    parser.add_argument("--blas", choices=["as-set", "native"], default="as-set",
                        help="'native': time NumPy with the OpenBLAS kernel it picks for this processor, "
                             "leaving out a forced OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (default: the "
                             "environment as set)")
    parser.add_argument("--worker", choices=["minidl", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check(args)
    args.clock = args.clock or ("cpu" if args.threads == 1 else "wall")

    if args.worker:                               # inside a worker process: serve the parent's requests
        if args.worker == "torch":
            torch_worker(args.suite, args.quick, args.repeats, args.threads, args.clock, args.device)
        else:
            minidl_worker(args.suite, args.quick, args.repeats, args.clock)
        return 0

    print(f"tuning: {tuning.ACTIVE.source}" + ("" if tuning.ACTIVE.source.startswith("tuned") else
                                                "; python -m minidl.tune measures this machine's choices first"))
    launches = []
    for launch in range(args.launches):
        load = os.getloadavg()[0]                   # the neighbours' share as the launch begins
        rows, meta = measure(args.suite, args)
        meta["load_average"] = load
        for row in rows:
            row["launch"] = launch
        summary = report(rows, meta, args, launch)
        launches.append((rows, meta, summary))
    counts = count_targets([rows for rows, _, _ in launches])
    if args.launches > 1:
        print(f"\ntargets over {args.launches} launches (each judged on its medians):")
        print_table(counts, ["case", "batch", "device", "target", "launches met"])
    rows, meta, summary = launches[0]
    if args.json:
        machine = {key: meta[key] for key in ("gemm_gflops", "torch_gemm_gflops", "torch_version", "gpu", "gpu_name",
                                              "cupy_gemm_gflops", "torch_cuda_gemm_gflops", "rounds")}
        machine.update(numpy_version=numpy.__version__, threads=args.threads, clock=args.clock, repeats=args.repeats,
                       blas=args.blas, blas_forced={name: os.environ.get(name) for name in FORCING
                                                    if args.blas == "as-set" and os.environ.get(name)},
                       tuning=meta.get("tuning", tuning.ACTIVE.source),        # as the minidl worker read them
                       settings=meta.get("settings", settings_in_force()),
                       gemm_gflops_launches=[meta["gemm_gflops"] for _, meta, _ in launches],
                       torch_gemm_gflops_launches=[meta["torch_gemm_gflops"] for _, meta, _ in launches],
                       load_launches=[meta["load_average"] for _, meta, _ in launches])
        summary = dict(summary or {}, machine=machine, launches=args.launches, targets=counts)
        output = [row for rows, _, _ in launches for row in rows] + [{"case": "summary", "kind": "summary", **summary}]
        with open(args.json, "w") as file:
            json.dump(output, file, indent=1)
    if args.plot and args.suite != "main":
        plot(rows, args.suite, args.plot)
    return 0


def count_targets(launches):
    """One row per case with a target: in how many launches its median met it, out of every launch (one
    that could not judge it, a side that failed, did not meet it)."""
    counts = {}
    for rows in launches:
        for row in rows:
            if row.get("met") is None:
                continue
            key = (row["case"], row.get("batch"), row["device"])
            entry = counts.setdefault(key, {"case": row["case"], "batch": row.get("batch"), "device": row["device"],
                                            "target": row["target"], "met_launches": 0, "launches": len(launches)})
            entry["met_launches"] += bool(row["met"])
    for entry in counts.values():
        entry["launches met"] = f"{entry['met_launches']} of {entry['launches']}"
    return list(counts.values())


def report(rows, meta, args, launch):
    """Print one launch's header and table (and its suite's extras); return the suite's summary."""
    print(f"{'' if launch == 0 else chr(10)}minidl.bench {args.suite}"
          + (f", launch {launch + 1} of {args.launches}" if args.launches > 1 else "")
          + f": float32, {args.threads} thread(s), {args.clock} time, median of {args.rounds} interleaved rounds "
          f"(each the minimum of {args.repeats} runs); NumPy GEMM {meta['gemm_gflops']:.1f} GFLOP/s"
          + (f", PyTorch {meta['torch_version']} GEMM {meta['torch_gemm_gflops']:.1f} GFLOP/s" if meta["torch_version"]
             else ", no PyTorch comparison (not installed or --no-torch)")
          + ("" if args.suite == "main" else ("; no GPU: CuPy not measured" if not meta["gpu"] else
              f"; GPU {meta['gpu_name'] or ''} (wall time): CuPy GEMM {meta['cupy_gemm_gflops']:.0f} GFLOP/s"
              + (f", PyTorch CUDA GEMM {meta['torch_cuda_gemm_gflops']:.0f} GFLOP/s; 'gpu' rows' torch_ms is PyTorch on"
                 " the GPU" if meta["torch_cuda_gemm_gflops"] else ""))))
    if args.blas == "native" and any(os.environ.get(name) for name in FORCING):
        forced = ", ".join(n + "=" + os.environ[n] for n in FORCING if os.environ.get(n))
        print(f"note: --blas native: NumPy ran without {forced} (OpenBLAS's own kernel choice for this processor)")
    elif os.environ.get("OPENBLAS_CORETYPE"):
        # a forced OpenBLAS kernel (set on some machines for old OpenBLAS bugs) can halve NumPy's GEMM rate
        print(f"note: OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} forces that OpenBLAS kernel; "
              "--blas native (or unsetting it and OPENBLAS_L2_SIZE) measures NumPy's own choice")
    if meta.get("tuning", tuning.ACTIVE.source) != tuning.ACTIVE.source:
        print(f"note: the minidl worker runs on {meta['tuning']} (its environment is not this process's)")
    summary = None
    if args.suite == "main":
        print_table(rows, MAIN_COLUMNS)
        summary = explain_breakdown(rows, meta["breakdown"])
    elif args.suite == "conv":
        add_costs(rows)
        summary = conv_summary(rows)
        print_table(rows, CONV_COLUMNS)
        for item in summary["winograd_vs_im2col"]:
            print(f"winograd vs im2col, {item['case']}: {item['time_ratio']}x faster measured, "
                  f"{item['multiply_ratio']}x fewer multiplications")
        print(f"FFT beats im2col from kernel size {summary['fft_crossover_kernel']} on "
              f"(kernel sweep; None = not within the sizes tried)")
    else:
        print_table(rows, SWEEP_COLUMNS if args.suite == "sweep" else LAYERS_COLUMNS)
    judged = [row for row in rows if row.get("met") is not None]
    if judged:
        print(f"targets met (on the medians): {sum(bool(row['met']) for row in judged)} of {len(judged)} rows")
    return summary
