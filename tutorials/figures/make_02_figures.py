"""Regenerate chapter 2's tables and figures (about 5-10 minutes on 2 shared cores; --quick: seconds):

    python tutorials/figures/make_02_figures.py [--quick] [--out DIR] [--only PART]

1. conv: ``python -m minidl.bench conv`` (every algorithm on LeNet-5's layers, a 64-channel layer,
   a channel sweep and a kernel sweep; PyTorch beside im2col when it is installed)
   -> 02_conv.json, 02_conv.txt (the printed table), 02_conv.png (time relative to im2col).
2. layers: ``python -m minidl.bench layers`` (Hegde & Usmani 2016, section 4: a conv layer and a
   fully connected layer over sizes; CuPy rows only where CuPy and a GPU are present)
   -> 02_layers.json, 02_layers.txt, 02_layers.png (minidl's time relative to PyTorch's).
3. main: ``python -m minidl.bench`` (its per-stage breakdown gives each GEMM's GFLOP/s)
   -> 02_main.json, 02_main.txt.
4. memory: the peak of memory NumPy allocates (tracemalloc, from a cold start of the scratch-buffer
   pool; outputs and gradients included) in forward and in forward + backward of each algorithm on
   the batch-32, 64-channel layer, beside ``cost.cost(...)["extra_elements"]``
   -> 02_memory.json, 02_memory.md.
5. workdepth: work W, depth D and average parallelism W / D (``cost.work_depth``, Ben-Nun & Hoefler)
   for each algorithm and the fully connected layer, beside the measured CPU times of parts 1-2
   -> 02_workdepth.json, 02_workdepth.md (needs parts 1 and 2's JSON in --out).
6. plots: the two figures and 02_gemm.md, from the JSON of parts 1-3 (no timing).
7. summary: the numbers the chapter's prose quotes, each computed from the JSON above
   -> 02_numbers.json (tests/test_chapter_numbers.py checks the prose against it).
8. precision: the worst float32 error of im2col, FFT and Winograd against a float64 ``direct``
   (max |error| / max |reference|, over the output and both gradients) on 300 random shapes and
   two wide layers (no timing: the same numbers on every run of the same NumPy)
   -> 02_precision.json.
10. gpu: chapter 2's CPU-versus-GPU tables and figure, from the JSON that
   ``bash tutorials/figures/gpu_02.sh OUTDIR`` wrote on a machine with a GPU (02_layers_gpu.json,
   02_sweep_gpu.json, 02_conv_gpu.json, copied here, and 02_layers_gpu_blocked.json, the layers
   suite's first GPU run, while im2col still cut the batch into 6 MiB blocks there; no timing here)
   and its two training runs (02_gpu_train_numpy.jsonl, 02_gpu_train_cupy.jsonl)
   -> 02_gpu_layers.md, 02_gpu_sweep.md, 02_gpu_conv.md, 02_gpu.png, 02_gpu_numbers.json.
11. tune: ``python -m minidl.tune --out OUT/02_tuning.json`` (this machine's block size, layouts, column
   budget and auto's thresholds, then collectives' calibration and selection) -> 02_tuning.json,
   02_tuning.txt (what it printed).
12. sweep: ``python -m minidl.bench sweep --blas native --launches 3`` with MINIDL_TUNING=OUT/02_tuning.json
   where part 11 wrote one (the LeNet-5 and MLP steps and the 64-channel layer at batch 16-256 against
   PyTorch, the layer's BLAS floor beside it, each row's target judged on its median over rounds, and in
   how many of the launches it was met) -> 02_sweep.json, 02_sweep.txt, 02_sweep.md (the first launch, with
   the times) and 02_sweep_launches.md (every launch's ratios side by side).
13. sweeptables: 02_sweep.md and 02_sweep_launches.md again from the 02_sweep.json in --out (no timing).
9. allocator: the LeNet-5 and MLP training steps and the 64-channel layer, minidl and PyTorch, each
   case in a fresh process, with glibc malloc's default thresholds (MINIDL_KEEP_FREED_MEMORY=0) and
   with the ones minidl sets at import (``minidl.backend.keep_freed_memory``): time and minor page
   faults per step -> 02_allocator.json, 02_allocator.md.

Timing: float32, one thread, this process's CPU time (``--clock cpu``: the other jobs on a shared
machine do not count); the benches in --rounds interleaved rounds (minidl, PyTorch and the floor in
turn, each turn the minimum of 3 runs), each time the median over rounds and each ratio the median of
the rounds' ratios with [min, max]; the allocator part the minimum of --repeats runs. --quick shrinks
every case and writes to /tmp/minidl_02_quick unless --out is given. Every part runs on the shipped
defaults (MINIDL_TUNING=none: a user's tuning file never reaches the book) but the sweep, which reads
the tuning part 11 wrote (named as a reader types it from the repository root).
"""
import argparse
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
# the book's parts run on the shipped defaults (MINIDL_TUNING=none), whatever the user's tuning file says;
# only the sweep reads the tuning that part 11 measured, and names it
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT),
           MINIDL_TUNING="none")

import numpy as np  # noqa: E402

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from minidl import conv  # noqa: E402
from minidl.conv import cost, direct, scratch  # noqa: E402

PARTS = ("conv", "layers", "main", "memory", "plots", "workdepth", "summary", "precision", "allocator", "gpu", "tune",
         "sweep", "sweeptables")
MEMORY_SHAPE = ((32, 64, 32, 32), (64, 64, 3, 3), 1, 1)     # the chapter's "big" layer (section 3)
COLOURS = {"direct": "tab:red", "fft": "tab:green", "winograd": "tab:purple", "PyTorch": "tab:orange",
           "im2col": "tab:blue"}


def as_typed(path):
    """``path`` as a reader types it from the repository root (the programs run there): relative inside the
    repository, so that what they print and record of it names no folder of this machine."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def tune(out, quick):
    """02_tuning.json: this machine's tuning file, measured by python -m minidl.tune (02_tuning.txt: its report)."""
    command = [sys.executable, "-m", "minidl.tune", "--out", as_typed(out / "02_tuning.json")] + (
        ["--quick", "--rounds", "1", "--calls", "1", "--no-collectives"] if quick else [])
    (out / "02_tuning.json").unlink(missing_ok=True)
    done = subprocess.run(command, env=ENV, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    (out / "02_tuning.txt").write_text(done.stdout + done.stderr)
    print(done.stdout + done.stderr)


def bench(suite, out, quick, rounds, no_torch=False, extra=(), env=None):
    """Run one suite of minidl.bench in its own process (``rounds`` interleaved rounds, each the minimum of
    3 runs; --quick: 1); keep its JSON and its printed table."""
    command = [sys.executable, "-m", "minidl.bench"] + ([suite] if suite != "main" else []) + [
        "--json", str(out / f"02_{suite}.json"), "--clock", "cpu", "--rounds", str(rounds), "--repeats",
        "1" if quick else "3"] + (["--quick"] if quick else []) + (["--no-torch"] if no_torch else []) + list(extra)
    done = subprocess.run(command, env=env or ENV, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    (out / f"02_{suite}.txt").write_text(done.stdout)
    print(done.stdout)


def ratio_of(row):
    """minidl / PyTorch of a row: the median of the rounds' ratios; rows of runs before the bench took
    rounds (the GPU machine's JSON) hold their one ratio as "ratio"."""
    return row.get("median_ratio", row.get("ratio"))


def load(out, suite):
    rows = json.loads((out / f"02_{suite}.json").read_text())
    return [row for row in rows if row["kind"] != "summary"], next(
        (row for row in rows if row["kind"] == "summary"), None)


# ---- figures: ratios, since the differences the chapter discusses are 1.5-5x ----------------------
def plot_conv(out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401
    rows, _ = load(out, "conv")
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for axis, sweep, label in [(axes[0], "channels", "channels (in = out); batch 16, 32x32, 3x3"),
                               (axes[1], "kernel", "kernel size; batch 8, 16 -> 16 channels, 64x64")]:
        chosen = [row for row in rows if row.get("sweep") == sweep and row["device"] == "cpu"]
        base = {row["x"]: row["minidl_ms"] for row in chosen if row["algorithm"] == "im2col"}
        lines = {}
        for row in chosen:
            if row["algorithm"] != "im2col":
                lines.setdefault(f"minidl {row['algorithm']}", []).append((row["x"], row["minidl_ms"] / base[row["x"]]))
            elif row["torch_ms"]:
                lines.setdefault("PyTorch conv2d", []).append((row["x"], row["torch_ms"] / base[row["x"]]))
        for name, points in lines.items():
            points.sort()
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name,
                      color=COLOURS.get(name.split()[-1] if name.startswith("minidl") else "PyTorch"))
        axis.axhline(1.0, color=COLOURS["im2col"], linestyle="--", label="minidl im2col (= 1)")
        axis.set_yscale("log", base=2)
        axis.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_xlabel(label)
        axis.set_ylabel("time / minidl im2col's time (fwd + bwd)")
        axis.grid(True, alpha=0.3, which="both")
        axis.legend(fontsize=8)
    figure.suptitle("Chapter 2: convolution algorithms on the CPU, float32, 1 thread, CPU time "
                    "(below 1 = faster than im2col)")
    figure.tight_layout()
    figure.savefig(out / "02_conv.png", dpi=110)
    plt.close(figure)


def plot_layers(out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401
    rows, _ = load(out, "layers")
    torch = any(row["torch_ms"] for row in rows)
    gpu = any(row["device"] == "gpu" for row in rows)
    torch_cpu = {(row["sweep"], row["x"]): row["torch_ms"] for row in rows if row["device"] == "cpu"}
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for axis, sweep, label in [(axes[0], "conv", "channels (in = out); batch 32, 32x32, 3x3, im2col"),
                               (axes[1], "fc", "width (in = out); batch 128")]:
        for device, name, colour in [("cpu", "minidl, NumPy on the CPU", "tab:blue"),
                                     ("gpu", "minidl, CuPy on the GPU", "tab:green")]:
            points = sorted((row["x"], row["minidl_ms"] / torch_cpu[(sweep, row["x"])] if torch
                             else row["gemm_fraction"])
                            for row in rows if row["sweep"] == sweep and row["device"] == device
                            and (row["gemm_fraction"] is not None or torch))
            if points:
                axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name, color=colour)
        if torch:
            axis.axhline(1.0, color=COLOURS["PyTorch"], linestyle="--", label="PyTorch on the CPU (= 1)")
        axis.set_ylim(bottom=0)
        axis.set_xscale("log", base=2)
        axis.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_xlabel(label)
        axis.set_ylabel("time / PyTorch CPU's time (fwd + bwd)" if torch else "fraction of NumPy's GEMM rate")
        axis.grid(True, alpha=0.3, which="both")
        axis.legend(fontsize=8)
    figure.suptitle("Chapter 2 (Hegde & Usmani, section 4): float32, 1 thread, CPU time"
                    + ("" if gpu else "; no GPU here, so no GPU line"))
    figure.tight_layout()
    figure.savefig(out / "02_layers.png", dpi=110)
    plt.close(figure)


# ---- CPU against GPU: tables from the JSON gpu_02.sh wrote on a GPU machine --------------------
def _pairs(rows, key):
    """{key: {"cpu": row, "gpu": row}} for the rows of one GPU-machine suite."""
    pairs = {}
    for row in rows:
        pairs.setdefault(key(row), {})[row["device"]] = row
    return pairs


def _ms(value):
    return "-" if value is None else f"{value:.3g}"


def gpu_tables(out):
    layers, layers_meta = load(out, "layers_gpu")
    sweep, _ = load(out, "sweep_gpu")
    conv_rows, _ = load(out, "conv_gpu")
    machine = layers_meta["machine"]
    lines = ["| layer | CPU, 1 core, ms | GPU, ms | CPU / GPU | minidl / PyTorch, CPU | minidl / PyTorch, GPU |",
             "|---|---|---|---|---|---|"]
    pairs = _pairs(layers, lambda row: row["case"])
    for case, pair in pairs.items():
        cpu, gpu = pair["cpu"], pair["gpu"]
        lines.append(f"| {case} | {_ms(cpu['minidl_ms'])} | {_ms(gpu['minidl_ms'])} | {gpu['cpu_over_gpu']:.3g} | "
                     f"{_ms(cpu['ratio'])} | {_ms(gpu['ratio'])} |")
    (out / "02_gpu_layers.md").write_text("\n".join(lines) + "\n")
    lines = ["| case | batch | CPU, ms | GPU, ms | CPU / GPU | PyTorch CPU, ms | PyTorch GPU, ms |",
             "|---|---|---|---|---|---|---|"]
    for (case, batch), pair in _pairs(sweep, lambda row: (row["case"], row["batch"])).items():
        cpu, gpu = pair["cpu"], pair["gpu"]
        lines.append(f"| {case} | {batch} | {_ms(cpu['minidl_ms'])} | {_ms(gpu['minidl_ms'])} | "
                     f"{gpu['cpu_over_gpu']:.3g} | {_ms(cpu['torch_ms'])} | {_ms(gpu['torch_ms'])} |")
    (out / "02_gpu_sweep.md").write_text("\n".join(lines) + "\n")
    # the four algorithms on the 64-channel layer at batch 32: direct, FFT and Winograd from the conv
    # suite's run (02_conv_gpu.json), which still cut im2col into the CPU's 6 MiB blocks on the GPU;
    # im2col as it runs now (one block on a GPU) and PyTorch from the layers run, the same shape
    lines = ["| algorithm | CPU, 1 core, ms | GPU, ms | CPU / GPU |", "|---|---|---|---|"]
    large = _pairs([row for row in conv_rows if row["case"] == "large"], lambda row: row["algorithm"])
    now = pairs["conv 64->64 32x32"]
    assert now["gpu"]["shape"] == large["im2col"]["gpu"]["shape"], \
        "the layers run's 64-channel layer is the conv suite's"
    rows = [(name, large[name]["cpu"]["minidl_ms"], large[name]["gpu"]["minidl_ms"])
            for name in ("direct", "fft", "winograd")]
    rows += [("im2col, in 6 MiB blocks of images", large["im2col"]["cpu"]["minidl_ms"],
              large["im2col"]["gpu"]["minidl_ms"]),
             ("im2col, one block on a GPU (as it runs now)", now["cpu"]["minidl_ms"], now["gpu"]["minidl_ms"])]
    for name, cpu_ms, gpu_ms in rows:
        lines.append(f"| {name} | {_ms(cpu_ms)} | {_ms(gpu_ms)} | {cpu_ms / gpu_ms:.3g} |")
    torch_gpu = now["gpu"]["torch_ms"]
    lines.append(f"| PyTorch (cuDNN) | {_ms(now['cpu']['torch_ms'])} | {_ms(torch_gpu)} | "
                 f"{now['cpu']['torch_ms'] / torch_gpu:.3g} |")
    (out / "02_gpu_conv.md").write_text("\n".join(lines) + "\n")

    def span(values):
        return [round(min(values), 3), round(max(values), 3)]
    gpu_layers = [row for row in layers if row["device"] == "gpu"]
    by_sweep = {(row["case"], row["batch"], row["device"]): row for row in sweep}
    gpu_large = {name: gpu_ms for name, _, gpu_ms in rows}
    gpu_large["im2col (blocks)"] = gpu_large.pop("im2col, in 6 MiB blocks of images")
    gpu_large["im2col"] = gpu_large.pop("im2col, one block on a GPU (as it runs now)")
    numbers = {
        "gpu_name": machine["gpu_name"], "cupy_gemm_gflops": machine["cupy_gemm_gflops"],
        "cpu_gemm_gflops": machine["gemm_gflops"],
        "conv_cpu_over_gpu": span([r["cpu_over_gpu"] for r in gpu_layers if r["kind"] == "conv"]),
        "fc_cpu_over_gpu": span([r["cpu_over_gpu"] for r in gpu_layers if r["kind"] == "linear"]),
        "conv_gpu_torch_ratio": span([ratio_of(r) for r in gpu_layers if r["kind"] == "conv"]),
        "fc_gpu_torch_ratio": span([ratio_of(r) for r in gpu_layers if r["kind"] == "linear"]),
        "lenet_cpu_over_gpu": {str(b): by_sweep[("lenet5 train step", b, "gpu")]["cpu_over_gpu"]
                               for b in sorted({r["batch"] for r in sweep})},
        "mlp_cpu_over_gpu": {str(b): by_sweep[("mlp 784-256-256-10 train step", b, "gpu")]["cpu_over_gpu"]
                             for b in sorted({r["batch"] for r in sweep})},
        "large_gpu_ms": gpu_large, "large_gpu_torch_ms": torch_gpu,
        "large_gpu_fastest": min(gpu_large, key=gpu_large.get),
        "large_gpu_auto_choice": next(r["auto_choice"] for r in conv_rows if r["case"] == "large"),
    }
    runs = {name: [json.loads(line) for line in (out / f"02_gpu_train_{name}.jsonl").read_text().splitlines()]
            for name in ("numpy", "cupy")}                       # one allreduce-SGD run per backend, same seed
    numbers["train_loss_max_relative_difference"] = max(
        abs(a["train_loss"] - b["train_loss"]) / abs(a["train_loss"]) for a, b in zip(runs["numpy"], runs["cupy"]))
    numbers["test_accuracy_equal"] = all(a["test_accuracy"] == b["test_accuracy"]
                                         for a, b in zip(runs["numpy"], runs["cupy"]))
    # the first GPU run, while im2col still cut the batch into the CPU's 6 MiB blocks on the GPU too
    blocked, _ = load(out, "layers_gpu_blocked")
    blocked_conv = [row for row in blocked if row["device"] == "gpu" and row["kind"] == "conv"]
    numbers["blocked_conv_cpu_over_gpu"] = span([row["cpu_over_gpu"] for row in blocked_conv])
    numbers["blocked_conv_gpu_torch_ratio"] = span([ratio_of(row) for row in blocked_conv])
    (out / "02_gpu_numbers.json").write_text(json.dumps(numbers, indent=1))
    print(json.dumps(numbers, indent=1))
    return layers, machine


def plot_gpu(out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401
    layers, layers_meta = load(out, "layers_gpu")
    machine = layers_meta["machine"]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for axis, sweep, label in [(axes[0], "conv", "channels (in = out); batch 32, 32x32, 3x3, im2col"),
                               (axes[1], "fc", "width (in = out); batch 128")]:
        for device, framework, name, colour, style in [
                ("cpu", "minidl_ms", "minidl, NumPy, 1 CPU core", "tab:blue", "-"),
                ("cpu", "torch_ms", "PyTorch, 1 CPU core", "tab:orange", "-"),
                ("gpu", "minidl_ms", "minidl, CuPy, GPU", "tab:blue", "--"),
                ("gpu", "torch_ms", "PyTorch, GPU", "tab:orange", "--")]:
            points = sorted((row["x"], row[framework]) for row in layers
                            if row["sweep"] == sweep and row["device"] == device and row[framework])
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name, color=colour,
                      linestyle=style)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_xlabel(label)
        axis.set_ylabel("time, fwd + bwd, ms")
        axis.grid(True, alpha=0.3, which="both")
        axis.legend(fontsize=8)
    figure.suptitle(f"Chapter 2 (Hegde & Usmani, section 4): float32, one core of the GPU machine's CPU "
                    f"against its {machine['gpu_name']}")
    figure.tight_layout()
    figure.savefig(out / "02_gpu.png", dpi=110)
    plt.close(figure)


# ---- the GEMM stages of the main suite's breakdown --------------------------------------------
def gemm_table(out):
    rows, summary = load(out, "main")
    stages = [stage for stage in summary["stages"] if stage["stage"] == "GEMM"]
    lines = ["| layer | pass | GEMM ms | GFLOP/s | fraction of NumPy's square GEMM |", "|---|---|---|---|---|"]
    lines += [f"| {s['layer']} | {s['pass']} | {s['ms']:.3g} | {s['gflops']:.3g} | {s['gemm_fraction']:.2f} |"
              for s in stages]
    (out / "02_gemm.md").write_text("\n".join(lines) + "\n")
    return stages


# ---- memory: tracemalloc sees NumPy's allocations --------------------------------------------
def memory(out, quick):
    x_shape, w_shape, stride, padding = ((2, 8, 8, 8), (8, 8, 3, 3), 1, 1) if quick else MEMORY_SHAPE
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    weight = rng.standard_normal(w_shape).astype(np.float32)
    rows = []
    for name in ("direct", "im2col", "winograd", "fft"):
        kernel = conv.get(name, x_shape, w_shape, stride, padding)
        scratch._workspaces.clear()       # a cold call: the reused scratch buffers are allocated, and counted
        tracemalloc.start()
        output, cache = kernel.forward(x, weight, stride, padding)
        forward_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        kernel.backward(output, cache)
        backward_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        del output, cache
        counted = cost.cost(name, x_shape, w_shape, stride, padding)["extra_elements"]
        rows.append({"algorithm": name, "forward_peak_mib": round(forward_peak / 2 ** 20, 2),
                     "fwd_bwd_peak_mib": round(max(forward_peak, backward_peak) / 2 ** 20, 2),
                     "cost_extra_mib": round(counted * 4 / 2 ** 20, 2)})
    (out / "02_memory.json").write_text(json.dumps({"shape": [x_shape, w_shape, stride, padding], "rows": rows},
                                                   indent=1))
    lines = ["| algorithm | cost.cost extra_elements, MiB | measured peak, forward, MiB | measured peak, "
             "forward + backward, MiB |", "|---|---|---|---|"]
    lines += [f"| {r['algorithm']} | {r['cost_extra_mib']:.1f} | {r['forward_peak_mib']:.1f} | "
              f"{r['fwd_bwd_peak_mib']:.1f} |" for r in rows]
    (out / "02_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# ---- allocator: glibc's default malloc thresholds against minidl's ------------------------------
ALLOCATOR_CASES = ("lenet5 train step", "mlp 784-256-256-10 train step", "conv2d large fwd+bwd")
SETTINGS = {"glibc defaults": {"MINIDL_KEEP_FREED_MEMORY": "0"}, "minidl's thresholds": {}}


def allocator_worker(library, case_name, quick, repeats):
    """In this (fresh) process: one case's best step time (CPU clock) and minor page faults per step."""
    import resource

    from minidl import bench  # importing minidl sets malloc's thresholds, unless told not to
    case = next(c for c in bench.main_cases(quick) if c["case"] == case_name)
    if library == "minidl":
        step = bench.minidl_step(case, np.random.default_rng(0))
    else:
        import torch
        torch.set_num_threads(1)
        step = bench.torch_step(case, torch)
    ms = bench.best_ms(step, repeats, clock="cpu")
    steps = 5 if quick else 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        step()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps
    print(json.dumps({"ms": ms, "faults_per_step": faults}))


def allocator(out, quick, repeats, no_torch):
    """Each (library, case, setting) in its own process, so no earlier case has moved glibc's
    dynamic threshold (it rises after a large block is freed: a long run ends up fast either way)."""
    import importlib.util
    libraries = ["minidl"] + ([] if no_torch or importlib.util.find_spec("torch") is None else ["torch"])
    rows = []
    for case in ALLOCATOR_CASES:
        for library in libraries:
            row = {"case": case, "library": library}
            for setting, extra in SETTINGS.items():
                env = {k: v for k, v in ENV.items() if not k.startswith("MALLOC_") and k != "MINIDL_KEEP_FREED_MEMORY"}
                command = [sys.executable, str(Path(__file__).resolve()), "--allocator-worker", library, case,
                           "--repeats", str(repeats)] + (["--quick"] if quick else [])
                done = subprocess.run(command, env=dict(env, **extra), cwd=ROOT, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
                row[setting] = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
    (out / "02_allocator.json").write_text(json.dumps(rows, indent=1))
    lines = ["| case | library | ms, glibc defaults | ms, minidl's thresholds | page faults a step, glibc defaults "
             "| page faults a step, minidl's thresholds |", "|---|---|---|---|---|---|"]
    for row in rows:
        a, b = row["glibc defaults"], row["minidl's thresholds"]
        lines.append(f"| {row['case']} | {'PyTorch' if row['library'] == 'torch' else 'minidl'} | {a['ms']:.3g} | "
                     f"{b['ms']:.3g} | {a['faults_per_step']:.0f} | {b['faults_per_step']:.0f} |")
    (out / "02_allocator.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# ---- precision: float32 against a float64 direct ------------------------------------------------
PRECISION_WIDE = (((4, 64, 32, 32), (64, 64, 3, 3), 1, 1), ((2, 16, 64, 64), (16, 16, 11, 11), 1, 5))


def precision(out, quick):
    """Worst max|float32 algorithm - float64 direct| / max|direct| per algorithm and array."""
    rng = np.random.default_rng(0)
    shapes = []
    for _ in range(20 if quick else 300):             # up to 16 channels, kernels up to the image size
        k, stride, padding = int(rng.integers(1, 8)), int(rng.integers(1, 4)), int(rng.integers(0, 3))
        side = int(rng.integers(max(1, k - 2 * padding), 17))
        shapes.append(((int(rng.integers(1, 4)), int(rng.integers(1, 17)), side, side),
                       (int(rng.integers(1, 17)), None, k, k), stride, padding))
    shapes = [(x, (w[0], x[1], w[2], w[3]), s, p) for x, w, s, p in shapes]
    if not quick:
        shapes += list(PRECISION_WIDE)
    worst = {name: {"error": 0.0, "array": None, "shape": None} for name in ("im2col", "fft", "winograd")}
    against_im2col = {"fft": 0.0, "winograd": 0.0}   # the largest error / im2col's, same shape and array
    zero = 0                                          # arrays exactly 0 (no window meets the image): no ratio
    for x_shape, w_shape, stride, padding in shapes:
        x = rng.standard_normal(x_shape).astype(np.float32)
        weight = rng.standard_normal(w_shape).astype(np.float32)
        o = conv.output_size(x_shape[2], w_shape[2], stride, padding)
        grad_out = rng.standard_normal((x_shape[0], w_shape[0], o, o)).astype(np.float32)
        exact, cache = direct.forward(x.astype(np.float64), weight.astype(np.float64), stride, padding)
        exact = (exact,) + direct.backward(grad_out.astype(np.float64), cache, need_x=True, need_weight=True)
        errors = {}
        for name in worst:
            try:
                kernel = conv.get(name, x_shape, w_shape, stride, padding)
            except ValueError:                        # Winograd: 3x3, stride 1 only
                continue
            result, cache = kernel.forward(x, weight, stride, padding)
            results = (result,) + tuple(kernel.backward(grad_out, cache, need_x=True, need_weight=True))
            for array, actual, wanted in zip(("out", "grad_x", "grad_weight"), results, exact):
                if not np.any(wanted):
                    zero += name == "im2col"
                    continue
                errors[name, array] = error = float(np.abs(actual - wanted).max() / np.abs(wanted).max())
                if error > worst[name]["error"]:
                    worst[name] = {"error": error, "array": array, "shape": [x_shape, w_shape, stride, padding]}
        for (name, array), error in errors.items():
            if name in against_im2col and errors[("im2col", array)] > 0:
                against_im2col[name] = max(against_im2col[name], error / errors[("im2col", array)])
    result = {"shapes": len(shapes), "random_shapes": len(shapes) - (0 if quick else len(PRECISION_WIDE)),
              "worst": worst, "largest_ratio_to_im2col": against_im2col, "zero_arrays_skipped": zero}
    (out / "02_precision.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


# ---- work and depth beside the measured times ---------------------------------------------------
def workdepth(out):
    conv_rows, _ = load(out, "conv")
    layer_rows, _ = load(out, "layers")
    table = []
    for row in conv_rows:
        if row["device"] != "cpu" or row["algorithm"] == "auto" or row["case"] not in ("large", "lenet conv2"):
            continue
        n, c, f, side, k, stride, padding = row["shape"]
        wd = cost.work_depth(row["algorithm"], (n, c, side, side), (f, c, k, k), stride, padding)
        table.append({"layer": f"conv {row['case']}", "algorithm": row["algorithm"], "shape": row["shape"],
                      **wd, "cpu_ms": row["minidl_ms"], "torch_ms": row["torch_ms"]})
    for row in layer_rows:
        if row["device"] == "cpu" and row["kind"] == "linear":
            n, i, o = row["shape"]
            wd = cost.work_depth_linear(n, i, o)
            table.append({"layer": row["case"], "algorithm": "GEMM", "shape": row["shape"], **wd,
                          "cpu_ms": row["minidl_ms"], "torch_ms": row["torch_ms"]})
    (out / "02_workdepth.json").write_text(json.dumps(table, indent=1))
    lines = ["| layer | algorithm | work W (fwd + bwd) | depth D | W / D | CPU time, ms | PyTorch CPU, ms |",
             "|---|---|---|---|---|---|---|"]
    for r in table:
        torch = f"{r['torch_ms']:.3g}" if r["torch_ms"] else "-"
        lines.append(f"| {r['layer']} | {r['algorithm']} | {r['work']:.3g} | {r['depth']} | "
                     f"{r['parallelism']:.3g} | {r['cpu_ms']:.3g} | {torch} |")
    (out / "02_workdepth.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# ---- the numbers the prose quotes ----------------------------------------------------------------
def numbers(out):
    conv_rows, conv_summary = load(out, "conv")
    layer_rows, _ = load(out, "layers")
    cpu = [row for row in conv_rows if row["device"] == "cpu"]
    by = {(row["case"], row["algorithm"]): row for row in cpu}
    result = {"winograd_speedup": {}, "fft_speedup": {}}
    _, main_summary = load(out, "main")
    conv_gemm = [s for s in main_summary["stages"] if s["stage"] == "GEMM" and s["layer"] == "conv2d large"]
    result["conv_large_gemm_gflops"] = [min(s["gflops"] for s in conv_gemm), max(s["gflops"] for s in conv_gemm)]
    main_rows, _ = load(out, "main")
    result["conv_large_layer_gflops"] = next(r["gflops"] for r in main_rows if r["case"] == "conv2d large fwd+bwd")
    for item in conv_summary["winograd_vs_im2col"]:
        result["winograd_speedup"][item["case"]] = item["time_ratio"]
    result["winograd_multiply_ratio"] = conv_summary["winograd_vs_im2col"][0]["multiply_ratio"]
    for row in cpu:
        if row.get("sweep") == "kernel" and row["algorithm"] == "fft":
            result["fft_speedup"][str(row["x"])] = round(by[(row["case"], "im2col")]["minidl_ms"] / row["minidl_ms"], 3)
    result["fft_crossover_kernel"] = conv_summary["fft_crossover_kernel"]
    ratios = {row["case"]: ratio_of(row) for row in cpu if row["algorithm"] == "im2col" and ratio_of(row)}
    if ratios:
        sweep = [ratio for case, ratio in ratios.items() if case.startswith("kernel")]
        result["torch_ratio_large"] = ratios.get("large")
        result["torch_ratio_channels"] = [min(r for c, r in ratios.items() if c.startswith("channels")),
                                          max(r for c, r in ratios.items() if c.startswith("channels"))]
        result["torch_ratio_kernel"] = [min(sweep), max(sweep)]
        result["torch_ratio_all"] = [min(ratios.values()), max(ratios.values())]
    result["auto_disagrees"] = sorted({row["case"] for row in cpu if row["auto_choice"] != row["fastest"]})
    fc = [ratio_of(row) for row in layer_rows if row["kind"] == "linear" and row["device"] == "cpu" and ratio_of(row)]
    cv = [ratio_of(row) for row in layer_rows if row["kind"] == "conv" and row["device"] == "cpu" and ratio_of(row)]
    if fc:
        result["layers_torch_ratio_fc"] = [min(fc), max(fc)]
        result["layers_torch_ratio_conv"] = [min(cv), max(cv)]
    result["layers_gpu_measured"] = any(row["device"] == "gpu" for row in layer_rows)
    memory_rows = {r["algorithm"]: r for r in json.loads((out / "02_memory.json").read_text())["rows"]}
    result["memory_fwd_bwd_peak_mib"] = {name: r["fwd_bwd_peak_mib"] for name, r in memory_rows.items()}
    result["memory_cost_mib"] = {name: r["cost_extra_mib"] for name, r in memory_rows.items()}
    (out / "02_numbers.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


def sweep_table(out):
    """02_sweep.md: the batch sweep's first launch, each ratio the median of its rounds with [min, max], its
    target, and in how many launches the median met it, from 02_sweep.json."""
    rows, summary = load(out, "sweep")
    if "launches" not in summary or "targets" not in summary:
        raise SystemExit(f"error: {out / '02_sweep.json'} is a sweep from before --launches (no launches or "
                         "targets in its summary): run --only sweep to measure one")
    machine = summary["machine"]
    forced = machine["blas_forced"]
    met_in = {(t["case"], t["batch"]): f"{t['met_launches']} of {t['launches']}" for t in summary["targets"]}
    lines = ["| case | batch | minidl, ms | PyTorch, ms | minidl / PyTorch [min, max] | floor, ms | "
             "minidl / floor [min, max] | target | met | launches met |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def cell(value, digits=".3g"):
        return "-" if value is None else format(value, digits)

    def spread(median, low_high):
        return "-" if median is None else f"{median:.2f} [{low_high[0]:.2f}, {low_high[1]:.2f}]"
    for row in rows:
        if row["device"] != "cpu" or row["launch"] != 0:
            continue
        met = "-" if row.get("met") is None else ("yes" if row["met"] else "NO")
        lines.append(f"| {row['case']} | {row['batch']} | {cell(row['minidl_ms'])} | {cell(row.get('torch_ms'))} | "
                     f"{spread(row.get('median_ratio'), row.get('ratio_range'))} | {cell(row.get('floor_ms'))} | "
                     f"{spread(row.get('median_over_floor'), row.get('over_floor_range'))} | "
                     f"{row.get('target', '-')} | {met} | {met_in.get((row['case'], row['batch']), '-')} |")
    lines.append("")
    lines.append("BLAS: " + (", ".join(f"{k}={v}" for k, v in forced.items()) if forced else
                             "OpenBLAS's own kernel for this processor (--blas native)")
                 + f"; NumPy GEMM {machine['gemm_gflops']:.0f} GFLOP/s, one thread, CPU time; each time the median "
                 f"of {machine['rounds']} interleaved rounds (each the minimum of {machine['repeats']} runs); "
                 f"{summary['launches']} launches; {machine['tuning']}")
    (out / "02_sweep.md").write_text("\n".join(lines) + "\n")
    launches_table(rows, summary, out)


def launches_table(rows, summary, out):
    """02_sweep_launches.md: every launch of the sweep side by side, each cell the median of that launch's
    per-round ratios (to PyTorch, or to the floor for the conv layer; three decimals, so that a median on
    the line shows on which side it fell) with [min, max] and whether it met the target, then in how many
    launches it did; below, each launch's GEMM rates and the tuning. CPU rows only (a GPU row has no floor
    and no tuning)."""
    launches, machine = summary["launches"], summary["machine"]
    by = {}
    for row in rows:
        key = (row["case"], row["batch"], row["device"], row["launch"])
        if key in by:
            raise SystemExit(f"error: {out / '02_sweep.json'}: two rows for {key}")
        by[key] = row
    lines = ["| case | batch | target | " + " | ".join(f"launch {k + 1}" for k in range(launches)) + " | met in |",
             "|---|---|---|" + "---|" * launches + "---|"]
    for target in summary["targets"]:
        if target["device"] != "cpu":
            continue
        cells = []
        for k in range(launches):
            row = by.get((target["case"], target["batch"], "cpu", k))
            if row is None:
                raise SystemExit(f"error: {out / '02_sweep.json'}: no row for {target['case']} at batch "
                                 f"{target['batch']} in launch {k + 1}")
            key, spread = (("median_over_floor", "over_floor_range") if "median_over_floor" in row else
                           ("median_ratio", "ratio_range"))
            met = {True: "yes", False: "NO"}.get(row.get("met"), "-")
            if row.get(key) is None or row.get(spread) is None:
                cells.append(f"- {met}")
                continue
            low, high = row[spread]
            cells.append(f"{row[key]:.3f} [{low:.3f}, {high:.3f}] {met}")
        lines.append(f"| {target['case']} | {target['batch']} | {target['target']} | " + " | ".join(cells) +
                     f" | {target['met_launches']} of {target['launches']} |")
    rates = ", ".join(f"{rate:.0f}" for rate in machine["gemm_gflops_launches"])
    torch = machine.get("torch_gemm_gflops_launches")
    if machine["torch_gemm_gflops"] is None:
        torch = "no PyTorch"
    elif torch:
        torch = "PyTorch " + ", ".join("-" if rate is None else f"{rate:.0f}" for rate in torch)
    else:            # a sweep from before the bench kept each launch's rate: the first launch's
        torch = f"PyTorch {machine['torch_gemm_gflops']:.0f} in launch 1"
    loads = machine.get("load_launches")
    loads = f"; load average {', '.join(f'{load:.1f}' for load in loads)} as each launch began" if loads else ""
    lines += ["", f"GEMM GFLOP/s in the {launches} launches: NumPy {rates} ({torch}); one thread, CPU time; each cell "
              f"the median of {machine['rounds']} interleaved rounds' ratios (each side the minimum of "
              f"{machine['repeats']} runs a round){loads}; {machine['tuning']}"]
    (out / "02_sweep_launches.md").write_text("\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny cases, for CI")
    parser.add_argument("--out", help="output folder (default: tutorials/figures/out, or /tmp/minidl_02_quick with "
                                      "--quick)")
    parser.add_argument("--only", choices=PARTS, action="append", help="run only this part (repeatable)")
    parser.add_argument("--repeats", type=int, default=None, help="the allocator part's timed runs per case (default "
                                                                  "7; --quick 2)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="the benches' interleaved rounds (default 7; --quick 2)")
    parser.add_argument("--launches", type=int, default=None, help="launches of the sweep (default 3; --quick 1)")
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch out (its columns stay empty)")
    parser.add_argument("--no-plots", action="store_true", help="skip the figures")
    parser.add_argument("--allocator-worker", nargs=2, metavar=("LIBRARY", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 7)
    rounds = args.rounds or (2 if args.quick else 7)
    launches = args.launches or (1 if args.quick else 3)
    if args.allocator_worker:
        allocator_worker(*args.allocator_worker, args.quick, repeats)
        return 0
    out = Path(args.out or ("/tmp/minidl_02_quick" if args.quick else HERE / "out"))
    out.mkdir(parents=True, exist_ok=True)
    parts = args.only or PARTS
    for suite in ("conv", "layers", "main"):
        if suite in parts:
            bench(suite, out, args.quick, rounds, args.no_torch)
    if "memory" in parts:
        memory(out, args.quick)
    if "plots" in parts:
        gemm_table(out)
        if not args.no_plots:
            plot_conv(out)
            plot_layers(out)
    if "workdepth" in parts:
        workdepth(out)
    if "summary" in parts:
        numbers(out)
    if "precision" in parts:
        precision(out, args.quick)
    if "allocator" in parts:
        allocator(out, args.quick, repeats, args.no_torch)
    if "tune" in parts:
        tune(out, args.quick)
    if "sweeptables" in parts and "sweep" not in parts:
        sweep_table(out)
    if "sweep" in parts:
        tuned = out / "02_tuning.json"
        bench("sweep", out, args.quick, rounds, args.no_torch, extra=["--blas", "native", "--launches", str(launches)],
              env=dict(ENV, MINIDL_TUNING=as_typed(tuned)) if tuned.exists() else None)
        sweep_table(out)
    if "gpu" in parts and (out / "02_layers_gpu.json").exists():
        gpu_tables(out)
        if not args.no_plots:
            plot_gpu(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
