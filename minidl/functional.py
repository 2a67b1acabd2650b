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
still is the builtin); import the module, never ``from minidl.functional import *``.

The operations that are ``Tensor``'s operators (``+``, ``*``, ``**``, ``@``, ``.sum()``, ``.relu()``,
...) are written in ``minidl/tensor.py``, beside the class that calls them, and exported here
with the others, so that ``F.add`` is the function ``a + b`` calls.
"""
from minidl import backend, conv, local, pool
from minidl.broadcasting import unbroadcast
from minidl.tensor import (  # noqa: F401
    Tensor,
    add,
    as_tensor,
    as_tensors,
    div,
    exp,
    log,
    matmul,
    mean,
    mul,
    neg,
    pow,
    relu,
    reshape,
    result,
    sigmoid,
    sub,
    sum,
    tanh,
    transpose,
)


# ---- a layer's product ------------------------------------------------------------------------
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
    prediction, target = as_tensors(prediction, target)
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
    x, weight = as_tensor(x), as_tensor(weight)
    conv.check_shapes(x.shape, weight.shape, stride, padding)
    kernel = conv.get(algorithm, x.shape, weight.shape, stride, padding)
    out, cache = kernel.forward(x.data, weight.data, stride, padding)
    cache.pop("weight", None)     # read again in the backward, as Linear does: nothing of it kept in between
    parents = (x, weight)
    if bias is not None:
        bias = as_tensor(bias)
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"conv2d: bias shape {bias.shape} != ({weight.shape[0]},) for weight shape {weight.shape}")
        add_bias(out, bias.data)
        parents = (x, weight, bias)

    def backward(grad):
        grad_x, grad_weight = kernel.backward(grad, {**cache, "weight": weight.data}, need_x=x.requires_grad,
                                              need_weight=weight.requires_grad)
        if bias is None:
            return grad_x, grad_weight
        return grad_x, grad_weight, bias_gradient(grad)
    return result(out, parents, backward, "conv2d")


def locally_connected2d(x, weight, bias=None, stride=1, padding=0):
    """DistBelief's locally connected layer (``minidl.local``): a convolution's windows over x (N, C, H, W),
    each output position with its own weights, weight (Ho, Wo, F, C, k, k) and bias (Ho, Wo, F)."""
    x, weight = as_tensor(x), as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    out, cache = local.forward(x.data, weight.data, None if bias is None else bias.data, stride, padding)

    def backward(grad):
        grad_x, grad_weight, grad_bias = local.backward(grad, cache, weight.data, need_x=x.requires_grad)
        return (grad_x, grad_weight) if bias is None else (grad_x, grad_weight, grad_bias)
    return result(out, (x, weight) if bias is None else (x, weight, bias), backward, "locally_connected2d")


def add_bias(out, bias):
    """out (N, F, Ho, Wo) += bias[f] over every channel f's plane, in place: ``out += bias.reshape(1, -1, 1, 1)``.

    The same additions, the same bits, about 2x faster on NumPy for LeNet-5's first layer (0.078 ->
    0.04 ms at batch 128): each image's F*Ho*Wo numbers get one row of as many (every bias repeated
    over its plane), NumPy's vector loop over two arrays, where the broadcast runs one loop per
    plane. An ``out`` that is not C-contiguous (no such row view) takes the broadcast.
    """
    xp = backend.get_array_module(out)
    n, f, out_h, out_w = out.shape
    if not out.flags.c_contiguous:
        out += bias.reshape(1, -1, 1, 1)
        return
    rows = out.reshape(n, f * out_h * out_w)          # a view: the adds land in ``out``
    rows += xp.repeat(bias, out_h * out_w)


def bias_gradient(grad):
    """d loss / d bias[f] = sum over n, h, w of grad[n, f, h, w], for grad (N, F, Ho, Wo).

    Summed over the batch first (whole (F, Ho, Wo) planes added, NumPy's vector loop), then along
    each channel's Ho*Wo numbers: the same sum as ``grad.sum(axis=(0, 2, 3))`` in another order,
    as accurate (the error measured against float64 stays the same size) and 2.5-4x faster on
    LeNet-5's layers (0.09 -> 0.04 ms for the first at batch 128), where NumPy's multi-axis
    reduction adds every row of Wo numbers on its own.
    """
    _, f, out_h, out_w = grad.shape
    return grad.sum(axis=0).reshape(f, out_h * out_w).sum(axis=1)


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """Max over kernel_size x kernel_size windows; ties send the gradient to the first maximum."""
    x = as_tensor(x)
    stride = kernel_size if stride is None else stride
    out, cache = pool.max_pool_forward(x.data, kernel_size, stride, padding)
    return result(out, (x,), lambda grad: (pool.max_pool_backward(grad, cache),), "max_pool2d")


def avg_pool2d(x, kernel_size, stride=None, padding=0):
    """Mean over kernel_size x kernel_size windows (zero padding counts in the mean)."""
    x = as_tensor(x)
    stride = kernel_size if stride is None else stride
    out = pool.avg_pool_forward(x.data, kernel_size, stride, padding)
    return result(out, (x,),
                  lambda grad: (pool.avg_pool_backward(grad, x.shape, kernel_size, stride, padding),),
                  "avg_pool2d")



# ---- tensor parallelism's conjugate operators (Shoeybi et al. 2019, section 3) -------------------
# ``total(array)`` sums an array over the tensor-parallel ranks and returns the sum: the caller's
# allreduce (minidl knows nothing of MPI). It gets a copy, so it may sum in place.
def copy_to_parallel(x, total):
    """Megatron's f: the identity forward (every rank goes on from the same x); backward, the
    gradient summed over ranks (each rank's columns contribute a part of dL/dx)."""
    # BEGIN SOLUTION
    x = as_tensor(x)
    return result(x.data, (x,), lambda grad: (total(grad.copy()),), "copy_to_parallel")
    # END SOLUTION


def reduce_from_parallel(x, total):
    """Megatron's g: forward, the sum over ranks of each rank's partial x; backward, the identity
    (the sum's gradient with respect to every rank's part is the sum's own gradient)."""
    # BEGIN SOLUTION
    x = as_tensor(x)
    return result(total(x.data.copy()), (x,), lambda grad: (grad,), "reduce_from_parallel")
    # END SOLUTION
