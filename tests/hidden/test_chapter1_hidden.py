"""Hidden: the chapter-1 hearts (tasks 1.1-1.5) on the shapes the visible tests do not draw.

The visible tests check matmul with one batched operand, softmax cross-entropy by finite
differences, and im2col/col2im through square kernels on hypothesis-drawn inputs. Here: both
operands batched and broadcast, one operand frozen, float32; batch 1, one class, an upstream
gradient other than 1; im2col and col2im on their own against index loops, with non-square
kernels, non-square inputs, strides larger than the kernel and windows that leave the last rows
of the padded input uncovered; and one SGD step against its closed form.

Oracles are index loops (im2col and col2im here; the convolution in tests/helpers.py, its gradients
in tests/hidden/conv_oracle.py), numpy formulas (the softmax, the matmul gradients) or finite
differences (minidl.gradcheck).
"""

import numpy as np
import pytest

from algorithms import serial_sgd
from algorithms.core.objective import NetworkObjective
from minidl import Tensor, functional as F, gradcheck, optim
from minidl.conv import im2col as im2col_module
from minidl.data.sharding import Batch
from minidl.nn import Flatten, Linear, Sequential
from tests.helpers import naive_conv2d, tiny_digits
from tests.hidden.conv_oracle import naive_conv2d_gradients

# ---- oracles ----------------------------------------------------------------------------------

def naive_im2col(x_pad, kh, kw, stride, out_h, out_w):
    """cols[n, c, i, j, ho, wo] = x_pad[n, c, ho*stride + i, wo*stride + j], one entry at a time."""
    n, c = x_pad.shape[:2]
    cols = np.zeros((n, c, kh, kw, out_h, out_w), dtype=x_pad.dtype)
    for b, ch, i, j, ho, wo in np.ndindex(cols.shape):
        cols[b, ch, i, j, ho, wo] = x_pad[b, ch, ho * stride + i, wo * stride + j]
    return cols


def naive_col2im(cols, padded_shape, stride):
    """Every column entry added onto the input pixel it came from, one entry at a time."""
    x_pad = np.zeros(padded_shape, dtype=cols.dtype)
    for b, ch, i, j, ho, wo in np.ndindex(cols.shape):
        x_pad[b, ch, ho * stride + i, wo * stride + j] += cols[b, ch, i, j, ho, wo]
    return x_pad


def output_size(size, kernel, stride, padding=0):
    return (size + 2 * padding - kernel) // stride + 1


# (batch, channels, padded height, padded width, kh, kw, stride): non-square kernels only (the visible
# tests draw square ones), non-square inputs, strides above the kernel (gaps), windows that leave the
# last rows or columns uncovered, a kernel as large as the input, batch 1
IM2COL_CASES = [
    (1, 1, 5, 7, 2, 3, 1),
    (2, 3, 6, 4, 3, 1, 1),
    (1, 2, 7, 7, 1, 4, 2),
    (3, 1, 8, 5, 3, 2, 2),
    (1, 3, 9, 6, 2, 3, 3),
    (2, 2, 5, 9, 1, 2, 3),
    (1, 1, 4, 11, 4, 5, 1),
    (2, 1, 10, 3, 5, 3, 2),
    (1, 4, 6, 8, 2, 4, 4),
    (1, 2, 3, 4, 3, 4, 1),
    (2, 2, 7, 5, 1, 2, 1),
    (1, 1, 12, 7, 3, 5, 3),
    (1, 3, 5, 6, 4, 1, 1),
    (2, 1, 9, 9, 2, 5, 2),
    (1, 2, 6, 10, 6, 2, 5),
    (3, 2, 4, 6, 2, 3, 3),
    (1, 1, 8, 13, 1, 6, 2),
    (2, 3, 11, 4, 4, 2, 3),
]
IM2COL_IDS = [f"n{n}c{c}_{h}x{w}_k{kh}x{kw}_s{s}" for n, c, h, w, kh, kw, s in IM2COL_CASES]


# ---- 1.1 matmul backward ----------------------------------------------------------------------

def naive_matmul_gradients(a, b, grad):
    """(grad_a, grad_b): every batch entry's grad @ b^T and a^T @ grad, summed back to the operand's shape."""
    batch = grad.shape[:-2]
    big_a = np.broadcast_to(a, batch + a.shape[-2:])
    big_b = np.broadcast_to(b, batch + b.shape[-2:])
    full_a, full_b = np.zeros(big_a.shape), np.zeros(big_b.shape)
    for index in np.ndindex(batch):
        full_a[index] = grad[index] @ big_b[index].T
        full_b[index] = big_a[index].T @ grad[index]

    def back_to(full, shape):
        full = full.sum(axis=tuple(range(full.ndim - len(shape))))
        return full.sum(axis=tuple(axis for axis, side in enumerate(shape) if side == 1), keepdims=True)
    return back_to(full_a, a.shape), back_to(full_b, b.shape)


MATMUL_SHAPES = [((1, 1), (1, 1)), ((1, 5), (5, 1)), ((4, 1), (1, 3)), ((3, 4), (2, 4, 5)),
                 ((2, 1, 3, 4), (5, 4, 2)), ((1, 3, 2), (4, 2, 6)), ((2, 3, 1, 2), (3, 2, 2))]


@pytest.mark.task("1.1")
@pytest.mark.parametrize("shape_a, shape_b", MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_matmul_gradients_sum_over_broadcast_batch_axes_of_either_operand(shape_a, shape_b):
    rng = np.random.default_rng(len(shape_a) * 10 + len(shape_b))
    a_data, b_data = rng.standard_normal(shape_a), rng.standard_normal(shape_b)
    a, b = Tensor(a_data, requires_grad=True), Tensor(b_data, requires_grad=True)
    out = F.matmul(a, b)
    grad = rng.standard_normal(out.shape)
    out.backward(grad)
    want_a, want_b = naive_matmul_gradients(a_data, b_data, grad)
    assert a.grad.shape == shape_a and b.grad.shape == shape_b, (a.grad.shape, b.grad.shape)
    np.testing.assert_allclose(a.grad, want_a, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b.grad, want_b, rtol=1e-12, atol=1e-12)


@pytest.mark.task("1.1")
@pytest.mark.parametrize("frozen", ["a", "b"])
def test_matmul_gives_a_gradient_only_to_the_operand_that_needs_one(frozen):
    rng = np.random.default_rng(3)
    a = Tensor(rng.standard_normal((2, 3, 4)), requires_grad=frozen != "a")
    b = Tensor(rng.standard_normal((4, 5)), requires_grad=frozen != "b")
    grad = rng.standard_normal((2, 3, 5))
    F.matmul(a, b).backward(grad)
    want_a, want_b = naive_matmul_gradients(a.numpy(), b.numpy(), grad)
    live, dead, want = (b, a, want_b) if frozen == "a" else (a, b, want_a)
    assert dead.grad is None
    np.testing.assert_allclose(live.grad, want, rtol=1e-12, atol=1e-12)


@pytest.mark.task("1.1")
def test_matmul_gradients_of_float32_operands_are_float32():
    rng = np.random.default_rng(4)
    a = Tensor(rng.standard_normal((3, 2, 5)).astype(np.float32), requires_grad=True)
    b = Tensor(rng.standard_normal((5, 7)).astype(np.float32), requires_grad=True)
    grad = rng.standard_normal((3, 2, 7)).astype(np.float32)
    F.matmul(a, b).backward(grad)
    want_a, want_b = naive_matmul_gradients(a.numpy().astype(np.float64), b.numpy().astype(np.float64), grad)
    assert a.grad.dtype == np.float32 and b.grad.dtype == np.float32
    np.testing.assert_allclose(a.grad, want_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.grad, want_b, rtol=1e-5, atol=1e-5)


@pytest.mark.task("1.1")
@pytest.mark.parametrize("shape_a, shape_b", [((1, 7), (7, 1)), ((6, 1), (2, 1, 3)), ((2, 2, 3), (2, 3, 1))])
def test_matmul_chain_matches_finite_differences(shape_a, shape_b):
    # matmul twice in a row (the first one's output is the second one's operand) and a nonlinearity
    rng = np.random.default_rng(5)
    a = Tensor(rng.standard_normal(shape_a), requires_grad=True)
    b = Tensor(rng.standard_normal(shape_b), requires_grad=True)
    c = Tensor(rng.standard_normal((shape_b[-1], 2)), requires_grad=True)
    assert gradcheck(lambda x, y, z: F.tanh(F.matmul(F.matmul(x, y), z)), [a, b, c])


# ---- 1.2 softmax cross-entropy backward ---------------------------------------------------------

def softmax_cross_entropy_gradient(logits, labels, upstream):
    """(softmax - one_hot) / N * upstream, row by row, from a shifted exp."""
    grad = np.zeros_like(logits, dtype=np.float64)
    for i, row in enumerate(logits.astype(np.float64)):
        e = np.exp(row - row.max())
        grad[i] = e / e.sum()
        grad[i, labels[i]] -= 1.0
    return grad * upstream / len(logits)


@pytest.mark.task("1.2")
@pytest.mark.parametrize("batch, classes, upstream", [(1, 1, 1.0), (1, 7, 1.0), (6, 2, -2.5), (5, 3, 3.0),
                                                      (4, 10, 0.5), (1, 4, 7.0)])
def test_softmax_cross_entropy_gradient_is_softmax_minus_one_hot_over_n_times_the_upstream(batch, classes, upstream):
    rng = np.random.default_rng(batch * 100 + classes)
    logits_data = rng.standard_normal((batch, classes)) * 3
    labels = rng.integers(0, classes, batch)
    labels[:1] = classes - 1                                   # a label at the last class too
    logits = Tensor(logits_data, requires_grad=True)
    loss = F.softmax_cross_entropy(logits, labels)
    loss.backward(np.asarray(upstream))
    np.testing.assert_allclose(logits.grad, softmax_cross_entropy_gradient(logits_data, labels, upstream),
                               rtol=1e-12, atol=1e-14)


@pytest.mark.task("1.2")
def test_softmax_cross_entropy_gradient_of_float32_logits_is_float32():
    rng = np.random.default_rng(8)
    data = rng.standard_normal((7, 5)).astype(np.float32)
    labels = np.array([0, 4, 4, 1, 2, 3, 0])
    logits = Tensor(data, requires_grad=True)
    F.softmax_cross_entropy(logits, labels).backward()
    assert logits.grad.dtype == np.float32
    np.testing.assert_allclose(logits.grad, softmax_cross_entropy_gradient(data, labels, 1.0), rtol=1e-5, atol=1e-7)


@pytest.mark.task("1.2")
def test_softmax_cross_entropy_gradient_with_huge_logits_on_the_wrong_class():
    # softmax computed naively would overflow: exp(800); the gradient is exactly 0 or -1/N or 1/N here
    data = np.array([[800.0, 0.0, -800.0], [0.0, -900.0, 900.0], [5.0, 5.0, 5.0]])
    labels = np.array([2, 0, 1])
    logits = Tensor(data, requires_grad=True)
    F.softmax_cross_entropy(logits, labels).backward()
    want = np.array([[1.0, 0.0, -1.0], [-1.0, 0.0, 1.0], [1 / 3, -2 / 3, 1 / 3]]) / 3
    assert np.all(np.isfinite(logits.grad))
    np.testing.assert_allclose(logits.grad, want, rtol=1e-12, atol=1e-15)


@pytest.mark.task("1.2")
@pytest.mark.parametrize("batch, classes", [(1, 3), (5, 4)])
def test_softmax_cross_entropy_inside_a_network_matches_finite_differences(batch, classes):
    rng = np.random.default_rng(batch)
    x = Tensor(rng.standard_normal((batch, 6)), requires_grad=True)
    weight = Tensor(rng.standard_normal((6, classes)), requires_grad=True)
    labels = rng.integers(0, classes, batch)
    assert gradcheck(lambda a, w: F.softmax_cross_entropy(F.matmul(a, w) * 2.0, labels) * 3.0, [x, weight])


# ---- 1.3 im2col, 1.4 col2im ---------------------------------------------------------------------

@pytest.mark.task("1.3")
@pytest.mark.parametrize("case", IM2COL_CASES, ids=IM2COL_IDS)
def test_im2col_equals_the_index_loop(case):
    n, c, h, w, kh, kw, stride = case
    out_h, out_w = output_size(h, kh, stride), output_size(w, kw, stride)
    x_pad = np.random.default_rng(h * w).standard_normal((n, c, h, w))
    cols = im2col_module.im2col(x_pad, kh, kw, stride, out_h, out_w)
    want = naive_im2col(x_pad, kh, kw, stride, out_h, out_w)
    assert cols.shape == want.shape and np.array_equal(cols, want), f"im2col for {case}"


@pytest.mark.task("1.3")
@pytest.mark.parametrize("x_shape, weight_shape, stride, padding", [
    ((1, 2, 7, 5), (3, 2, 2, 3), 1, 0),
    ((2, 1, 6, 9), (2, 1, 3, 1), 2, 1),
    ((1, 3, 5, 5), (4, 3, 1, 4), 1, 2),
    ((2, 2, 8, 6), (1, 2, 4, 2), 3, 1),
])
def test_im2col_convolution_with_a_non_square_kernel_equals_the_loop_in_float32(x_shape, weight_shape, stride,
                                                                                padding):
    # the forward pass only (F > C or stride > 1 or padding > k - 1: no other path in the way)
    rng = np.random.default_rng(sum(x_shape))
    x = rng.standard_normal(x_shape).astype(np.float32)
    weight = rng.standard_normal(weight_shape).astype(np.float32)
    out, _ = im2col_module.forward(x, weight, stride, padding)
    want = naive_conv2d(x.astype(np.float64), weight.astype(np.float64), stride, padding)
    assert out.dtype == np.float32 and out.shape == want.shape
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.task("1.4")
@pytest.mark.parametrize("case", IM2COL_CASES, ids=IM2COL_IDS)
def test_col2im_equals_the_index_loop(case):
    n, c, h, w, kh, kw, stride = case
    out_h, out_w = output_size(h, kh, stride), output_size(w, kw, stride)
    # small integers: every order of the additions gives the same bits
    cols = np.random.default_rng(h + w).integers(-4, 5, (n, c, kh, kw, out_h, out_w)).astype(np.float64)
    x_pad = im2col_module.col2im(cols, (n, c, h, w), stride).copy()      # a workspace buffer: copy it
    want = naive_col2im(cols, (n, c, h, w), stride)
    assert x_pad.shape == want.shape and np.array_equal(x_pad, want), f"col2im for {case}"


@pytest.mark.task("1.4")
@pytest.mark.parametrize("case", IM2COL_CASES[::3], ids=IM2COL_IDS[::3])
def test_col2im_is_the_adjoint_of_im2col(case):
    # <im2col(x), y> = <x, col2im(y)> for any x and y, with the loop's im2col on the left
    n, c, h, w, kh, kw, stride = case
    out_h, out_w = output_size(h, kh, stride), output_size(w, kw, stride)
    rng = np.random.default_rng(kh * 10 + kw)
    x_pad = rng.standard_normal((n, c, h, w))
    y = rng.standard_normal((n, c, kh, kw, out_h, out_w))
    left = float(np.sum(naive_im2col(x_pad, kh, kw, stride, out_h, out_w) * y))
    right = float(np.sum(x_pad * im2col_module.col2im(y, (n, c, h, w), stride)))
    assert right == pytest.approx(left, rel=1e-12, abs=1e-12)


@pytest.mark.task("1.4")
@pytest.mark.parametrize("x_shape, weight_shape, stride, padding", [
    ((1, 2, 7, 6), (3, 2, 2, 3), 2, 0),
    ((2, 3, 9, 5), (2, 3, 3, 1), 3, 1),
    ((1, 1, 8, 8), (4, 1, 1, 4), 2, 2),
    ((2, 2, 6, 11), (3, 2, 4, 2), 4, 1),
])
def test_im2col_input_gradient_with_strides_and_non_square_kernels_equals_the_loop(x_shape, weight_shape, stride,
                                                                                  padding):
    # stride > 1: grad_x is GEMM + col2im
    rng = np.random.default_rng(sum(weight_shape))
    x, weight = rng.standard_normal(x_shape), rng.standard_normal(weight_shape)
    out, cache = im2col_module.forward(x, weight, stride, padding)
    grad_out = rng.standard_normal(out.shape)
    grad_x, grad_weight = im2col_module.backward(grad_out, cache)
    want_x, want_weight = naive_conv2d_gradients(x, weight, grad_out, stride, padding)
    np.testing.assert_allclose(grad_x, want_x, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(grad_weight, want_weight, rtol=1e-11, atol=1e-11)


# ---- 1.5 one SGD step ---------------------------------------------------------------------------

def linear_digits_objective(data):
    rng = np.random.default_rng(3)
    return NetworkObjective(Sequential(Flatten(), Linear(64, 10, rng=rng, dtype="float64")), data)


@pytest.mark.task("1.5")
def test_sgd_step_computes_the_gradient_of_its_batch_then_steps_once_and_returns_the_loss():
    # real objects (the grader hands them to the sandbox): the loss and gradient at w0 on rows 4, 1, 3,
    # then exactly one step (with momentum, a second step or a step before the gradient lands elsewhere)
    data = tiny_digits()
    objective = linear_digits_objective(data)
    optimizer = optim.SGD([objective.flat.as_parameter()], lr=0.2, momentum=0.5)
    start = objective.params.copy()
    probe = linear_digits_objective(data)
    want_loss = probe.loss_and_grad(np.array([4, 1, 3]))
    loss = serial_sgd.sgd_step(objective, optimizer, Batch(np.array([4, 1, 3]), 3))
    assert loss == want_loss, (loss, want_loss)
    np.testing.assert_array_equal(objective.grad, probe.grad)
    np.testing.assert_allclose(objective.params, start - 0.2 * probe.grad, rtol=1e-13, atol=1e-15)


@pytest.mark.task("1.5")
@pytest.mark.parametrize("rows", [[0], [5, 2, 9], [1, 3, 5, 7, 11, 13, 17]])
def test_one_sgd_step_of_a_linear_softmax_model_is_w_minus_lr_times_the_batch_mean_gradient(rows):
    data = tiny_digits()
    objective = linear_digits_objective(data)
    optimizer = optim.SGD([objective.flat.as_parameter()], lr=0.3)
    layer = objective.net[1]
    weight, bias = layer.weight.numpy().copy(), layer.bias.numpy().copy()
    x = data.x_train[rows].reshape(len(rows), -1)
    labels = data.y_train[rows]
    logits = x @ weight + bias
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    softmax = shifted / shifted.sum(axis=1, keepdims=True)
    want_loss = float(np.mean(-np.log(softmax[np.arange(len(rows)), labels])))
    softmax[np.arange(len(rows)), labels] -= 1.0
    grad_weight, grad_bias = x.T @ softmax / len(rows), softmax.mean(axis=0)
    loss = serial_sgd.sgd_step(objective, optimizer, Batch(np.array(rows), len(rows)))
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(layer.weight.numpy(), weight - 0.3 * grad_weight, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(layer.bias.numpy(), bias - 0.3 * grad_bias, rtol=1e-12, atol=1e-14)


@pytest.mark.task("1.5")
def test_two_sgd_steps_with_momentum_follow_the_velocity():
    # v1 = g1, w1 = w0 - lr v1; v2 = mu v1 + g2, w2 = w1 - lr v2 (g2 at w1, on another batch)
    data = tiny_digits()
    objective = linear_digits_objective(data)
    optimizer = optim.SGD([objective.flat.as_parameter()], lr=0.2, momentum=0.5)
    start = objective.params.copy()
    serial_sgd.sgd_step(objective, optimizer, Batch(np.arange(0, 6), 6))
    first = objective.params.copy()
    g1 = (start - first) / 0.2
    probe = linear_digits_objective(data)
    probe.params[...] = first
    probe.loss_and_grad(np.arange(6, 10))
    g2 = probe.grad.copy()
    serial_sgd.sgd_step(objective, optimizer, Batch(np.arange(6, 10), 4))
    np.testing.assert_allclose(objective.params, first - 0.2 * (0.5 * g1 + g2), rtol=1e-10, atol=1e-13)


@pytest.mark.task("1.5")
@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_serial_sgd_with_batches_that_do_not_divide_the_data_equals_the_reference_loop(batch_size):
    # 50 rows: batch 7 leaves a last batch of 1, batch 64 is one short batch per epoch
    data = tiny_digits()
    params, _ = serial_sgd.train(model=lambda: linear_model(), data=data, epochs=1, lr=0.05, momentum=0.9,
                                 batch_size=batch_size, quiet=True)
    want = reference_linear(data, lr=0.05, momentum=0.9, batch_size=batch_size)
    np.testing.assert_allclose(params, want, rtol=1e-12, atol=1e-14)


def linear_model():
    return Sequential(Flatten(), Linear(64, 10, rng=np.random.default_rng(3), dtype="float64"))


def reference_linear(data, lr, momentum, batch_size, seed=0):
    """One epoch of plain SGD on the linear model, step by step in the test."""
    from minidl.data import epoch_order
    objective = NetworkObjective(linear_model(), data)
    optimizer = optim.SGD([objective.flat.as_parameter()], lr=lr, momentum=momentum)
    order = epoch_order(objective.n, seed, 0)
    for start in range(0, len(order), batch_size):
        objective.loss_and_grad(order[start:start + batch_size])
        optimizer.step()
    return objective.params.copy()

