"""Convolution as one matrix product: im2col + GEMM, the textbook algorithm.

Hegde & Usmani 2016, section 4.1; Ben-Nun & Hoefler 2019 ("im2col"). Every
receptive field of the padded input is copied out as a column, so that the convolution becomes
one matrix product for the whole batch:

    cols     : (C*kh*kw, N*Ho*Wo)    column (n, p) holds the C x kh x kw window under output pixel p of image n
    out_2d   = weight_2d @ cols      : (F, C*kh*kw) @ (C*kh*kw, N*Ho*Wo) -> (F, N*Ho*Wo)

and the backward pass is two more products plus the inverse copy (col2im, adding overlaps):

    grad_weight_2d = grad_2d @ cols.T      : (F, N*Ho*Wo) @ (N*Ho*Wo, C*kh*kw)
    grad_cols      = weight_2d.T @ grad_2d : (C*kh*kw, F) @ (F, N*Ho*Wo)

Layout choice: ``cols`` is stored as (C, kh, kw, N, Ho, Wo) (``im2col`` hands back a view indexed
(N, C, kh, kw, Ho, Wo), the textbook order). im2col fills it one kernel offset (i, j) at a
time with a strided slice of the input, so each copy runs along contiguous output rows of Wo
elements, and col2im is the same loop with ``+=`` (Chainer's approach). Putting the batch inside
the columns makes each of the three products ONE large GEMM (the batch is the long side), instead
of N small ones; the price is a transposing copy of the (small) output and output gradient.
The big scratch arrays come from ``workspace`` (reused, not re-allocated every call).

``forward`` and ``backward`` below are this algorithm for the whole batch at once, to read first
and to test against. The kernel that ``algorithm="im2col"`` runs (``im2col_blocked.py``) is built
from the same pieces (``columns``, ``forward_block``, ``gradient_2d``, ``weight_gradient``,
``input_gradient_by_col2im``): it cuts a large batch into blocks of images that fit the caches,
and takes faster ways to the input gradient where the shape allows.

Multiplications: N * F * C*kh*kw * Ho*Wo (as direct). Extra memory: the column buffer,
N * C*kh*kw * Ho*Wo elements (kh*kw times the input for stride 1). Supports every case.
"""
from minidl.backend import get_array_module
from minidl.conv.scratch import workspace
from minidl.conv.shapes import output_size


def supports(x_shape, weight_shape, stride, padding):
    return None


def _window(a, i, j, stride, out_h, out_w):
    """a[:, :, i + stride*ho, j + stride*wo] for all ho < out_h, wo < out_w (a strided view)."""
    return a[:, :, i:i + stride * (out_h - 1) + 1:stride, j:j + stride * (out_w - 1) + 1:stride]


def im2col(x_pad, kh, kw, stride, out_h, out_w):
    """(N, C, Hp, Wp) -> cols (N, C, kh, kw, Ho, Wo) with cols[n, c, i, j, ho, wo] = x_pad[n, c, ho*s + i, wo*s + j].

    Stored batch-inside as (C, kh, kw, N, Ho, Wo) (see the layout note above); what is returned is
    a (N, C, kh, kw, Ho, Wo) view of that buffer, so the index order is the textbook one.
    """
    xp = get_array_module(x_pad)
    n, c = x_pad.shape[:2]
    cols = workspace(xp, (c, kh, kw, n, out_h, out_w), x_pad.dtype)     # the stored order, batch inside
    # BEGIN SOLUTION
    # one strided copy per kernel offset (i, j): every channel, image and output pixel at once
    for i in range(kh):
        for j in range(kw):
            cols[:, i, j] = _window(x_pad, i, j, stride, out_h, out_w).transpose(1, 0, 2, 3)
    # END SOLUTION
    return cols.transpose(3, 0, 1, 2, 4, 5)


def col2im(cols, padded_shape, stride):
    """The adjoint of im2col: add every column entry cols[n, c, i, j, ho, wo] back onto the input pixel it came from."""
    xp = get_array_module(cols)
    n, c, kh, kw, out_h, out_w = cols.shape
    x_pad = workspace(xp, padded_shape, cols.dtype, zero=True)
    # BEGIN SOLUTION
    # im2col's loop with += : windows of neighbouring outputs overlap, so their entries add up
    for i in range(kh):
        for j in range(kw):
            _window(x_pad, i, j, stride, out_h, out_w)[...] += cols[:, :, i, j]
    # END SOLUTION
    return x_pad


# ---- the layer's steps, each one call -----------------------------------------------------------
def zero_pad(x, padding):
    """x (N, C, H, W) inside a zeroed (N, C, H + 2 padding, W + 2 padding) scratch array (x itself if padding is 0)."""
    if not padding:
        return x
    xp = get_array_module(x)
    n, c, h, w = x.shape
    x_pad = workspace(xp, (n, c, h + 2 * padding, w + 2 * padding), x.dtype, zero=True)
    x_pad[:, :, padding:padding + h, padding:padding + w] = x
    return x_pad


def columns(x, kh, kw, stride, padding, out_h, out_w):
    """Zero-pad x (N, C, H, W) and copy out its columns: (C*kh*kw, N*Ho*Wo), the stored order."""
    n, c = x.shape[:2]
    x_pad = zero_pad(x, padding)
    cols = im2col(x_pad, kh, kw, stride, out_h, out_w).transpose(1, 2, 3, 0, 4, 5)   # back to the stored order
    return cols.reshape(c * kh * kw, n * out_h * out_w), x_pad.shape                  # a view, no copy


def forward_block(x, weight, stride, padding, out):
    """out (N, F, Ho, Wo) <- the convolution of x; returns the columns it used and the padded shape."""
    xp = get_array_module(x)
    n = x.shape[0]
    f, c, kh, kw = weight.shape
    out_h, out_w = out.shape[2:]
    cols, padded_shape = columns(x, kh, kw, stride, padding, out_h, out_w)
    out_2d = xp.matmul(weight.reshape(f, c * kh * kw), cols,          # (F, CKK) @ (CKK, N HoWo)
                       out=workspace(xp, (f, n * out_h * out_w), out.dtype))
    out[...] = out_2d.reshape(f, n, out_h, out_w).transpose(1, 0, 2, 3)
    return cols, padded_shape


def gradient_2d(grad_out):
    """grad_out (N, F, Ho, Wo) as the (F, N*Ho*Wo) matrix the products need (a transposing copy)."""
    xp = get_array_module(grad_out)
    n, f, out_h, out_w = grad_out.shape
    grad_2d = workspace(xp, (f, n, out_h, out_w), grad_out.dtype)
    grad_2d[...] = grad_out.transpose(1, 0, 2, 3)
    return grad_2d.reshape(f, n * out_h * out_w)


def weight_gradient(cols, grad_2d, weight_shape):
    """grad_weight (F, C, kh, kw) from the columns and the output gradient's (F, N*Ho*Wo) matrix."""
    # (CKK, N HoWo) @ (N HoWo, F), then the small (CKK, F) result transposed: the same product as
    # grad_2d @ cols.T, but in the order OpenBLAS runs 20-40% faster for these skinny shapes
    # (cols is read along its rows; python -m minidl.bench breakdown shows the GEMM's rate)
    return get_array_module(cols).matmul(cols, grad_2d.T).T.reshape(weight_shape)


def input_gradient_by_col2im(grad_out, grad_2d, weight, padded_shape, stride, padding, x_shape):
    """grad_x by GEMM + col2im: (CKK, F) @ (F, N HoWo), then the columns added back onto the input."""
    xp = get_array_module(grad_2d)
    f, c, kh, kw = weight.shape
    n, out_h, out_w = grad_out.shape[0], grad_out.shape[2], grad_out.shape[3]
    h, w = x_shape[2:]
    grad_cols = xp.matmul(weight.reshape(f, c * kh * kw).T, grad_2d,
                          out=workspace(xp, (c * kh * kw, n * out_h * out_w), xp.result_type(weight, grad_2d)))
    grad_cols = grad_cols.reshape(c, kh, kw, n, out_h, out_w).transpose(3, 0, 1, 2, 4, 5)
    grad_x_pad = col2im(grad_cols, padded_shape, stride)
    return grad_x_pad[:, :, padding:padding + h, padding:padding + w]


# ---- the textbook layer: the whole batch at once ----------------------------------------------
def forward(x, weight, stride, padding):
    xp = get_array_module(x)
    n, c, h, w = x.shape
    f, _, kh, kw = weight.shape
    out = xp.empty((n, f, output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)),
                   dtype=xp.result_type(weight, x))
    cols, padded_shape = forward_block(x, weight, stride, padding, out)
    return out, {"weight": weight, "x_shape": x.shape, "stride": stride, "padding": padding, "cols": cols,
                 "padded_shape": padded_shape}


def backward(grad_out, cache, need_x=True, need_weight=True):
    grad_2d = gradient_2d(grad_out)
    grad_weight = weight_gradient(cache["cols"], grad_2d, cache["weight"].shape) if need_weight else None
    grad_x = None
    if need_x:
        grad_x = input_gradient_by_col2im(grad_out, grad_2d, cache["weight"], cache["padded_shape"], cache["stride"],
                                          cache["padding"], cache["x_shape"])
    return grad_x, grad_weight
