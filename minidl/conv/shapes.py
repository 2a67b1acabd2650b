"""The shapes of a convolution: the output size and shape, the checks every algorithm shares, zero padding.

    Ho = (H + 2 padding - kh) // stride + 1,   Wo = (W + 2 padding - kw) // stride + 1.
"""
from minidl.backend import get_array_module


def output_size(size, kernel, stride, padding):
    return (size + 2 * padding - kernel) // stride + 1


def output_shape(x_shape, weight_shape, stride, padding):
    """(N, F, Ho, Wo): the output's shape for input (N, C, H, W) and weight (F, C, kh, kw)."""
    (n, _, h, w), (f, _, kh, kw) = x_shape, weight_shape
    return n, f, output_size(h, kh, stride, padding), output_size(w, kw, stride, padding)


def check_shapes(x_shape, weight_shape, stride, padding):
    """Raise ValueError naming both shapes if this convolution is impossible."""
    if len(x_shape) != 4:
        raise ValueError(f"conv2d: input must be (N, C, H, W), got shape {tuple(x_shape)}")
    if len(weight_shape) != 4:
        raise ValueError(f"conv2d: weight must be (F, C, kh, kw), got shape {tuple(weight_shape)}")
    if x_shape[1] != weight_shape[1]:
        raise ValueError(f"conv2d: input shape {tuple(x_shape)} has {x_shape[1]} channels but weight "
                         f"shape {tuple(weight_shape)} expects {weight_shape[1]}")
    if not isinstance(stride, int) or stride < 1:
        raise ValueError(f"conv2d: stride must be an integer >= 1, got {stride!r}")
    if not isinstance(padding, int) or padding < 0:
        raise ValueError(f"conv2d: padding must be an integer >= 0, got {padding!r}")
    height, width = x_shape[2] + 2 * padding, x_shape[3] + 2 * padding
    if weight_shape[2] > height or weight_shape[3] > width:
        raise ValueError(f"conv2d: kernel {tuple(weight_shape[2:])} is larger than the padded input "
                         f"({height}, {width}) from input shape {tuple(x_shape)} and padding {padding}")


def pad(x, padding):
    """Zero-pad the two spatial axes of (N, C, H, W)."""
    if padding == 0:
        return x
    xp = get_array_module(x)
    n, c, h, w = x.shape
    out = xp.zeros((n, c, h + 2 * padding, w + 2 * padding), dtype=x.dtype)
    out[:, :, padding:padding + h, padding:padding + w] = x
    return out
