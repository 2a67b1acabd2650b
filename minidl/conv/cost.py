"""The arithmetic and memory cost of each convolution algorithm, as a function of the shape.

    cost(algorithm, x_shape, weight_shape, stride, padding) -> dict with
        multiplies          real multiplications of the forward pass
        multiplies_fwd_bwd  forward + grad_x + grad_weight
        extra_elements      elements of the largest buffers the method allocates beyond input and
                            output (im2col's column matrix, Winograd's tiles, FFT's spectra, counted
                            as 2 real numbers per complex one)

Counts are the textbook ones (Ben-Nun & Hoefler 2019; Lavin & Gray 2016, section 4;
Mathieu et al. 2014): multiplications only (additions are about as many), products by 0 and +-1
not counted, FFTs counted as S log2 S real multiplications for a real transform of S points
(half of a complex one's (S/2) log2 S complex multiplications), which is an estimate, not exact.
``python -m minidl.bench conv`` prints this table beside the measured times.
"""
import math

from minidl.conv import winograd as wino
from minidl.conv.fft import transform_size
from minidl.conv.im2col_blocked import image_blocks
from minidl.conv.shapes import output_size


def _shape(x_shape, weight_shape, stride, padding):
    n, c, h, w = x_shape
    f, _, kh, kw = weight_shape
    return n, c, f, kh, kw, output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)


def _transform_multiplies(matrix, tile_columns):
    """Multiplications of ``transform(matrix, tile)`` per tile: entries other than 0 and +-1, both passes."""
    general = sum(1 for row in matrix for k in row if k not in (0, 1, -1))
    return general * tile_columns + general * len(matrix)


def direct(x_shape, weight_shape, stride, padding):
    n, c, f, kh, kw, out_h, out_w = _shape(x_shape, weight_shape, stride, padding)
    products = n * f * c * kh * kw * out_h * out_w
    padded = n * c * (x_shape[2] + 2 * padding) * (x_shape[3] + 2 * padding) if padding else 0
    return {"multiplies": products, "multiplies_fwd_bwd": 3 * products, "extra_elements": padded}


def im2col(x_shape, weight_shape, stride, padding, itemsize=4):
    """The column matrix of the whole batch, or, where the kernel cuts the batch into blocks of
    images (``im2col_blocked.image_blocks``, for ``itemsize``-byte numbers), of one block."""
    n, c, f, kh, kw, out_h, out_w = _shape(x_shape, weight_shape, stride, padding)
    products = n * f * c * kh * kw * out_h * out_w
    start, stop = image_blocks(x_shape, weight_shape, stride, padding, itemsize)[0]
    return {"multiplies": products, "multiplies_fwd_bwd": 3 * products,
            "extra_elements": (stop - start) * c * kh * kw * out_h * out_w}


def winograd(x_shape, weight_shape, stride, padding):
    n, c, f, kh, kw, out_h, out_w = _shape(x_shape, weight_shape, stride, padding)
    tiles_h, tiles_w = (out_h + 1) // 2, (out_w + 1) // 2
    p = n * tiles_h * tiles_w
    weight_transform = _transform_multiplies(wino.G, 3) * f * c                        # G g G^T (B, A: +-1 only)
    grad_weight_transform = _transform_multiplies([list(r) for r in zip(*wino.G)], 4) * f * c   # G^T dU G
    forward = 16 * f * c * p + weight_transform
    extended = n * c * (2 * tiles_h + 2) * (2 * tiles_w + 2)
    return {"multiplies": forward, "multiplies_fwd_bwd": forward + 32 * f * c * p + grad_weight_transform,
            "extra_elements": extended + 16 * c * p + 16 * f * p + 16 * f * c}


def fft(x_shape, weight_shape, stride, padding):
    n, c, f, kh, kw, out_h, out_w = _shape(x_shape, weight_shape, stride, padding)
    size_h, size_w = transform_size(x_shape[2] + 2 * padding, x_shape[3] + 2 * padding)
    points = size_h * size_w
    frequencies = size_h * (size_w // 2 + 1)
    one_fft = points * math.log2(points) if points > 1 else 0
    products = 4 * n * f * c * frequencies                                        # complex multiply-adds
    forward = round((n * c + f * c + n * f) * one_fft) + products
    backward = round((n * f + n * c + f * c) * one_fft) + 2 * products
    return {"multiplies": forward, "multiplies_fwd_bwd": forward + backward,
            "extra_elements": 2 * (n * c + f * c + n * f) * frequencies}


def cost(algorithm, x_shape, weight_shape, stride, padding):
    """The cost dict of ``algorithm`` ('direct', 'im2col', 'winograd' or 'fft') for this shape."""
    functions = {"direct": direct, "im2col": im2col, "winograd": winograd, "fft": fft}
    if algorithm not in functions:
        raise ValueError(f"cost: no cost model for algorithm {algorithm!r}; choose one of {sorted(functions)}")
    return functions[algorithm](tuple(x_shape), tuple(weight_shape), stride, padding)


# ---- work and depth (Ben-Nun & Hoefler 2019, the primer's work-depth model) -------------------
# W counts arithmetic operations: a multiplication and the addition that accumulates it are two
# (so W = 2 * multiplies; the transforms' additions are left out, as in ``cost``). D is the longest
# chain of dependent operations with unbounded processors: one level for a multiplication, and
# ceil(log2 n) levels for a sum of n terms added as a balanced tree. Copies (im2col, padding,
# transposes) are free in this model. A layer's forward + backward is the forward, then the two
# gradients side by side: D = D_forward + max(D_grad_x, D_grad_weight). W / D is the average
# parallelism: how many processors the layer could keep busy on average.

def _sum_depth(terms):
    """Levels of a balanced tree adding ``terms`` numbers (0 for one term)."""
    return math.ceil(math.log2(terms)) if terms > 1 else 0


def _dot_depth(terms):
    """A dot product of length ``terms``: the multiplications (one level), then their sum."""
    return 1 + _sum_depth(terms)


def _transform_depth(matrix):
    """Depth of ``M X M^T`` for a constant matrix M: per side, a multiplication level if an entry is
    not 0 or +-1, and the sum of a row's nonzero terms."""
    general = any(k not in (0, 1, -1) for row in matrix for k in row)
    one_side = int(general) + _sum_depth(max(sum(1 for k in row if k != 0) for row in matrix))
    return 2 * one_side


def _result(work_passes, depth_forward, depth_grad_x, depth_grad_weight):
    work = sum(work_passes)
    depth = depth_forward + max(depth_grad_x, depth_grad_weight)
    return {"work": work, "depth": depth, "parallelism": work / depth, "work_forward": work_passes[0],
            "depth_forward": depth_forward}


def work_depth(algorithm, x_shape, weight_shape, stride, padding):
    """Work W, depth D and average parallelism W / D of forward + both gradients of one conv layer.

    Returns {"work", "depth", "parallelism", "work_forward", "depth_forward"}. W is
    2 * ``cost(...)["multiplies"]`` per pass; D follows the data dependences of minidl's kernels:
      direct, im2col  each output a dot product over C kh kw; grad_x over F kh kw; grad_weight over N Ho Wo
      winograd        the tile transforms (B^T d B, G g G^T side by side), one product, a sum over C,
                      then A^T M A; the gradients the transposed maps, summed over F or over the tiles
      fft             a transform (2-D radix-2: log2 of the points, a multiply and an add per stage),
                      one product, a sum over C (F, N for the gradients), the inverse transform
    """
    n, c, f, kh, kw, out_h, out_w = _shape(x_shape, weight_shape, stride, padding)
    counted = cost(algorithm, x_shape, weight_shape, stride, padding)
    forward = 2 * counted["multiplies"]
    passes = (forward, 2 * counted["multiplies_fwd_bwd"] - forward)
    if algorithm in ("direct", "im2col"):
        return _result(passes, _dot_depth(c * kh * kw), _dot_depth(f * kh * kw), _dot_depth(n * out_h * out_w))
    if algorithm == "winograd":
        tiles = n * ((out_h + 1) // 2) * ((out_w + 1) // 2)
        d_in, d_g, d_out = _transform_depth(wino.B_T), _transform_depth(wino.G), _transform_depth(wino.A_T)
        forward_depth = max(d_in, d_g) + _dot_depth(c) + d_out
        grad_x = d_out + _dot_depth(f) + d_in                          # A dY A^T, U^T dM over F, B dV B^T
        grad_weight = max(d_out, d_in) + _dot_depth(tiles) + d_g       # dM V^T over the tiles, G^T dU G
        return _result(passes, forward_depth, grad_x, grad_weight)
    if algorithm == "fft":
        size_h, size_w = transform_size(x_shape[2] + 2 * padding, x_shape[3] + 2 * padding)
        transform = 2 * _sum_depth(size_h * size_w)                    # log2 S stages, multiply + add each
        return _result(passes, 2 * transform + _dot_depth(c), 2 * transform + _dot_depth(f),
                       2 * transform + _dot_depth(n))
    raise ValueError(f"work_depth: no model for algorithm {algorithm!r}; choose one of direct, im2col, winograd, fft")


def work_depth_linear(batch, in_features, out_features):
    """Work, depth and W / D of a fully connected layer's forward + both gradients (three GEMMs)."""
    gemm = 2 * batch * in_features * out_features
    return _result((gemm, 2 * gemm), _dot_depth(in_features), _dot_depth(out_features), _dot_depth(batch))
