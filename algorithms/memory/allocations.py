"""Measured: the bytes one rank allocates for each part of a data-parallel step, by tracemalloc.

    measured = allocations.data_parallel(comm, "lenet5", (1, 28, 28), batch=64, recompute=False)
    # {"params": ..., "grads": ..., "optimizer": ..., "activations": ..., "extra": ...}

The step is allreduce SGD's (``algorithms.allreduce_sgd``), taken phase by phase with the objects a
run uses (the model of ``objective.build_model``, its flat buffer, SGD with momentum, the ring
allreduce), and tracemalloc's count of live bytes (NumPy reports its arrays to it) read between the
phases:

    params       building the model: its parameter arrays
    grads        flattening it: one flat vector for the parameters and one for the gradients, the
                 layers' own arrays freed, so the growth is the gradient vector
    activations  the forward and the loss, with the conv workspace pool emptied first (its buffers
                 are activation memory too); with --recompute, plus the largest segment's
                 activations recorded again, as the backward does one segment at a time
    extra        the allreduce, with the collectives' cached receive buffers emptied first
    optimizer    the first update: the momentum vector it creates

Each figure also holds a few hundred bytes of Python objects per layer or graph node, which the
formulas of ``algorithms.memory`` leave out: below 10% for the batch sizes the tests use.
"""
import math
import tracemalloc

import numpy

from algorithms.core.objective import build_model
from collectives.buffers import release_scratch
from minidl import functional as F
from minidl.conv.scratch import release
from minidl.flat import flatten
from minidl.optim import SGD
from minidl.recompute import checkpointed
from minidl.tensor import Tensor


class Meter:
    """Live bytes (tracemalloc) since the last ``take``."""

    def __init__(self):
        self.started = not tracemalloc.is_tracing()
        if self.started:
            tracemalloc.start()
        self.mark = tracemalloc.get_traced_memory()[0]

    def take(self):
        now = tracemalloc.get_traced_memory()[0]
        grown, self.mark = now - self.mark, now
        return grown

    def stop(self):
        if self.started:
            tracemalloc.stop()


def largest_segment(segments, inputs):
    """The most bytes one segment's recorded forward keeps, run from its kept input (as the backward does)."""
    largest = 0
    for segment, kept in zip(segments, inputs):
        if getattr(segment, "module", None) is None:      # a layer kept whole (tensor_parallel's replicated ones)
            continue
        start = Tensor(kept.data, requires_grad=True)
        before = tracemalloc.get_traced_memory()[0]
        again = segment.module(start)
        largest = max(largest, tracemalloc.get_traced_memory()[0] - before)
        del again, start
    return largest


def forward(meter, layers, x, labels, recompute=False):
    """The forward and the loss, from an emptied conv workspace pool: (loss, the bytes kept for the
    backward); with ``recompute`` (``layers`` checkpointed segments), plus the largest segment's
    activations recorded again, as the backward does one segment at a time."""
    release()
    meter.take()
    h, inputs = Tensor(x), []
    for layer in layers:
        inputs.append(h)
        h = layer(h)
    loss = F.softmax_cross_entropy(h, labels)
    kept = meter.take()
    if recompute:
        kept += largest_segment(list(layers), inputs)
        meter.take()
    return loss, kept


def example_batch(example_shape, batch, seed=0):
    """Random images (batch, *example_shape) in float32 and labels: memory does not depend on the values."""
    rng = numpy.random.default_rng(seed)
    return rng.standard_normal((batch,) + tuple(example_shape)).astype(numpy.float32), rng.integers(0, 10, batch)


def set_up(meter, model, example_shape, recompute=False, momentum=0.9, seed=0):
    """The model, its flat buffer and SGD, as a run builds them: (net, flat, optimizer, measured params and grads)."""
    net = build_model(model, seed, "mnist" if example_shape[-1] == 28 else "digits")
    measured = {"params": meter.take()}
    if recompute:
        net = checkpointed(net, max(1, round(math.sqrt(len(net)))))
    flat = flatten(net)
    measured["grads"] = meter.take()
    return net, flat, SGD([flat.as_parameter()], lr=0.01, momentum=momentum), measured


def data_parallel(comm, model, example_shape, batch, recompute=False, momentum=0.9, seed=0, allreduce=None):
    """This rank's measured bytes per part of one data-parallel step of ``model`` at ``batch`` rows.

    ``allreduce(comm, vector)``: the sum over ranks (default: none, for one rank)."""
    x, labels = example_batch(example_shape, batch, seed)
    meter = Meter()
    try:
        net, flat, optimizer, measured = set_up(meter, model, example_shape, recompute, momentum, seed)
        loss, measured["activations"] = forward(meter, net, x, labels, recompute)
        loss.backward()
        del loss
        release_scratch()
        meter.take()
        if allreduce is not None:
            allreduce(comm, flat.grad)
        measured["extra"] = meter.take()
        optimizer.step()
        measured["optimizer"] = meter.take()
    finally:
        meter.stop()
    return measured
