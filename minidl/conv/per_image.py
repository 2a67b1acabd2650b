"""im2col with every image's columns a matrix of its own: the three products batched over images, no transposes.

The same three products as the textbook algorithm (``im2col.py``), image by image, as cs231n's
layers write them. The columns are stored (N, C, kh, kw, Ho, Wo), the order ``im2col.im2col``
hands back, so that image n's columns are one contiguous (C*kh*kw, Ho*Wo) matrix, and
``numpy.matmul`` runs one BLAS product per image:

    out[n]          (F, Ho*Wo)     = weight_2d (F, C*kh*kw) @ cols[n] (C*kh*kw, Ho*Wo)
    grad_weight_2d  (F, C*kh*kw)   = sum over n of grad_out[n] (F, Ho*Wo) @ cols[n].T
    grad_cols[n]    (C*kh*kw, Ho*Wo) = weight_2d.T @ grad_out[n]          then col2im (im2col.col2im)

Why: image n's product IS out[n] in the (N, F, Ho, Wo) order the next layer reads, and grad_out[n]
is already the matrix the backward needs, so the output and its gradient need no transposing
copies (the whole-batch layouts transpose both). Where the columns have few rows (LeNet-5's
conv1: 1 channel, 5x5, 25 rows), those copies cost as much as the products, and the weight
gradient as one product of the whole batch, (25, N*Ho*Wo) @ (N*Ho*Wo, 6), is a product with a
long inner side and a tiny result that OpenBLAS ran at about a third of its rate; as N products
of (6, 784) @ (784, 25) and a sum of N small (6, 25) results, 2.5x faster (batch 128, one core).
For the layer with 150 rows (conv2) the whole-batch layouts stay faster (``im2col_blocked.kept_layout``).

The batch runs in blocks of images (``blocks``, as ``batch_inner.py``), each block's columns
copied and multiplied while in cache, into ONE buffer for the batch that backward reads. Every sum
runs in a fixed order (one product per image, the images' weight gradients added in image order),
so the same input gives the same bits; they are not the bits of the other layouts, only equal to
rounding (tests/test_conv_layouts.py).

Multiplications: N * F * C*kh*kw * Ho*Wo (as direct). Extra memory: the columns, N * C*kh*kw *
Ho*Wo numbers, kept until backward.
"""
from minidl.backend import get_array_module
from minidl.conv.im2col import col2im, zero_pad
from minidl.conv.scratch import workspace
from minidl.conv.shapes import output_size


def forward(x, weight, stride, padding, blocks=None):
    """(out, cache); ``blocks``: [(start, stop)] images whose columns are built and multiplied together
    (default: the whole batch), all into ONE buffer (N, C, kh, kw, Ho, Wo) kept for backward."""
    xp = get_array_module(x)
    n, c, h, w = x.shape
    f, _, kh, kw = weight.shape
    out_h, out_w = output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)
    rows = c * kh * kw
    cols = workspace(xp, (n, c, kh, kw, out_h, out_w), x.dtype)
    out = xp.empty((n, f, out_h, out_w), dtype=xp.result_type(weight, x))
    blocks = blocks or [(0, n)]
    for start, stop in blocks:
        columns_in_two_passes(zero_pad(x[start:stop], padding), kh, kw, stride, cols[start:stop])
        xp.matmul(weight.reshape(f, rows), cols[start:stop].reshape(stop - start, rows, out_h * out_w),
                  out=out[start:stop].reshape(stop - start, f, out_h * out_w))     # (F, CKK) @ (nb, CKK, HoWo)
    return out, {"weight": weight, "x_shape": x.shape, "stride": stride, "padding": padding, "cols": cols,
                 "blocks": blocks, "layout": "per image"}


def columns_in_two_passes(x_pad, kh, kw, stride, out):
    """out (N, C, kh, kw, Ho, Wo)[n, c, i, j, ho, wo] = x_pad[n, c, ho*s + i, wo*s + j], in kh + kw copies instead
    of kh*kw (as ``im2col_blocked.columns_in_two_passes`` for im2col's order): first every kernel column j
    over all padded rows, then every kernel row i, whose (kw, Ho, Wo) lie in runs of Ho*Wo numbers for
    stride 1 where one offset's copy moves rows of Wo (LeNet's conv1: the copies 25-35% faster)."""
    n, c, _, _, out_h, out_w = out.shape
    shifted = workspace(get_array_module(x_pad), (n, c, kw, x_pad.shape[2], out_w), x_pad.dtype)
    for j in range(kw):
        shifted[:, :, j] = x_pad[:, :, :, j:j + stride * (out_w - 1) + 1:stride]
    for i in range(kh):
        out[:, :, i] = shifted[:, :, :, i:i + stride * (out_h - 1) + 1:stride]
    return out


def backward(grad_out, cache, need_x=True, need_weight=True):
    """The weight gradient as one product per image, summed in image order; grad_x by one product
    per image and im2col.col2im."""
    xp = get_array_module(grad_out)
    weight, stride, padding, cols = cache["weight"], cache["stride"], cache["padding"], cache["cols"]
    f, c, kh, kw = weight.shape
    n, _, out_h, out_w = grad_out.shape
    h, w = cache["x_shape"][2:]
    rows = c * kh * kw
    grad = grad_out.reshape(n, f, out_h * out_w)
    grad_weight = grad_x = None
    if need_weight:                # (nb, F, HoWo) @ (nb, HoWo, CKK) -> (nb, F, CKK), summed over the images
        per_image = xp.matmul(grad, cols.reshape(n, rows, out_h * out_w).transpose(0, 2, 1))
        grad_weight = per_image.sum(axis=0).reshape(weight.shape)
    if need_x:                     # (CKK, F) @ (nb, F, HoWo) -> (nb, CKK, HoWo), added back onto the input
        grad_cols = xp.matmul(weight.reshape(f, rows).T, grad,
                              out=workspace(xp, (n, rows, out_h * out_w), xp.result_type(weight, grad_out)))
        padded_shape = (n, c, h + 2 * padding, w + 2 * padding)
        grad_x_pad = col2im(grad_cols.reshape(n, c, kh, kw, out_h, out_w), padded_shape, stride)
        grad_x = grad_x_pad[:, :, padding:padding + h, padding:padding + w]
    return grad_x, grad_weight
