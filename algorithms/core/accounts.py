"""The per-rank memory formulas of ``algorithms/memory.py`` (whose header writes them out), one per method.

    rows = accounts.predicted_rows("lenet5", p=4, batch=64, micro_batches=8, k=1, recompute=False)
    # [(method, {"params": bytes, "grads": ..., "optimizer": ..., "activations": ..., "comm": ...}
    #   or the reason the method does not apply), ...]

The activations come from ``footprint`` (what minidl's kernels keep per example) and, for the
spatial split, from ``tiling`` (what each rank's tiles keep).
"""
import dataclasses
import math

from algorithms.core import footprint
from algorithms.core.cli import SettingError
from algorithms.core.objective import build_model
from algorithms.core.tiling import Tiling
from minidl.data import shard_sizes

PARTS = ("params", "grads", "optimizer", "activations", "comm")
EXAMPLE = {"mlp": (1, 8, 8), "cnn": (1, 8, 8), "lenet5": (1, 28, 28)}      # one example's shape per model


def dataset_of(model):
    return "mnist" if model == "lenet5" else "digits"


def share(n, p):
    return math.ceil(n / p)


def scaled(layer, fraction):
    """``layer``'s per-example activation bytes times ``fraction`` (a rank's share of them)."""
    return dataclasses.replace(layer, **{part: math.ceil(getattr(layer, part) * fraction)
                                         for part in ("fresh", "columns", "scratch", "out")})


def row(params, grads, optimizer, activations, comm):
    return dict(zip(PARTS, (params, grads, optimizer, activations, comm)))


def data_parallel(layers, p, batch, b, k, recompute):
    n = footprint.parameters(layers)
    comm = share(n, p) * b if p > 1 else 0
    return row(n * b, n * b, k * n * b, footprint.activations(layers, batch, recompute), comm)


def zero(stage, layers, p, batch, b, k, recompute):
    """ZeRO stage 1, 2 or 3 (the formulas of the header)."""
    n = footprint.parameters(layers)
    largest = max(layer.params for layer in layers)
    comm = {1: share(n, p) * b, 2: n * b, 3: 2 * largest * b}[stage] if p > 1 else 0
    return row((share(n, p) if stage >= 3 else n) * b, (share(n, p) if stage >= 2 else n) * b, k * share(n, p) * b,
               footprint.activations(layers, batch, recompute), comm)


def tensor(layers, p, batch, b, k, recompute):
    """Megatron's split of the Linear layers in (column, row) pairs; the rest replicated."""
    linear = [index for index, layer in enumerate(layers) if layer.name == "Linear"]
    pairs = [(linear[i], linear[i + 1]) for i in range(0, len(linear) - 1, 2)]
    split = {index for pair in pairs for index in pair}
    params = sum(share(layer.params, p) if index in split else layer.params for index, layer in enumerate(layers))
    # the column layer's output and the ReLU behind it are split p ways; the row layer's output is whole
    column = {first + offset for first, _ in pairs for offset in (0, 1)}
    activations = footprint.activations([scaled(layer, 1 / p) if index in column else layer
                                         for index, layer in enumerate(layers)], batch, recompute)
    width = max((layers[second].out for _, second in pairs), default=0)
    return row(params * b, params * b, k * params * b, activations, batch * width if p > 1 else 0)


def stage_layers(layers, p):
    """Stage 0's layers and the layer after them (``pipeline_parallel``'s cut: L/p each, the first stages one more)."""
    return layers[:int(shard_sizes(len(layers), p)[0])]


def pipeline(layers, p, batch, b, k, recompute, micro_batches, kind):
    """GPipe or 1F1B, stage 0 (the most micro-batches in flight); its comm buffers: every micro-batch's
    output, which ``pipeline_gradient``'s Isend holds until the step's Waitall, and one gradient received."""
    stage = stage_layers(layers, p)
    rows = share(batch, micro_batches)
    in_flight = micro_batches if kind == "gpipe" else min(p, micro_batches)
    n = footprint.parameters(stage)
    last = len(stage) == len(layers)
    activations = footprint.activations(stage, rows, recompute, copies=in_flight, loss=last)
    comm = 0 if p == 1 else (micro_batches + 1) * rows * stage[-1].out
    return row(n * b, n * b, k * n * b, activations, comm)


def spatial(net, layers, example, p, batch, b, k):
    """Spatial tiles of the conv stages (the rank with the most), the head whole on the gathered map."""
    tiling = Tiling.of(net, example[1], example[2], p)       # SettingError where it cannot tile
    convs = len(layers) - len(tiling.head)                   # the conv stages' layers come first
    n, n_conv = footprint.parameters(layers), tiling.conv_parameters()
    activations = max(tiling.activation_bytes(rank, batch, b) for rank in range(p))
    activations += footprint.activations(layers[convs:], batch)
    comm = batch * layers[convs - 1].out + (share(n_conv, p) * b if p > 1 else 0)
    return row(n * b, n * b, k * n * b, activations, comm)


def predicted_rows(model, p, batch, micro_batches, k, recompute):
    """[(method, row or the reason it does not apply)] for every method, predicted."""
    example = EXAMPLE[model]
    net = build_model(model, 0, dataset_of(model))
    layers = footprint.of(net, example)
    b = next(iter(net.parameters())).dtype.itemsize
    rows = [("data parallel", data_parallel(layers, p, batch, b, k, recompute))]
    rows += [(f"ZeRO-{stage}", zero(stage, layers, p, batch, b, k, recompute)) for stage in (1, 2, 3)]
    rows.append(("tensor", tensor(layers, p, batch, b, k, recompute)))
    for kind, name in (("gpipe", "pipeline GPipe"), ("1f1b", "pipeline 1F1B")):
        rows.append((name, pipeline(layers, p, batch, b, k, recompute, micro_batches, kind)
                     if p <= len(layers) else f"{p} stages for {len(layers)} layers"))
    try:
        rows.append(("spatial", "spatial_parallel has no --recompute" if recompute else
                     spatial(net, layers, example, p, batch, b, k)))
    except SettingError as error:
        rows.append(("spatial", str(error)))
    if p % 2 == 0 and p > 2:                                  # 2 pipeline stages x p/2 data replicas
        hybrid = pipeline(layers, 2, batch, b, k, recompute, micro_batches, "1f1b")
        hybrid["comm"] += share(hybrid["params"] // b, p // 2) * b
        rows.append(("hybrid 2 x p/2", hybrid))
    else:
        rows.append(("hybrid 2 x p/2", f"{p} ranks do not form a grid of 2 pipeline stages"))
    return rows
