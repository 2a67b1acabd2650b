"""Direct convolution: the definition, summed one kernel offset at a time. The readable reference.

    out[n, f, ho, wo] = sum_{c, i, j} weight[f, c, i, j] * x_pad[n, c, ho*stride + i, wo*stride + j]

(Ben-Nun & Hoefler 2019, "direct" convolution.) Looping over the kh*kw kernel offsets
(i, j) and contracting the channel axis for all output pixels at once keeps this obviously the
formula above while staying fast enough to be the test oracle of every other algorithm.

Multiplications: N * F * C * kh * kw * Ho * Wo, the same as im2col; no extra memory beyond the
padded input. Supports every stride, padding and kernel size.
"""
from minidl.backend import get_array_module
from minidl.conv.shapes import output_shape, pad


def supports(x_shape, weight_shape, stride, padding):
    return None


def _window(x_pad, i, j, stride, out_h, out_w):
    """x_pad[:, :, i + stride*ho, j + stride*wo] for all ho < out_h, wo < out_w (a strided view)."""
    return x_pad[:, :, i:i + stride * (out_h - 1) + 1:stride, j:j + stride * (out_w - 1) + 1:stride]


def forward(x, weight, stride, padding):
    xp = get_array_module(x)
    kh, kw = weight.shape[2:]
    out = xp.zeros(output_shape(x.shape, weight.shape, stride, padding), dtype=x.dtype)
    out_h, out_w = out.shape[2:]
    x_pad = pad(x, padding)
    for i in range(kh):
        for j in range(kw):
            # (n, c, ho, wo) x (f, c) -> (n, f, ho, wo)
            out += xp.einsum("nchw,fc->nfhw", _window(x_pad, i, j, stride, out_h, out_w), weight[:, :, i, j])
    return out, {"x_pad": x_pad, "x_shape": x.shape, "weight": weight, "stride": stride, "padding": padding}


def backward(grad_out, cache, need_x=True, need_weight=True):
    xp = get_array_module(grad_out)
    x_pad, weight, stride, padding = cache["x_pad"], cache["weight"], cache["stride"], cache["padding"]
    _, _, kh, kw = weight.shape
    _, _, out_h, out_w = grad_out.shape
    grad_x_pad = xp.zeros_like(x_pad) if need_x else None
    grad_weight = xp.zeros_like(weight) if need_weight else None
    for i in range(kh):
        for j in range(kw):
            if need_weight:
                grad_weight[:, :, i, j] = xp.einsum("nfhw,nchw->fc", grad_out,
                                                    _window(x_pad, i, j, stride, out_h, out_w))
            if need_x:
                _window(grad_x_pad, i, j, stride, out_h, out_w)[...] += xp.einsum(
                    "nfhw,fc->nchw", grad_out, weight[:, :, i, j])
    grad_x = None
    if need_x:
        h, w = cache["x_shape"][2:]
        grad_x = grad_x_pad[:, :, padding:padding + h, padding:padding + w]
    return grad_x, grad_weight
