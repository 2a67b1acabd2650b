"""Autograd: every function's backward against central finite differences (float64), and the engine."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minidl import Tensor, functional as F, gradcheck, no_grad
from tests import strategies


def tensor(rng, shape, positive=False):
    data = rng.standard_normal(shape)
    if positive:
        data = np.abs(data) + 0.5
    return Tensor(data, requires_grad=True)


@given(shapes=strategies.broadcastable_shapes(), seed=strategies.seeds,
       op=st.sampled_from(["add", "sub", "mul", "div", "pow"]))
def test_binary_ops_with_broadcasting_match_finite_differences(backend_name, shapes, seed, op):
    rng = np.random.default_rng(seed)
    a = tensor(rng, shapes[0], positive=op in ("div", "pow"))
    b = tensor(rng, shapes[1], positive=op in ("div", "pow"))
    assert gradcheck(getattr(F, op), [a, b])


@given(shape=strategies.shapes(1, 3), seed=strategies.seeds,
       op=st.sampled_from(["neg", "exp", "log", "relu", "tanh", "sigmoid"]))
def test_unary_ops_match_finite_differences(backend_name, shape, seed, op):
    rng = np.random.default_rng(seed)
    a = tensor(rng, shape, positive=op == "log")
    if op == "relu":   # keep entries away from the kink at 0, where the derivative is undefined
        a.data[np.abs(a.data) < 1e-3] = 0.5
    assert gradcheck(getattr(F, op), [a])


@given(n=strategies.small_dims, k=strategies.small_dims, m=strategies.small_dims,
       batch=st.sampled_from([(), (2,), (3, 1)]), seed=strategies.seeds)
def test_matmul_matches_finite_differences(backend_name, n, k, m, batch, seed):
    rng = np.random.default_rng(seed)
    assert gradcheck(F.matmul, [tensor(rng, batch + (n, k)), tensor(rng, (k, m))])


@given(shape=strategies.shapes(1, 3), seed=strategies.seeds, keepdims=st.booleans(), data=st.data())
def test_sum_and_mean_over_any_axes_match_finite_differences(shape, seed, keepdims, data):
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    a = tensor(np.random.default_rng(seed), shape)
    assert gradcheck(lambda t: F.sum(t, axis, keepdims), [a])
    assert gradcheck(lambda t: F.mean(t, axis, keepdims), [a])


@given(shape=strategies.shapes(2, 3), seed=strategies.seeds)
def test_reshape_and_transpose_match_finite_differences(shape, seed):
    a = tensor(np.random.default_rng(seed), shape)
    assert gradcheck(lambda t: F.reshape(t, (-1,)), [a])
    axes = tuple(np.random.default_rng(seed).permutation(len(shape)))
    assert gradcheck(lambda t: F.transpose(t, axes), [a])


@given(batch=st.integers(1, 5), classes=st.integers(2, 6), seed=strategies.seeds)
def test_softmax_cross_entropy_matches_finite_differences_and_direct_formula(backend_name, batch, classes, seed):
    rng = np.random.default_rng(seed)
    logits = tensor(rng, (batch, classes))
    labels = rng.integers(0, classes, batch)
    assert gradcheck(lambda z: F.softmax_cross_entropy(z, labels), [logits])
    z = np.asarray(logits.numpy())
    direct = np.mean([-np.log(np.exp(z[i, labels[i]]) / np.exp(z[i]).sum()) for i in range(batch)])
    assert F.softmax_cross_entropy(logits, labels).item() == pytest.approx(direct, rel=1e-12)


def test_softmax_cross_entropy_is_stable_for_huge_logits():
    logits = Tensor(np.array([[1000.0, 0.0], [0.0, -1000.0]]), requires_grad=True)
    loss = F.softmax_cross_entropy(logits, np.array([0, 1]))
    loss.backward()
    assert loss.item() == pytest.approx(500.0)          # (0 + 1000) / 2
    assert np.all(np.isfinite(logits.grad))


@given(shape=strategies.shapes(1, 3), seed=strategies.seeds)
def test_mse_loss_matches_finite_differences(shape, seed):
    rng = np.random.default_rng(seed)
    target = rng.standard_normal(shape)
    assert gradcheck(lambda p: F.mse_loss(p, target), [tensor(rng, shape)])


@given(shape=strategies.shapes(1, 3), seed=strategies.seeds, p=st.sampled_from([0.0, 0.3, 0.7]))
def test_dropout_matches_finite_differences_with_a_fixed_mask(shape, seed, p):
    a = tensor(np.random.default_rng(seed), shape)
    # the same Generator state for every evaluation, so the mask is the same in each
    assert gradcheck(lambda t: F.dropout(t, p, True, np.random.default_rng(seed + 1)), [a])


def test_dropout_keeps_expected_value_and_is_identity_in_eval():
    x = Tensor(np.ones((200, 200)))
    kept = F.dropout(x, 0.25, True, np.random.default_rng(0)).data
    assert set(np.unique(kept)) == {0.0, 1 / 0.75}
    assert kept.mean() == pytest.approx(1.0, abs=0.02)    # 40000 draws: sd of the mean ~0.004
    assert F.dropout(x, 0.25, False, np.random.default_rng(0)) is x


def test_gradients_accumulate_until_zero_grad():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    (x * x).sum().backward()
    (x * x).sum().backward()
    np.testing.assert_array_equal(x.grad, [4.0, 8.0])    # 2 * (2x)
    x.zero_grad()
    np.testing.assert_array_equal(x.grad, [0.0, 0.0])


def test_a_tensor_used_twice_gets_both_gradients():
    x = Tensor(np.array(3.0), requires_grad=True)
    y = x * x + x * 2.0                                   # dy/dx = 2x + 2
    y.backward()
    assert x.grad == 8.0


def test_no_grad_records_no_graph():
    x = Tensor(np.ones(3), requires_grad=True)
    with no_grad():
        y = (x * 2.0).sum()
    assert not y.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.backward()


def test_backward_of_a_non_scalar_needs_a_gradient():
    x = Tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="one-element"):
        (x * 2.0).backward()


def test_float32_stays_float32_with_python_scalars():
    x = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    y = 2.0 * x + 1.0 - x / 3.0
    assert y.dtype == np.float32


def test_shape_errors_name_both_shapes():
    a, b = Tensor(np.ones((2, 3))), Tensor(np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        F.add(a, b)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        F.matmul(a, b)
    with pytest.raises(ValueError, match=r"labels shape \(3,\).*\(2, 3\)"):
        F.softmax_cross_entropy(a, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 2\)"):
        F.mse_loss(a, np.ones((3, 2)))


def test_integer_data_is_refused_with_its_dtype():
    with pytest.raises(TypeError, match="int64"):
        Tensor(np.arange(3))


def test_labels_out_of_range_are_refused():
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        F.softmax_cross_entropy(Tensor(np.zeros((2, 3))), np.array([0, 3]))
