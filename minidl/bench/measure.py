"""Run the workers in their own processes and turn their answers into rows (and the conv suite's summary)."""
import importlib.util
import json
import os
import subprocess
import sys

from minidl import backend
from minidl.bench.cases import SUITES, conv_flops, linear_flops
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


def run_worker(framework, suite, args, backend_name="numpy", device="cpu"):
    """Run one worker process and return its JSON answer (None if it could not run)."""
    env = dict(os.environ)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = str(args.threads)
    env["MINIDL_BACKEND"] = backend_name
    blas_environment(env, getattr(args, "blas", "as-set"))
    command = [sys.executable, "-m", "minidl.bench", suite, "--worker", framework,
               "--threads", str(args.threads), "--repeats", str(args.repeats), "--clock", args.clock,
               "--device", device] + (["--quick"] if args.quick else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"[bench] the {framework} worker ({backend_name}) failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("times", "floors"):               # JSON made the case indices strings
        if key in answer:
            answer[key] = {int(index): value for index, value in answer[key].items()}
    return answer


def torch_installed():
    return importlib.util.find_spec("torch") is not None


def gpu_available():
    return backend.cupy_available()


def torch_cuda_available():
    if not torch_installed():
        return False
    import torch
    return torch.cuda.is_available()


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def measure(suite, args):
    """Rows for ``suite``: one per case (and, for conv/layers with a GPU, one per case on CuPy)."""
    cases = SUITES[suite](args.quick)
    minidl = run_worker("minidl", suite, args)
    if minidl is None:
        raise SystemExit("minidl benchmark worker failed")
    torch = run_worker("torch", suite, args) if torch_installed() and not args.no_torch else None
    gpu = run_worker("minidl", suite, args, "cupy") if suite != "main" and gpu_available() else None
    torch_gpu = (run_worker("torch", suite, args, device="cuda")
                 if gpu and not args.no_torch and torch_cuda_available() else None)
    rows = []
    for index, case in enumerate(cases):
        for device, result, yardstick in (("cpu", minidl, torch), ("gpu", gpu, torch_gpu)):
            if result is None:
                continue
            row = _row(case, result["times"][index], yardstick["times"].get(index) if yardstick else None,
                       result["gemm_gflops"], device, args.threads)
            if index in result.get("floors", {}):
                row["floor_ms"] = round(result["floors"][index], 4)
                row["over_floor"] = round(row["minidl_ms"] / row["floor_ms"], 3)
                row["target"] = f"<= {case['target_floor']}x floor"
                row["met"] = row["over_floor"] <= case["target_floor"]
            if device == "gpu":               # Hegde & Usmani's question: how much faster than the CPU?
                row["cpu_over_gpu"] = round(minidl["times"][index] / result["times"][index], 2)
            rows.append(row)
    meta = {"gemm_gflops": minidl["gemm_gflops"], "torch_gemm_gflops": torch["gemm_gflops"] if torch else None,
            "torch_version": torch["version"] if torch else None, "gpu": gpu is not None,
            "cupy_gemm_gflops": gpu["gemm_gflops"] if gpu else None,
            "torch_cuda_gemm_gflops": torch_gpu["gemm_gflops"] if torch_gpu else None,
            "gpu_name": torch_gpu.get("device_name") if torch_gpu else None,
            "breakdown": minidl.get("breakdown")}
    return rows, meta


def _row(case, minidl_ms, torch_ms, gemm, device, threads):
    flops = conv_flops(case["shape"]) if case["kind"] == "conv" else (
        linear_flops(case["shape"]) if case["kind"] == "linear" else None)
    row = {"case": case["case"], "kind": case["kind"], "device": device, "threads": threads,
           "minidl_ms": round(minidl_ms, 4), "torch_ms": round(torch_ms, 4) if torch_ms else None,
           "ratio": _ratio(minidl_ms, torch_ms)}
    if "algorithm" in case:
        row["algorithm"] = case["algorithm"]
    if "shape" in case:
        row["shape"] = list(case["shape"])
    if "sweep" in case:
        row["sweep"], row["x"] = case["sweep"], case["x"]
    if "batch" in case:
        row["batch"] = case["batch"]
    if flops:
        row["gflops"] = round(flops / minidl_ms / 1e6, 2)
        row["gemm_fraction"] = round(row["gflops"] / gemm, 3)     # of this device's own GEMM rate
    if "target_ratio" in case and device == "cpu":       # the targets are the CPU's; the GPU rows are numbers
        row["target"] = f"<= {case['target_ratio']}x torch"
        row["met"] = row["ratio"] <= case["target_ratio"] if row["ratio"] is not None else None
    if "target_gemm_fraction" in case:
        row["target"] += f", >= {case['target_gemm_fraction']:.0%} of GEMM"
        row["met_gemm"] = row["gemm_fraction"] >= case["target_gemm_fraction"]
        if row.get("met") is not None:
            row["met"] = row["met"] and row["met_gemm"]        # both parts of the target
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
