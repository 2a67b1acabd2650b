"""Activation recomputation: a segment of layers keeps no activations in the forward pass and
recomputes them during the backward pass (Chen et al. 2016, "Training deep nets with sublinear
memory cost"; Griewank's checkpointing for reverse-mode differentiation).

    y = checkpoint(segment, x)              # segment: a Module (or any Tensor -> Tensor function)
    net = checkpointed(net, segments=3)     # a Sequential cut into 3 Checkpoint segments
    net = Sequential(Checkpoint(block_1), Checkpoint(block_2), head)

The backward pass of a network needs every layer's input (a ReLU its input, a Linear its input,
a convolution its columns): plain backward keeps them all, from the forward pass until the
backward reaches that layer, so a network of L layers with activations of A bytes each holds

    plain          L A                                   at the start of the backward
    checkpointed   S A + (L / S) A                       S segment boundaries, plus one segment recomputed

and with S = sqrt(L) segments that is 2 sqrt(L) A instead of L A, for one more forward pass
per step (the recomputation: about a third more arithmetic).

``checkpoint`` runs ``segment`` under ``no_grad`` (nothing inside is recorded or kept) and records one
node whose parents are the segment's input and parameters. Its backward runs the segment again,
now recording, from the kept input, and back-propagates the incoming gradient through that
fresh graph: the parameters' gradients accumulate (and their hooks run) there, the input's
gradient is handed on. The recomputed forward repeats the same operations on the same arrays, so
the gradients are bitwise those of the plain backward (tests/test_recompute.py). A segment must
therefore draw nothing at random (Dropout is refused) and read no state that the forward changed.
"""
from minidl import autograd
from minidl.nn import Dropout, Module, Sequential
from minidl.tensor import Tensor, as_tensor, result


def checkpoint(segment, x):
    """``segment(x)`` with its activations recomputed in the backward instead of kept (see the header)."""
    x = as_tensor(x)
    parameters = tuple(segment.parameters()) if isinstance(segment, Module) else ()
    if isinstance(segment, Module) and any(isinstance(m, Dropout) and m.training and m.p for m in segment.modules()):
        raise ValueError("checkpoint: a segment with Dropout would draw another mask when it is recomputed")
    if not autograd.grad_enabled():
        return segment(x)
    # forward: nothing inside the segment is recorded, so nothing inside it is kept
    with autograd.no_grad():
        out = segment(Tensor(x.data))

    def backward(grad):
        # BEGIN SOLUTION
        # recompute the segment from its kept input, recording this time, and back-propagate through it
        start = Tensor(x.data, requires_grad=x.requires_grad)
        recomputed = segment(start)
        if recomputed.requires_grad:
            recomputed.backward(grad)           # the parameters' gradients accumulate here
        return (start.grad,) + (None,) * len(parameters)
        # END SOLUTION
    return result(out.data, (x,) + parameters, backward, "checkpoint")


class Checkpoint(Module):
    """A layer that runs ``module`` through ``checkpoint``: the same numbers, fewer kept activations."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return checkpoint(self.module, x)


def checkpointed(net, segments):
    """The layers of the Sequential ``net`` in ``segments`` consecutive Checkpoint segments (as even as
    the layer count allows): the same parameters, in the same order."""
    layers = list(net)
    if not 1 <= segments <= len(layers):
        raise ValueError(f"checkpointed: segments must be 1..{len(layers)} (the layers), got {segments}")
    base, extra = divmod(len(layers), segments)
    cut, start = [], 0
    for k in range(segments):
        stop = start + base + (k < extra)
        cut.append(Checkpoint(Sequential(*layers[start:stop])))
        start = stop
    return Sequential(*cut)
