"""Convolution as one matrix product: im2col + GEMM (the default kernel).

Hegde & Usmani 2016, section 4.1; Ben-Nun & Hoefler 2018, section 4.2 ("im2col"). Every
receptive field of the padded input is copied out as a column, so that the convolution becomes

    cols[n]  : (C*kh*kw, Ho*Wo)     column p holds the C x kh x kw window under output pixel p
    out[n]   = weight_2d @ cols[n]  : (F, C*kh*kw) @ (C*kh*kw, Ho*Wo) -> (F, Ho*Wo)

and the backward pass is two more products plus the inverse copy (col2im, adding overlaps):

    grad_weight_2d = sum_n grad_out[n] @ cols[n].T   : (F, Ho*Wo) @ (Ho*Wo, C*kh*kw)
    grad_cols[n]   = weight_2d.T @ grad_out[n]       : (C*kh*kw, F) @ (F, Ho*Wo)

Layout choice: ``cols`` is (N, C, kh, kw, Ho, Wo). im2col fills it one kernel offset (i, j) at a
time with a strided slice of the input, so each copy runs along contiguous output rows of Wo
elements, and col2im is the same loop with ``+=`` (Chainer's approach). Keeping N first lets the
product write (N, F, Ho*Wo), which is already the output layout: no transpose copy afterwards.

Multiplications: N * F * C*kh*kw * Ho*Wo (as direct). Extra memory: the column buffer,
N * C*kh*kw * Ho*Wo elements (kh*kw times the input for stride 1). Supports every case.
"""
from minidl.backend import get_array_module
from minidl.conv import output_size, pad


def supports(x_shape, weight_shape, stride, padding):
    return None


def im2col(x_pad, kh, kw, stride, out_h, out_w):
    """(N, C, Hp, Wp) -> cols (N, C, kh, kw, Ho, Wo) with cols[n, c, i, j, ho, wo] = x_pad[n, c, ho*s + i, wo*s + j]."""
    xp = get_array_module(x_pad)
    n, c = x_pad.shape[:2]
    cols = xp.empty((n, c, kh, kw, out_h, out_w), dtype=x_pad.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = x_pad[:, :, i:i + stride * (out_h - 1) + 1:stride,
                                     j:j + stride * (out_w - 1) + 1:stride]
    return cols


def col2im(cols, padded_shape, stride):
    """The adjoint of im2col: add every column entry back onto the input pixel it came from."""
    xp = get_array_module(cols)
    n, c, kh, kw, out_h, out_w = cols.shape
    x_pad = xp.zeros(padded_shape, dtype=cols.dtype)
    for i in range(kh):
        for j in range(kw):
            x_pad[:, :, i:i + stride * (out_h - 1) + 1:stride,
                  j:j + stride * (out_w - 1) + 1:stride] += cols[:, :, i, j]
    return x_pad


def forward(x, weight, stride, padding):
    xp = get_array_module(x)
    n, c, h, w = x.shape
    f, _, kh, kw = weight.shape
    out_h, out_w = output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)
    x_pad = pad(x, padding)
    cols = im2col(x_pad, kh, kw, stride, out_h, out_w).reshape(n, c * kh * kw, out_h * out_w)
    weight_2d = weight.reshape(f, c * kh * kw)
    out = xp.matmul(weight_2d, cols)                # (F, CKK) @ (N, CKK, HoWo) -> (N, F, HoWo)
    cache = {"cols": cols, "weight": weight, "padded_shape": x_pad.shape, "x_shape": x.shape,
             "stride": stride, "padding": padding}
    return out.reshape(n, f, out_h, out_w), cache


def backward(grad_out, cache, need_x=True, need_weight=True):
    xp = get_array_module(grad_out)
    cols, weight = cache["cols"], cache["weight"]
    n, f, out_h, out_w = grad_out.shape
    _, c, kh, kw = weight.shape
    grad_2d = grad_out.reshape(n, f, out_h * out_w)
    grad_weight = grad_x = None
    if need_weight:
        # sum_n (F, HoWo) @ (HoWo, CKK): one product over the batch laid side by side
        grad_weight = xp.matmul(grad_2d, cols.transpose(0, 2, 1)).sum(axis=0).reshape(weight.shape)
    if need_x:
        grad_cols = xp.matmul(weight.reshape(f, c * kh * kw).T, grad_2d)   # (CKK, F) @ (N, F, HoWo)
        grad_x_pad = col2im(grad_cols.reshape(n, c, kh, kw, out_h, out_w), cache["padded_shape"], cache["stride"])
        padding = cache["padding"]
        h, w = cache["x_shape"][2:]
        grad_x = grad_x_pad[:, :, padding:padding + h, padding:padding + w]
    return grad_x, grad_weight
