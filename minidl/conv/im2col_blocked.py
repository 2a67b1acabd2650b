"""The im2col kernel that ``algorithm="im2col"`` runs: im2col.py's products, in blocks of images, fast input gradients.

The textbook algorithm (``im2col.py``: columns, one GEMM, col2im) computes the same numbers; this
kernel reorganises the work in five ways, each for a measured reason, each below with its own
docstring:

0. **Kept columns** (``kept_layout``): on the CPU, when a batch is more than one block (1.) and its
   columns fit the column budget (``budget.py``: ``minidl.conv.set_column_budget`` or the
   environment's MINIDL_CONV_COLUMN_BYTES; 64 MiB unless set), they are built block by block into
   one buffer and kept for backward, which rebuilds none. Where output rows are short, in the
   layout (C, kh, kw, Ho, Wo, N) whose copies and col2im adds run along rows of Wo*N numbers
   (``batch_inner.py``); where the columns have few rows, per image (``per_image.py``). LeNet-5's
   layers at batch 32 to 512 take them.
1. **Blocks of images** (``image_blocks``): when a whole batch's columns would outgrow the caches,
   the same three products run on a few images at a time, so that each block's columns are still
   in cache when its GEMM reads them; beyond the column budget, the backward pass rebuilds each
   block's columns instead of keeping the batch's, and sums the blocks' weight gradients. A batch
   whose columns fit in one block is one block: the textbook algorithm, unchanged, bit for bit (in
   cache the two layouts take about the same time, measured on LeNet's layers at batch 32).
2. **The input gradient as a convolution** (``input_gradient_as_convolution``): for stride 1 and
   F <= C, grad_x is a "full" convolution of grad_out with the flipped kernel, copies instead of
   col2im's ``+=``.
3. **col2im on planes** (``col2im_planes``): for stride 1 otherwise, col2im as kh*kw contiguous adds.
4. **Gradients from output columns** (``gradients_from_output_columns``): in blocks, with 2., one
   im2col of the output gradient serves both gradients.

``input_gradient_path`` names which of them ``backward`` takes for a shape (the benchmark's
breakdown asks it too, so that it times the path the layer runs).

Multiplications: N * F * C*kh*kw * Ho*Wo (as direct). Extra memory: the column buffer,
N * C*kh*kw * Ho*Wo elements (one block, or kept under the budget), or one block's of it. Supports every case.
"""
from minidl import tuning
from minidl.backend import get_array_module
from minidl.conv import batch_inner, budget, per_image
from minidl.conv.budget import column_bytes
from minidl.conv.im2col import columns, forward_block, gradient_2d, input_gradient_by_col2im, weight_gradient, zero_pad
from minidl.conv.scratch import workspace
from minidl.conv.shapes import output_size


def supports(x_shape, weight_shape, stride, padding):
    return None


# ---- 0. kept columns: the batch's columns kept for backward when they fit the column budget ------
def kept_layout(x_shape, weight_shape, stride, padding, itemsize, block_count):
    """Where the CPU layer keeps the columns of all its blocks for backward: "batch inner"
    (``batch_inner.py``), "per image" (``per_image.py``), "im2col order" (im2col.im2col's
    (C, kh, kw, N, Ho, Wo), block after block), or None (one block keeps its own; or none kept).

    Kept: several blocks whose columns together fit the budget (``budget.py``), two images or
    more per block. Where the tuning file (``minidl/tuning.py``) names a layout for this shape and
    batch, measured on this machine by ``python -m minidl.tune``, that one ("blocks": none kept).
    Otherwise: per image where the columns have at most PER_IMAGE_ROWS rows (LeNet's conv1, 25: its
    layer about 2x faster so at batch 32 and 128 on an AMD EPYC; conv2's 150 rows lose), else the rule
    measured on chapter 2's machine: where one image's columns fill a block (the
    64-channel 32x32 layer: 2.3 MB) the blocked path is faster (at batch 16, 28.5 ms against 34
    kept in the batch-inner layout). Batch innermost where output rows are short (Wo < SHORT_ROW:
    LeNet's conv2, 10 pixels): there numpy's per-row cost dominates the copies and col2im's adds,
    and rows of Wo * images are several times faster; LeNet's conv1 (rows of 28) runs 0.5 ms
    faster at batch 256 in im2col's order, which needs no transposes. Layers with F <= C and
    stride 1 (``output columns``) keep none in that order: their backward builds the output
    gradient's columns, which serve both gradients, and rebuilds nothing anyway."""
    per_image = budget.column_bytes(x_shape, weight_shape, stride, padding, itemsize)
    if x_shape[0] * per_image > budget.current() or block_count < 2 or 2 * per_image > BLOCK_BYTES:
        return None
    by_convolution = input_gradient_as_convolution(weight_shape, stride, padding)
    tuned = tuning.layout_for(LAYOUTS, tuning.shape_key(x_shape, weight_shape, stride, padding, itemsize), x_shape[0])
    if tuned is not None:
        return None if tuned == "blocks" or (tuned == "im2col order" and by_convolution) else tuned
    if weight_shape[1] * weight_shape[2] * weight_shape[3] <= PER_IMAGE_ROWS:
        return "per image"
    if output_size(x_shape[3], weight_shape[3], stride, padding) < SHORT_ROW:
        return "batch inner"
    return None if by_convolution else "im2col order"


# ---- 1. blocks of images: the same products, a few images at a time -----------------------------
# twice the per-core L2 cache (sysconf; 1 MiB where it says nothing), unless the tuning file says
BLOCK_BYTES = tuning.ACTIVE.block_bytes
LAYOUTS = tuning.ACTIVE.layouts      # {shape key: [[from_batch, layout], ...]}, measured by python -m minidl.tune
GPU_BLOCK_BYTES = 1 << 30
SHORT_ROW = 16         # output rows shorter than this (pixels) keep their columns batch innermost
PER_IMAGE_ROWS = 32    # columns of at most this many rows (C*kh*kw) are kept per image (per_image.py)


def image_blocks(x_shape, weight_shape, stride, padding, itemsize, block_bytes=None):
    """[(start, stop)]: the batch cut into blocks whose columns take at most about ``block_bytes``
    (default BLOCK_BYTES: the tuning file's, else twice the L2 cache), at least one image each.

    Why: a whole batch's columns can be far larger than the processor's caches (75 MB for 32
    images of 64 channels at 32x32, 3x3), and then im2col writes them to memory and the GEMM
    reads them back from it: the layer runs at memory speed (``python -m minidl.bench`` shows
    its stages). A block's columns stay in cache between the copy and the product. The size was
    measured, not guessed: on a core with 1 MiB of L2 (chapter 2's machine) the 64-channel layer
    at batch 32 ran fastest with one image (2.3 MB of columns) per block (49 ms; 52 with two, 60
    with three), LeNet-5's layers with about 32 images (2-2.5 MB) per block; blocks four times
    larger were 15-50% slower. A batch whose columns fit one block is one block. Another core,
    another cache, another BLAS kernel: ``python -m minidl.tune`` times candidates from half the L2
    cache to eight times it on LeNet-5's layers and the 64-channel layer and writes the fastest to
    the tuning file, which sets BLOCK_BYTES at import.

    On a GPU (CuPy arrays) the budget is GPU_BLOCK_BYTES: there no cache holds a block between
    the copy and the product, and each block costs a dozen kernel launches from Python, so 6 MiB
    blocks left the GPU waiting (chapter 2, section 6, measured 16 blocks for the 64-channel layer
    at batch 32); the whole batch is one block until its columns reach 1 GiB of GPU memory.
    """
    per_image = column_bytes(x_shape, weight_shape, stride, padding, itemsize)
    images = max(1, (BLOCK_BYTES if block_bytes is None else block_bytes) // max(per_image, 1))
    return [(start, min(start + images, x_shape[0])) for start in range(0, x_shape[0], images)] or [(0, 0)]


def forward(x, weight, stride, padding):
    xp = get_array_module(x)
    n, c, h, w = x.shape
    f, _, kh, kw = weight.shape
    out_h, out_w = output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)
    on_gpu = xp.__name__ == "cupy"
    blocks = image_blocks(x.shape, weight.shape, stride, padding, x.dtype.itemsize, GPU_BLOCK_BYTES if on_gpu else None)
    keep = None if on_gpu else kept_layout(x.shape, weight.shape, stride, padding, x.dtype.itemsize, len(blocks))
    if keep in ("batch inner", "per image"):
        return (batch_inner if keep == "batch inner" else per_image).forward(x, weight, stride, padding, blocks)
    out = xp.empty((n, f, out_h, out_w), dtype=xp.result_type(weight, x))
    cache = {"weight": weight, "x_shape": x.shape, "stride": stride, "padding": padding, "blocks": blocks}
    if len(blocks) == 1:                       # one block: keep the columns for the weight gradient
        cache["cols"], cache["padded_shape"] = forward_block(x, weight, stride, padding, out)
        return out, cache
    cache["x"] = x                             # several: keep x and rebuild each block's columns in backward,
    if keep == "im2col order":                 # or keep them all
        cache["kept"] = workspace(xp, (n * column_bytes(x.shape, weight.shape, stride, padding, 1),), x.dtype)
    for index, (start, stop) in enumerate(blocks):
        _forward_block(x[start:stop], weight, stride, padding, out[start:stop], _kept(cache, index, out_h, out_w))
    return out, cache


def _kept(cache, index, out_h, out_w):
    """Block ``index``'s part of the kept columns, (C, kh, kw, nb, Ho, Wo) as im2col.im2col stores them
    (None: none kept)."""
    if "kept" not in cache:
        return None
    start, stop = cache["blocks"][index]
    f, c, kh, kw = cache["weight"].shape
    per_image = c * kh * kw * out_h * out_w
    return cache["kept"][start * per_image:stop * per_image].reshape(c, kh, kw, stop - start, out_h, out_w)


def _forward_block(x, weight, stride, padding, out, kept=None):
    """``im2col.forward_block``, except that the columns go into ``kept`` (when given: a part of the
    batch's kept columns, in im2col.im2col's stored order), and that a block of ONE image needs no
    transposing copy of its output: (F, CKK) @ (CKK, Ho*Wo) is that image's (F, Ho, Wo) already."""
    if kept is None and (len(x) != 1 or not out.flags.c_contiguous):
        return forward_block(x, weight, stride, padding, out)
    xp = get_array_module(x)
    n = len(x)
    f, c, kh, kw = weight.shape
    out_h, out_w = out.shape[2:]
    if kept is None:
        cols, _ = columns(x, kh, kw, stride, padding, out_h, out_w)
    else:
        cols = columns_in_two_passes(zero_pad(x, padding), kh, kw, stride, kept)
    if n == 1 and out.flags.c_contiguous:
        xp.matmul(weight.reshape(f, c * kh * kw), cols, out=out[0].reshape(f, out_h * out_w))
    else:
        out_2d = xp.matmul(weight.reshape(f, c * kh * kw), cols, out=workspace(xp, (f, n * out_h * out_w), out.dtype))
        out[...] = out_2d.reshape(f, n, out_h, out_w).transpose(1, 0, 2, 3)
    return cols, None


def columns_in_two_passes(x_pad, kh, kw, stride, out):
    """im2col.im2col's columns of x_pad (N, C, Hp, Wp), written into ``out`` (C, kh, kw, N, Ho, Wo)
    in kh + kw copies instead of kh*kw: first every kernel column j over all padded rows, then
    every kernel row i, most of them whole (Ho, Wo) planes (30% faster on LeNet's conv1)."""
    c, _, _, n, out_h, out_w = out.shape
    shifted = workspace(get_array_module(x_pad), (kw, c, n, x_pad.shape[2], out_w), x_pad.dtype)
    for j in range(kw):
        shifted[j] = x_pad[:, :, :, j:j + stride * (out_w - 1) + 1:stride].transpose(1, 0, 2, 3)
    for i in range(kh):
        out[:, i] = shifted[:, :, :, i:i + stride * (out_h - 1) + 1:stride].transpose(1, 0, 2, 3, 4)
    return out.reshape(c * kh * kw, n * out_h * out_w)


# ---- 2. the input gradient as a convolution ----------------------------------------------------
def input_gradient_as_convolution(weight_shape, stride, padding):
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


def flipped_weight(weight):
    """flipped[c, f, i, j] = weight[f, c, kh-1-i, kw-1-j]: the kernel of the "full" convolution that gives grad_x."""
    return get_array_module(weight).ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))


def input_gradient_path(weight_shape, stride, padding, block_count):
    """How ``backward`` computes grad_x: "output columns" (4., in blocks), "convolution" (2., one block),
    "planes" (3., stride 1) or "col2im" (the textbook GEMM + col2im, stride > 1)."""
    if input_gradient_as_convolution(weight_shape, stride, padding):
        return "output columns" if block_count > 1 else "convolution"
    return "planes" if stride == 1 else "col2im"


# ---- 3. col2im on whole padded planes (stride 1) --------------------------------------------
def col2im_planes(grad_out, weight, padded_shape, padding):
    """GEMM + col2im for stride 1, with every image's columns as long as its padded input plane.

    The fast path beside ``im2col.col2im`` (the same sums in the same order, the same bits). col2im
    adds each kernel offset's columns back with a strided ``+=``, and numpy spends about 50 ns on every
    row of a strided operation: LeNet's second layer has rows of Wo = 10 pixels. For stride 1,
    give each image's output gradient the shape of its padded input, (Hp, Wp), with zeros outside
    the (Ho, Wo) corner, before the GEMM. Then the columns of kernel offset (i, j) are the padded
    planes of every channel and image laid end to end, shifted by i*Wp + j, and col2im is kh*kw
    adds of ONE contiguous run each (``add_shifted_runs``, about 5x faster per element than strided
    rows). A non-zero column (ho, wo) lands on pixel (ho + i, wo + j), inside its own plane; zero
    columns may run on into the next plane and add exact zeros there, which change nothing.
    Price: the GEMM computes Hp*Wp columns per image instead of Ho*Wo (1.96x for LeNet's conv2;
    the extra ones are weights times zeros). On LeNet's conv2 the layer's forward and backward
    take 2.6 ms instead of 2.85 (python -m minidl.bench, "lenet conv2").
    Returns grad_x (N, C, H, W).
    """
    xp = get_array_module(grad_out)
    f, c, kh, kw = weight.shape
    n, _, out_h, out_w = grad_out.shape
    height, width = padded_shape[2:]
    dtype = xp.result_type(weight, grad_out)
    grad_planes = workspace(xp, (f, n, height, width), grad_out.dtype, zero=True)           # (F, N, Hp, Wp)
    grad_planes[:, :, :out_h, :out_w] = grad_out.transpose(1, 0, 2, 3)
    weight_rows = xp.ascontiguousarray(weight.transpose(2, 3, 1, 0)).reshape(kh * kw * c, f)   # rows (i, j, c)
    cols = xp.matmul(weight_rows, grad_planes.reshape(f, -1),
                     out=workspace(xp, (kh * kw * c, n * height * width), dtype))
    planes = add_shifted_runs(cols.reshape(kh, kw, c * n * height * width), (c, n, height, width))
    return planes[:, :, padding:height - padding, padding:width - padding].transpose(1, 0, 2, 3)


def add_shifted_runs(cols, planes_shape):
    """col2im on planes: cols (kh, kw, C*N*Hp*Wp), each offset's run added at shift i*Wp + j
    -> planes (C, N, Hp, Wp)."""
    xp = get_array_module(cols)
    kh, kw, length = cols.shape
    width = planes_shape[-1]
    planes = workspace(xp, planes_shape, cols.dtype, zero=True)
    flat = planes.reshape(length)                                             # every plane, end to end
    for i in range(kh):
        for j in range(kw):
            shift = i * width + j
            flat[shift:] += cols[i, j, :length - shift]
    return planes


def _input_gradient_block(grad_out, grad_2d, weight, padded_shape, stride, padding, x_shape):
    if stride == 1:
        return col2im_planes(grad_out, weight, padded_shape, padding)
    return input_gradient_by_col2im(grad_out, grad_2d, weight, padded_shape, stride, padding, x_shape)


# ---- 4. both gradients from the output gradient's columns (stride 1, in blocks) ------------------
def gradients_from_output_columns(grad_out, x, weight, padding, blocks, need_weight):
    """(grad_x, grad_weight) for stride 1 in blocks, both from each block's output-gradient columns.

    grad_x is the "full" convolution of grad_out with the flipped kernel (see
    input_gradient_as_convolution), whose columns are gcols[(f, i', j'), (n, h, w)] =
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
    flipped = flipped_weight(weight).reshape(c, f * kh * kw)
    grad_x = xp.empty(x.shape, dtype=dtype)
    grad_flipped = xp.zeros((f * kh * kw, c), dtype=dtype) if need_weight else None
    for start, stop in blocks:
        images = stop - start
        gcols, _ = columns(grad_out[start:stop], kh, kw, 1, kh - 1 - padding, h, w)     # (F kh kw, nb H W)
        if images == 1 and x.flags.c_contiguous:    # one image: (C, H W) is its own layout, no transposing copies
            xp.matmul(flipped, gcols, out=grad_x[start].reshape(c, h * w))
            x_2d = x[start].reshape(c, h * w)
        else:
            grad_2d = xp.matmul(flipped, gcols, out=workspace(xp, (c, images * h * w), dtype))   # (C, nb H W)
            grad_x[start:stop] = grad_2d.reshape(c, images, h, w).transpose(1, 0, 2, 3)
            x_2d = workspace(xp, (c, images, h, w), x.dtype)
            x_2d[...] = x[start:stop].transpose(1, 0, 2, 3)
        if need_weight:
            grad_flipped += xp.matmul(gcols, x_2d.reshape(c, images * h * w).T)             # (F kh kw, C)
    grad_weight = None
    if need_weight:
        grad_weight = xp.ascontiguousarray(grad_flipped.reshape(f, kh, kw, c)[:, ::-1, ::-1].transpose(0, 3, 1, 2))
    return grad_x, grad_weight


def backward(grad_out, cache, need_x=True, need_weight=True):
    if cache.get("layout") in ("batch inner", "per image"):
        return (batch_inner if cache["layout"] == "batch inner" else per_image).backward(grad_out, cache, need_x,
                                                                                          need_weight)
    xp = get_array_module(grad_out)
    weight, stride, padding, blocks = cache["weight"], cache["stride"], cache["padding"], cache["blocks"]
    f, c, kh, kw = weight.shape
    out_h, out_w = grad_out.shape[2:]
    path = input_gradient_path(weight.shape, stride, padding, len(blocks))
    by_col2im = path in ("planes", "col2im")
    grad_weight = grad_x = None
    if len(blocks) == 1:
        grad_2d = gradient_2d(grad_out)
        if need_weight:
            grad_weight = weight_gradient(cache["cols"], grad_2d, weight.shape)
        if need_x and by_col2im:
            grad_x = _input_gradient_block(grad_out, grad_2d, weight, cache["padded_shape"], stride, padding,
                                           cache["x_shape"])
    elif need_x and path == "output columns":  # one im2col per block serves both gradients
        return gradients_from_output_columns(grad_out, cache["x"], weight, padding, blocks, need_weight)
    else:
        x = cache["x"]
        if need_x and by_col2im:
            grad_x = xp.empty(cache["x_shape"], dtype=xp.result_type(weight, grad_out))
        for index, (start, stop) in enumerate(blocks):    # each block's columns kept, or rebuilt while in cache
            grad_2d = gradient_2d(grad_out[start:stop])
            if need_weight and "kept" in cache:
                cols = _kept(cache, index, out_h, out_w).reshape(c * kh * kw, -1)
            elif need_weight:
                cols, _ = columns(x[start:stop], kh, kw, stride, padding, out_h, out_w)
            if need_weight:
                block = weight_gradient(cols, grad_2d, weight.shape)
                grad_weight = block.copy() if grad_weight is None else grad_weight + block
            if need_x and by_col2im:
                padded = (stop - start, c) + tuple(s + 2 * padding for s in x.shape[2:])
                grad_x[start:stop] = _input_gradient_block(grad_out[start:stop], grad_2d, weight, padded, stride,
                                                            padding, x.shape)
    if need_x and path == "convolution":       # a "full" convolution of grad_out with the flipped kernel
        grad_x, _ = forward(grad_out, flipped_weight(weight), 1, kh - 1 - padding)
    return grad_x, grad_weight
