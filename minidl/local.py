"""Locally connected 2-D layers: a convolution's windows, each output position with weights of its own.

Dean et al. 2012 (DistBelief), section 3 and Figure 1: "locally-connected" layers, as a convolution
whose weights are not shared between positions (Keras calls the layer LocallyConnected2D). For x
(N, C, H, W), a k x k window, stride s and zero padding p, the output (N, F, Ho, Wo), Ho = (H + 2 p
- k) // s + 1 (Wo likewise), is

    out[n, f, i, j] = bias[i, j, f] + sum_{c, a, b} weight[i, j, f, c, a, b] xp[n, c, s i + a, s j + b]

with xp the zero-padded input: weight (Ho, Wo, F, C, k, k), bias (Ho, Wo, F); output position (i, j)
first, so that the weights of a block of output rows are one contiguous piece of the layer's
parameters (the spatial split gives each rank the rows it computes: ``algorithms.spatial_parallel``).
A convolution has F C k k weights; this layer Ho Wo times as many, for the same arithmetic.

``forward``/``backward`` are the fast form: the windows as columns (a loop over the k k kernel
offsets, as minidl's im2col), then one matrix product per position, batched over the Ho Wo
positions: (P, N, C k k) @ (P, C k k, F). Backward, per position: d weight = g^T cols, d cols = g
weight, d bias = sum_n g, and d x by adding each column back where it came from (col2im).
``direct_forward`` is the obvious loop over positions, the oracle (tests/test_local.py).
"""
from minidl import backend


def output_size(size, kernel, stride, padding):
    return (size + 2 * padding - kernel) // stride + 1


def columns(x, kernel, stride, padding, out_h, out_w):
    """(N, C, H, W) -> (Ho Wo, N, C k k): every output position's window, flattened."""
    xp = backend.get_array_module(x)
    n, c = x.shape[:2]
    padded = xp.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding))) if padding else x
    cols = xp.empty((n, c, kernel, kernel, out_h, out_w), dtype=x.dtype)
    for a in range(kernel):
        for b in range(kernel):
            cols[:, :, a, b] = padded[:, :, a:a + stride * out_h:stride, b:b + stride * out_w:stride]
    return cols.reshape(n, c * kernel * kernel, out_h * out_w).transpose(2, 0, 1)


def forward(x, weight, bias, stride, padding):
    """(out (N, F, Ho, Wo), cache for ``backward``); weight (Ho, Wo, F, C, k, k), bias (Ho, Wo, F) or None."""
    xp = backend.get_array_module(x)
    out_h, out_w, filters, channels, kernel, _ = weight.shape
    check(x.shape, weight.shape, stride, padding)
    cols = columns(x, kernel, stride, padding, out_h, out_w)                    # (P, N, C k k)
    w = weight.reshape(out_h * out_w, filters, channels * kernel * kernel)       # (P, F, C k k)
    out = xp.matmul(cols, w.transpose(0, 2, 1))                                  # (P, N, F)
    if bias is not None:
        out += bias.reshape(out_h * out_w, 1, filters)
    out = xp.ascontiguousarray(out.transpose(1, 2, 0)).reshape(x.shape[0], filters, out_h, out_w)
    return out, {"cols": cols, "x_shape": x.shape, "stride": stride, "padding": padding}


def backward(grad_out, cache, weight, need_x=True):
    """(d x, d weight, d bias) from d out (N, F, Ho, Wo); ``weight`` read now, not kept by the forward."""
    xp = backend.get_array_module(grad_out)
    n, channels, height, width = cache["x_shape"]
    out_h, out_w, filters, _, kernel, _ = weight.shape
    stride, padding = cache["stride"], cache["padding"]
    g = grad_out.reshape(n, filters, out_h * out_w).transpose(2, 0, 1)           # (P, N, F)
    grad_weight = xp.matmul(g.transpose(0, 2, 1), cache["cols"]).reshape(weight.shape)    # (P, F, C k k)
    grad_bias = g.sum(axis=1).reshape(out_h, out_w, filters)
    if not need_x:
        return None, grad_weight, grad_bias
    w = weight.reshape(out_h * out_w, filters, channels * kernel * kernel)
    grad_cols = xp.matmul(g, w)                                                  # (P, N, C k k)
    grad_cols = grad_cols.transpose(1, 2, 0).reshape(n, channels, kernel, kernel, out_h, out_w)
    padded = xp.zeros((n, channels, height + 2 * padding, width + 2 * padding), dtype=grad_out.dtype)
    for a in range(kernel):
        for b in range(kernel):
            padded[:, :, a:a + stride * out_h:stride, b:b + stride * out_w:stride] += grad_cols[:, :, a, b]
    grad_x = padded[:, :, padding:padding + height, padding:padding + width] if padding else padded
    return grad_x, grad_weight, grad_bias


def direct_forward(x, weight, bias, stride, padding):
    """The definition, position by position: the oracle of ``forward`` (slow)."""
    xp = backend.get_array_module(x)
    out_h, out_w, filters, channels, kernel, _ = weight.shape
    padded = xp.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    out = xp.zeros((x.shape[0], filters, out_h, out_w), dtype=x.dtype)
    for i in range(out_h):
        for j in range(out_w):
            window = padded[:, :, stride * i:stride * i + kernel, stride * j:stride * j + kernel]   # (N, C, k, k)
            for f in range(filters):
                out[:, f, i, j] = (window * weight[i, j, f]).sum(axis=(1, 2, 3))
                if bias is not None:
                    out[:, f, i, j] += bias[i, j, f]
    return out


def check(x_shape, weight_shape, stride, padding):
    """A ValueError naming both shapes if ``weight`` does not fit ``x``'s output positions and channels."""
    if len(x_shape) != 4 or len(weight_shape) != 6 or weight_shape[4] != weight_shape[5]:
        raise ValueError(f"locally_connected2d: x must be (N, C, H, W) and weight (Ho, Wo, F, C, k, k), "
                         f"got {tuple(x_shape)} and {tuple(weight_shape)}")
    out_h, out_w, _, channels, kernel, _ = weight_shape
    expected = (output_size(x_shape[2], kernel, stride, padding), output_size(x_shape[3], kernel, stride, padding))
    if channels != x_shape[1] or (out_h, out_w) != expected:
        raise ValueError(f"locally_connected2d: weight {tuple(weight_shape)} does not fit x {tuple(x_shape)} "
                         f"(stride {stride}, padding {padding}: {expected[0]} x {expected[1]} positions, "
                         f"{x_shape[1]} channels)")
