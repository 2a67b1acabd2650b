"""im2col with the batch as the innermost axis: every copy and every add runs along long contiguous rows.

The same three products as the textbook algorithm (``im2col.py``), on a different layout of the
columns. There the columns are stored (C, kh, kw, N, Ho, Wo): the copy for one kernel offset
(i, j) moves rows of Wo pixels, and col2im adds rows of Wo pixels back; NumPy spends a few
nanoseconds on every row of a strided operation, and a layer with small images (LeNet's conv2,
Wo = 10) spends more time on rows than on elements. Here the input is first transposed to
(C, Hp, Wp, N), the batch innermost, and the columns are stored (C, kh, kw, Ho, Wo, N):

    x_t[c, h, w, n]                    = x_pad[n, c, h, w]                       (one transposing copy)
    cols[c, i, j, ho, wo, n]           = x_t[c, ho*s + i, wo*s + j, n]           (kh*kw copies)
    out_t   (F, Ho*Wo*N)               = weight_2d (F, C*kh*kw) @ cols (C*kh*kw, Ho*Wo*N)
    grad_t  (F, Ho*Wo*N)               = grad_out transposed alike               (one transposing copy)
    grad_weight_2d (C*kh*kw, F)        = cols @ grad_t.T
    grad_cols (C*kh*kw, Ho*Wo*N)       = weight_2d.T @ grad_t
    grad_x_t[c, ho*s + i, wo*s + j, n] += grad_cols[c, i, j, ho, wo, n]          (col2im: kh + kw adds)

For stride 1 one kernel offset's copy is C*Ho rows of Wo*N contiguous numbers (1280 for LeNet's
conv2 at 128 images) instead of C*N*Ho rows of Wo, and col2im's adds run as long; all three GEMMs
read contiguous operands. The price is four transposing copies of the input, output and their gradients
(N*C*H*W and N*F*Ho*Wo numbers, no kh*kw factor).

The batch runs in blocks of images (``blocks``, chosen by ``im2col_blocked.image_blocks`` to fit
the cache), so that a block's columns are still in cache when its GEMM reads them; every block's
columns go into one buffer for the whole batch, kept from forward to backward (the layer takes
this path only when they fit the column budget, ``im2col_blocked.kept_layout``), so backward
rebuilds nothing. Each block is a contiguous (C*kh*kw, Ho*Wo*nb) matrix of that buffer. Every sum
runs in a fixed order (one GEMM per block, the blocks' weight gradients added in block order,
col2im over kernel rows, then columns), so the same input and blocks give the same bits; they are
not the bits of the other layout (BLAS cuts a product's sums its own way), only equal to rounding
(tests/test_conv_layouts.py).

Multiplications: N * F * C*kh*kw * Ho*Wo (as direct). Extra memory: the columns, N * C*kh*kw *
Ho*Wo numbers, kept until backward, plus the transposed copies.
"""
from minidl.backend import get_array_module
from minidl.conv.scratch import workspace
from minidl.conv.shapes import output_size


def _window(a, i, j, stride, out_h, out_w):
    """a[:, i + stride*ho, j + stride*wo, :] for all ho < out_h, wo < out_w:
    a (C, Ho, Wo, N) strided view of (C, Hp, Wp, N)."""
    return a[:, i:i + stride * (out_h - 1) + 1:stride, j:j + stride * (out_w - 1) + 1:stride, :]


def batch_last(x, padding):
    """x (N, C, H, W) -> x_t (C, H + 2 padding, W + 2 padding, N): zero-padded, the batch innermost."""
    xp = get_array_module(x)
    n, c, h, w = x.shape
    x_t = workspace(xp, (c, h + 2 * padding, w + 2 * padding, n), x.dtype, zero=bool(padding))
    x_t[:, padding:padding + h, padding:padding + w, :] = x.transpose(1, 2, 3, 0)
    return x_t


def columns(x_t, kh, kw, stride, out_h, out_w, out):
    """x_t (C, Hp, Wp, N) -> out (C*kh*kw, Ho*Wo*N), stored (C, kh, kw, Ho, Wo, N)."""
    c, n = x_t.shape[0], x_t.shape[3]
    cols = out.reshape(c, kh, kw, out_h, out_w, n)
    for i in range(kh):            # one copy per kernel offset: C*Ho rows of Wo*N numbers (stride 1)
        for j in range(kw):
            cols[:, i, j] = _window(x_t, i, j, stride, out_h, out_w)
    return out


def col2im(grad_cols, padded_t_shape, kh, kw, stride, out_h, out_w):
    """The adjoint of ``columns``: grad_cols (C*kh*kw, Ho*Wo*N) added back onto a zeroed (C, Hp, Wp, N).

    In two passes of adds, kh + kw in all instead of kh*kw: first down the rows, every kernel row i
    at once for all j (into rows[c, j, h, wo, n], runs of Wo*N numbers, a whole (Ho, Wo*N) plane for
    stride 1), then across, every kernel column j (runs of Wo*N). The same sums in a fixed order
    (over i, then over j), so the same bits every time; on LeNet's conv2 1.8x faster than kh*kw
    adds of one offset each."""
    xp = get_array_module(grad_cols)
    c, height, n = padded_t_shape[0], padded_t_shape[1], padded_t_shape[3]
    grad_cols = grad_cols.reshape(c, kh, kw, out_h, out_w * n)
    rows = workspace(xp, (c, kw, height, out_w * n), grad_cols.dtype, zero=True)
    for i in range(kh):            # down: kernel row i lands on padded rows i + stride*ho
        rows[:, :, i:i + stride * (out_h - 1) + 1:stride] += grad_cols[:, i]
    rows = rows.reshape(c, kw, height, out_w, n)
    grad_t = workspace(xp, padded_t_shape, grad_cols.dtype, zero=True)
    for j in range(kw):            # across: kernel column j lands on padded columns j + stride*wo
        grad_t[:, :, j:j + stride * (out_w - 1) + 1:stride, :] += rows[:, j]
    return grad_t


def forward(x, weight, stride, padding, blocks=None):
    """(out, cache); ``blocks``: [(start, stop)] images whose columns are built and multiplied together
    (default: the whole batch). Every block's columns go into ONE buffer for the batch, kept for backward."""
    xp = get_array_module(x)
    n, c, h, w = x.shape
    f, _, kh, kw = weight.shape
    out_h, out_w = output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)
    blocks = blocks or [(0, n)]
    rows, per_image = c * kh * kw, c * kh * kw * out_h * out_w
    kept = workspace(xp, (n * per_image,), x.dtype)                      # block after block, each (CKK, HoWo nb)
    out = xp.empty((n, f, out_h, out_w), dtype=xp.result_type(weight, x))
    for start, stop in blocks:
        images = stop - start
        x_t = batch_last(x[start:stop], padding)
        cols = columns(x_t, kh, kw, stride, out_h, out_w,
                       kept[start * per_image:stop * per_image].reshape(rows, out_h * out_w * images))
        out_t = xp.matmul(weight.reshape(f, rows), cols,                  # (F, CKK) @ (CKK, HoWo nb)
                          out=workspace(xp, (f, out_h * out_w * images), out.dtype))
        out[start:stop] = out_t.reshape(f, out_h, out_w, images).transpose(3, 0, 1, 2)
    return out, {"weight": weight, "x_shape": x.shape, "stride": stride, "padding": padding, "kept": kept,
                 "blocks": blocks, "layout": "batch inner"}


def backward(grad_out, cache, need_x=True, need_weight=True):
    """Block by block: the output gradient transposed, the weight gradient's GEMM on the kept columns
    (summed over blocks in block order), then grad_x by GEMM + col2im while the block is in cache."""
    xp = get_array_module(grad_out)
    weight, stride, padding, kept = cache["weight"], cache["stride"], cache["padding"], cache["kept"]
    f, c, kh, kw = weight.shape
    n, _, out_h, out_w = grad_out.shape
    h, w = cache["x_shape"][2:]
    rows, per_image = c * kh * kw, c * kh * kw * out_h * out_w
    dtype = xp.result_type(weight, grad_out)
    grad_x = xp.empty(cache["x_shape"], dtype=dtype) if need_x else None
    grad_weight_2d = None
    for start, stop in cache["blocks"]:
        images = stop - start
        grad_t = workspace(xp, (f, out_h, out_w, images), grad_out.dtype)
        grad_t[...] = grad_out[start:stop].transpose(1, 2, 3, 0)
        grad_t = grad_t.reshape(f, out_h * out_w * images)
        if need_weight:                                                   # (CKK, HoWo nb) @ (HoWo nb, F)
            cols = kept[start * per_image:stop * per_image].reshape(rows, out_h * out_w * images)
            block = xp.matmul(cols, grad_t.T)
            grad_weight_2d = block if grad_weight_2d is None else xp.add(grad_weight_2d, block, out=grad_weight_2d)
        if need_x:
            grad_cols = xp.matmul(weight.reshape(f, rows).T, grad_t,     # (CKK, F) @ (F, HoWo nb)
                                  out=workspace(xp, (rows, out_h * out_w * images), dtype))
            padded_t = (c, h + 2 * padding, w + 2 * padding, images)
            grad_x_t = col2im(grad_cols, padded_t, kh, kw, stride, out_h, out_w)
            grad_x[start:stop] = grad_x_t[:, padding:padding + h, padding:padding + w, :].transpose(3, 0, 1, 2)
    grad_weight = None if grad_weight_2d is None else xp.ascontiguousarray(grad_weight_2d.T).reshape(weight.shape)
    return grad_x, grad_weight
