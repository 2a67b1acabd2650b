"""What each layer of a network holds in memory: parameters, and per example what its forward keeps.

    layers = footprint.of(net, (1, 28, 28))      # one LayerBytes per layer of a Sequential, in order
    activations(layers, rows)                    # bytes the forward keeps for the backward, for ``rows`` examples
    activations(layers, rows, recompute=True)    # the same with --recompute (minidl.recompute)

The per-example bytes follow minidl's own kernels (float32 unless the model says otherwise):

    Linear      its output (N, out) (its input is the previous layer's output, already counted)
    ReLU        its output
    Conv2d      its output, and arrays of the workspace pool (minidl.conv.scratch): the columns
                (C k k, N Ho Wo), which the backward reads, so each batch in flight holds its own;
                the GEMM's (F, N Ho Wo) result and the zero-padded input (C, H + 2p, W + 2p) when
                p > 0, free again after the forward (the pool keeps them for the next one)
    MaxPool2d   its output and the copy of the k k window offsets (k k outputs) the backward compares
    Flatten     nothing (a view)
    the loss    the shifted logits (classes), the log-sum (one value) and two int64 vectors (the
                labels and the row indices its backward reads): LOSS_EXTRA bytes a row beyond the logits

With recomputation in S segments (``checkpointed``), the forward keeps each segment's output and the
conv scratch (the pool keeps it whatever runs), and the backward, one segment at a time, the
activations of one segment: the largest segment's is the peak.
"""
import dataclasses
import math

import numpy

from minidl.conv import budget, im2col_blocked
from minidl.conv.im2col_blocked import image_blocks
from minidl.nn import Conv2d, Linear, MaxPool2d, ReLU
from minidl.tensor import Tensor, no_grad

LOSS_EXTRA = 4 + 8 + 8        # bytes per row the loss keeps beside its logits: float32 log-sum, labels, row indices


@dataclasses.dataclass
class LayerBytes:
    name: str
    params: int               # parameter count
    fresh: int                # bytes per example of arrays the forward allocates and keeps
    columns: int              # bytes per example of the conv's columns: pooled, held until the backward
    scratch: int              # bytes per example of pooled arrays free again after the forward (conv)
    out: int                  # bytes per example of the layer's output
    block: int = 0            # conv: images per block of minidl's blocked im2col (0: not a conv)
    keep: int = 0             # conv: the most examples whose columns the layer keeps (its column budget)

    def held_and_free(self, rows):
        """(bytes kept until the backward, bytes of pooled scratch free after the forward) for ``rows``
        examples. A conv whose columns fit its column budget keeps them (built a block at a time:
        one block's scratch pooled, and the last, shorter block's); otherwise one whose columns fit
        one block keeps them; a larger batch runs in blocks, keeps only its input (counted already)
        and pools one block's columns and scratch, and the last block's as well (their shapes
        differ; minidl.conv.im2col_blocked)."""
        if not self.block or rows <= self.block:
            return rows * (self.fresh + self.columns), rows * self.scratch
        if rows <= self.keep:
            return rows * (self.fresh + self.columns), (self.block + rows % self.block) * self.scratch
        return rows * self.fresh, (self.block + rows % self.block) * (self.columns + self.scratch)


def of(net, example_shape):
    """One LayerBytes per layer of the Sequential ``net`` for inputs of ``example_shape`` (no batch axis)."""
    dtype = next(iter(net.parameters())).dtype
    x, layers = numpy.zeros((1,) + tuple(example_shape), dtype=dtype), []
    with no_grad():
        for layer in net:
            y = layer(Tensor(x)).data
            fresh, columns, scratch, block, keep = 0, 0, 0, 0, 0
            if isinstance(layer, (Linear, ReLU)):
                fresh = y.nbytes
            elif isinstance(layer, Conv2d):
                k, p, (c, h, w) = layer.kernel_size, layer.padding, x.shape[1:]
                fresh, columns = y.nbytes, c * k * k * y.shape[2] * y.shape[3] * y.itemsize
                scratch = y.nbytes + (c * (h + 2 * p) * (w + 2 * p) * y.itemsize if p else 0)
                enough = im2col_blocked.BLOCK_BYTES // columns + 2   # images for at least two blocks
                block = image_blocks((enough,) + x.shape[1:], layer.weight.shape, layer.stride, p, y.itemsize)[0][1]
                keeps = im2col_blocked.kept_layout((1,) + x.shape[1:], layer.weight.shape, layer.stride, p,
                                                   y.itemsize, 2)
                keep = budget.current() // columns if keeps else 0
            elif isinstance(layer, MaxPool2d):
                fresh = y.nbytes * (layer.kernel_size ** 2 + 1)
            params = sum(parameter.size for parameter in layer.parameters())
            layers.append(LayerBytes(type(layer).__name__, params, fresh, columns, scratch, y.nbytes, block, keep))
            x = y
    return layers


def segments_of(count):
    """(start, stop) layer ranges of the round(sqrt(count)) segments ``--recompute`` cuts ``count`` layers
    into (``minidl.recompute.checkpointed``, as ``algorithms.core.objective.build``)."""
    segments = max(1, round(math.sqrt(count)))
    base, extra = divmod(count, segments)
    ranges, start = [], 0
    for k in range(segments):
        ranges.append((start, start + base + (k < extra)))
        start = ranges[-1][1]
    return ranges


def activations(layers, rows, recompute=False, copies=1, loss=True):
    """Bytes of activations a rank holds for ``copies`` batches of ``rows`` examples through ``layers``
    (a pipeline stage holds several micro-batches at once): plain, all that the forward keeps; with
    ``recompute``, each segment's output (and one copy of the conv scratch), plus the largest
    segment of one batch recomputed. ``loss``: the layers end in the loss, which keeps its logits."""
    logits = layers[-1].out + LOSS_EXTRA if loss else 0
    held, free = [sum(parts) for parts in zip(*(layer.held_and_free(rows) for layer in layers))]
    if not recompute:          # every batch in flight holds what it keeps; the pooled scratch is reused
        return copies * (held + rows * logits) + free
    cut = segments_of(len(layers))
    kept = sum(layers[stop - 1].out for _, stop in cut) + logits
    largest = max(sum(layer.fresh for layer in layers[start:stop]) for start, stop in cut)
    return copies * rows * kept + held + free - rows * sum(layer.fresh for layer in layers) + rows * largest


def parameters(layers):
    return sum(layer.params for layer in layers)
