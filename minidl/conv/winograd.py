"""Winograd minimal filtering F(2x2, 3x3): a 3x3 convolution with 2.25x fewer multiplications.

Lavin & Gray 2016, "Fast Algorithms for Convolutional Neural Networks" (section 4, F(2x2, 3x3));
Ben-Nun & Hoefler 2019 (the "Winograd" way of computing a convolutional layer).

The output is cut into 2x2 tiles. Each needs a 4x4 tile of the padded input (neighbouring input
tiles overlap by 2). Lavin & Gray's formula for one tile, one filter g (3x3), one channel:

    Y = A^T [ (G g G^T)  (.)  (B^T d B) ] A          (.) = elementwise product of 4x4 matrices

with B^T (4x4), G (4x3), A^T (2x4) below. Summing over channels inside the brackets turns the
16 elementwise products into 16 matrix products, one per position (a, b) of the 4x4 tile:

    U = G weight G^T      : (4, 4, F, C)   the transformed filters
    V = B^T tiles B       : (4, 4, C, P)   the transformed input tiles, P = N * tiles per image
    M[a, b] = U[a, b] @ V[a, b]            : (F, C) @ (C, P) -> (F, P)      (16 GEMMs)
    Y = A^T M A           : (2, 2, F, P)   each tile's 2x2 outputs, scattered back to (N, F, Ho, Wo)

Gradients (exact; the transposes ("adjoints") of the same linear maps, in reverse order):

    dM = A dY A^T                      : (4, 4, F, P)   dY = grad_out cut into 2x2 tiles
    dU[a, b] = dM[a, b] @ V[a, b]^T    : (F, P) @ (P, C);   grad_weight = G^T dU G  (3x3)
    dV[a, b] = U[a, b]^T @ dM[a, b]    : (C, F) @ (F, P);   d(tiles) = B dV B^T, added back onto
                                         the input pixels each overlapping tile came from

Layout: the batch axis goes second, (C, N, ...) for input tiles and (F, N, ...) for outputs, so
the 16 products each see one (C, P) matrix with no copy; the transforms are written as sums of
+-1 times strided views (``combine``), one tile axis at a time, straight into the next buffer.
The large buffers come from ``workspace`` (reused between calls rather than allocated afresh).

Arithmetic, with P = N * ceil(Ho/2) * ceil(Wo/2) tiles:
    products  16 F C P multiplications per pass (forward, grad_x and grad_weight alike)
    direct    36 F C P (9 per output pixel, 4 pixels per tile): a ratio of 36 / 16 = 2.25
    transforms: B and A hold only 0 and +-1 (additions only); G's 1/2 costs 12 F C per pass.
Extra memory: the tiles and V (16 C P each), M (16 F P), U (16 F C): for stride 1 about
16/36 of im2col's column buffer per array.

Restrictions: 3x3 kernels and stride 1 only (other shapes raise ValueError via ``supports``);
any padding, any input size (the last tile row/column is zero-extended and cropped).
Precision: the transforms mix values of different sizes, so float32 loses a little more than
im2col (see tests/test_conv_algorithms.py); larger tiles (F(4x4, 3x3)) would lose much more.
"""
from minidl.backend import get_array_module
from minidl.conv.scratch import workspace
from minidl.conv.shapes import output_size

# Lavin & Gray 2016, section 4.1, F(2x2, 3x3)
B_T = [[1, 0, -1, 0],
       [0, 1, 1, 0],
       [0, -1, 1, 0],
       [0, 1, 0, -1]]
G = [[1, 0, 0],
     [0.5, 0.5, 0.5],
     [0.5, -0.5, 0.5],
     [0, 0, 1]]
A_T = [[1, 1, 1, 0],
       [0, 1, -1, -1]]


def supports(x_shape, weight_shape, stride, padding):
    if tuple(weight_shape[2:]) != (3, 3):
        return f"Winograd F(2x2, 3x3) needs a 3x3 kernel, got {tuple(weight_shape[2:])}"
    if stride != 1:
        return f"Winograd F(2x2, 3x3) needs stride 1, got stride {stride}"
    return None


def transposed(matrix):
    return [list(column) for column in zip(*matrix)]


def combine(coefficients, parts, out=None):
    """sum_j coefficients[j] * parts[j] (into ``out``): additions and subtractions where a coefficient is +-1."""
    terms = [(k, part) for k, part in zip(coefficients, parts) if k != 0]
    terms.sort(key=lambda term: term[0] != 1)            # a +1 term first: "a - b", never "-b + a"
    xp = get_array_module(terms[0][1])
    (k0, first), rest = terms[0], terms[1:]
    if k0 == 1 and rest and rest[0][0] in (1, -1):
        k1, second = rest.pop(0)
        out = (xp.add if k1 == 1 else xp.subtract)(first, second, out=out)
    else:
        out = xp.multiply(first, k0, out=out)
    for k, part in rest:
        if k == 1:
            out += part
        elif k == -1:
            out -= part
        else:
            out += k * part
    return out


def transform(matrix, row, column, target):
    """target(a, b) <- (matrix @ tile @ matrix^T)[a, b], for every tile at once, one tile axis at a time.

    ``row(u)`` is row u of every tile (all its columns still there); ``column(r, v)`` is column v of such
    a row; ``target(a, b)`` is the array that receives entry (a, b) of every transformed tile.
    """
    size = len(matrix[0])
    rows = [combine(coefficients, [row(u) for u in range(size)]) for coefficients in matrix]   # matrix @ tile
    for a, tile_row in enumerate(rows):
        for b, coefficients in enumerate(matrix):                                            # ... @ matrix^T
            combine(coefficients, [column(tile_row, v) for v in range(size)], out=target(a, b))


def _tile_counts(out_h, out_w):
    return (out_h + 1) // 2, (out_w + 1) // 2


def forward(x, weight, stride, padding):
    """conv2d of x (N, C, H, W) with 3x3 weight (F, C, 3, 3), stride 1, by F(2x2, 3x3); returns (out, cache)."""
    xp = get_array_module(x)
    n, c, h, w = x.shape
    f = weight.shape[0]
    out_h, out_w = output_size(h, 3, stride, padding), output_size(w, 3, stride, padding)
    tiles_h, tiles_w = _tile_counts(out_h, out_w)
    p = n * tiles_h * tiles_w

    # the padded input, channels first, zero-extended so that the last 4x4 tile is whole
    x_ext = workspace(xp, (c, n, 2 * tiles_h + 2, 2 * tiles_w + 2), x.dtype, zero=True)
    x_ext[:, :, padding:padding + h, padding:padding + w] = x.transpose(1, 0, 2, 3)

    # BEGIN SOLUTION
    # U = G weight G^T: (4, 4, F, C)
    U = xp.empty((4, 4, f, c), dtype=x.dtype)
    transform(G, lambda u: weight[:, :, u, :], lambda r, v: r[..., v], lambda a, b: U[a, b])
    # V = B^T d B for every input tile d = x_ext[:, :, 2i:2i+4, 2j:2j+4]: (4, 4, C, N, th, tw)
    V = workspace(xp, (4, 4, c, n, tiles_h, tiles_w), x.dtype)
    transform(B_T, lambda u: x_ext[:, :, u:u + 2 * tiles_h:2, :],
              lambda r, v: r[..., v:v + 2 * tiles_w:2], lambda a, b: V[a, b])
    # M[a, b] = U[a, b] @ V[a, b]: 16 x (F, C) @ (C, P) -> (16, F, P)
    M = xp.matmul(U.reshape(16, f, c), V.reshape(16, c, p), out=workspace(xp, (16, f, p), x.dtype))
    M = M.reshape(4, 4, f, n, tiles_h, tiles_w)
    # Y = A^T M A: each tile's 2x2 outputs, written to out_fn[:, :, 2i + a, 2j + b]
    out_fn = workspace(xp, (f, n, 2 * tiles_h, 2 * tiles_w), x.dtype)
    transform(A_T, lambda u: M[u], lambda r, v: r[v], lambda a, b: out_fn[:, :, a::2, b::2])
    # END SOLUTION

    out = xp.ascontiguousarray(out_fn[:, :, :out_h, :out_w].transpose(1, 0, 2, 3))
    cache = {"U": U, "V": V, "x_shape": x.shape, "padding": padding}
    return out, cache


def backward(grad_out, cache, need_x=True, need_weight=True):
    """(grad_x, grad_weight) from grad_out (N, F, Ho, Wo): forward's linear maps transposed; None where not needed."""
    xp = get_array_module(grad_out)
    U, V = cache["U"], cache["V"]
    n, f, out_h, out_w = grad_out.shape
    c = V.shape[2]
    tiles_h, tiles_w = _tile_counts(out_h, out_w)
    p = n * tiles_h * tiles_w
    # dY = grad_out cut into 2x2 tiles (zero where the last tile hangs over), channels first
    grad_fn = workspace(xp, (f, n, 2 * tiles_h, 2 * tiles_w), grad_out.dtype, zero=True)
    grad_fn[:, :, :out_h, :out_w] = grad_out.transpose(1, 0, 2, 3)

    # BEGIN SOLUTION
    # dM = A dY A^T: (4, 4, F, P)
    dM = workspace(xp, (4, 4, f, n, tiles_h, tiles_w), grad_out.dtype)
    transform(transposed(A_T), lambda u: grad_fn[:, :, u::2, :], lambda r, v: r[..., v::2],
              lambda a, b: dM[a, b])
    dM = dM.reshape(16, f, p)

    grad_x = grad_weight = None
    if need_weight:
        dU = xp.matmul(dM, V.reshape(16, c, p).transpose(0, 2, 1)).reshape(4, 4, f, c)   # 16 x (F, P) @ (P, C)
        grad_weight = xp.empty((f, c, 3, 3), dtype=grad_out.dtype)
        transform(transposed(G), lambda u: dU[u], lambda r, v: r[v],                      # G^T dU G
                  lambda a, b: grad_weight[:, :, a, b])
    if need_x:
        dV = xp.matmul(U.reshape(16, f, c).transpose(0, 2, 1), dM,                        # 16 x (C, F) @ (F, P)
                       out=workspace(xp, (16, c, p), grad_out.dtype)).reshape(4, 4, c, n, tiles_h, tiles_w)
        d_tiles = workspace(xp, dV.shape, grad_out.dtype)
        transform(transposed(B_T), lambda u: dV[u], lambda r, v: r[v], lambda a, b: d_tiles[a, b])  # B dV B^T
        # add every tile back onto the input pixels it came from (neighbouring tiles overlap by 2)
        grad_ext = workspace(xp, (c, n, 2 * tiles_h + 2, 2 * tiles_w + 2), grad_out.dtype, zero=True)
        for u in range(4):
            for v in range(4):
                grad_ext[:, :, u:u + 2 * tiles_h:2, v:v + 2 * tiles_w:2] += d_tiles[u, v]
        padding = cache["padding"]
        h, w = cache["x_shape"][2:]
        grad_x = xp.ascontiguousarray(grad_ext[:, :, padding:padding + h, padding:padding + w].transpose(1, 0, 2, 3))
    # END SOLUTION
    return grad_x, grad_weight
