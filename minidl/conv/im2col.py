"""Convolution as one matrix product: im2col + GEMM (the default kernel).

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

Multiplications: N * F * C*kh*kw * Ho*Wo (as direct). Extra memory: the column buffer,
N * C*kh*kw * Ho*Wo elements (kh*kw times the input for stride 1). Supports every case.
"""
from minidl.backend import get_array_module
from minidl.conv import output_size, workspace


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


def _input_gradient_as_convolution(weight_shape, stride, padding):
    """Whether backward computes grad_x as a convolution instead of GEMM + col2im.

    For stride 1, grad_x = conv2d(grad_out, flipped weight, padding = k - 1 - padding): each input
    pixel gathers the output gradients of every window that covered it, which is a correlation of
    grad_out with the kernel turned by 180 degrees and with in/out channels swapped. That trades
    col2im's k*k passes of ``+=`` over the columns (read, add, write) for im2col's plain copies of
    the output gradient. The copies are of F*k*k*N*H*W elements instead of C*k*k*N*Ho*Wo, so
    it pays when F <= C (e.g. 64 -> 64 channels, about 15% of the whole layer's backward), not
    when a layer widens the channels (LeNet's 6 -> 16), where col2im stays.
    """
    f, c, kh, kw = weight_shape
    return stride == 1 and kh == kw and padding <= kh - 1 and f <= c


def forward(x, weight, stride, padding):
    xp = get_array_module(x)
    n, c, h, w = x.shape
    f, _, kh, kw = weight.shape
    out_h, out_w = output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)
    x_pad = x
    if padding:
        x_pad = workspace(xp, (n, c, h + 2 * padding, w + 2 * padding), x.dtype, zero=True)
        x_pad[:, :, padding:padding + h, padding:padding + w] = x
    cols = im2col(x_pad, kh, kw, stride, out_h, out_w).transpose(1, 2, 3, 0, 4, 5)   # back to the stored order
    cols = cols.reshape(c * kh * kw, n * out_h * out_w)                                # a view, no copy
    out_2d = xp.matmul(weight.reshape(f, c * kh * kw), cols,          # (F, CKK) @ (CKK, N HoWo)
                       out=workspace(xp, (f, n * out_h * out_w), xp.result_type(weight, x)))
    out = xp.ascontiguousarray(out_2d.reshape(f, n, out_h, out_w).transpose(1, 0, 2, 3))
    cache = {"cols": cols, "weight": weight, "padded_shape": x_pad.shape, "x_shape": x.shape,
             "stride": stride, "padding": padding}
    return out, cache


def backward(grad_out, cache, need_x=True, need_weight=True):
    xp = get_array_module(grad_out)
    cols, weight = cache["cols"], cache["weight"]
    n, f, out_h, out_w = grad_out.shape
    _, c, kh, kw = weight.shape
    grad_2d = workspace(xp, (f, n, out_h, out_w), grad_out.dtype)
    grad_2d[...] = grad_out.transpose(1, 0, 2, 3)
    grad_2d = grad_2d.reshape(f, n * out_h * out_w)
    grad_weight = grad_x = None
    if need_weight:
        # (CKK, N HoWo) @ (N HoWo, F), then the small (CKK, F) result transposed: the same product as
        # grad_2d @ cols.T, but in the order OpenBLAS runs 20-40% faster for these skinny shapes
        # (cols is read along its rows; python -m minidl.bench breakdown shows the GEMM's rate)
        grad_weight = xp.matmul(cols, grad_2d.T).T.reshape(weight.shape)
    if need_x and _input_gradient_as_convolution(weight.shape, cache["stride"], cache["padding"]):
        # flipped[c, f, i, j] = weight[f, c, kh-1-i, kw-1-j]: a "full" convolution of grad_out
        flipped = xp.ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        grad_x, _ = forward(grad_out, flipped, 1, kh - 1 - cache["padding"])
    elif need_x:
        grad_cols = xp.matmul(weight.reshape(f, c * kh * kw).T, grad_2d,    # (CKK, F) @ (F, N HoWo)
                              out=workspace(xp, (c * kh * kw, n * out_h * out_w), xp.result_type(weight, grad_out)))
        grad_cols = grad_cols.reshape(c, kh, kw, n, out_h, out_w).transpose(3, 0, 1, 2, 4, 5)
        grad_x_pad = col2im(grad_cols, cache["padded_shape"], cache["stride"])
        padding = cache["padding"]
        h, w = cache["x_shape"][2:]
        grad_x = grad_x_pad[:, :, padding:padding + h, padding:padding + w]
    return grad_x, grad_weight
