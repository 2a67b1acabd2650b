"""Run the workers in their own processes, time every case in interleaved rounds, and make the rows (and the conv
suite's summary)."""
import importlib.util
import os
import statistics
import sys

from minidl import backend
from minidl.bench.cases import SUITES, conv_flops, linear_flops
from minidl.bench.rounds import Worker
from minidl.bench.timing import rotated, spread
from minidl.conv import auto, cost

# what some machines set to force OpenBLAS's kernel and cache size (for old OpenBLAS bugs); --blas
# native leaves them out of the workers' environment, for the benchmark's own processes only
FORCING = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def blas_environment(env, blas):
    """``env`` for a worker: as it is (``blas`` "as-set"), or without FORCING ("native": OpenBLAS
    picks its kernel for this processor). Returns the forced settings the worker runs with."""
    if blas == "native":
        for variable in FORCING:
            env.pop(variable, None)
    return {name: env[name] for name in FORCING if env.get(name)}


def start_worker(framework, suite, args, backend_name="numpy", device="cpu"):
    """A worker process serving ``suite`` (rounds.Worker), or None if it could not start."""
    env = dict(os.environ)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = str(args.threads)
    env["MINIDL_BACKEND"] = backend_name
    blas_environment(env, getattr(args, "blas", "as-set"))
    command = [sys.executable, "-m", "minidl.bench", suite, "--worker", framework,
               "--threads", str(args.threads), "--repeats", str(args.repeats), "--clock", args.clock,
               "--device", device] + (["--quick"] if args.quick else [])
    try:
        return Worker(f"{framework} ({backend_name}, {device})", command, env)
    except RuntimeError as error:
        print(f"[bench] {error}", file=sys.stderr)
        return None


def torch_installed():
    return importlib.util.find_spec("torch") is not None


def gpu_available():
    return backend.cupy_available()


def torch_cuda_available():
    if not torch_installed():
        return False
    import torch
    return torch.cuda.is_available()


def time_in_rounds(sides, index, rounds):
    """{side: [ms of each round]} for case ``index``: every side of ``sides`` ({side: (worker, request)})
    asked once a round, in an order rotated from round to round."""
    times = {side: [] for side in sides}
    for turn in range(rounds):
        for side in rotated(list(sides), turn):
            worker, request = sides[side]
            times[side].append(worker.ask(dict(request, case=index))["ms"])
    return times


def measure(suite, args):
    """Rows for ``suite``: one per case (and, for conv/layers/sweep with a GPU, one per case on CuPy),
    each side timed in ``args.rounds`` interleaved rounds."""
    cases = SUITES[suite](args.quick)
    minidl = start_worker("minidl", suite, args)
    if minidl is None:
        raise SystemExit("minidl benchmark worker failed")
    torch = start_worker("torch", suite, args) if torch_installed() and not args.no_torch else None
    gpu = start_worker("minidl", suite, args, "cupy") if suite != "main" and gpu_available() else None
    torch_gpu = (start_worker("torch", suite, args, device="cuda")
                 if gpu and not args.no_torch and torch_cuda_available() else None)
    rows = []
    try:
        for index, case in enumerate(cases):
            cpu_row = None
            for device, mine, yardstick in (("cpu", minidl, torch), ("gpu", gpu, torch_gpu)):
                if mine is None:
                    continue
                sides = {"minidl": (mine, {})}
                if yardstick and (suite != "conv" or case["algorithm"] == "im2col"):   # one PyTorch row per shape
                    sides["torch"] = (yardstick, {})
                if device == "cpu" and suite == "sweep" and case["kind"] == "conv":
                    sides["floor"] = (mine, {"floor": True})
                row = _row(case, time_in_rounds(sides, index, args.rounds), mine.meta["gemm_gflops"], device,
                           args.threads)
                if device == "gpu":           # Hegde & Usmani's question: how much faster than the CPU?
                    row["cpu_over_gpu"] = round(cpu_row["minidl_ms"] / row["minidl_ms"], 2)
                cpu_row = cpu_row or row
                rows.append(row)
        breakdown = minidl.ask({"breakdown": True}) if suite == "main" else None
    finally:
        for worker in (minidl, torch, gpu, torch_gpu):
            if worker is not None:
                worker.close()
    meta = {"gemm_gflops": minidl.meta["gemm_gflops"],
            "torch_gemm_gflops": torch.meta["gemm_gflops"] if torch else None,
            "torch_version": torch.meta["version"] if torch else None, "gpu": gpu is not None,
            "cupy_gemm_gflops": gpu.meta["gemm_gflops"] if gpu else None,
            "torch_cuda_gemm_gflops": torch_gpu.meta["gemm_gflops"] if torch_gpu else None,
            "gpu_name": torch_gpu.meta.get("device_name") if torch_gpu else None,
            "breakdown": breakdown, "rounds": args.rounds, "tuning": minidl.meta["tuning"],
            "settings": minidl.meta["settings"]}
    return rows, meta


def _per_round(times, numerator, denominator):
    """(median, [min, max]) of each round's ``numerator`` time over ``denominator``'s, rounded; (None, None)
    where either side was not timed."""
    if numerator not in times or denominator not in times:
        return None, None
    median, (low, high) = spread([a / b for a, b in zip(times[numerator], times[denominator])])
    return round(median, 3), [round(low, 3), round(high, 3)]


def _row(case, times, gemm, device, threads):
    """A row from the rounds' times ({side: [ms per round]}): each time the median over rounds, each ratio
    the median of the per-round ratios with its [min, max]; the targets judged on those medians."""
    flops = conv_flops(case["shape"]) if case["kind"] == "conv" else (
        linear_flops(case["shape"]) if case["kind"] == "linear" else None)
    minidl_ms = statistics.median(times["minidl"])
    torch_ms = statistics.median(times["torch"]) if "torch" in times else None
    row = {"case": case["case"], "kind": case["kind"], "device": device, "threads": threads,
           "rounds": len(times["minidl"]), "minidl_ms": round(minidl_ms, 4),
           "torch_ms": round(torch_ms, 4) if torch_ms else None}
    row["median_ratio"], row["ratio_range"] = _per_round(times, "minidl", "torch")
    for key in ("algorithm", "batch"):
        if key in case:
            row[key] = case[key]
    if "shape" in case:
        row["shape"] = list(case["shape"])
    if "sweep" in case:
        row["sweep"], row["x"] = case["sweep"], case["x"]
    if flops:
        row["gflops"] = round(flops / minidl_ms / 1e6, 2)
        row["gemm_fraction"] = round(row["gflops"] / gemm, 3)     # of this device's own GEMM rate
    if "target_ratio" in case and device == "cpu":       # the targets are the CPU's; the GPU rows are numbers
        row["target"] = f"<= {case['target_ratio']}x torch"
        row["met"] = row["median_ratio"] <= case["target_ratio"] if row["median_ratio"] is not None else None
    if "target_gemm_fraction" in case:
        row["target"] += f", >= {case['target_gemm_fraction']:.0%} of GEMM"
        row["met_gemm"] = row["gemm_fraction"] >= case["target_gemm_fraction"]
        if row.get("met") is not None:
            row["met"] = row["met"] and row["met_gemm"]        # both parts of the target
    if "floor" in times:
        row["floor_ms"] = round(statistics.median(times["floor"]), 4)
        row["median_over_floor"], row["over_floor_range"] = _per_round(times, "minidl", "floor")
        row["target"] = f"<= {case['target_floor']}x floor"
        row["met"] = row["median_over_floor"] <= case["target_floor"]
    return row


# ---- the conv suite's extras: cost table, Winograd ratio, FFT crossover -------------------------
def add_costs(rows):
    for row in rows:
        if row["kind"] != "conv":
            continue
        n, c, f, side, k, stride, padding = row["shape"]
        x_shape, weight_shape = (n, c, side, side), (f, c, k, k)
        name = row["algorithm"]
        if name == "auto":
            name = auto.choose_name(x_shape, weight_shape, stride, padding)
        counted = cost.cost(name, x_shape, weight_shape, stride, padding)
        row["multiplies_fwd_bwd"], row["extra_elements"] = counted["multiplies_fwd_bwd"], counted["extra_elements"]
        row["auto_choice"] = auto.choose_name(x_shape, weight_shape, stride, padding)


def conv_summary(rows):
    """Winograd vs im2col (measured time ratio beside the multiply-count ratio) and the FFT crossover."""
    cpu = [row for row in rows if row["device"] == "cpu" and row["kind"] == "conv"]
    by = {(row["case"], row["algorithm"]): row for row in cpu}
    summary = {"winograd_vs_im2col": []}
    for (case, algorithm), row in by.items():
        if algorithm == "winograd" and (case, "im2col") in by:
            base = by[(case, "im2col")]
            summary["winograd_vs_im2col"].append({
                "case": case, "time_ratio": round(base["minidl_ms"] / row["minidl_ms"], 3),
                "multiply_ratio": round(base["multiplies_fwd_bwd"] / row["multiplies_fwd_bwd"], 3)})
    kernels = sorted({row["x"] for row in cpu if row.get("sweep") == "kernel"})
    faster = [k for k in kernels
              if by[(f"kernel {k}x{k}", "fft")]["minidl_ms"] < by[(f"kernel {k}x{k}", "im2col")]["minidl_ms"]]
    # the crossover: the smallest kernel from which on FFT stays faster
    crossover = None
    for k in reversed(kernels):
        if k not in faster:
            break
        crossover = k
    summary["fft_crossover_kernel"] = crossover
    fastest = {}
    for row in cpu:
        if row["algorithm"] != "auto" and (row["case"] not in fastest or row["minidl_ms"] < fastest[row["case"]][1]):
            fastest[row["case"]] = (row["algorithm"], row["minidl_ms"])
    for row in cpu:
        row["fastest"] = fastest[row["case"]][0]
    return summary
