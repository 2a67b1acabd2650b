"""Autograd: every function's backward against central finite differences (float64), and the engine."""
import os
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minidl import Tensor, backend, functional as F, gradcheck, no_grad
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


@pytest.mark.task("1.1")
@given(n=strategies.small_dims, k=strategies.small_dims, m=strategies.small_dims,
       batch=st.sampled_from([(), (2,), (3, 1)]), seed=strategies.seeds)
def test_matmul_matches_finite_differences(backend_name, n, k, m, batch, seed):
    rng = np.random.default_rng(seed)
    assert gradcheck(F.matmul, [tensor(rng, batch + (n, k)), tensor(rng, (k, m))])


@pytest.mark.task("1.1")
@given(n=strategies.small_dims, k=strategies.small_dims, m=strategies.small_dims,
       batch=st.sampled_from([(), (2,)]), seed=strategies.seeds,
       needs=st.sampled_from([(True, True, True), (False, True, True), (False, False, True), (True, False, False)]))
@settings(deadline=None)
def test_linear_is_matmul_plus_bias_bit_for_bit(backend_name, n, k, m, batch, seed, needs):
    # F.linear is one node instead of matmul's and add's: the same value and the same gradients,
    # bit for bit, whichever of x, weight and bias need one (a frozen weight, a frozen layer's bias)
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(batch + (n, k)), rng.standard_normal((k, m)), rng.standard_normal(m)]
    grad = rng.standard_normal(batch + (n, m))
    results = []
    for op in (lambda x, w, b: F.linear(x, w, b), lambda x, w, b: F.matmul(x, w) + b):
        leaves = [Tensor(a.copy(), requires_grad=need) for a, need in zip(arrays, needs)]
        out = op(*leaves)
        out.backward(grad)
        results.append([backend.to_numpy(a) if a is not None else None
                        for a in [out.data] + [leaf.grad for leaf in leaves]])
    for ours, plain in zip(*results):
        assert (ours is None) == (plain is None)
        if ours is not None:
            assert ours.dtype == plain.dtype and np.array_equal(ours.view(np.uint64), plain.view(np.uint64))
    assert gradcheck(lambda x, w, b: F.linear(x, w, b), [tensor(rng, batch + (n, k)), tensor(rng, (k, m)),
                                                         tensor(rng, (m,))])


def test_linear_records_no_graph_under_no_grad_and_refuses_a_bias_of_the_wrong_shape():
    x, w, b = (Tensor(np.ones(shape), requires_grad=True) for shape in ((2, 3), (3, 4), (4,)))
    with no_grad():
        assert not F.linear(x, w, b).requires_grad
    with pytest.raises(ValueError, match="do not broadcast"):
        F.linear(x, w, Tensor(np.ones(3)))


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


@pytest.mark.task("1.2")
@given(batch=st.integers(1, 5), classes=st.integers(2, 6), seed=strategies.seeds)
def test_softmax_cross_entropy_matches_finite_differences_and_direct_formula(backend_name, batch, classes, seed):
    rng = np.random.default_rng(seed)
    logits = tensor(rng, (batch, classes))
    labels = rng.integers(0, classes, batch)
    assert gradcheck(lambda z: F.softmax_cross_entropy(z, labels), [logits])
    z = np.asarray(logits.numpy())
    direct = np.mean([-np.log(np.exp(z[i, labels[i]]) / np.exp(z[i]).sum()) for i in range(batch)])
    assert F.softmax_cross_entropy(logits, labels).item() == pytest.approx(direct, rel=1e-12)


@pytest.mark.task("1.2")
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


def test_a_leaf_gradient_never_shares_memory_with_an_array_someone_else_holds():
    """A leaf takes a backward's fresh array as its .grad without copying it only when nobody else
    holds that array: the gradient the caller passed in, a view, a second leaf's gradient are copied."""
    x = Tensor(np.zeros(4), requires_grad=True)
    given = np.arange(4.0)
    (x + 0.0).backward(given)                          # add's backward hands back ``given`` itself
    given[...] = -1.0
    np.testing.assert_array_equal(x.grad, [0.0, 1.0, 2.0, 3.0])
    a, b = Tensor(np.ones(3), requires_grad=True), Tensor(np.ones(3), requires_grad=True)
    (a + b).sum().backward()                           # both leaves get the same array
    a.grad[...] = 5.0
    np.testing.assert_array_equal(b.grad, [1.0, 1.0, 1.0])
    w = Tensor(np.ones((2, 3)), requires_grad=True)
    F.reshape(w, (6,)).sum().backward()                # a view of sum's read-only broadcast gradient
    w.grad[...] = 3.0                                  # a writable copy of its own (a view would refuse)
    assert w.grad.shape == (2, 3)
    (x * 2.0).sum().backward()                         # a fresh array, accumulated into the existing grad
    np.testing.assert_array_equal(x.grad, [2.0, 3.0, 4.0, 5.0])


def test_leaves_sharing_one_gradient_array_accumulate_separately():
    """add's backward hands the same array to both operands; if both leaves adopted it, the second
    backward's += would add into both at once (a: 3, b: 3 here instead of 2 and 2)."""
    a, b = Tensor(np.ones(3), requires_grad=True), Tensor(np.ones(3), requires_grad=True)
    for _ in range(2):
        (a + b).sum().backward()
    assert a.grad is not b.grad
    np.testing.assert_array_equal(a.grad, [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(b.grad, [2.0, 2.0, 2.0])


def test_the_reference_counts_that_adoption_and_workspace_rely_on_hold_on_this_python():
    """Gradient adoption (minidl.autograd._sole_holder) and buffer reuse (minidl.conv.workspace) count
    the references to ``container[key]``, an expression: 2 when only the container holds the array,
    one more for every other holder. A local name is never counted, because Python 3.14 may load it
    without a reference of its own (CPython's "What's new in 3.14" on sys.getrefcount). If a Python
    version ever counted expressions differently too, this fails, instead of gradients silently
    sharing memory."""
    held = {"grad": np.zeros(3)}
    alone = sys.getrefcount(held["grad"])          # counted outside the asserts: pytest's rewritten
    other = held["grad"]                           # assert keeps a reference of its own
    with_a_name = sys.getrefcount(held["grad"])
    view = other[1:]
    del other
    with_a_view = sys.getrefcount(held["grad"])    # a view's base is a holder too
    del view
    pool = [np.zeros(3)]
    in_a_list = sys.getrefcount(pool[0])
    assert (alone, with_a_name, with_a_view, in_a_list) == (2, 3, 3, 2)


def test_a_leaf_adopts_the_gradient_its_last_user_made():
    """The gradient that an operation's backward makes for its LAST operand (a Linear's weight in
    x @ w) becomes the leaf's .grad as it is: no copy. The backward loop must not keep a reference
    to it (it once did, in its loop variable, and every weight gradient was copied)."""
    x = Tensor(np.ones((4, 3)), requires_grad=True)
    w = Tensor(np.ones((3, 2)), requires_grad=True)
    out = F.matmul(x, w)
    made = []                   # weak references: a strong one would itself force a copy
    backward = out._backward

    def watched(grad):
        grads = backward(grad)
        made.extend(weakref.ref(g) for g in grads)
        return grads
    out._backward = watched
    out.backward(np.ones((4, 2)))
    assert w.grad is made[1]() and x.grad is made[0]()
    np.testing.assert_array_equal(w.grad, np.full((3, 2), 4.0))


def test_zero_grad_set_to_none_drops_owned_gradients_and_zeroes_flat_views():
    from minidl import FlatParameters, models, optim
    rng = np.random.default_rng(0)
    data = Tensor(rng.standard_normal((5, 4)))
    runs = []
    for set_to_none in (False, True):
        model = models.mlp(np.random.default_rng(1), in_features=4, hidden=(3,))
        optimizer = optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad(set_to_none=set_to_none)
            if set_to_none:
                assert all(p.grad is None for p in model.parameters()) or optimizer.steps == 0
            F.softmax_cross_entropy(model(data), np.array([0, 1, 2, 0, 1])).backward()
            optimizer.step()
        runs.append([p.data.copy() for p in model.parameters()])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)                   # the same bits either way
    model = models.mlp(np.random.default_rng(1), in_features=4, hidden=(3,))
    flat = FlatParameters(model.parameters())
    flat.grad[...] = 1.0
    model.zero_grad(set_to_none=True)
    assert all(p.grad is not None for p in model.parameters())    # still views of flat.grad ...
    assert not flat.grad.any()                                      # ... zeroed in place
    assert flat.in_sync()


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


def test_tensor_module_docstring_example_runs_as_a_doctest_in_a_fresh_interpreter():
    # A fresh interpreter: nothing this test process imported or switched (backend, monkeypatches)
    # can make the example pass; it must run from ``import minidl.tensor`` alone.
    code = ("import doctest, minidl.tensor\n"
            "result = doctest.testmod(minidl.tensor)\n"
            "print('RESULT', result.failed, result.attempted)")
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root)))
    assert done.returncode == 0, done.stderr
    failed, attempted = (int(word) for word in done.stdout.split("RESULT")[-1].split())
    assert failed == 0, done.stdout
    assert attempted > 0, "minidl/tensor.py's docstring has no >>> example"


OPERATORS = [          # (operator form, the functional it must equal, with operands in this order)
    ("a + b", lambda a, b: F.add(a, b)), ("a - b", lambda a, b: F.sub(a, b)),
    ("a * b", lambda a, b: F.mul(a, b)), ("a / b", lambda a, b: F.div(a, b)),
    ("a ** b", lambda a, b: F.pow(a, b)), ("a @ b.transpose()", lambda a, b: F.matmul(a, F.transpose(b))),
    ("2.0 + a", lambda a, b: F.add(2.0, a)), ("2.0 - a", lambda a, b: F.sub(2.0, a)),
    ("2.0 * a", lambda a, b: F.mul(2.0, a)), ("2.0 / a", lambda a, b: F.div(2.0, a)),
    ("-a", lambda a, b: F.neg(a)), ("a ** 3.0", lambda a, b: F.pow(a, 3.0)),
    ("a.sum(1)", lambda a, b: F.sum(a, 1)), ("a.sum(0, True)", lambda a, b: F.sum(a, 0, True)),
    ("a.mean(1)", lambda a, b: F.mean(a, 1)),
    ("a.reshape(3, 2)", lambda a, b: F.reshape(a, (3, 2))), ("a.reshape((6,))", lambda a, b: F.reshape(a, (6,))),
    ("a.transpose()", lambda a, b: F.transpose(a)), ("a.transpose(1, 0)", lambda a, b: F.transpose(a, (1, 0))),
    ("a.exp()", lambda a, b: F.exp(a)), ("a.log()", lambda a, b: F.log(a)), ("a.relu()", lambda a, b: F.relu(a)),
    ("a.tanh()", lambda a, b: F.tanh(a)), ("a.sigmoid()", lambda a, b: F.sigmoid(a)),
]


@pytest.mark.parametrize("expression, reference", OPERATORS, ids=[expression for expression, _ in OPERATORS])
def test_each_tensor_operator_is_its_functional_with_the_operands_in_order(expression, reference):
    rng = np.random.default_rng(0)
    a_data, b_data, weights = rng.uniform(0.5, 2, (2, 3)), rng.uniform(0.5, 2, (2, 3)), rng.standard_normal(6)
    results = []
    for compute in (lambda a, b: eval(expression, {"a": a, "b": b}), reference):
        a, b = Tensor(a_data.copy(), requires_grad=True), Tensor(b_data.copy(), requires_grad=True)
        out = compute(a, b)
        (F.reshape(out, (-1,)) * weights[:out.size]).sum().backward()    # unequal weights: order shows
        results.append((out.data, a.grad, b.grad))
    (out, a_grad, b_grad), (expected, expected_a_grad, expected_b_grad) = results
    assert out.shape == expected.shape
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(a_grad, expected_a_grad)
    np.testing.assert_array_equal(b_grad, expected_b_grad)
