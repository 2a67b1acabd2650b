"""Benchmarks (numbers, not tests): minidl beside PyTorch CPU and beside the machine's GEMM rate.

The command line of ``python -m minidl.bench`` (see ``minidl/bench/__init__.py`` for what each
suite measures and how it is timed).
"""
import argparse
import json
import os
import sys

import numpy

from minidl.bench.breakdown import explain_breakdown
from minidl.bench.cases import SUITES
from minidl.bench.measure import FORCING, add_costs, conv_summary, measure
from minidl.bench.steps import minidl_worker
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
    for flag, value in (("--threads", args.threads), ("--repeats", args.repeats)):
        if value < 1:
            fail(f"{flag} must be at least 1, got {value}")
    try:                                          # the workers read it at their first convolution
        budget.from_environment()
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
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case; the minimum is reported")
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

    if args.worker:                               # inside a worker process: time and answer in JSON
        if args.worker == "torch":
            answer = torch_worker(args.suite, args.quick, args.repeats, args.threads, args.clock, args.device)
        else:
            answer = minidl_worker(args.suite, args.quick, args.repeats, args.clock)
        print(json.dumps(answer))
        return 0

    rows, meta = measure(args.suite, args)
    print(f"minidl.bench {args.suite}: float32, {args.threads} thread(s), {args.clock} time, "
          f"minimum of {args.repeats} runs; NumPy GEMM {meta['gemm_gflops']:.1f} GFLOP/s"
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
    elif args.suite == "sweep":
        print_table(rows, SWEEP_COLUMNS)
    else:
        print_table(rows, LAYERS_COLUMNS)
    if args.json:
        machine = {key: meta[key] for key in ("gemm_gflops", "torch_gemm_gflops", "torch_version", "gpu", "gpu_name",
                                              "cupy_gemm_gflops", "torch_cuda_gemm_gflops")}
        machine.update(numpy_version=numpy.__version__, threads=args.threads, clock=args.clock, repeats=args.repeats,
                       blas=args.blas, blas_forced={name: os.environ.get(name) for name in FORCING
                                                    if args.blas == "as-set" and os.environ.get(name)})
        summary = dict(summary or {}, machine=machine)
        output = rows + [{"case": "summary", "kind": "summary", **summary}]
        with open(args.json, "w") as file:
            json.dump(output, file, indent=1)
    if args.plot and args.suite != "main":
        plot(rows, args.suite, args.plot)
    return 0

