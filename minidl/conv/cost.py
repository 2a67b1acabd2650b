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

from minidl.conv import output_size


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


def im2col(x_shape, weight_shape, stride, padding):
    n, c, f, kh, kw, out_h, out_w = _shape(x_shape, weight_shape, stride, padding)
    products = n * f * c * kh * kw * out_h * out_w
    return {"multiplies": products, "multiplies_fwd_bwd": 3 * products,
            "extra_elements": n * c * kh * kw * out_h * out_w}


def winograd(x_shape, weight_shape, stride, padding):
    from minidl.conv.winograd import G
    n, c, f, kh, kw, out_h, out_w = _shape(x_shape, weight_shape, stride, padding)
    tiles_h, tiles_w = (out_h + 1) // 2, (out_w + 1) // 2
    p = n * tiles_h * tiles_w
    weight_transform = _transform_multiplies(G, 3) * f * c                        # G g G^T (B, A: +-1 only)
    grad_weight_transform = _transform_multiplies([list(r) for r in zip(*G)], 4) * f * c   # G^T dU G
    forward = 16 * f * c * p + weight_transform
    extended = n * c * (2 * tiles_h + 2) * (2 * tiles_w + 2)
    return {"multiplies": forward, "multiplies_fwd_bwd": forward + 32 * f * c * p + grad_weight_transform,
            "extra_elements": extended + 16 * c * p + 16 * f * p + 16 * f * c}


def fft(x_shape, weight_shape, stride, padding):
    from minidl.conv.fft import transform_size
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
