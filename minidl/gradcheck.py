"""Check hand-written backward passes against central finite differences, in float64.

For a function ``fn`` of tensors, pick a fixed random direction ``r`` of the output's shape and
compare the analytic gradient of the scalar ``sum(fn(inputs) * r)`` with

    (L(x + eps e_k) - L(x - eps e_k)) / (2 eps)      for every entry k of every input,

whose error is O(eps^2). A random ``r`` (rather than summing the output) makes every output entry
matter with a different weight, so a transposed or misplaced gradient cannot hide.
"""
import numpy

from minidl import backend
from minidl.tensor import Tensor, no_grad


def gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5, seed=0):
    """Return True if analytic and numerical gradients agree; raise AssertionError naming the worst entry.

    ``inputs`` are float64 Tensors; those with ``requires_grad`` are checked.
    """
    for position, tensor in enumerate(inputs):
        if not isinstance(tensor, Tensor) or tensor.dtype != numpy.float64:
            raise TypeError(f"gradcheck: input {position} must be a float64 Tensor, got "
                            f"{type(tensor).__name__} {getattr(tensor, 'dtype', '')}")
    xp = backend.xp()
    out = fn(*inputs)
    direction = xp.asarray(numpy.random.default_rng(seed).standard_normal(out.shape))
    for tensor in inputs:
        tensor.grad = None
    (out * Tensor(direction)).sum().backward()

    def loss():
        with no_grad():
            return float((fn(*inputs).data * direction).sum())

    for position, tensor in enumerate(inputs):
        if not tensor.requires_grad:
            continue
        analytic = tensor.grad if tensor.grad is not None else xp.zeros_like(tensor.data)
        numeric = xp.zeros_like(tensor.data)
        for index in numpy.ndindex(*tensor.shape):
            saved = float(tensor.data[index])
            tensor.data[index] = saved + eps
            plus = loss()
            tensor.data[index] = saved - eps
            minus = loss()
            tensor.data[index] = saved
            numeric[index] = (plus - minus) / (2 * eps)
        error = xp.abs(analytic - numeric) - (atol + rtol * xp.abs(numeric))
        if analytic.shape != numeric.shape or bool((error > 0).any()):
            index = numpy.unravel_index(int(error.argmax()), numeric.shape)
            raise AssertionError(f"gradcheck: input {position} (shape {tensor.shape}) entry {index}: "
                                 f"analytic {float(analytic[index]):.10g} vs numerical {float(numeric[index]):.10g}")
    return True
