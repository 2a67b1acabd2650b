"""The per-rank memory formulas of ``algorithms/memory/__init__.py`` (whose header writes them out), one per method.

    rows = accounts.predicted_rows("lenet5", p=4, batch=64, micro_batches=8, k=1, recompute=False)
    # [(method, {"params": bytes, "grads": ..., "optimizer": ..., "activations": ..., "extra": ...}
    #   or the reason the method does not apply), ...]

The activations come from ``footprint`` (what minidl's kernels keep per example) and, for the
spatial split, from ``tiling`` (what each rank's tiles keep).
"""
import dataclasses
import math

from algorithms.core.cli import SettingError
from algorithms.core.objective import build_model
from algorithms.memory import footprint
from algorithms.shards.tiling import Tiling
from collectives import block_counts
from minidl.data import shard_sizes
from minidl.nn import LocallyConnected2d

PARTS = ("params", "grads", "optimizer", "activations", "extra")
ARRAYS = {"sgd": 1, "adam": 5}    # vectors of the updated size minidl's update makes and drops (measured)
EXAMPLE = {"mlp": (1, 8, 8), "cnn": (1, 8, 8), "lenet5": (1, 28, 28), "wide-mlp": (1, 8, 8)}   # one example per model


def dataset_of(model):
    return "mnist" if model == "lenet5" else "digits"


def share(n, p):
    return math.ceil(n / p)


def scaled(layer, fraction):
    """``layer``'s per-example activation bytes times ``fraction`` (a rank's share of them)."""
    return dataclasses.replace(layer, **{part: math.ceil(getattr(layer, part) * fraction)
                                         for part in ("fresh", "columns", "scratch", "out")})


def row(params, grads, optimizer, activations, extra):
    return dict(zip(PARTS, (params, grads, optimizer, activations, extra)))


def data_parallel(layers, p, batch, b, k, recompute, arrays=1):
    """Allreduce SGD: every rank the whole model states; extra: the ring's receive block and the
    ``arrays`` vectors of the model's size that minidl's update makes and drops (momentum SGD 1, Adam 5)."""
    n = footprint.parameters(layers)
    extra = (share(n, p) if p > 1 else 0) + arrays * n
    return row(n * b, n * b, k * n * b, footprint.activations(layers, batch, recompute), extra * b)


def unit_sizes(layers, recompute):
    """The parameters of ZeRO's units, in order (``shards.units.units_of``): each layer with parameters and
    the layers without after it; with ``recompute`` each checkpointed segment with parameters."""
    groups = [layers[start:stop] for start, stop in footprint.segments_of(len(layers))] if recompute else \
        [[layer] for layer in layers]
    sizes = []
    for group in groups:
        params = footprint.parameters(group)
        if params and sizes and sizes[-1]:
            sizes.append(params)
        elif sizes:
            sizes[-1] += params
        else:
            sizes.append(params)
    return sizes


def zero(stage, layers, p, batch, b, k, recompute, arrays=1):
    """ZeRO stage 1, 2 or 3 unit by unit (the formulas of the header), rank 0 (the largest blocks): the
    paper's model states, where a unit's whole weights (stage 3) and its whole gradient (stages 2, 3)
    exist from its gather or backward to its release (every layer, convolutions too, reads its weights
    again in its backward and keeps none in between); extra: the ring's receive block, one cached per
    block size, and the update's ``arrays`` vectors of the largest block."""
    sizes = unit_sizes(layers, recompute)
    blocks = [share(size, p) for size in sizes]
    n, mine = sum(sizes), sum(blocks)
    params = n if stage < 3 else mine + max(sizes)
    # stage 1: every unit's gradient until the update; 2, 3: one whole beside the blocks reduced before it
    grads = n if stage == 1 else max(size + sum(blocks[u + 1:]) for u, size in enumerate(sizes))
    extra = (sum(set(blocks)) if p > 1 else 0) + arrays * max(blocks)
    return row(params * b, grads * b, k * mine * b, footprint.activations(layers, batch, recompute), extra * b)


def local_region(tiling, rank, classes):
    """(parameters, activations per example) of rank ``rank``'s region of a locally connected network
    (``spatial_parallel --layer local``): its rows of every stage's weights and of the head's first
    Linear (the bias on rank 0); per stage its padded window, its columns (C k k values per output
    position, kept for the backward), output, ReLU and pooling (k k + 1 outputs), and the head's
    partial logits, g's sum of them and the loss's."""
    params, kept = classes if rank == 0 else 0, 0
    for stage in tiling.stages:
        layer, (lo, hi), (top, bottom) = stage.conv, stage.conv_rows(rank), stage.padding(rank)
        params += (layer.weight.size + layer.bias.size) // layer.weight.shape[0] * (hi - lo)
        width, (need_lo, need_hi) = layer.weight.shape[1], stage.needed[rank]
        out = layer.out_channels * (hi - lo) * width
        kept += layer.in_channels * (need_hi - need_lo + top + bottom) * (stage.width + 2 * layer.padding)
        kept += out * layer.in_channels * layer.kernel_size ** 2 // layer.out_channels + out * (2 if stage.relu else 1)
        kept += out // stage.pool ** 2 * (stage.pool ** 2 + 1) if stage.pool > 1 else 0
    (lo, hi), (channels, _, width) = tiling.final[0][rank], tiling.final[1]
    params += channels * (hi - lo) * width * classes
    return params, kept + 3 * classes + (footprint.LOSS_EXTRA // 4)


def spatial_local(p, batch, b, k):
    """The small CNN's locally connected twin split over p ranks, the rank with the most (``local_region``);
    extra: the ring's receive block of the (B, classes) logits' sum."""
    net = build_model("local-cnn", 0, "digits")
    tiling = Tiling.of(net, 8, 8, p, layer=LocallyConnected2d)
    params, kept = max(local_region(tiling, rank, 10) for rank in range(p))
    return row(params * b, params * b, k * params * b, batch * kept * b, share(batch * 10, p) * b if p > 1 else 0)


def sent(method, layers, p, b, recompute):
    """Bytes rank 0 sends in one step of data parallelism or ZeRO: a ring reduce-scatter sends every
    block but its own, an allgather every block but the next rank's (None for the other methods)."""
    if method == "data parallel":
        sizes = [footprint.parameters(layers)]
    elif method.startswith("ZeRO"):
        sizes = unit_sizes(layers, recompute)
    else:
        return None
    halves = {"data parallel": (1, 1), "ZeRO-1": (1, 1), "ZeRO-2": (1, 1), "ZeRO-3": (1, 2)}[method]
    total = 0
    for size in sizes:
        counts = block_counts(size, p)
        total += halves[0] * (size - counts[0]) + halves[1] * (size - counts[1 % p])
    return total * b


def tensor(layers, p, batch, b, k, recompute=False):
    """Megatron's split of the Linear layers in (column, row) pairs; the rest replicated. ``recompute``:
    each pair's column output and ReLU are not kept, and the backward records one pair's segment
    again (the largest: its column output, ReLU and row product Z_r)."""
    linear = [index for index, layer in enumerate(layers) if layer.name == "Linear"]
    pairs = [(linear[i], linear[i + 1]) for i in range(0, len(linear) - 1, 2)]
    columns, rows = {first for first, _ in pairs}, {second for _, second in pairs}
    # a column layer's weights and bias are split; a row layer's weights, its bias (o values) is whole
    params = sum(share(layer.params, p) if index in columns else
                 share(layer.params - layer.out // b, p) + layer.out // b if index in rows else layer.params
                 for index, layer in enumerate(layers))
    # the column layer's output and the ReLU behind it are split p ways; the row layer keeps three
    # whole (N, o) arrays: its partial product, g's sum of them, and the sum plus the bias
    column = {first + offset for first, _ in pairs for offset in (0, 1)}
    split = [scaled(layer, 1 / p) if index in column else scaled(layer, 3) if index in rows else layer
             for index, layer in enumerate(layers)]
    activations = footprint.activations(split, batch)
    if recompute:
        inside = [split[first].fresh + split[first + 1].fresh for first, _ in pairs]
        activations += batch * (max((a + layers[second].out for a, (_, second) in zip(inside, pairs)), default=0)
                                - sum(inside))
    # comm: the ring's receive block of g's allreduce (N o), and of f's (N i) where the block's input
    # needs a gradient (a layer with parameters before it)
    blocks = {share(batch * layers[second].out // b, p) for _, second in pairs}
    blocks |= {share(batch * layers[first - 1].out // b, p) for first, _ in pairs
               if footprint.parameters(layers[:first])}
    # extra: the ring's blocks, and the serial model's flat weights and gradient the module keeps
    n = footprint.parameters(layers)
    return row(params * b, params * b, k * params * b, activations, (sum(blocks) if p > 1 else 0) * b + 2 * n * b)


def stage_layers(layers, p):
    """Stage 0's layers and the layer after them (``pipeline_parallel``'s cut: L/p each, the first stages one more)."""
    return layers[:int(shard_sizes(len(layers), p)[0])]


def pipeline(layers, p, batch, b, k, recompute, micro_batches, kind):
    """GPipe or 1F1B, stage 0 (the most micro-batches in flight); its comm buffers: every micro-batch's
    output, which ``pipeline_gradient``'s Isend holds until the step's Waitall, and one gradient received.
    With ``recompute`` the stage is one segment: each micro-batch in flight keeps its output (its
    input is the data, or the previous stage's message), and a backward first runs one micro-batch's
    stage again, while its own output is held only by its send."""
    stage = stage_layers(layers, p)
    rows = share(batch, micro_batches)
    in_flight = micro_batches if kind == "gpipe" else min(p, micro_batches)
    n = footprint.parameters(stage)
    last = len(stage) == len(layers)
    if recompute:
        held, free = [sum(parts) for parts in zip(*(layer.held_and_free(rows) for layer in stage))]
        kept = rows * (stage[-1].out + (layers[-1].out + footprint.LOSS_EXTRA if last else 0))    # and the loss's
        activations = free + (in_flight * kept + held if last else max(in_flight * kept, (in_flight - 1) * kept + held))
    else:
        activations = footprint.activations(stage, rows, copies=in_flight, loss=last)
    comm = 0 if p == 1 else (micro_batches + 1) * rows * stage[-1].out
    # and the rest of the whole model's weights, gradient and momentum, which every rank keeps
    serial = (2 + k) * (footprint.parameters(layers) - n) * b
    return row(n * b, n * b, k * n * b, activations, comm + serial)


def spatial(net, layers, example, p, batch, b, k, recompute=False):
    """Spatial tiles of the conv stages (the rank with the most), the head whole on the gathered map;
    ``recompute``: the tiles' outputs and one stage recorded again (``Tiling.activation_bytes``)."""
    tiling = Tiling.of(net, example[1], example[2], p)       # SettingError where it cannot tile
    convs = len(layers) - len(tiling.head)                   # the conv stages' layers come first
    n, n_conv = footprint.parameters(layers), tiling.conv_parameters()
    activations = max(tiling.activation_bytes(rank, batch, b, recompute) for rank in range(p))
    activations += footprint.activations(layers[convs:], batch)
    comm = batch * layers[convs - 1].out + (share(n_conv, p) * b if p > 1 else 0)
    return row(n * b, n * b, k * n * b, activations, comm)


def sent_bytes(method, model, p, recompute):
    """``sent`` for ``model``: bytes rank 0 sends per step of data parallelism or ZeRO (None otherwise)."""
    net = build_model(model, 0, dataset_of(model))
    return sent(method, footprint.of(net, EXAMPLE[model]), p, next(iter(net.parameters())).dtype.itemsize, recompute)


def predicted_rows(model, p, batch, micro_batches, k, recompute, optimizer="sgd"):
    """[(method, row or the reason it does not apply)] for every method, predicted; with ``optimizer``
    "adam" (k = 2) data parallelism and ZeRO only (the other modules train with momentum SGD)."""
    example = EXAMPLE[model]
    net = build_model(model, 0, dataset_of(model))
    layers = footprint.of(net, example)
    b = next(iter(net.parameters())).dtype.itemsize
    arrays = ARRAYS[optimizer]
    rows = [("data parallel", data_parallel(layers, p, batch, b, k, recompute, arrays))]
    rows += [(f"ZeRO-{stage}", zero(stage, layers, p, batch, b, k, recompute, arrays)) for stage in (1, 2, 3)]
    if optimizer != "sgd":
        return rows
    rows.append(("tensor", tensor(layers, p, batch, b, k, recompute)))
    for kind, name in (("gpipe", "pipeline GPipe"), ("1f1b", "pipeline 1F1B")):
        rows.append((name, pipeline(layers, p, batch, b, k, recompute, micro_batches, kind)
                     if p <= len(layers) else f"{p} stages for {len(layers)} layers"))
    try:
        rows.append(("spatial", spatial(net, layers, example, p, batch, b, k, recompute)))
    except SettingError as error:
        rows.append(("spatial", str(error)))
    if model != "cnn":
        rows.append(("spatial local", "the locally connected split runs the small CNN's twin (--model cnn)"))
    elif not recompute:
        try:
            rows.append(("spatial local", spatial_local(p, batch, b, k)))
        except SettingError as error:
            rows.append(("spatial local", str(error)))
    if p % 2 == 0:                                           # 2 pipeline stages x p/2 data replicas
        hybrid = pipeline(layers, 2, batch, b, k, recompute, micro_batches, "1f1b")
        hybrid["extra"] += share(hybrid["params"] // b, p // 2) * b if p > 2 else 0    # the column's ring block
        rows.append(("hybrid 2 x p/2", hybrid))
    else:
        rows.append(("hybrid 2 x p/2", f"{p} ranks do not form a grid of 2 pipeline stages"))
    return rows
