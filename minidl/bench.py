"""Benchmarks (numbers, not tests): minidl beside PyTorch CPU and beside the machine's GEMM rate.

    python -m minidl.bench                 conv / pooling / linear layers and two training steps
    python -m minidl.bench conv            the four convolution algorithms, their cost table, the
                                           Winograd channel sweep and the FFT kernel-size crossover
    python -m minidl.bench sweep           the LeNet-5 and MLP training steps and the 64-channel conv layer
                                           at batch 16..256, PyTorch beside them, the conv layer's floor
                                           (its GEMMs and copies timed alone); CuPy rows if a GPU
    python -m minidl.bench layers          Hegde & Usmani 2016, section 4: a conv layer and a fully
                                           connected layer over sizes, NumPy vs CuPy (if a GPU) vs PyTorch
    options: --json PATH  --plot PATH (conv, layers)  --threads N (default 1)  --repeats R  --clock cpu|wall
             --quick  --no-torch

Every case is timed as forward + backward (and, for a training step, the optimizer update);
the reported time is the minimum over ``--repeats`` runs after a warm-up, since the minimum is
the least disturbed by other processes on the machine. With one thread (the default) the clock is
the process's CPU time (``--clock cpu``): on an idle machine it equals wall time, on a shared one
it leaves out the time other jobs held the core (cache and memory-bandwidth contention remain);
with more threads, and on the GPU, it is wall time. minidl and PyTorch each run in their own
process (``--worker``), started with the same thread count in OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS and MKL_NUM_THREADS (and ``torch.set_num_threads``), so neither library's
thread pool or allocator disturbs the other. Both workers import minidl (this module is part of
it), so both run with the malloc thresholds ``minidl.backend.keep_freed_memory`` sets at import:
the allocator is the same on both sides (with glibc's defaults PyTorch's 64-channel layer page-faults
and takes 42-46 ms instead of 39 on the machine of chapter 2). The training steps zero gradients
with ``set_to_none=True`` on both sides. PyTorch is only a yardstick: it is imported here
and nowhere else in minidl, and the PyTorch columns are empty when it is not installed.

``gflops`` counts the direct method's 2 * N * F * C * kh * kw * Ho * Wo floating-point operations
per pass (three passes for forward + backward) whatever the algorithm, so a faster algorithm shows
as a higher "effective" rate; ``gemm_gflops`` is float32 NumPy matmul of two n x n matrices.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

import numpy

# ---- the cases ---------------------------------------------------------------------------------
# conv: (batch, in_channels, out_channels, side, kernel, stride, padding)
LARGE_CONV = (32, 64, 64, 32, 3, 1, 1)
LENET_CONV1 = (64, 1, 6, 28, 5, 1, 2)
LENET_CONV2 = (64, 6, 16, 14, 5, 1, 0)


def main_cases(quick):
    """The main suite: the large conv, LeNet-5's layers at batch 64, and two training steps."""
    large = (2, 8, 8, 8, 3, 1, 1) if quick else LARGE_CONV
    batch = 4 if quick else 64
    return [
        {"case": "conv2d large fwd+bwd", "kind": "conv", "shape": large, "algorithm": "im2col",
         "target_ratio": 1.5, "target_gemm_fraction": 0.8},
        {"case": "conv2d large fwd+bwd (auto)", "kind": "conv", "shape": large, "algorithm": "auto",
         "target_ratio": 1.3},
        {"case": "lenet conv1 fwd+bwd", "kind": "conv", "shape": (batch,) + LENET_CONV1[1:], "algorithm": "im2col"},
        {"case": "lenet pool1 fwd+bwd", "kind": "pool", "shape": (batch, 6, 28, 2)},
        {"case": "lenet conv2 fwd+bwd", "kind": "conv", "shape": (batch,) + LENET_CONV2[1:], "algorithm": "im2col"},
        {"case": "lenet pool2 fwd+bwd", "kind": "pool", "shape": (batch, 16, 10, 2)},
        {"case": "lenet fc1 fwd+bwd", "kind": "linear", "shape": (batch, 400, 120)},
        {"case": "lenet fc2 fwd+bwd", "kind": "linear", "shape": (batch, 120, 84)},
        {"case": "lenet fc3 fwd+bwd", "kind": "linear", "shape": (batch, 84, 10)},
        {"case": "lenet5 train step", "kind": "step", "model": "lenet5", "batch": batch, "target_ratio": 1.2},
        {"case": "mlp 784-256-256-10 train step", "kind": "step", "model": "mlp", "batch": batch, "target_ratio": 0.9},
    ]


def conv_cases(quick):
    """The conv suite: every algorithm on the LeNet and large shapes, a channel sweep, a kernel sweep."""
    algorithms = ("direct", "im2col", "fft", "winograd", "auto")
    if quick:
        shapes = {"large": (2, 4, 4, 8, 3, 1, 1)}
        channels, kernels, kernel_side = (4, 8), (3, 5), 12
    else:
        shapes = {"lenet conv1": LENET_CONV1, "lenet conv2": LENET_CONV2, "large": LARGE_CONV}
        channels, kernels, kernel_side = (8, 16, 32, 64, 128), (3, 5, 7, 9, 11, 13, 15, 17, 21), 64
    cases = []
    for label, shape in shapes.items():
        cases += [{"case": f"{label}", "kind": "conv", "shape": shape, "algorithm": a} for a in algorithms
                  if _supported(a, shape)]
    for width in channels:        # Winograd's regime: 3x3, stride 1, channel count grows
        shape = (2 if quick else 16, width, width, 8 if quick else 32, 3, 1, 1)
        cases += [{"case": f"channels {width}", "kind": "conv", "shape": shape, "algorithm": a, "sweep": "channels",
                   "x": width} for a in ("im2col", "winograd", "fft")]
    for k in kernels:             # FFT's regime: the kernel grows, the image stays ("same" padding)
        shape = (2 if quick else 8, 4 if quick else 16, 4 if quick else 16, kernel_side, k, 1, k // 2)
        cases += [{"case": f"kernel {k}x{k}", "kind": "conv", "shape": shape, "algorithm": a, "sweep": "kernel", "x": k}
                  for a in ("im2col", "fft") + (("direct",) if k <= 7 else ())]
    return cases


def _supported(algorithm, shape):
    from minidl import conv
    n, c, f, side, k, stride, padding = shape
    try:
        conv.get(algorithm, (n, c, side, side), (f, c, k, k), stride, padding)
    except ValueError:
        return False
    return True


def layers_cases(quick):
    """Hegde & Usmani 2016, section 4.2: a convolution layer and a fully connected layer over sizes."""
    channels = (4, 8) if quick else (16, 32, 64, 128)
    widths = (64, 128) if quick else (256, 512, 1024, 2048, 4096)
    batch_conv, side, batch_fc = (2, 8, 8) if quick else (32, 32, 128)
    cases = [{"case": f"conv {c}->{c} {side}x{side}", "kind": "conv", "shape": (batch_conv, c, c, side, 3, 1, 1),
              "algorithm": "im2col", "sweep": "conv", "x": c} for c in channels]
    cases += [{"case": f"fc {w}x{w}", "kind": "linear", "shape": (batch_fc, w, w), "sweep": "fc", "x": w} for w in widths]
    return cases


SWEEP_BATCHES = (16, 32, 64, 128, 256)
FLOOR_STAGES = ("GEMM", "im2col copy", "im2col copy (rebuilt)", "col2im", "zero-pad copy")


def sweep_cases(quick):
    """Every batch size: the LeNet-5 and MLP training steps and the 64-channel conv layer (with its floor)."""
    cases = []
    for batch in ((2, 4) if quick else SWEEP_BATCHES):
        conv_shape = (batch,) + ((4, 4, 8, 3, 1, 1) if quick else LARGE_CONV[1:])
        cases += [{"case": "lenet5 train step", "kind": "step", "model": "lenet5", "batch": batch, "target_ratio": 1.2},
                  {"case": "mlp 784-256-256-10 train step", "kind": "step", "model": "mlp", "batch": batch,
                   "target_ratio": 0.9},
                  {"case": "conv 64->64 32x32", "kind": "conv", "shape": conv_shape, "algorithm": "im2col",
                   "batch": batch, "target_floor": 1.15}]
    return cases


SUITES = {"main": main_cases, "conv": conv_cases, "layers": layers_cases, "sweep": sweep_cases}


def conv_flops(shape):
    """2 N F C kh kw Ho Wo per pass, times three passes (forward, grad_x, grad_weight)."""
    n, c, f, side, k, stride, padding = shape
    out = (side + 2 * padding - k) // stride + 1
    return 3 * 2 * n * f * c * k * k * out * out


def linear_flops(shape):
    n, i, o = shape
    return 3 * 2 * n * i * o


# ---- timing ----------------------------------------------------------------------------------
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}


def best_ms(step, repeats, sync=lambda: None, warmup=2, clock="wall"):
    """Minimum time of ``step()`` over ``repeats`` runs, in milliseconds, after ``warmup`` runs.

    ``clock="cpu"`` measures this process's CPU time instead of wall time: on one thread the two
    agree on an idle machine, but CPU time does not count the time other jobs held the core.
    """
    now = CLOCK[clock]
    for _ in range(warmup):
        step()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = now()
        step()
        sync()
        best = min(best, now() - start)
    return best * 1e3


def gemm_gflops(matmul_of, size, repeats, clock, sync=lambda: None):
    """GFLOP/s of one size x size float32 matrix product."""
    seconds = best_ms(matmul_of(size), repeats, sync, clock=clock) / 1e3
    return 2 * size ** 3 / seconds / 1e9


# ---- the minidl side -----------------------------------------------------------------------
def minidl_step(case, rng):
    """A no-argument function that runs ``case`` once with minidl on the active backend."""
    from minidl import Tensor, backend, functional as F, models, nn, optim
    xp = backend.xp()

    def array(*shape):
        return xp.asarray(rng.standard_normal(shape), dtype=xp.float32)

    if case["kind"] == "conv":
        n, c, f, side, k, stride, padding = case["shape"]
        layer = nn.Conv2d(c, f, k, stride=stride, padding=padding, rng=rng, algorithm=case["algorithm"])
        x = Tensor(array(n, c, side, side), requires_grad=True)
        out_side = (side + 2 * padding - k) // stride + 1
        grad = array(n, f, out_side, out_side)
        return lambda: _forward_backward(layer, x, grad)
    if case["kind"] == "pool":
        n, c, side, k = case["shape"]
        layer = nn.MaxPool2d(k)
        x = Tensor(array(n, c, side, side), requires_grad=True)
        grad = array(n, c, side // k, side // k)
        return lambda: _forward_backward(layer, x, grad)
    if case["kind"] == "linear":
        n, i, o = case["shape"]
        layer = nn.Linear(i, o, rng=rng)
        x = Tensor(array(n, i), requires_grad=True)
        grad = array(n, o)
        return lambda: _forward_backward(layer, x, grad)
    # a training step: forward, loss, backward, SGD update
    batch = case["batch"]
    if case["model"] == "lenet5":
        model = models.lenet5(rng)
    else:
        model = models.mlp(rng, in_features=784, hidden=(256, 256))
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    x = Tensor(array(batch, 1, 28, 28))
    labels = xp.asarray(rng.integers(0, 10, batch))

    def step():
        optimizer.zero_grad(set_to_none=True)                  # as the PyTorch step below
        F.softmax_cross_entropy(model(x), labels).backward()
        optimizer.step()
    return step


def _forward_backward(layer, x, grad):
    for parameter in layer.parameters():
        parameter.grad = None
    x.grad = None
    layer(x).backward(grad)


def minidl_worker(suite, quick, repeats, clock):
    from minidl import backend
    rng = numpy.random.default_rng(0)
    sync = lambda: None                                           # noqa: E731
    if backend.get_backend() == "cupy":
        import cupy
        sync = cupy.cuda.Device().synchronize
        clock = "wall"                                            # GPU time is not this process's CPU time
    xp = backend.xp()

    def matmul_of(size):
        a = xp.asarray(rng.standard_normal((size, size)), dtype=xp.float32)
        return lambda: a @ a
    times = {}
    for index, case in enumerate(SUITES[suite](quick)):
        times[index] = best_ms(minidl_step(case, rng), repeats, sync, clock=clock)
    answer = {"times": times, "gemm_gflops": gemm_gflops(matmul_of, 256 if quick else 2048, repeats, clock, sync)}
    if suite == "sweep":          # the conv layer's floor: its GEMMs and im2col/col2im copies, each timed alone
        answer["floors"] = {index: sum(best_ms(fn, repeats, sync, clock=clock) * scale
                                       for _, stage, fn, _, scale in conv_stages(case["shape"], rng, xp)
                                       if stage in FLOOR_STAGES)
                            for index, case in enumerate(SUITES[suite](quick)) if case["kind"] == "conv"}
    if suite == "main" and backend.get_backend() == "numpy":
        answer["breakdown"] = breakdown(quick, repeats, clock, answer["gemm_gflops"])
    return answer


# ---- where the time goes: the layers' stages, timed one by one (main suite) -------------------
BREAKDOWN_LAYERS = ("conv2d large fwd+bwd", "lenet conv1 fwd+bwd", "lenet conv2 fwd+bwd", "lenet pool1 fwd+bwd",
                    "lenet fc1 fwd+bwd")


def conv_stages(shape, rng, xp):
    """[(pass, stage, fn, flops, scale)]: the im2col layer's steps (minidl.conv.im2col) with its own building blocks.

    Each stage is one of the calls the layer makes, on arrays of the layer's shapes, so the stages
    add up to about the layer's time (not exactly: caches are warmer when a stage runs alone).
    Where the layer cuts its batch into blocks of images (``im2col.image_blocks``), a per-block
    stage runs on one block and counts ``scale`` = N / images per block times; for stride 1 the
    output gradient's columns serve both gradients (a transposing copy of x instead of its
    columns), otherwise the layer rebuilds each block's columns ("im2col copy (rebuilt)").
    """
    from minidl.conv import im2col as kernel
    n, c, f, side, k, stride, padding = shape
    blocks = kernel.image_blocks((n, c, side, side), (f, c, k, k), stride, padding, 4)
    nb = blocks[0][1] - blocks[0][0]
    scale = n / nb
    x = xp.asarray(rng.standard_normal((nb, c, side, side)), dtype=xp.float32)
    weight = xp.asarray(rng.standard_normal((f, c, k, k)), dtype=xp.float32)
    out_side = (side + 2 * padding - k) // stride + 1
    grad = xp.asarray(rng.standard_normal((nb, f, out_side, out_side)), dtype=xp.float32)
    stages = _conv_forward_stages("forward", x, weight, stride, padding, xp, scale)
    out = xp.zeros((n, f, out_side, out_side), dtype=xp.float32)
    bias = xp.zeros((1, f, 1, 1), dtype=xp.float32)
    whole_grad = xp.asarray(rng.standard_normal((n, f, out_side, out_side)), dtype=xp.float32)
    stages.append(("forward", "bias add", lambda: xp.add(out, bias, out=out), None, 1))
    fused = len(blocks) > 1 and kernel._input_gradient_as_convolution(weight.shape, stride, padding)
    if fused:
        # blocks, stride 1: the output gradient's columns (built for grad_x below) serve the weight
        # gradient too (im2col._gradients_from_output_columns): x's block transposed to (C, nb H W)
        # and one GEMM (F kh kw, nb H W) @ (nb H W, C)
        gcols = _columns(grad, k, 1, k - 1 - padding, side, xp)
        x_2d = xp.empty((c, nb, side, side), dtype=xp.float32)
        x_cnhw = x.transpose(1, 0, 2, 3)
        stages.append(("weight gradient", "x transpose", lambda: x_2d.__setitem__(Ellipsis, x_cnhw), None, scale))
        stages.append(("weight gradient", "GEMM", lambda: xp.matmul(gcols, x_2d.reshape(c, -1).T),
                       2 * c * gcols.size, scale))
        stages.append(("weight gradient", "bias sum", lambda: whole_grad.sum(axis=(0, 2, 3)), None, 1))
        flipped = xp.ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        stages.append(("input gradient", "flip weight",
                       lambda: xp.ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)), None, 1))
        stages += _conv_forward_stages("input gradient", grad, flipped, 1, k - 1 - padding, xp, scale)
        return stages
    # weight gradient: the output gradient transposed to (F, N HoWo), then one GEMM with the columns
    cols = _columns(x, k, stride, padding, out_side, xp)
    if len(blocks) > 1:
        x_pad = xp.zeros((nb, c, side + 2 * padding, side + 2 * padding), dtype=x.dtype)
        stages.append(("weight gradient", "im2col copy (rebuilt)",
                       lambda: kernel.im2col(x_pad, k, k, stride, out_side, out_side), None, scale))
    grad_2d = xp.empty((f, nb * out_side * out_side), dtype=xp.float32)
    grad_nchw = grad.transpose(1, 0, 2, 3).reshape(f, nb, out_side, out_side)
    stages.append(("weight gradient", "grad transpose",
                   lambda: grad_2d.reshape(f, nb, out_side, out_side).__setitem__(Ellipsis, grad_nchw), None, scale))
    stages.append(("weight gradient", "GEMM", lambda: xp.matmul(cols, grad_2d.T), 2 * f * cols.size, scale))
    stages.append(("weight gradient", "bias sum", lambda: whole_grad.sum(axis=(0, 2, 3)), None, 1))
    # input gradient: a "full" convolution of grad (stride 1, F <= C), or GEMM + col2im
    if kernel._input_gradient_as_convolution(weight.shape, stride, padding):
        flipped = xp.ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        stages.append(("input gradient", "flip weight",
                       lambda: xp.ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)), None, 1))
        stages += _conv_forward_stages("input gradient", grad, flipped, 1, k - 1 - padding, xp, scale)
    elif stride == 1:             # GEMM + col2im on whole padded planes (im2col._col2im_planes)
        width = side + 2 * padding
        length = c * nb * width * width
        weight_rows = xp.ascontiguousarray(weight.transpose(2, 3, 1, 0)).reshape(k * k * c, f)
        grad_planes = xp.zeros((f, nb * width * width), dtype=xp.float32)
        grad_cols = xp.empty((k * k * c, nb * width * width), dtype=xp.float32)
        stages.append(("input gradient", "GEMM", lambda: xp.matmul(weight_rows, grad_planes, out=grad_cols),
                       2 * f * c * k * k * nb * out_side * out_side, scale))    # the useful flops only
        runs = grad_cols.reshape(k, k, length)
        planes = xp.zeros(length, dtype=xp.float32)

        def col2im_planes():
            planes[...] = 0
            for i in range(k):
                for j in range(k):
                    planes[i * width + j:] += runs[i, j, :length - i * width - j]
        stages.append(("input gradient", "col2im", col2im_planes, None, scale))
    else:
        weight_t = weight.reshape(f, -1).T
        grad_cols = xp.empty((c * k * k, nb * out_side * out_side), dtype=xp.float32)
        stages.append(("input gradient", "GEMM", lambda: xp.matmul(weight_t, grad_2d, out=grad_cols),
                       2 * f * grad_cols.size, scale))
        cols_view = grad_cols.reshape(c, k, k, nb, out_side, out_side).transpose(3, 0, 1, 2, 4, 5)
        padded = (nb, c, side + 2 * padding, side + 2 * padding)
        stages.append(("input gradient", "col2im", lambda: kernel.col2im(cols_view, padded, stride), None, scale))
    return stages


def _columns(x, k, stride, padding, out_side, xp):
    from minidl.conv import im2col as kernel
    n, c, side = x.shape[0], x.shape[1], x.shape[2]
    x_pad = xp.zeros((n, c, side + 2 * padding, side + 2 * padding), dtype=x.dtype)
    x_pad[:, :, padding:padding + side, padding:padding + side] = x
    cols = kernel.im2col(x_pad, k, k, stride, out_side, out_side).transpose(1, 2, 3, 0, 4, 5)
    return xp.ascontiguousarray(cols).reshape(c * k * k, n * out_side * out_side)


def _conv_forward_stages(label, x, weight, stride, padding, xp, scale=1):
    from minidl.conv import im2col as kernel
    n, c, side = x.shape[0], x.shape[1], x.shape[2]
    f, k = weight.shape[0], weight.shape[2]
    out_side = (side + 2 * padding - k) // stride + 1
    x_pad = xp.zeros((n, c, side + 2 * padding, side + 2 * padding), dtype=x.dtype)
    stages = []
    if padding:
        inner = (slice(None), slice(None), slice(padding, padding + side), slice(padding, padding + side))
        stages.append((label, "zero-pad copy", lambda: x_pad.__setitem__(inner, x), None, scale))
    stages.append((label, "im2col copy", lambda: kernel.im2col(x_pad, k, k, stride, out_side, out_side), None, scale))
    cols = _columns(x, k, stride, padding, out_side, xp)
    weight_2d = weight.reshape(f, -1)
    out_2d = xp.empty((f, cols.shape[1]), dtype=x.dtype)
    stages.append((label, "GEMM", lambda: xp.matmul(weight_2d, cols, out=out_2d), 2 * f * cols.size, scale))
    stages.append((label, "output transpose",
                   lambda: xp.ascontiguousarray(out_2d.reshape(f, n, out_side, out_side).transpose(1, 0, 2, 3)), None,
                   scale))
    return stages


def pool_stages(shape, rng, xp):
    from minidl import pool
    n, c, side, k = shape
    x = xp.asarray(rng.standard_normal((n, c, side, side)), dtype=xp.float32)
    out, cache = pool.max_pool_forward(x, k, k, 0)
    grad = xp.ones_like(out)
    return [("forward", "max over windows", lambda: pool.max_pool_forward(x, k, k, 0), None, 1),
            ("input gradient", "route to the maxima", lambda: pool.max_pool_backward(grad, cache), None, 1)]


def linear_stages(shape, rng, xp):
    n, i, o = shape
    x = xp.asarray(rng.standard_normal((n, i)), dtype=xp.float32)
    weight = xp.asarray(rng.standard_normal((i, o)), dtype=xp.float32)
    grad = xp.asarray(rng.standard_normal((n, o)), dtype=xp.float32)
    bias = xp.zeros(o, dtype=xp.float32)
    flops, out = 2 * n * i * o, x @ weight
    return [("forward", "GEMM", lambda: x @ weight, flops, 1), ("forward", "bias add", lambda: out + bias, None, 1),
            ("weight gradient", "GEMM", lambda: x.T @ grad, flops, 1),
            ("weight gradient", "bias sum", lambda: grad.sum(axis=0), None, 1),
            ("input gradient", "GEMM", lambda: grad @ weight.T, flops, 1)]


def breakdown(quick, repeats, clock, gemm):
    """Rows (layer, pass, stage, ms, gflops, gemm_fraction) for the main suite's layers."""
    from minidl import backend
    xp, rng = backend.xp(), numpy.random.default_rng(1)
    rows = []
    for case in main_cases(quick):
        if case["case"] not in BREAKDOWN_LAYERS:
            continue
        stages = {"conv": conv_stages, "pool": pool_stages, "linear": linear_stages}[case["kind"]](case["shape"], rng, xp)
        for pass_, stage, fn, flops, scale in stages:
            ms = best_ms(fn, repeats, clock=clock) * scale
            row = {"layer": case["case"].replace(" fwd+bwd", ""), "pass": pass_, "stage": stage, "ms": round(ms, 4)}
            if flops:
                row["gflops"] = round(flops * scale / ms / 1e6, 1)
                row["gemm_fraction"] = round(row["gflops"] / gemm, 3)
            rows.append(row)
    return rows


# ---- the PyTorch side (only here, only as a yardstick) ----------------------------------------
def torch_step(case, torch, device="cpu"):
    nn_ = torch.nn
    generator = torch.Generator().manual_seed(0)

    def array(*shape, grad=False):
        return torch.randn(*shape, generator=generator).to(device).requires_grad_(grad)

    if case["kind"] in ("conv", "pool", "linear"):
        if case["kind"] == "conv":
            n, c, f, side, k, stride, padding = case["shape"]
            layer, x = nn_.Conv2d(c, f, k, stride=stride, padding=padding), array(n, c, side, side, grad=True)
        elif case["kind"] == "pool":
            n, c, side, k = case["shape"]
            layer, x = nn_.MaxPool2d(k), array(n, c, side, side, grad=True)
        else:
            n, i, o = case["shape"]
            layer, x = nn_.Linear(i, o), array(n, i, grad=True)
        layer = layer.to(device)
        grad = torch.randn(layer(x).shape, generator=generator).to(device)

        def step():
            layer.zero_grad(set_to_none=True)
            x.grad = None
            layer(x).backward(grad)
        return step
    if case["model"] == "lenet5":
        model = nn_.Sequential(nn_.Conv2d(1, 6, 5, padding=2), nn_.ReLU(), nn_.MaxPool2d(2),
                               nn_.Conv2d(6, 16, 5), nn_.ReLU(), nn_.MaxPool2d(2), nn_.Flatten(),
                               nn_.Linear(400, 120), nn_.ReLU(), nn_.Linear(120, 84), nn_.ReLU(), nn_.Linear(84, 10))
    else:
        model = nn_.Sequential(nn_.Flatten(), nn_.Linear(784, 256), nn_.ReLU(), nn_.Linear(256, 256), nn_.ReLU(),
                               nn_.Linear(256, 10))
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, labels = array(case["batch"], 1, 28, 28), torch.randint(0, 10, (case["batch"],), generator=generator).to(device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        nn_.functional.cross_entropy(model(x), labels).backward()
        optimizer.step()
    return step


def torch_worker(suite, quick, repeats, threads, clock, device="cpu"):
    """PyTorch's times; ``device="cuda"`` is the yardstick for the CuPy rows (wall time, synchronized)."""
    import torch
    torch.set_num_threads(threads)
    sync = lambda: None                                           # noqa: E731
    if device == "cuda":
        sync, clock = torch.cuda.synchronize, "wall"
    times = {}
    for index, case in enumerate(SUITES[suite](quick)):
        if suite == "conv" and case["algorithm"] != "im2col":
            continue              # one PyTorch time per shape (beside the default algorithm's row) is enough
        times[index] = best_ms(torch_step(case, torch, device), repeats, sync, clock=clock)

    def matmul_of(size):
        a = torch.randn(size, size).to(device)
        return lambda: a @ a
    answer = {"times": times, "version": torch.__version__,
              "gemm_gflops": gemm_gflops(matmul_of, 256 if quick else 2048, repeats, clock, sync)}
    if device == "cuda":
        answer["device_name"] = torch.cuda.get_device_name()
    return answer


# ---- running the workers in their own processes -------------------------------------------
def run_worker(framework, suite, args, backend_name="numpy", device="cpu"):
    """Run one worker process and return its JSON answer (None if it could not run)."""
    env = dict(os.environ)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = str(args.threads)
    env["MINIDL_BACKEND"] = backend_name
    command = [sys.executable, "-m", "minidl.bench", suite, "--worker", framework,
               "--threads", str(args.threads), "--repeats", str(args.repeats), "--clock", args.clock, "--device", device] + (["--quick"] if args.quick else [])
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
    from minidl import backend
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
    from minidl.conv import auto, cost
    for row in rows:
        if row["kind"] != "conv":
            continue
        n, c, f, side, k, stride, padding = row["shape"]
        x_shape, weight_shape = (n, c, side, side), (f, c, k, k)
        name = auto.choose_name(x_shape, weight_shape, stride, padding) if row["algorithm"] == "auto" else row["algorithm"]
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
    faster = [k for k in kernels if by[(f"kernel {k}x{k}", "fft")]["minidl_ms"] < by[(f"kernel {k}x{k}", "im2col")]["minidl_ms"]]
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


def explain_breakdown(rows, stages):
    """Print where each layer's time goes and what bounds it; return the numbers for the JSON."""
    by_case = {row["case"]: row for row in rows}
    for stage in stages:
        layer = by_case[stage["layer"] + " fwd+bwd"]
        stage["share"] = round(stage["ms"] / layer["minidl_ms"], 3)
    print("\nwhere the time goes (each stage timed alone, same shapes; share = of the layer's measured time):")
    print_table(stages, ["layer", "pass", "stage", "ms", "share", "gflops", "gemm_fraction"])
    summary = {"stages": stages, "layers": []}
    for name in BREAKDOWN_LAYERS:
        mine = [stage for stage in stages if stage["layer"] + " fwd+bwd" == name]
        gemm_ms = sum(stage["ms"] for stage in mine if stage["stage"] == "GEMM")
        layer = by_case[name]
        item = {"layer": name, "measured_ms": layer["minidl_ms"], "sum_of_stages_ms": round(sum(s["ms"] for s in mine), 3),
                "gemm_ms": round(gemm_ms, 3), "torch_ms": layer["torch_ms"]}
        summary["layers"].append(item)
        line = (f"{name}: measured {item['measured_ms']:.3g} ms, stages add up to {item['sum_of_stages_ms']:.3g} ms, "
                f"of which GEMM {gemm_ms:.3g} ms ({gemm_ms / layer['minidl_ms']:.0%})")
        if layer["torch_ms"] and gemm_ms:
            line += f"; the GEMMs alone are {gemm_ms / layer['torch_ms']:.2f}x PyTorch's whole layer"
            copy_ms = sum(stage["ms"] for stage in mine if stage["stage"].startswith("im2col copy"))
            if copy_ms:       # the two stages no im2col layer can skip: a bound on the layer's ratio
                item["gemm_and_im2col_ms"] = round(gemm_ms + copy_ms, 3)
                line += f", GEMMs and im2col copies {(gemm_ms + copy_ms) / layer['torch_ms']:.2f}x"
        print(line)
    step = by_case.get("lenet5 train step")
    layers = [row for row in rows if row["case"].startswith("lenet ") and row["case"] != "lenet5 train step"]
    if step and layers:
        # the step does not compute conv1's input gradient (the images need none): leave its stages out
        in_layers = sum(row["minidl_ms"] for row in layers) - sum(
            stage["ms"] for stage in stages if stage["layer"] == "lenet conv1" and stage["pass"] == "input gradient")
        summary["lenet5_outside_layers_ms"] = round(step["minidl_ms"] - in_layers, 3)
        print(f"lenet5 train step: {step['minidl_ms']:.3g} ms, of which its conv, pool and fc layers (less conv1's "
              f"input gradient) "
              f"{in_layers:.3g} ms; the rest (ReLU, loss, SGD update, autograd bookkeeping) "
              f"{step['minidl_ms'] - in_layers:.3g} ms")
    return summary


# ---- printing and plotting -------------------------------------------------------------------
def _format(value):
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, int) and abs(value) >= 10 ** 6:
        return f"{value:.3g}"
    return str(value)


def print_table(rows, columns):
    table = [columns] + [[_format(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)))


COLOURS = {"direct": "tab:red", "im2col": "tab:blue", "fft": "tab:green", "winograd": "tab:purple", "auto": "tab:gray",
           "PyTorch": "tab:orange", "minidl cpu": "tab:blue", "minidl gpu": "tab:green"}


def plot(rows, suite, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = {"conv": [("channels", "channels (in = out), batch 16, 32x32, 3x3"),
                       ("kernel", "kernel size, batch 8, 16 -> 16 channels, 64x64")],
              "layers": [("conv", "channels (in = out), batch 32, 32x32, 3x3"),
                         ("fc", "width (in = out), batch 128")]}[suite]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for axis, (sweep, label) in zip(axes, panels):
        chosen = [row for row in rows if row.get("sweep") == sweep]
        lines = {}
        for row in chosen:
            name = f"{row['algorithm']} ({row['device']})" if suite == "conv" else f"minidl {row['device']}"
            if suite == "layers" and row["device"] == "gpu":
                name = "minidl gpu (CuPy)"
            lines.setdefault(name, []).append((row["x"], row["minidl_ms"]))
            if row["torch_ms"] is not None:
                lines.setdefault("PyTorch (cpu)", []).append((row["x"], row["torch_ms"]))
        for name, points in lines.items():
            points = sorted(set(points))
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name,
                      color=COLOURS.get(name.split(" (")[0]))
        axis.set_xlabel(label)
        axis.set_ylabel("forward + backward, ms")
        axis.set_yscale("log")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"minidl.bench {suite}: float32, {rows[0]['threads']} thread(s)"
                    + ("" if any(row["device"] == "gpu" for row in rows) else "; GPU not measured (none present)"))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


MAIN_COLUMNS = ["case", "minidl_ms", "torch_ms", "ratio", "gflops", "gemm_fraction", "target", "met"]
CONV_COLUMNS = ["case", "algorithm", "device", "minidl_ms", "torch_ms", "ratio", "gflops", "multiplies_fwd_bwd",
                "extra_elements", "auto_choice", "fastest"]
SWEEP_COLUMNS = ["case", "batch", "device", "minidl_ms", "torch_ms", "ratio", "floor_ms", "over_floor", "target", "met"]
LAYERS_COLUMNS = ["case", "device", "minidl_ms", "torch_ms", "ratio", "gflops", "gemm_fraction", "cpu_over_gpu"]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m minidl.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", nargs="?", default="main", choices=sorted(SUITES))
    parser.add_argument("--json", help="write the rows as a JSON list of objects to this path")
    parser.add_argument("--plot", help="write a PNG plot (conv and layers suites) to this path")
    parser.add_argument("--threads", type=int, default=1, help="threads for NumPy's BLAS and for PyTorch (default 1)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case; the minimum is reported")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test of the benchmark itself)")
    parser.add_argument("--clock", choices=sorted(CLOCK), default=None,
                        help="'wall' time, or this process's 'cpu' time (default: cpu for 1 thread, else wall)")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    parser.add_argument("--worker", choices=["minidl", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.clock = args.clock or ("cpu" if args.threads == 1 else "wall")

    if args.worker:                               # inside a worker process: time and answer in JSON
        if args.worker == "torch":
            answer = torch_worker(args.suite, args.quick, args.repeats, args.threads, args.clock, args.device)
        else:
            answer = minidl_worker(args.suite, args.quick, args.repeats, args.clock)
        print(json.dumps(answer))
        return 0

    rows, meta = measure(args.suite, args)
    print(f"minidl.bench {args.suite}: float32, {args.threads} thread(s), {args.clock} time, minimum of {args.repeats} runs; "
          f"NumPy GEMM {meta['gemm_gflops']:.1f} GFLOP/s"
          + (f", PyTorch {meta['torch_version']} GEMM {meta['torch_gemm_gflops']:.1f} GFLOP/s" if meta["torch_version"]
             else ", no PyTorch comparison (not installed or --no-torch)")
          + ("" if args.suite == "main" else ("; no GPU: CuPy not measured" if not meta["gpu"] else
              f"; GPU {meta['gpu_name'] or ''} (wall time): CuPy GEMM {meta['cupy_gemm_gflops']:.0f} GFLOP/s"
              + (f", PyTorch CUDA GEMM {meta['torch_cuda_gemm_gflops']:.0f} GFLOP/s; 'gpu' rows' torch_ms is PyTorch on"
                 " the GPU" if meta["torch_cuda_gemm_gflops"] else ""))))
    if os.environ.get("OPENBLAS_CORETYPE"):
        # a forced OpenBLAS kernel (set on some machines for old OpenBLAS bugs) can halve NumPy's GEMM rate
        print(f"note: OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} forces that OpenBLAS kernel; "
              "unset it (and OPENBLAS_L2_SIZE) for this command to measure NumPy's own choice")
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
        machine.update(numpy_version=numpy.__version__, threads=args.threads, clock=args.clock, repeats=args.repeats)
        summary = dict(summary or {}, machine=machine)
        output = rows + [{"case": "summary", "kind": "summary", **summary}]
        with open(args.json, "w") as file:
            json.dump(output, file, indent=1)
    if args.plot and args.suite != "main":
        plot(rows, args.suite, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
