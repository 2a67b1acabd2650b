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

Blocks of images (``image_blocks``, below the two copies): when a whole batch's columns would
outgrow the caches (tens of MB), the same three products run on a few images at a time, so that
each block's columns are still in cache when its GEMM reads them; the backward pass rebuilds each
block's columns instead of keeping the batch's, and sums the blocks' weight gradients. A batch
whose columns fit in BLOCK_BYTES is one block: the algorithm above, unchanged.

Multiplications: N * F * C*kh*kw * Ho*Wo (as direct). Extra memory: the column buffer,
N * C*kh*kw * Ho*Wo elements (kh*kw times the input for stride 1), or one block's of it.
Supports every case.
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


# ---- blocks of images: the same products, a few images at a time --------------------------------
BLOCK_BYTES = 6 << 20


def image_blocks(x_shape, weight_shape, stride, padding, itemsize):
    """[(start, stop)]: the batch cut into blocks whose columns take at most about BLOCK_BYTES.

    Why: a whole batch's columns can be far larger than the processor's caches (75 MB for 32
    images of 64 channels at 32x32, 3x3), and then im2col writes them to memory and the GEMM
    reads them back from it: the layer runs at memory speed (``python -m minidl.bench`` shows
    its stages). A block's columns (about 8 MB: 3 such images) stay in cache between the copy
    and the product. The batch stays ONE block, and the layer the textbook algorithm above bit
    for bit, whenever all its columns fit (every layer of LeNet-5 and the small CNN does).
    """
    n, c, h, w = x_shape
    f, _, kh, kw = weight_shape
    per_image = c * kh * kw * output_size(h, kh, stride, padding) * output_size(w, kw, stride, padding) * itemsize
    images = max(1, BLOCK_BYTES // max(per_image, 1))
    return [(start, min(start + images, n)) for start in range(0, n, images)] or [(0, 0)]


def _columns(x, kh, kw, stride, padding, out_h, out_w):
    """Zero-pad x (N, C, H, W) and copy out its columns: (C*kh*kw, N*Ho*Wo), the stored order."""
    xp = get_array_module(x)
    n, c, h, w = x.shape
    x_pad = x
    if padding:
        x_pad = workspace(xp, (n, c, h + 2 * padding, w + 2 * padding), x.dtype, zero=True)
        x_pad[:, :, padding:padding + h, padding:padding + w] = x
    cols = im2col(x_pad, kh, kw, stride, out_h, out_w).transpose(1, 2, 3, 0, 4, 5)   # back to the stored order
    return cols.reshape(c * kh * kw, n * out_h * out_w), x_pad.shape                  # a view, no copy


def _forward_block(x, weight, stride, padding, out):
    """out (N, F, Ho, Wo) <- the convolution of x; returns the columns it used and the padded shape."""
    xp = get_array_module(x)
    n = x.shape[0]
    f, c, kh, kw = weight.shape
    out_h, out_w = out.shape[2:]
    cols, padded_shape = _columns(x, kh, kw, stride, padding, out_h, out_w)
    out_2d = xp.matmul(weight.reshape(f, c * kh * kw), cols,          # (F, CKK) @ (CKK, N HoWo)
                       out=workspace(xp, (f, n * out_h * out_w), out.dtype))
    out[...] = out_2d.reshape(f, n, out_h, out_w).transpose(1, 0, 2, 3)
    return cols, padded_shape


def forward(x, weight, stride, padding):
    xp = get_array_module(x)
    n, c, h, w = x.shape
    f, _, kh, kw = weight.shape
    out_h, out_w = output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)
    out = xp.empty((n, f, out_h, out_w), dtype=xp.result_type(weight, x))
    blocks = image_blocks(x.shape, weight.shape, stride, padding, x.dtype.itemsize)
    cache = {"weight": weight, "x_shape": x.shape, "stride": stride, "padding": padding, "blocks": blocks}
    if len(blocks) == 1:                       # one block: keep the columns for the weight gradient
        cache["cols"], cache["padded_shape"] = _forward_block(x, weight, stride, padding, out)
    else:                                      # several: keep x and rebuild each block's columns in backward
        for start, stop in blocks:
            _forward_block(x[start:stop], weight, stride, padding, out[start:stop])
        cache["x"] = x
    return out, cache


def _gradient_2d(grad_out):
    """grad_out (N, F, Ho, Wo) as the (F, N*Ho*Wo) matrix the products need (a transposing copy)."""
    xp = get_array_module(grad_out)
    n, f, out_h, out_w = grad_out.shape
    grad_2d = workspace(xp, (f, n, out_h, out_w), grad_out.dtype)
    grad_2d[...] = grad_out.transpose(1, 0, 2, 3)
    return grad_2d.reshape(f, n * out_h * out_w)


def _weight_gradient_block(cols, grad_2d, weight_shape):
    # (CKK, N HoWo) @ (N HoWo, F), then the small (CKK, F) result transposed: the same product as
    # grad_2d @ cols.T, but in the order OpenBLAS runs 20-40% faster for these skinny shapes
    # (cols is read along its rows; python -m minidl.bench breakdown shows the GEMM's rate)
    return get_array_module(cols).matmul(cols, grad_2d.T).T.reshape(weight_shape)


def _input_gradient_block(grad_out, grad_2d, weight, padded_shape, stride, padding, x_shape):
    """grad_x of one block by GEMM + col2im: (CKK, F) @ (F, N HoWo), then the columns added back."""
    xp = get_array_module(grad_2d)
    f, c, kh, kw = weight.shape
    n, out_h, out_w = grad_out.shape[0], grad_out.shape[2], grad_out.shape[3]
    h, w = x_shape[2:]
    if stride == 1:
        return _col2im_planes(grad_out, weight, padded_shape, padding)
    grad_cols = xp.matmul(weight.reshape(f, c * kh * kw).T, grad_2d,
                          out=workspace(xp, (c * kh * kw, n * out_h * out_w), xp.result_type(weight, grad_2d)))
    grad_cols = grad_cols.reshape(c, kh, kw, n, out_h, out_w).transpose(3, 0, 1, 2, 4, 5)
    grad_x_pad = col2im(grad_cols, padded_shape, stride)
    return grad_x_pad[:, :, padding:padding + h, padding:padding + w]


def _col2im_planes(grad_out, weight, padded_shape, padding):
    """GEMM + col2im for stride 1, with every image's columns as long as its padded input plane.

    The fast path beside ``col2im`` (the same sums in the same order, the same bits). col2im adds
    each kernel offset's columns back with a strided ``+=``, and numpy spends about 50 ns on every
    row of a strided operation: LeNet's second layer has rows of Wo = 10 pixels. For stride 1,
    give each image's output gradient the shape of its padded input, (Hp, Wp), with zeros outside
    the (Ho, Wo) corner, before the GEMM. Then the columns of kernel offset (i, j) are the padded
    planes of every channel and image laid end to end, shifted by i*Wp + j, and col2im is kh*kw
    adds of ONE contiguous run each (about 5x faster per element than strided rows). A non-zero
    column (ho, wo) lands on pixel (ho + i, wo + j), inside its own plane; zero columns may run
    on into the next plane and add exact zeros there, which change nothing.
    Price: the GEMM computes Hp*Wp columns per image instead of Ho*Wo (1.96x for LeNet's conv2;
    the extra ones are weights times zeros). On LeNet's conv2 the layer's forward and backward
    take 2.6 ms instead of 2.85 (python -m minidl.bench, "lenet conv2").
    Returns grad_x (N, C, H, W).
    """
    xp = get_array_module(grad_out)
    f, c, kh, kw = weight.shape
    n, _, out_h, out_w = grad_out.shape
    height, width = padded_shape[2:]
    length = c * n * height * width                                          # every plane, end to end
    dtype = xp.result_type(weight, grad_out)
    grad_planes = workspace(xp, (f, n, height, width), grad_out.dtype, zero=True)           # (F, N, Hp, Wp)
    grad_planes[:, :, :out_h, :out_w] = grad_out.transpose(1, 0, 2, 3)
    weight_rows = xp.ascontiguousarray(weight.transpose(2, 3, 1, 0)).reshape(kh * kw * c, f)   # rows (i, j, c)
    cols = xp.matmul(weight_rows, grad_planes.reshape(f, -1),
                     out=workspace(xp, (kh * kw * c, n * height * width), dtype)).reshape(kh, kw, length)
    planes = workspace(xp, (c, n, height, width), dtype, zero=True)
    flat = planes.reshape(length)
    for i in range(kh):
        for j in range(kw):
            shift = i * width + j
            flat[shift:] += cols[i, j, :length - shift]
    return planes[:, :, padding:height - padding, padding:width - padding].transpose(1, 0, 2, 3)


def _gradients_from_output_columns(grad_out, x, weight, padding, blocks, need_weight):
    """(grad_x, grad_weight) for stride 1 in blocks, both from each block's output-gradient columns.

    grad_x is the "full" convolution of grad_out with the flipped kernel (see
    _input_gradient_as_convolution), whose columns are gcols[(f, i', j'), (n, h, w)] =
    grad_pad[n, f, h + i', w + j'], grad_pad being grad_out padded by k - 1 - padding. The weight
    gradient needs the same numbers (substitute h = ho + i - padding in its definition):

        grad_weight[f, c, i, j] = sum_{n, h, w} x[n, c, h, w] grad_pad[n, f, h + k-1-i, w + k-1-j]
                                = (gcols @ x_2d.T)[(f, k-1-i, k-1-j), c]      x_2d: x as (C, N*H*W)

    so each block needs one im2col (of its output gradient) for both products, not a second one
    that rebuilds x's columns. The blocks' weight gradients are summed in block order.
    """
    xp = get_array_module(grad_out)
    f, c, kh, kw = weight.shape
    n, _, h, w = x.shape
    dtype = xp.result_type(weight, grad_out)
    flipped = xp.ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)).reshape(c, f * kh * kw)
    grad_x = xp.empty(x.shape, dtype=dtype)
    grad_flipped = xp.zeros((f * kh * kw, c), dtype=dtype) if need_weight else None
    for start, stop in blocks:
        images = stop - start
        gcols, _ = _columns(grad_out[start:stop], kh, kw, 1, kh - 1 - padding, h, w)     # (F kh kw, nb H W)
        grad_2d = xp.matmul(flipped, gcols, out=workspace(xp, (c, images * h * w), dtype))   # (C, nb H W)
        grad_x[start:stop] = grad_2d.reshape(c, images, h, w).transpose(1, 0, 2, 3)
        if need_weight:
            x_2d = workspace(xp, (c, images, h, w), x.dtype)
            x_2d[...] = x[start:stop].transpose(1, 0, 2, 3)
            grad_flipped += xp.matmul(gcols, x_2d.reshape(c, images * h * w).T)             # (F kh kw, C)
    grad_weight = None
    if need_weight:
        grad_weight = xp.ascontiguousarray(grad_flipped.reshape(f, kh, kw, c)[:, ::-1, ::-1].transpose(0, 3, 1, 2))
    return grad_x, grad_weight


def backward(grad_out, cache, need_x=True, need_weight=True):
    xp = get_array_module(grad_out)
    weight, stride, padding, blocks = cache["weight"], cache["stride"], cache["padding"], cache["blocks"]
    f, c, kh, kw = weight.shape
    out_h, out_w = grad_out.shape[2:]
    as_convolution = _input_gradient_as_convolution(weight.shape, stride, padding)
    grad_weight = grad_x = None
    if len(blocks) == 1:
        grad_2d = _gradient_2d(grad_out)
        if need_weight:
            grad_weight = _weight_gradient_block(cache["cols"], grad_2d, weight.shape)
        if need_x and not as_convolution:
            grad_x = _input_gradient_block(grad_out, grad_2d, weight, cache["padded_shape"], stride, padding,
                                           cache["x_shape"])
    elif need_x and as_convolution:            # one im2col per block serves both gradients
        return _gradients_from_output_columns(grad_out, cache["x"], weight, padding, blocks, need_weight)
    else:
        x = cache["x"]
        if need_x and not as_convolution:
            grad_x = xp.empty(cache["x_shape"], dtype=xp.result_type(weight, grad_out))
        for start, stop in blocks:             # each block's columns rebuilt while they are in cache
            grad_2d = _gradient_2d(grad_out[start:stop])
            if need_weight:
                cols, _ = _columns(x[start:stop], kh, kw, stride, padding, out_h, out_w)
                block = _weight_gradient_block(cols, grad_2d, weight.shape)
                grad_weight = block.copy() if grad_weight is None else grad_weight + block
            if need_x and not as_convolution:
                padded = (stop - start, c) + tuple(s + 2 * padding for s in x.shape[2:])
                grad_x[start:stop] = _input_gradient_block(grad_out[start:stop], grad_2d, weight, padded, stride,
                                                            padding, x.shape)
    if need_x and as_convolution:
        # flipped[c, f, i, j] = weight[f, c, kh-1-i, kw-1-j]: a "full" convolution of grad_out
        flipped = xp.ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        grad_x, _ = forward(grad_out, flipped, 1, kh - 1 - padding)
    return grad_x, grad_weight
