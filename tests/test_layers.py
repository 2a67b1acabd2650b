"""Layers: each kernel against a slow, obviously-correct loop version, and against finite differences."""
import weakref

import numpy as np
import pytest
from hypothesis import given, strategies as st

from minidl import Tensor, backend, conv, functional as F, gradcheck, nn
from tests import strategies
from tests.helpers import naive_conv2d


# ---- slow references: the formulas, one output element at a time (naive_conv2d: tests/helpers.py) ----
def naive_pool(x, k, stride, padding, reduce):
    n, c, h, w = x.shape
    fill = -np.inf if reduce is np.max else 0.0
    x_pad = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=fill)
    out_h, out_w = (h + 2 * padding - k) // stride + 1, (w + 2 * padding - k) // stride + 1
    out = np.zeros((n, c, out_h, out_w))
    for i in range(out_h):
        for j in range(out_w):
            out[:, :, i, j] = reduce(x_pad[:, :, i * stride:i * stride + k, j * stride:j * stride + k], axis=(2, 3))
    return out


def naive_max_pool_grad(x, grad_out, k, stride, padding):
    """Each output's gradient goes to the first (row-major) maximum of its window."""
    x_pad = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=-np.inf)
    grad = np.zeros_like(x_pad)
    n, c, out_h, out_w = grad_out.shape
    for b in range(n):
        for ch in range(c):
            for i in range(out_h):
                for j in range(out_w):
                    window = x_pad[b, ch, i * stride:i * stride + k, j * stride:j * stride + k]
                    r, s = np.unravel_index(np.argmax(window), window.shape)
                    grad[b, ch, i * stride + r, j * stride + s] += grad_out[b, ch, i, j]
    h, w = x.shape[2:]
    return grad[:, :, padding:padding + h, padding:padding + w]


# im2col's backward takes col2im (task 1.4) for strides above 1
@pytest.mark.parametrize("algorithm", ["direct", pytest.param("im2col", marks=pytest.mark.task("1.4"))])
@given(setting=strategies.conv_settings(), seed=strategies.seeds)
def test_conv2d_equals_the_naive_loop_and_its_gradients_match_finite_differences(backend_name, algorithm, setting,
                                                                                 seed):
    n, c, f, h, w, k, stride, padding = setting
    rng = np.random.default_rng(seed)
    x = Tensor(rng.standard_normal((n, c, h, w)), requires_grad=True)
    weight = Tensor(rng.standard_normal((f, c, k, k)), requires_grad=True)
    bias = Tensor(rng.standard_normal(f), requires_grad=True)
    out = F.conv2d(x, weight, bias, stride, padding, algorithm)
    expected = naive_conv2d(x.numpy(), weight.numpy(), stride, padding) + bias.numpy()[None, :, None, None]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-10)
    assert gradcheck(lambda a, b, c_: F.conv2d(a, b, c_, stride, padding, algorithm), [x, weight, bias])


@given(setting=strategies.conv_settings(max_channels=2), seed=strategies.seeds, data=st.data())
def test_max_and_avg_pool_equal_naive_loops(backend_name, setting, seed, data):
    n, c, _, h, w, _, stride, _ = setting
    k = data.draw(st.integers(1, min(h, w, 3)))
    padding = data.draw(st.integers(0, k // 2))
    rng = np.random.default_rng(seed)
    x = Tensor(rng.standard_normal((n, c, h, w)), requires_grad=True)
    out = F.max_pool2d(x, k, stride, padding)
    np.testing.assert_array_equal(out.numpy(), naive_pool(x.numpy(), k, stride, padding, np.max))
    grad_out = rng.standard_normal(out.shape)
    out.backward(backend.asarray(grad_out))
    np.testing.assert_allclose(backend.to_numpy(x.grad),
                               naive_max_pool_grad(x.numpy(), grad_out, k, stride, padding), atol=1e-12)
    avg = F.avg_pool2d(x, k, stride, padding)
    np.testing.assert_allclose(avg.numpy(), naive_pool(x.numpy(), k, stride, padding, np.mean), atol=1e-12)
    assert gradcheck(lambda t: F.avg_pool2d(t, k, stride, padding), [x])


@given(setting=strategies.conv_settings(max_channels=2), seed=strategies.seeds, data=st.data())
def test_max_pool_with_many_ties_routes_each_gradient_to_the_first_maximum_bit_for_bit(backend_name, setting, seed,
                                                                                   data):
    # after a ReLU most windows hold several equal values (zeros); small integers make ties common
    # for every stride, so both the copied-windows path (stride >= k) and the strided one are hit
    n, c, _, h, w, _, stride, _ = setting
    k = data.draw(st.integers(1, min(h, w, 3)))
    padding = data.draw(st.integers(0, k // 2))
    rng = np.random.default_rng(seed)
    x = Tensor(np.maximum(rng.integers(-1, 3, (n, c, h, w)), 0).astype(np.float32), requires_grad=True)
    out = F.max_pool2d(x, k, stride, padding)
    np.testing.assert_array_equal(out.numpy(), naive_pool(x.numpy(), k, stride, padding, np.max))
    grad_out = rng.integers(-4, 5, out.shape).astype(np.float32)    # integers: overlapping windows' sums are exact
    grad_out.reshape(-1)[::3] = -0.0                 # a negative zero must arrive as the naive loop's +0.0
    out.backward(backend.asarray(grad_out))
    expected = naive_max_pool_grad(x.numpy(), grad_out, k, stride, padding).astype(np.float32)
    assert backend.to_numpy(x.grad).tobytes() == np.ascontiguousarray(expected).tobytes()


def test_max_pool_sends_a_tied_maximum_to_one_position_only():
    x = Tensor(np.ones((1, 1, 2, 2)), requires_grad=True)
    F.max_pool2d(x, 2).sum().backward()
    np.testing.assert_array_equal(x.grad[0, 0], [[1.0, 0.0], [0.0, 0.0]])


@pytest.mark.task("1.1")
def test_linear_is_x_times_weight_plus_bias():
    rng = np.random.default_rng(0)
    layer = nn.Linear(4, 3, rng=rng, dtype="float64")
    x = rng.standard_normal((5, 4))
    expected = x @ layer.weight.numpy() + layer.bias.numpy()
    np.testing.assert_allclose(layer(Tensor(x)).numpy(), expected, rtol=1e-12)
    assert gradcheck(lambda t: layer(t), [Tensor(x, requires_grad=True)])


def test_he_initialisation_has_the_stated_spread():
    layer = nn.Linear(400, 300, rng=np.random.default_rng(0))
    assert layer.weight.numpy().std() == pytest.approx(np.sqrt(2 / 400), rel=0.02)   # 120000 draws
    assert np.all(layer.bias.numpy() == 0)


def test_same_seed_same_weights_other_seed_other_weights():
    from minidl import models
    a = models.small_cnn(np.random.default_rng(1)).state_dict()
    b = models.small_cnn(np.random.default_rng(1)).state_dict()
    c = models.small_cnn(np.random.default_rng(2)).state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["0.weight"], c["0.weight"])


@pytest.mark.parametrize("name, side", [("mlp", 8), ("cnn", 8), ("lenet5", 28)])
def test_models_give_ten_logits_and_a_gradient_for_every_parameter(name, side):
    from minidl import models
    model = models.build(name, np.random.default_rng(0))
    x = Tensor(np.random.default_rng(1).standard_normal((3, 1, side, side)).astype(np.float32))
    logits = model(x)
    assert logits.shape == (3, 10)
    F.softmax_cross_entropy(logits, np.array([0, 1, 2])).backward()
    assert all(p.grad is not None and np.any(p.grad != 0) for p in model.parameters())


@pytest.mark.parametrize("algorithm", conv.ALGORITHMS)
def test_a_convolution_reads_its_weight_again_in_the_backward_and_keeps_no_array_of_it_in_between(algorithm):
    """As Linear's: an array the layer let go of after the forward is freed at once (ZeRO-3 releases a
    unit's gathered weights there), and the backward computes with the array the layer holds then."""
    rng = np.random.default_rng(0)
    layer = nn.Conv2d(2, 3, 3, padding=1, rng=rng)
    layer.algorithm = algorithm
    x = rng.standard_normal((2, 2, 6, 6)).astype(np.float32)
    grad_out = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)

    def gradients(let_go):
        start = Tensor(x, requires_grad=True)
        layer.weight.grad = layer.bias.grad = None
        given = layer.weight.data.copy()
        layer.weight.data, held = given, weakref.ref(given)
        out = layer(start)
        if let_go:                             # the same values, in another array; the forward's let go of
            layer.weight.data = given.copy()
            del given
            assert held() is None, f"{algorithm}: the convolution still holds the forward's weight array"
        out.backward(grad_out)
        return start.grad, layer.weight.grad, layer.bias.grad
    for kept, read_again in zip(gradients(False), gradients(True)):
        np.testing.assert_array_equal(kept, read_again)


def test_conv_errors_name_shapes_and_limits():
    x = Tensor(np.zeros((1, 3, 5, 5)))
    with pytest.raises(ValueError, match=r"\(1, 3, 5, 5\).*3 channels.*\(4, 2, 3, 3\)"):
        F.conv2d(x, Tensor(np.zeros((4, 2, 3, 3))))
    with pytest.raises(ValueError, match="larger than the padded input"):
        F.conv2d(x, Tensor(np.zeros((4, 3, 7, 7))))
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        F.conv2d(x, Tensor(np.zeros((4, 3, 3, 3))), algorithm="nope")
    with pytest.raises(ValueError, match=r"Linear\(4, 3\).*\(2, 5\)"):
        nn.Linear(4, 3, rng=np.random.default_rng(0))(Tensor(np.zeros((2, 5))))


@pytest.mark.parametrize("in_channels, out_channels, kernel, stride, padding", [
    # F <= C, stride 1: grad_x by a convolution with the flipped kernel (im2col again, no col2im)
    pytest.param(4, 2, 3, 1, 1, marks=pytest.mark.task("1.3")),
    # padding = k - 1: the "full" convolution needs no extra padding
    pytest.param(4, 4, 3, 1, 2, marks=pytest.mark.task("1.3")),
    # F > C, stride 1: grad_x by GEMM + the plane col2im (col2im_planes, one contiguous run per offset)
    pytest.param(2, 5, 3, 1, 1, marks=pytest.mark.task("1.3")),
    pytest.param(1, 3, 5, 1, 0, marks=pytest.mark.task("1.3")),
    # stride 2: grad_x by GEMM + col2im
    pytest.param(2, 5, 3, 2, 1, marks=pytest.mark.task("1.4")),
    pytest.param(4, 2, 2, 2, 0, marks=pytest.mark.task("1.4")),
    # even kernel
    pytest.param(3, 3, 2, 1, 0, marks=pytest.mark.task("1.3")),
])
def test_every_input_gradient_path_of_im2col_equals_the_direct_kernel(in_channels, out_channels, kernel, stride,
                                                                        padding):
    from minidl.conv import direct, im2col, im2col_blocked
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, in_channels, 6, 5))
    weight = rng.standard_normal((out_channels, in_channels, kernel, kernel))
    expected_out, expected_cache = direct.forward(x, weight, stride, padding)
    grad_out = rng.standard_normal(expected_out.shape)
    for kernel_module in (im2col_blocked, im2col):       # the layer's kernel, and the textbook one it is built from
        out, cache = kernel_module.forward(x, weight, stride, padding)
        np.testing.assert_allclose(out, expected_out, rtol=1e-12, atol=1e-12)
        for got, want in zip(kernel_module.backward(grad_out, cache), direct.backward(grad_out, expected_cache)):
            np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("shape", [(4, 6, 28, 28), (3, 16, 10, 10), (2, 5, 1, 7), (0, 3, 4, 4)])
def test_conv_bias_gradient_is_the_output_gradient_summed_over_images_and_pixels(shape):
    rng = np.random.default_rng(7)
    grad = rng.standard_normal(shape).astype(np.float32)
    expected = [sum(float(value) for value in grad[:, f].reshape(-1)) for f in range(shape[1])]   # one by one, exactly
    got = F.bias_gradient(grad)
    assert got.shape == (shape[1],) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    x = Tensor(rng.standard_normal((shape[0], 2, shape[2] + 2, shape[3] + 2)))
    bias = Tensor(np.zeros(shape[1]), requires_grad=True)
    out = F.conv2d(x, Tensor(rng.standard_normal((shape[1], 2, 3, 3))), bias)
    out.backward(grad.astype(np.float64))
    np.testing.assert_allclose(bias.grad, expected, rtol=1e-12, atol=1e-9)       # the layer uses it


@pytest.mark.parametrize("shape", [(4, 6, 28, 28), (3, 16, 10, 10), (2, 5, 1, 7), (0, 3, 4, 4)])
@pytest.mark.parametrize("dtypes", [(np.float32, np.float32), (np.float64, np.float64), (np.float32, np.float64)])
def test_conv_bias_add_has_the_bits_of_the_broadcast_add(shape, dtypes):
    rng = np.random.default_rng(3)
    out = rng.standard_normal(shape).astype(dtypes[0])
    bias = rng.standard_normal(shape[1]).astype(dtypes[1])
    for case in (out.copy(), out.copy().transpose(0, 1, 3, 2)):       # C-contiguous, and not (the broadcast's path)
        expected = case.copy()
        expected += bias.reshape(1, -1, 1, 1)
        F.add_bias(case, bias)
        assert case.dtype == expected.dtype and case.tobytes() == expected.tobytes()
