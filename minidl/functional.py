"""Operations with hand-written backward passes.

Each function computes its forward result and hands ``tensor.result`` a ``backward(grad)``
closure that maps the gradient of the result to the gradients of the inputs (chain rule),
written right beside the forward so the two can be read together (as in micrograd).

Shapes follow NumPy's broadcasting rules for the elementwise operations; the backward of a
broadcast input sums the gradient over the broadcast axes (``unbroadcast``). Where a
broadcast would only hide a bug (labels of the wrong length, targets of another shape),
the function refuses with an error that names both shapes.

``sum`` and ``pow`` share their names with Python builtins on purpose: they are called through
the module, ``F.sum(x, axis=0)`` and ``F.pow(x, 2)``, as ``numpy.sum`` and ``torch.sum`` are, and
a trailing underscore would only make them harder to find. Inside this file, ``sum`` and ``pow``
therefore mean these operations and nothing here uses the builtins of those names (``max``
still is the builtin); import the module, never ``from minidl.functional import *``. ``Tensor``'s
operators (``+``, ``*``, ``**``, ``@``, ``.sum()``, ...) call these functions.
"""
import numpy

from minidl import backend
from minidl.tensor import Tensor, result


def as_tensor(value, like=None):
    """``value`` as a Tensor; python numbers and arrays become constants of ``like``'s dtype."""
    if isinstance(value, Tensor):
        return value
    xp = backend.xp()
    dtype = like.dtype if like is not None else None
    return Tensor(xp.asarray(value, dtype=dtype))


def unbroadcast(grad, shape):
    """Sum ``grad`` over the axes that broadcasting added or stretched, back to ``shape``."""
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, side in enumerate(shape):
        if side == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad


def _pair(a, b):
    """Both operands as Tensors; a plain number or array takes the other operand's dtype."""
    if isinstance(a, Tensor) and not isinstance(b, Tensor):
        return a, as_tensor(b, like=a)
    if isinstance(b, Tensor) and not isinstance(a, Tensor):
        return as_tensor(a, like=b), b
    return as_tensor(a), as_tensor(b)


def _broadcast_check(name, a, b):
    try:
        numpy.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"{name}: shapes {a.shape} and {b.shape} do not broadcast") from None


# ---- elementwise arithmetic -------------------------------------------------------------
def add(a, b):
    a, b = _pair(a, b)
    _broadcast_check("add", a, b)

    def backward(grad):
        return unbroadcast(grad, a.shape), unbroadcast(grad, b.shape)
    return result(a.data + b.data, (a, b), backward, "add")


def sub(a, b):
    a, b = _pair(a, b)
    _broadcast_check("sub", a, b)

    def backward(grad):
        return unbroadcast(grad, a.shape), unbroadcast(-grad, b.shape)
    return result(a.data - b.data, (a, b), backward, "sub")


def mul(a, b):
    a, b = _pair(a, b)
    _broadcast_check("mul", a, b)

    def backward(grad):
        return unbroadcast(grad * b.data, a.shape), unbroadcast(grad * a.data, b.shape)
    return result(a.data * b.data, (a, b), backward, "mul")


def div(a, b):
    a, b = _pair(a, b)
    _broadcast_check("div", a, b)

    def backward(grad):
        grad_a = grad / b.data
        grad_b = -grad_a * a.data / b.data          # d(a/b)/db = -a / b^2
        return unbroadcast(grad_a, a.shape), unbroadcast(grad_b, b.shape)
    return result(a.data / b.data, (a, b), backward, "div")


def neg(a):
    a = as_tensor(a)
    return result(-a.data, (a,), lambda grad: (-grad,), "neg")


def pow(a, b):
    """a ** b; d/da = b a^(b-1), d/db = a^b log a (needs a > 0 where b needs a gradient)."""
    a, b = _pair(a, b)
    _broadcast_check("pow", a, b)
    xp = backend.get_array_module(a.data)
    out = a.data ** b.data

    def backward(grad):
        grad_a = unbroadcast(grad * b.data * a.data ** (b.data - 1), a.shape) if a.requires_grad else None
        grad_b = unbroadcast(grad * out * xp.log(a.data), b.shape) if b.requires_grad else None
        return grad_a, grad_b
    return result(out, (a, b), backward, "pow")


# ---- matrix product and reductions ------------------------------------------------------
def matmul(a, b):
    """a @ b for (..., n, k) @ (..., k, m); batch axes broadcast."""
    a, b = as_tensor(a), as_tensor(b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul: needs operands with at least 2 dimensions, got shapes {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not match "
                         f"(inner dimensions {a.shape[-1]} != {b.shape[-2]})")
    xp = backend.get_array_module(a.data)

    def backward(grad):
        """(grad @ b^T, a^T @ grad), each summed back to its operand's shape; None where none is needed."""
        # BEGIN SOLUTION
        # d(a @ b)/da: (..., n, m) @ (..., m, k) -> (..., n, k); d/db: (..., k, n) @ (..., n, m) -> (..., k, m)
        grad_a = unbroadcast(xp.matmul(grad, xp.swapaxes(b.data, -1, -2)), a.shape) if a.requires_grad else None
        grad_b = unbroadcast(xp.matmul(xp.swapaxes(a.data, -1, -2), grad), b.shape) if b.requires_grad else None
        # END SOLUTION
        return grad_a, grad_b
    return result(xp.matmul(a.data, b.data), (a, b), backward, "matmul")


def linear(x, weight, bias=None):
    """x @ weight + bias for x (N, in), weight (in, out), bias (out,): one graph node, not two.

    The same numbers as ``matmul(x, weight) + bias`` (the bias is added into the fresh product,
    and the backward is matmul's, plus grad summed over the batch for the bias), without the
    add's node: its output array and its backward call cost more than the addition itself for a
    small layer (python -m minidl.bench, "mlp ... train step").
    """
    product = matmul(x, weight)
    if bias is None:
        return product
    bias = as_tensor(bias)
    if bias.shape != (weight.shape[-1],) or bias.dtype != product.dtype:
        return product + bias                  # a broadcast or a type promotion: the plain add
    product.data += bias.data                  # the product is fresh: nothing else holds it
    matmul_backward = product._backward        # None when neither x nor weight needs a gradient

    def backward(grad):
        grad_x, grad_weight = matmul_backward(grad) if matmul_backward is not None else (None, None)
        return grad_x, grad_weight, unbroadcast(grad, bias.shape) if bias.requires_grad else None
    return result(product.data, (x, weight, bias), backward, "linear")


def _normalise_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ValueError(f"axis {ax} is out of range for a tensor with {ndim} dimensions")
    return tuple(sorted(ax % ndim for ax in axes))


def sum(a, axis=None, keepdims=False):
    a = as_tensor(a)
    axes = _normalise_axes(axis, a.ndim)
    xp = backend.get_array_module(a.data)

    def backward(grad):
        if not keepdims:
            grad = xp.expand_dims(grad, axes) if axes else grad
        return (xp.broadcast_to(grad, a.shape),)
    return result(a.data.sum(axis=axes, keepdims=keepdims), (a,), backward, "sum")


def mean(a, axis=None, keepdims=False):
    a = as_tensor(a)
    axes = _normalise_axes(axis, a.ndim)
    count = 1
    for ax in axes:
        count *= a.shape[ax]
    return div(sum(a, axis, keepdims), float(max(count, 1)))


def reshape(a, shape):
    a = as_tensor(a)
    try:
        out = a.data.reshape(shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape shape {a.shape} ({a.size} elements) into {shape}") from None
    return result(out, (a,), lambda grad: (grad.reshape(a.shape),), "reshape")


def transpose(a, axes=None):
    a = as_tensor(a)
    axes = tuple(reversed(range(a.ndim))) if axes is None else tuple(axes)
    if sorted(axes) != list(range(a.ndim)):
        raise ValueError(f"transpose: axes {axes} are not a permutation of the {a.ndim} axes of shape {a.shape}")
    inverse = tuple(numpy.argsort(axes))
    return result(a.data.transpose(axes), (a,), lambda grad: (grad.transpose(inverse),), "transpose")


# ---- elementwise functions --------------------------------------------------------------
def exp(a):
    a = as_tensor(a)
    xp = backend.get_array_module(a.data)
    out = xp.exp(a.data)
    return result(out, (a,), lambda grad: (grad * out,), "exp")


def log(a):
    a = as_tensor(a)
    xp = backend.get_array_module(a.data)
    return result(xp.log(a.data), (a,), lambda grad: (grad / a.data,), "log")


def relu(a):
    a = as_tensor(a)
    xp = backend.get_array_module(a.data)
    return result(xp.maximum(a.data, 0), (a,), lambda grad: (grad * (a.data > 0),), "relu")


def tanh(a):
    a = as_tensor(a)
    xp = backend.get_array_module(a.data)
    out = xp.tanh(a.data)
    return result(out, (a,), lambda grad: (grad * (1 - out * out),), "tanh")


def sigmoid(a):
    a = as_tensor(a)
    xp = backend.get_array_module(a.data)
    # 1 / (1 + e^-x) written so that neither branch overflows
    out = xp.where(a.data >= 0, 1 / (1 + xp.exp(-xp.abs(a.data))),
                   xp.exp(-xp.abs(a.data)) / (1 + xp.exp(-xp.abs(a.data))))
    return result(out, (a,), lambda grad: (grad * out * (1 - out),), "sigmoid")


# ---- losses -------------------------------------------------------------------------------
def softmax(logits, axis=-1):
    """Softmax of an array or Tensor's data (no gradient; for predictions)."""
    data = logits.data if isinstance(logits, Tensor) else logits
    xp = backend.get_array_module(data)
    shifted = data - data.max(axis=axis, keepdims=True)
    e = xp.exp(shifted)
    return e / e.sum(axis=axis, keepdims=True)


def softmax_cross_entropy(logits, labels):
    """Mean over the batch of -log softmax(logits)[i, labels[i]], by a stable log-sum-exp.

    loss = (1/N) sum_i [ log sum_k exp(z_ik - m_i) - (z_{i,y_i} - m_i) ],  m_i = max_k z_ik
    d loss / d z_ik = (softmax(z)_ik - [k == y_i]) / N
    """
    logits = as_tensor(logits)
    xp = backend.get_array_module(logits.data)
    labels = xp.asarray(labels)
    if logits.ndim != 2:
        raise ValueError(f"softmax_cross_entropy: logits must be (batch, classes), got shape {logits.shape}")
    if labels.shape != (logits.shape[0],):
        raise ValueError(f"softmax_cross_entropy: labels shape {labels.shape} does not match "
                         f"logits shape {logits.shape} (need ({logits.shape[0]},))")
    if labels.dtype.kind not in "iu":
        raise TypeError(f"softmax_cross_entropy: labels must be integers, got dtype {labels.dtype}")
    batch, classes = logits.shape
    if batch and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise ValueError(f"softmax_cross_entropy: labels must lie in [0, {classes}), "
                         f"got values in [{int(labels.min())}, {int(labels.max())}]")
    shifted = logits.data - logits.data.max(axis=1, keepdims=True)
    log_sum = xp.log(xp.exp(shifted).sum(axis=1))
    rows = xp.arange(batch)
    loss = (log_sum - shifted[rows, labels]).sum() / max(batch, 1)

    def backward(grad):
        """d loss / d logits = (softmax(logits) - one_hot(labels)) * grad / N."""
        # BEGIN SOLUTION
        # softmax from the forward's pieces, exp(z - m - log sum exp(z - m)): no second pass, no overflow
        probabilities = xp.exp(shifted - log_sum[:, None])
        probabilities[rows, labels] -= 1
        return (probabilities * (grad / max(batch, 1)),)
        # END SOLUTION
    return result(xp.asarray(loss, dtype=logits.dtype), (logits,), backward, "softmax_cross_entropy")


def mse_loss(prediction, target):
    """mean((prediction - target)^2); shapes must be equal (no silent broadcasting)."""
    prediction, target = _pair(prediction, target)
    if prediction.shape != target.shape:
        raise ValueError(f"mse_loss: prediction shape {prediction.shape} != target shape {target.shape}")
    difference = sub(prediction, target)
    return mean(mul(difference, difference))


def dropout(a, p, training, rng):
    """Inverted dropout: keep each entry with probability 1 - p and scale it by 1 / (1 - p).

    ``rng`` is a ``numpy.random.Generator``; the mask is drawn on the host so that the same seed
    gives the same mask on both backends.
    """
    a = as_tensor(a)
    if not 0 <= p < 1:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if not training or p == 0:
        return a
    xp = backend.get_array_module(a.data)
    mask = xp.asarray((rng.random(a.shape) >= p) / (1 - p), dtype=a.dtype)
    return result(a.data * mask, (a,), lambda grad: (grad * mask,), "dropout")


# ---- convolution and pooling (the kernels live in minidl.conv and minidl.pool) ------------
def conv2d(x, weight, bias=None, stride=1, padding=0, algorithm="im2col"):
    """2-D convolution (cross-correlation) of x (N, C, H, W) with weight (F, C, kh, kw).

    Output (N, F, Ho, Wo) with Ho = (H + 2 padding - kh) // stride + 1 (Wo likewise);
    ``algorithm`` picks the kernel (``minidl.conv.ALGORITHMS``), all with the same result.
    """
    from minidl import conv
    x, weight = as_tensor(x), as_tensor(weight)
    conv.check_shapes(x.shape, weight.shape, stride, padding)
    kernel = conv.get(algorithm, x.shape, weight.shape, stride, padding)
    out, cache = kernel.forward(x.data, weight.data, stride, padding)
    parents = (x, weight)
    if bias is not None:
        bias = as_tensor(bias)
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"conv2d: bias shape {bias.shape} != ({weight.shape[0]},) for weight shape {weight.shape}")
        out += bias.data.reshape(1, -1, 1, 1)
        parents = (x, weight, bias)

    def backward(grad):
        grad_x, grad_weight = kernel.backward(grad, cache, need_x=x.requires_grad,
                                              need_weight=weight.requires_grad)
        if bias is None:
            return grad_x, grad_weight
        return grad_x, grad_weight, grad.sum(axis=(0, 2, 3))
    return result(out, parents, backward, "conv2d")


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """Max over kernel_size x kernel_size windows; ties send the gradient to the first maximum."""
    from minidl import pool
    x = as_tensor(x)
    stride = kernel_size if stride is None else stride
    out, cache = pool.max_pool_forward(x.data, kernel_size, stride, padding)
    return result(out, (x,), lambda grad: (pool.max_pool_backward(grad, cache),), "max_pool2d")


def avg_pool2d(x, kernel_size, stride=None, padding=0):
    """Mean over kernel_size x kernel_size windows (zero padding counts in the mean)."""
    from minidl import pool
    x = as_tensor(x)
    stride = kernel_size if stride is None else stride
    out = pool.avg_pool_forward(x.data, kernel_size, stride, padding)
    return result(out, (x,),
                  lambda grad: (pool.avg_pool_backward(grad, x.shape, kernel_size, stride, padding),),
                  "avg_pool2d")

