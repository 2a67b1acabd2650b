"""Max and average pooling over k x k windows, written as a loop over the k*k window offsets.

    out[n, c, ho, wo] = max (or mean) over i, j < k of x_pad[n, c, ho*stride + i, wo*stride + j]
    Ho = (H + 2 padding - k) // stride + 1

Max pooling takes ``maximum`` over k*k strided slices of the input (no reshape-and-reduce, no
index arrays); its backward sends each output gradient to the *first* window position (in
row-major offset order) that holds the maximum, so ties are not counted twice. Max pooling pads
with -inf, average pooling with zeros (the zeros count in the mean).

Windows that do not overlap (stride >= k, LeNet's 2 x 2 pools): the forward copies the k*k
strided slices once into one contiguous array ``windows`` (k*k, N, C, Ho, Wo) and keeps it for
the backward, which then compares contiguous arrays instead of strided slices (a strided compare or
multiply costs 3-5x a contiguous one; ``python -m minidl.bench`` times the step). Same numbers, same
first-maximum rule; the price is one copy of the covered input. Overlapping windows (stride < k)
would copy the input k*k / stride^2 times, so they compare the strided slices directly.
"""
from minidl.backend import get_array_module


def _check(x_shape, kernel_size, stride, padding, name):
    if len(x_shape) != 4:
        raise ValueError(f"{name}: input must be (N, C, H, W), got shape {tuple(x_shape)}")
    if kernel_size < 1 or stride < 1 or padding < 0:
        raise ValueError(f"{name}: need kernel_size >= 1, stride >= 1, padding >= 0; "
                         f"got {kernel_size}, {stride}, {padding}")
    if 2 * padding > kernel_size:
        raise ValueError(f"{name}: padding {padding} is more than half the kernel size {kernel_size}")
    h, w = x_shape[2] + 2 * padding, x_shape[3] + 2 * padding
    if kernel_size > h or kernel_size > w:
        raise ValueError(f"{name}: kernel {kernel_size} is larger than the padded input ({h}, {w}) "
                         f"of input shape {tuple(x_shape)}")
    return (h - kernel_size) // stride + 1, (w - kernel_size) // stride + 1


def _pad(x, padding, value):
    if padding == 0:
        return x
    xp = get_array_module(x)
    n, c, h, w = x.shape
    out = xp.full((n, c, h + 2 * padding, w + 2 * padding), value, dtype=x.dtype)
    out[:, :, padding:padding + h, padding:padding + w] = x
    return out


def _window(x_pad, i, j, stride, out_h, out_w):
    return x_pad[:, :, i:i + stride * (out_h - 1) + 1:stride, j:j + stride * (out_w - 1) + 1:stride]


def _offset(cache, i, j):
    """x_pad[n, c, ho*stride + i, wo*stride + j] for every output (n, c, ho, wo): the contiguous
    copy in ``windows`` where the forward made one, else the strided slice of x_pad."""
    if cache["windows"] is not None:
        return cache["windows"][i * cache["kernel_size"] + j]
    out_h, out_w = cache["out_shape"][2:]
    return _window(cache["x_pad"], i, j, cache["stride"], out_h, out_w)


def max_pool_forward(x, kernel_size, stride, padding):
    xp = get_array_module(x)
    out_h, out_w = _check(x.shape, kernel_size, stride, padding, "max_pool2d")
    x_pad = _pad(x, padding, -xp.inf)
    cache = {"x_pad": x_pad, "windows": None, "out_shape": x.shape[:2] + (out_h, out_w), "x_shape": x.shape,
             "kernel_size": kernel_size, "stride": stride, "padding": padding}
    if stride >= kernel_size:                        # no overlap: one contiguous copy of the k*k slices
        cache["windows"] = xp.empty((kernel_size * kernel_size,) + cache["out_shape"], dtype=x.dtype)
        for i in range(kernel_size):
            for j in range(kernel_size):
                cache["windows"][i * kernel_size + j] = _window(x_pad, i, j, stride, out_h, out_w)
        cache["x_pad"] = None                        # the backward reads the copy only
    out = _offset(cache, 0, 0).copy()
    for i in range(kernel_size):
        for j in range(kernel_size):
            if i or j:
                xp.maximum(out, _offset(cache, i, j), out=out)
    cache["out"], cache["padded_shape"] = out, x_pad.shape
    return out, cache


def max_pool_backward(grad_out, cache):
    xp = get_array_module(grad_out)
    out, k, stride, padding = cache["out"], cache["kernel_size"], cache["stride"], cache["padding"]
    out_h, out_w = out.shape[2:]
    padded_shape = cache["padded_shape"]
    tiled = stride == k and padded_shape[2:] == (k * out_h, k * out_w)    # the windows cover every pixel once
    grad_x_pad = (xp.empty if tiled else xp.zeros)(padded_shape, dtype=grad_out.dtype)
    taken = xp.zeros(out.shape, dtype=bool)          # outputs whose maximum was already routed
    hit = xp.empty(out.shape, dtype=bool)
    for i in range(k):
        for j in range(k):
            xp.equal(_offset(cache, i, j), out, out=hit)
            xp.greater(hit, taken, out=hit)          # hit and not taken: the first maximum only
            window = _window(grad_x_pad, i, j, stride, out_h, out_w)
            if stride >= k:                          # windows do not overlap: each pixel is written once
                xp.multiply(grad_out, hit, out=window)
            else:
                window += grad_out * hit
            xp.logical_or(taken, hit, out=taken)
    if stride >= k:
        grad_x_pad += 0                              # as 0 + grad * hit would be: -0.0 becomes +0.0
    h, w = cache["x_shape"][2:]
    return grad_x_pad[:, :, padding:padding + h, padding:padding + w]


def avg_pool_forward(x, kernel_size, stride, padding):
    out_h, out_w = _check(x.shape, kernel_size, stride, padding, "avg_pool2d")
    x_pad = _pad(x, padding, 0)
    out = _window(x_pad, 0, 0, stride, out_h, out_w).copy()
    for i in range(kernel_size):
        for j in range(kernel_size):
            if i or j:
                out += _window(x_pad, i, j, stride, out_h, out_w)
    return out / (kernel_size * kernel_size)


def avg_pool_backward(grad_out, x_shape, kernel_size, stride, padding):
    xp = get_array_module(grad_out)
    n, c, h, w = x_shape
    out_h, out_w = grad_out.shape[2:]
    grad_x_pad = xp.zeros((n, c, h + 2 * padding, w + 2 * padding), dtype=grad_out.dtype)
    share = grad_out / (kernel_size * kernel_size)
    for i in range(kernel_size):
        for j in range(kernel_size):
            _window(grad_x_pad, i, j, stride, out_h, out_w)[...] += share
    return grad_x_pad[:, :, padding:padding + h, padding:padding + w]
