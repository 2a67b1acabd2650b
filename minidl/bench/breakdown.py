"""Where the time goes: each layer's stages (copies, GEMMs, transposes) timed one by one (main suite).

``conv_stages`` also gives the sweep suite its floor: the sum of the stages named in
``cases.FLOOR_STAGES``.
"""
import numpy

from minidl import backend, functional, pool
from minidl.bench.cases import main_cases
from minidl.bench.table import print_table
from minidl.bench.timing import best_ms
from minidl.conv import batch_inner, im2col, im2col_blocked as blocked

BREAKDOWN_LAYERS = ("conv2d large fwd+bwd", "lenet conv1 fwd+bwd", "lenet conv2 fwd+bwd", "lenet pool1 fwd+bwd",
                    "lenet fc1 fwd+bwd")


def conv_stages(shape, rng, xp):
    """[(pass, stage, fn, flops, scale)]: the steps of the im2col layer (minidl.conv.im2col_blocked), one by one.

    Each stage calls the kernel's own functions (``im2col.zero_pad``, ``im2col.im2col``,
    ``im2col.gradient_2d``, ``im2col.weight_gradient``, ``im2col.col2im``,
    ``im2col_blocked.flipped_weight``, ``im2col_blocked.add_shifted_runs``; a GEMM is the one
    ``xp.matmul`` the kernel runs) on arrays of the layer's shapes, and the input gradient's stages
    follow ``im2col_blocked.input_gradient_path``, the same choice the layer's backward makes, so
    the stages add up to about the layer's time (not exactly: caches are warmer when a stage runs
    alone). Where the layer cuts its batch into blocks of images (``im2col_blocked.image_blocks``),
    a per-block stage runs on one block and counts ``scale`` = N / images per block times; for
    stride 1 the output gradient's columns serve both gradients (a transposing copy of x instead of
    its columns), otherwise the layer rebuilds each block's columns ("im2col copy (rebuilt)"), unless
    it keeps them (``im2col_blocked.kept_layout``); kept batch innermost, the stages are those of
    ``minidl.conv.batch_inner`` for one block.
    """
    n, c, f, side, k, stride, padding = shape
    blocks = blocked.image_blocks((n, c, side, side), (f, c, k, k), stride, padding, 4)
    nb = blocks[0][1] - blocks[0][0]
    scale = n / nb
    x = xp.asarray(rng.standard_normal((nb, c, side, side)), dtype=xp.float32)
    weight = xp.asarray(rng.standard_normal((f, c, k, k)), dtype=xp.float32)
    out_side = (side + 2 * padding - k) // stride + 1
    grad = xp.asarray(rng.standard_normal((nb, f, out_side, out_side)), dtype=xp.float32)
    stages = []
    out = xp.zeros((n, f, out_side, out_side), dtype=xp.float32)
    bias = xp.zeros(f, dtype=xp.float32)
    whole_grad = xp.asarray(rng.standard_normal((n, f, out_side, out_side)), dtype=xp.float32)
    stages.append(("forward", "bias add", lambda: functional.add_bias(out, bias), None, 1))
    stages.append(("weight gradient", "bias sum", lambda: functional.bias_gradient(whole_grad), None, 1))
    kept = blocked.kept_layout((n, c, side, side), weight.shape, stride, padding, 4, len(blocks))
    if kept == "batch inner":
        return _batch_inner_stages(x, weight, grad, stride, padding, scale, xp) + stages
    stages = _conv_forward_stages("forward", x, weight, stride, padding, xp, scale) + stages
    if kept == "im2col order":    # the layer's copy into its kept columns (im2col_blocked.columns_in_two_passes)
        kept_cols, x_pad = xp.empty((c, k, k, nb, out_side, out_side), dtype=xp.float32), im2col.zero_pad(x, padding)
        stages = [(p, s, fn, fl, sc) if s != "im2col copy" else (p, s, lambda: blocked.columns_in_two_passes(
            x_pad, k, k, stride, kept_cols), fl, sc) for p, s, fn, fl, sc in stages]
    path = blocked.input_gradient_path(weight.shape, stride, padding, len(blocks))
    if path == "output columns":
        # blocks, stride 1: the output gradient's columns (built for grad_x below) serve the weight
        # gradient too (im2col_blocked.gradients_from_output_columns): x's block transposed to
        # (C, nb H W) and one GEMM (F kh kw, nb H W) @ (nb H W, C)
        gcols, _ = im2col.columns(grad, k, k, 1, k - 1 - padding, side, side)
        x_cnhw = x.transpose(1, 0, 2, 3)
        x_2d = xp.ascontiguousarray(x_cnhw)                   # filled: the GEMM below must not read garbage
        if nb > 1:            # one image per block: x's (C, H W) is the layout already
            stages.append(("weight gradient", "x transpose", lambda: x_2d.__setitem__(Ellipsis, x_cnhw), None, scale))
        stages.append(("weight gradient", "GEMM", lambda: xp.matmul(gcols, x_2d.reshape(c, -1).T),
                       2 * c * gcols.size, scale))
        stages.append(("input gradient", "flip weight", lambda: blocked.flipped_weight(weight), None, 1))
        stages += _conv_forward_stages("input gradient", grad, blocked.flipped_weight(weight), 1, k - 1 - padding,
                                       xp, scale)
        return stages
    # weight gradient: the output gradient transposed to (F, N HoWo), then one GEMM with the columns
    cols, _ = im2col.columns(x, k, k, stride, padding, out_side, out_side)
    if len(blocks) > 1 and not kept:
        x_pad = im2col.zero_pad(x, padding)
        stages.append(("weight gradient", "im2col copy (rebuilt)",
                       lambda: im2col.im2col(x_pad, k, k, stride, out_side, out_side), None, scale))
    grad_2d = im2col.gradient_2d(grad)
    stages.append(("weight gradient", "grad transpose", lambda: im2col.gradient_2d(grad), None, scale))
    stages.append(("weight gradient", "GEMM", lambda: im2col.weight_gradient(cols, grad_2d, weight.shape),
                   2 * f * cols.size, scale))
    # input gradient: a "full" convolution of grad (stride 1, F <= C), or GEMM + col2im
    if path == "convolution":
        stages.append(("input gradient", "flip weight", lambda: blocked.flipped_weight(weight), None, 1))
        stages += _conv_forward_stages("input gradient", grad, blocked.flipped_weight(weight), 1, k - 1 - padding,
                                       xp, scale)
    elif path == "planes":        # GEMM + col2im on whole padded planes (im2col_blocked.col2im_planes)
        width = side + 2 * padding
        weight_rows = xp.ascontiguousarray(weight.transpose(2, 3, 1, 0)).reshape(k * k * c, f)
        grad_planes = xp.zeros((f, nb * width * width), dtype=xp.float32)
        grad_cols = xp.empty((k * k * c, nb * width * width), dtype=xp.float32)
        stages.append(("input gradient", "GEMM", lambda: xp.matmul(weight_rows, grad_planes, out=grad_cols),
                       2 * f * c * k * k * nb * out_side * out_side, scale))    # the useful flops only
        runs = grad_cols.reshape(k, k, c * nb * width * width)
        stages.append(("input gradient", "col2im", lambda: blocked.add_shifted_runs(runs, (c, nb, width, width)),
                       None, scale))
    else:
        weight_t = weight.reshape(f, -1).T
        grad_cols = xp.empty((c * k * k, nb * out_side * out_side), dtype=xp.float32)
        stages.append(("input gradient", "GEMM", lambda: xp.matmul(weight_t, grad_2d, out=grad_cols),
                       2 * f * grad_cols.size, scale))
        cols_view = grad_cols.reshape(c, k, k, nb, out_side, out_side).transpose(3, 0, 1, 2, 4, 5)
        padded = (nb, c, side + 2 * padding, side + 2 * padding)
        stages.append(("input gradient", "col2im", lambda: im2col.col2im(cols_view, padded, stride), None, scale))
    return stages


def _batch_inner_stages(x, weight, grad, stride, padding, scale, xp):
    """The stages of one block of the kept-columns, batch-inner path (minidl.conv.batch_inner)."""
    n, c, side = x.shape[:3]
    f, k = weight.shape[0], weight.shape[2]
    out_side = (side + 2 * padding - k) // stride + 1
    x_t = batch_inner.batch_last(x, padding).copy()
    cols = xp.empty((c * k * k, out_side * out_side * n), dtype=x.dtype)
    batch_inner.columns(x_t, k, k, stride, out_side, out_side, cols)
    weight_2d = weight.reshape(f, -1)
    out_t, out = weight_2d @ cols, xp.empty((n, f, out_side, out_side), dtype=x.dtype)
    grad_t = xp.ascontiguousarray(grad.transpose(1, 2, 3, 0)).reshape(f, -1)
    grad_cols = weight_2d.T @ grad_t
    grad_x = xp.empty_like(x)
    grad_x_t = batch_inner.col2im(grad_cols, x_t.shape, k, k, stride, out_side, out_side).copy()
    flops = 2 * f * cols.size
    return [("forward", "batch-last copy", lambda: batch_inner.batch_last(x, padding), None, scale),
            ("forward", "im2col copy", lambda: batch_inner.columns(x_t, k, k, stride, out_side, out_side, cols), None,
             scale),
            ("forward", "GEMM", lambda: xp.matmul(weight_2d, cols, out=out_t), flops, scale),
            ("forward", "output transpose", lambda: out.__setitem__(
                Ellipsis, out_t.reshape(f, out_side, out_side, n).transpose(3, 0, 1, 2)), None, scale),
            ("weight gradient", "grad transpose", lambda: xp.ascontiguousarray(grad.transpose(1, 2, 3, 0)), None,
             scale),
            ("weight gradient", "GEMM", lambda: xp.matmul(cols, grad_t.T), flops, scale),
            ("input gradient", "GEMM", lambda: xp.matmul(weight_2d.T, grad_t, out=grad_cols), flops, scale),
            ("input gradient", "col2im",
             lambda: batch_inner.col2im(grad_cols, x_t.shape, k, k, stride, out_side, out_side), None, scale),
            ("input gradient", "grad_x transpose", lambda: grad_x.__setitem__(
                Ellipsis, grad_x_t[:, padding:padding + side, padding:padding + side, :].transpose(3, 0, 1, 2)),
             None, scale)]


def _conv_forward_stages(label, x, weight, stride, padding, xp, scale=1):
    """The forward pass of one block (im2col.forward_block): zero-pad, im2col, one GEMM, the output transposed."""
    n, side = x.shape[0], x.shape[2]
    f, k = weight.shape[0], weight.shape[2]
    out_side = (side + 2 * padding - k) // stride + 1
    stages = []
    if padding:
        stages.append((label, "zero-pad copy", lambda: im2col.zero_pad(x, padding), None, scale))
    x_pad = im2col.zero_pad(x, padding)
    stages.append((label, "im2col copy", lambda: im2col.im2col(x_pad, k, k, stride, out_side, out_side), None, scale))
    cols, _ = im2col.columns(x, k, k, stride, padding, out_side, out_side)
    weight_2d = weight.reshape(f, -1)
    out_2d = xp.empty((f, cols.shape[1]), dtype=x.dtype)
    out = xp.empty((n, f, out_side, out_side), dtype=x.dtype)
    stages.append((label, "GEMM", lambda: xp.matmul(weight_2d, cols, out=out_2d), 2 * f * cols.size, scale))
    if n > 1:                 # one image per block: the GEMM writes the output in place
        stages.append((label, "output transpose",
                       lambda: out.__setitem__(Ellipsis,
                                               out_2d.reshape(f, n, out_side, out_side).transpose(1, 0, 2, 3)),
                       None, scale))
    return stages


def pool_stages(shape, rng, xp):
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
    xp, rng = backend.xp(), numpy.random.default_rng(1)
    rows = []
    for case in main_cases(quick):
        if case["case"] not in BREAKDOWN_LAYERS:
            continue
        stages_of = {"conv": conv_stages, "pool": pool_stages, "linear": linear_stages}[case["kind"]]
        stages = stages_of(case["shape"], rng, xp)
        for pass_, stage, fn, flops, scale in stages:
            ms = best_ms(fn, repeats, clock=clock) * scale
            row = {"layer": case["case"].replace(" fwd+bwd", ""), "pass": pass_, "stage": stage, "ms": round(ms, 4)}
            if flops:
                row["gflops"] = round(flops * scale / ms / 1e6, 1)
                row["gemm_fraction"] = round(row["gflops"] / gemm, 3)
            rows.append(row)
    return rows


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
        item = {"layer": name, "measured_ms": layer["minidl_ms"],
                "sum_of_stages_ms": round(sum(s["ms"] for s in mine), 3),
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
