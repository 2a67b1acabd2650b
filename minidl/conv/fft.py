"""Convolution as a product in the frequency domain (FFT).

Mathieu, Henaff & LeCun 2014, "Fast Training of Convolutional Networks through FFTs";
Ben-Nun & Hoefler 2019 (the "FFT" way of computing a convolutional layer).

By the convolution theorem a (circular) cross-correlation is an elementwise product of spectra:

    out[n, f] = sum_c x_pad[n, c] (*) weight[f, c]                (*) = cross-correlation
    =>  out_hat[n, f] = sum_c x_hat[n, c] * conj(weight_hat[f, c])

Every input plane and every kernel is transformed ONCE (``rfft2`` to a common size, the kernel
zero-padded up to it), then, at each of the ``freqs`` frequencies, the sum over channels is a small
complex matrix product, which is why the method pays off when many filters share one input
(Mathieu et al.):

    x_hat      : (freqs, N, C)     weight_hat : (freqs, C, F)   (conjugated)
    out_hat    = x_hat @ weight_hat : (freqs, N, F)   then irfft2 back to space and crop

The two gradients are the same trick with the other two pairings (adjoints of the above):

    grad_x_hat      = grad_hat @ conj(weight_hat).T : (freqs, N, F) @ (freqs, F, C)  (full convolution)
    grad_weight_hat = conj(grad_hat).T @ x_hat       : (freqs, F, N) @ (freqs, N, C)  (correlation)

Why no wrap-around: the transform size is at least the padded input (Hp, Wp). The valid outputs
of a correlation, the full convolution in grad_x (length Ho + kh - 1 = Hp) and the kh lags of
grad_weight all fit in that size, so the circular products equal the linear ones.

Stride: the product gives the stride-1 output; stride s keeps every s-th row and column
(``out1[:, :, ::s, ::s]``), and backward scatters grad_out into a zero stride-1 gradient first.
This is exact but does s*s times the work a strided algorithm needs; FFT is for large kernels.

Arithmetic (forward; S = Hs * Ws transform size, Hs >= H + 2 padding, a 2-3-5-smooth length):
    transforms  ~ (N C + F C + N F) * S log2 S real multiplications (real FFTs, ~ S/2 log2 S complex)
    products      4 * N * F * C * Hs * (Ws // 2 + 1) real multiplications (complex multiply-adds)
The product term does not grow with the kernel size, im2col's N F C kh kw Ho Wo does: for a
kernel large enough FFT wins (``python -m minidl.bench conv`` finds the crossover).
Extra memory: the spectra, (N C + F C + N F) * Hs * (Ws // 2 + 1) complex numbers.

Restrictions: none (every stride, padding, kernel); precision is that of the FFT, an error of
about eps * log2(S) * (size of the sum), larger than im2col's for float32 (see the tests).
"""
from minidl.backend import get_array_module
from minidl.conv.shapes import output_shape, pad


def supports(x_shape, weight_shape, stride, padding):
    return None


def fast_length(n):
    """The smallest length >= n with no prime factor above 5: sizes that pocketFFT / cuFFT do fastest."""
    length = n
    while True:
        rest = length
        for prime in (2, 3, 5):
            while rest % prime == 0:
                rest //= prime
        if rest == 1:
            return length
        length += 1


def transform_size(padded_h, padded_w):
    """(Hs, Ws): the FFT size used for a padded input of (padded_h, padded_w)."""
    return fast_length(padded_h), fast_length(padded_w)


def _spectrum(xp, a, size):
    """rfft2 over the last two axes, zero-padded to ``size``, laid out frequency-first: (freqs, A, B)."""
    a_hat = xp.fft.rfft2(a, s=size)                       # (A, B, Hs, Ws//2+1)
    rows, cols = a_hat.shape[:2]
    return a_hat.reshape(rows, cols, -1).transpose(2, 0, 1)


def _to_space(xp, product_hat, size, shape_2d, crop, dtype):
    """(freqs, A, B) spectrum -> (A, B, crop_h, crop_w) real array: irfft2 and crop the top-left corner."""
    freqs, rows, cols = product_hat.shape
    spectrum = product_hat.transpose(1, 2, 0).reshape(rows, cols, *shape_2d)
    space = xp.fft.irfft2(spectrum, s=size)
    return space[:, :, :crop[0], :crop[1]].astype(dtype, copy=False)


def forward(x, weight, stride, padding):
    """conv2d of x (N, C, H, W) with weight (F, C, kh, kw) as a product of spectra; returns (out, cache)."""
    xp = get_array_module(x)
    n, c = x.shape[:2]
    _, f, out_h, out_w = output_shape(x.shape, weight.shape, stride, padding)
    kh, kw = weight.shape[2:]
    x_pad = pad(x, padding)
    size = transform_size(*x_pad.shape[2:])
    spectrum_shape = (size[0], size[1] // 2 + 1)
    full_h, full_w = x_pad.shape[2] - kh + 1, x_pad.shape[3] - kw + 1   # the stride-1 output

    # BEGIN SOLUTION
    # transform every input plane and every kernel once, to the common size
    x_hat = _spectrum(xp, x_pad, size)                               # (freqs, N, C)
    weight_hat = xp.conj(_spectrum(xp, weight, size)).transpose(0, 2, 1)   # (freqs, C, F), conjugated
    # at each frequency, the sum over channels is one small complex matrix product
    out_hat = xp.matmul(x_hat, weight_hat)                           # (freqs, N, C) @ (freqs, C, F)
    # back to space, crop the valid stride-1 output, keep every stride-th row and column
    out_full = _to_space(xp, out_hat, size, spectrum_shape, (full_h, full_w), x.dtype)
    out = out_full[:, :, ::stride, ::stride]
    # END SOLUTION
    assert out.shape[2:] == (out_h, out_w)
    cache = {"x_hat": x_hat, "weight_hat": weight_hat, "size": size, "x_shape": x.shape,
             "weight_shape": weight.shape, "padded_shape": x_pad.shape, "full_shape": (full_h, full_w),
             "stride": stride, "padding": padding, "dtype": x.dtype}
    return xp.ascontiguousarray(out), cache


def backward(grad_out, cache, need_x=True, need_weight=True):
    xp = get_array_module(grad_out)
    size, stride, padding, dtype = cache["size"], cache["stride"], cache["padding"], cache["dtype"]
    n, f = grad_out.shape[:2]
    _, _, kh, kw = cache["weight_shape"]
    spectrum_shape = (size[0], size[1] // 2 + 1)

    # the stride-1 gradient: grad_out where an output was kept, zero where the stride skipped it
    grad_full = xp.zeros((n, f, *cache["full_shape"]), dtype=grad_out.dtype)
    grad_full[:, :, ::stride, ::stride] = grad_out
    grad_hat = _spectrum(xp, grad_full, size)                        # (freqs, N, F)

    grad_x = grad_weight = None
    if need_x:
        # full convolution of grad with the kernel: multiply by weight_hat (un-conjugated)
        grad_x_hat = xp.matmul(grad_hat, xp.conj(cache["weight_hat"]).transpose(0, 2, 1))   # (freqs, N, C)
        grad_x_pad = _to_space(xp, grad_x_hat, size, spectrum_shape, cache["padded_shape"][2:], dtype)
        h, w = cache["x_shape"][2:]
        grad_x = grad_x_pad[:, :, padding:padding + h, padding:padding + w]
    if need_weight:
        # correlation of x with grad, summed over the batch: conj(grad_hat).T @ x_hat
        grad_weight_hat = xp.matmul(xp.conj(grad_hat).transpose(0, 2, 1), cache["x_hat"])   # (freqs, F, C)
        grad_weight = _to_space(xp, grad_weight_hat, size, spectrum_shape, (kh, kw), dtype)
    return grad_x, grad_weight
