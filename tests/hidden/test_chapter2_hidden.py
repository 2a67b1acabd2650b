"""Hidden: FFT and Winograd convolution (tasks 2.1-2.3) on shapes the visible tests do not draw.

The visible tests draw square kernels and compare with ``direct``. Here the oracle is an index
loop (forward: tests/helpers.py; both gradients: tests/hidden/conv_oracle.py; any kernel),
and the shapes are the edges of each algorithm: for FFT non-square kernels, strides that skip
the last rows, a kernel as large as the padded input (one output), transform sizes that are not
2-3-5-smooth; for Winograd odd output sizes (the last 2x2 tile hangs over and is cropped), one
output pixel, non-square inputs, batch 1, one channel, paddings 0 to 2, and each gradient asked
for alone. float64 to 1e-11 of the largest entry; float32 must stay float32, to 5e-6.
"""
import numpy as np
import pytest

from minidl import Tensor, functional as F, gradcheck
from minidl.conv import fft, winograd
from tests.helpers import naive_conv2d
from tests.hidden.conv_oracle import naive_conv2d_gradients

FLOAT64_TOL = 1e-11
FLOAT32_TOL = 5e-6


def relative_error(actual, expected):
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1.0))


def arrays(x_shape, weight_shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(weight_shape).astype(dtype)


# ---- 2.1 FFT forward ----------------------------------------------------------------------------

# (x shape, weight shape, stride, padding)
FFT_CASES = [
    ((1, 1, 7, 5), (1, 1, 1, 3), 1, 0),          # a row kernel
    ((2, 2, 6, 9), (3, 2, 4, 1), 1, 1),          # a column kernel, non-square input
    ((1, 3, 11, 7), (2, 3, 2, 5), 2, 0),         # stride 2 skips the last row
    ((2, 1, 8, 8), (1, 1, 3, 2), 3, 2),          # stride 3 with padding
    ((1, 2, 5, 6), (4, 2, 5, 6), 1, 0),          # the kernel is the whole input: one output pixel
    ((1, 1, 4, 3), (2, 1, 6, 5), 1, 1),          # kernel larger than the input, padding makes room
    ((3, 2, 13, 4), (1, 2, 3, 3), 2, 1),         # 15-point transform on one side (not a power of two)
    ((1, 4, 7, 7), (2, 4, 7, 1), 1, 0),
    ((2, 1, 9, 10), (3, 1, 1, 1), 4, 0),         # a 1x1 kernel at stride 4
    ((1, 2, 6, 6), (2, 2, 2, 4), 5, 2),          # stride larger than the kernel
]
FFT_IDS = [f"x{x[2]}x{x[3]}_k{w[2]}x{w[3]}_s{s}_p{p}" for x, w, s, p in FFT_CASES]


@pytest.mark.task("2.1")
@pytest.mark.parametrize("x_shape, weight_shape, stride, padding", FFT_CASES, ids=FFT_IDS)
def test_fft_forward_equals_the_loop_in_float64(x_shape, weight_shape, stride, padding):
    x, weight = arrays(x_shape, weight_shape, np.float64, sum(x_shape) + stride)
    out, _ = fft.forward(x, weight, stride, padding)
    want = naive_conv2d(x, weight, stride, padding)
    assert out.dtype == np.float64 and relative_error(out, want) <= FLOAT64_TOL


@pytest.mark.task("2.1")
@pytest.mark.parametrize("x_shape, weight_shape, stride, padding", FFT_CASES[1::3], ids=FFT_IDS[1::3])
def test_fft_forward_of_float32_is_float32_and_close(x_shape, weight_shape, stride, padding):
    x, weight = arrays(x_shape, weight_shape, np.float32, sum(weight_shape))
    out, _ = fft.forward(x, weight, stride, padding)
    want = naive_conv2d(x.astype(np.float64), weight.astype(np.float64), stride, padding)
    assert out.dtype == np.float32 and out.flags.c_contiguous and relative_error(out, want) <= FLOAT32_TOL


@pytest.mark.task("2.1")
@pytest.mark.parametrize("x_shape, weight_shape, stride, padding", [FFT_CASES[2], FFT_CASES[5]],
                         ids=[FFT_IDS[2], FFT_IDS[5]])
def test_fft_convolution_through_autograd_matches_finite_differences(x_shape, weight_shape, stride, padding):
    # the backward pass (no task) reads the spectra the forward pass leaves in its cache
    x, weight = arrays(x_shape, weight_shape, np.float64, 9)
    bias = np.random.default_rng(10).standard_normal(weight_shape[0])
    leaves = [Tensor(a, requires_grad=True) for a in (x, weight, bias)]
    assert gradcheck(lambda a, b, c: F.conv2d(a, b, c, stride, padding, "fft"), leaves)


# ---- 2.2 Winograd forward, 2.3 Winograd backward --------------------------------------------------

# (x shape, number of filters, padding): Ho, Wo odd or even, one pixel, non-square
WINOGRAD_CASES = [
    ((1, 1, 3, 3), 1, 0),          # one output pixel: a single tile, three of its four outputs cropped
    ((1, 2, 5, 5), 3, 0),          # 3x3 output: the last tile hangs over on both sides
    ((2, 1, 4, 9), 2, 1),          # 4x9 output, non-square
    ((1, 3, 7, 4), 1, 2),          # padding 2: the output is larger than the input
    ((3, 2, 6, 3), 2, 0),          # one output column
    ((1, 1, 10, 7), 4, 1),
    ((2, 3, 3, 8), 1, 1),
    ((1, 5, 6, 6), 2, 0),
    ((1, 2, 1, 1), 3, 1),          # a 1x1 image, padding 1: one output pixel made of the padding's zeros and x
    ((2, 2, 9, 5), 3, 2),
]
WINOGRAD_IDS = [f"n{x[0]}c{x[1]}f{f}_{x[2]}x{x[3]}_p{p}" for x, f, p in WINOGRAD_CASES]


@pytest.mark.task("2.2")
@pytest.mark.parametrize("x_shape, filters, padding", WINOGRAD_CASES, ids=WINOGRAD_IDS)
def test_winograd_forward_equals_the_loop_in_float64(x_shape, filters, padding):
    x, weight = arrays(x_shape, (filters, x_shape[1], 3, 3), np.float64, sum(x_shape) + padding)
    out, _ = winograd.forward(x, weight, 1, padding)
    want = naive_conv2d(x, weight, 1, padding)
    assert out.dtype == np.float64 and relative_error(out, want) <= FLOAT64_TOL


@pytest.mark.task("2.2")
@pytest.mark.parametrize("x_shape, filters, padding", WINOGRAD_CASES[::3], ids=WINOGRAD_IDS[::3])
def test_winograd_forward_of_float32_is_float32_and_close(x_shape, filters, padding):
    x, weight = arrays(x_shape, (filters, x_shape[1], 3, 3), np.float32, filters + padding)
    out, _ = winograd.forward(x, weight, 1, padding)
    want = naive_conv2d(x.astype(np.float64), weight.astype(np.float64), 1, padding)
    assert out.dtype == np.float32 and relative_error(out, want) <= FLOAT32_TOL


@pytest.mark.task("2.2")
def test_winograd_forward_of_one_hot_inputs_picks_single_weights():
    # x = one pixel at (2, 3), weight = arange: out[0, 0, i, j] = weight[0, 0, 2 - i, 3 - j] where in range
    x = np.zeros((1, 1, 6, 7))
    x[0, 0, 2, 3] = 1.0
    weight = np.arange(9.0).reshape(1, 1, 3, 3)
    out, _ = winograd.forward(x, weight, 1, 0)
    want = np.zeros((4, 5))
    for i in range(4):
        for j in range(5):
            if 0 <= 2 - i < 3 and 0 <= 3 - j < 3:
                want[i, j] = weight[0, 0, 2 - i, 3 - j]
    np.testing.assert_allclose(out[0, 0], want, atol=1e-12)


@pytest.mark.task("2.3")
@pytest.mark.parametrize("x_shape, filters, padding", WINOGRAD_CASES, ids=WINOGRAD_IDS)
def test_winograd_gradients_equal_the_loop_in_float64(x_shape, filters, padding):
    x, weight = arrays(x_shape, (filters, x_shape[1], 3, 3), np.float64, sum(x_shape) * 7 + padding)
    out, cache = winograd.forward(x, weight, 1, padding)
    grad_out = np.random.default_rng(filters).standard_normal(out.shape)
    grad_x, grad_weight = winograd.backward(grad_out, cache, need_x=True, need_weight=True)
    want_x, want_weight = naive_conv2d_gradients(x, weight, grad_out, 1, padding)
    assert relative_error(grad_x, want_x) <= FLOAT64_TOL, "grad_x"
    assert relative_error(grad_weight, want_weight) <= FLOAT64_TOL, "grad_weight"


@pytest.mark.task("2.3")
@pytest.mark.parametrize("need_x, need_weight", [(True, False), (False, True)])
def test_winograd_backward_computes_only_the_gradient_asked_for(need_x, need_weight):
    x, weight = arrays((2, 2, 5, 6), (3, 2, 3, 3), np.float64, 21)
    out, cache = winograd.forward(x, weight, 1, 1)
    grad_out = np.random.default_rng(22).standard_normal(out.shape)
    grad_x, grad_weight = winograd.backward(grad_out, cache, need_x=need_x, need_weight=need_weight)
    want_x, want_weight = naive_conv2d_gradients(x, weight, grad_out, 1, 1)
    assert (grad_x is None) != need_x and (grad_weight is None) != need_weight
    if need_x:
        assert relative_error(grad_x, want_x) <= FLOAT64_TOL
    else:
        assert relative_error(grad_weight, want_weight) <= FLOAT64_TOL


@pytest.mark.task("2.3")
def test_winograd_gradients_of_float32_are_float32_and_close():
    x, weight = arrays((2, 3, 7, 5), (4, 3, 3, 3), np.float32, 31)
    out, cache = winograd.forward(x, weight, 1, 1)
    grad_out = np.random.default_rng(32).standard_normal(out.shape).astype(np.float32)
    grad_x, grad_weight = winograd.backward(grad_out, cache)
    want_x, want_weight = naive_conv2d_gradients(x.astype(np.float64), weight.astype(np.float64), grad_out, 1, 1)
    assert grad_x.dtype == np.float32 and grad_weight.dtype == np.float32
    assert relative_error(grad_x, want_x) <= FLOAT32_TOL and relative_error(grad_weight, want_weight) <= FLOAT32_TOL


@pytest.mark.task("2.3")
@pytest.mark.parametrize("x_shape, padding", [((1, 1, 4, 7), 0), ((2, 2, 3, 5), 2)])
def test_winograd_convolution_through_autograd_matches_finite_differences(x_shape, padding):
    x, weight = arrays(x_shape, (2, x_shape[1], 3, 3), np.float64, 41)
    bias = np.random.default_rng(42).standard_normal(2)
    leaves = [Tensor(a, requires_grad=True) for a in (x, weight, bias)]
    assert gradcheck(lambda a, b, c: F.conv2d(a, b, c, 1, padding, "winograd"), leaves)
