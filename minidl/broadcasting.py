"""Broadcasting, forward and backward: the check every elementwise operation makes, and its chain rule.

NumPy's broadcasting stretches an operand of shape (3, 1) or (4,) to the shape of the other one
(say (2, 3, 4)) without copying it. In the backward pass every stretched axis has read the same
entry many times, so the gradient of that entry is the sum over the axis: ``unbroadcast``.
"""
import numpy


def unbroadcast(grad, shape):
    """Sum ``grad`` over the axes that broadcasting added or stretched, back to ``shape``."""
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, side in enumerate(shape):
        if side == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad


def check_broadcast(name, a, b):
    """Refuse, naming both shapes, operands that do not broadcast (an error, not a surprise in backward)."""
    try:
        numpy.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"{name}: shapes {a.shape} and {b.shape} do not broadcast") from None
