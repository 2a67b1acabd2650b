"""Modules (registration, state_dict), flat buffers, and optimizers against hand-computed steps."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from minidl import FlatParameters, Tensor, functional as F, models, nn, optim
from minidl.optim import two_loop_direction
from tests import strategies


class TwoLayer(nn.Module):
    def __init__(self, rng):
        super().__init__()
        self.hidden = nn.Linear(3, 4, rng=rng, dtype="float64")
        self.act = nn.ReLU()
        self.out = nn.Linear(4, 2, rng=rng, dtype="float64")

    def forward(self, x):
        return self.out(self.act(self.hidden(x)))


def test_module_registers_parameters_and_submodules_in_assignment_order():
    model = TwoLayer(np.random.default_rng(0))
    assert [name for name, _ in model.named_parameters()] == ["hidden.weight", "hidden.bias", "out.weight", "out.bias"]
    assert model.num_parameters() == 3 * 4 + 4 + 4 * 2 + 2
    model.eval()
    assert not model.hidden.training and not model.training
    model.train()
    assert model.out.training


def test_state_dict_round_trips_through_an_npz_file(tmp_path):
    model = models.small_cnn(np.random.default_rng(0))
    other = models.small_cnn(np.random.default_rng(1))
    model.save(tmp_path / "params.npz")
    other.load(tmp_path / "params.npz")
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(other.state_dict()[name], value)
    with np.load(tmp_path / "params.npz", allow_pickle=False) as archive:   # plain arrays, no pickle
        assert set(archive.files) == set(model.state_dict())


def test_load_state_dict_names_missing_unexpected_and_misshapen_entries():
    model = TwoLayer(np.random.default_rng(0))
    state = model.state_dict()
    del state["out.bias"]
    state["extra"] = np.zeros(1)
    with pytest.raises(ValueError, match=r"missing entries \['out.bias'\].*unexpected entries \['extra'\]"):
        model.load_state_dict(state)
    state = model.state_dict()
    state["hidden.weight"] = np.zeros((4, 3))
    state["out.bias"] = np.array(["a", "b"])
    with pytest.raises(ValueError, match=r"hidden.weight: expected \(3, 4\), got \(4, 3\); out.bias: expected numbers"):
        model.load_state_dict(state)


def _truncated(path, good):
    path.write_bytes(good[:len(good) // 2])


def _random_bytes(path, good):
    path.write_bytes(np.random.default_rng(0).bytes(len(good)))


def _empty(path, good):
    path.write_bytes(b"")


def _one_npy_array(path, good):
    with open(path, "wb") as file:
        np.save(file, np.zeros(3))


def _pickled_object_inside(path, good):
    with open(path, "wb") as file:
        np.savez(file, **{"hidden.weight": np.array([{}], dtype=object)})


def _corrupt_entry(path, good):
    corrupt = bytearray(good)
    corrupt[200:300] = b"\x01" * 100           # inside the first entry: its CRC no longer matches
    path.write_bytes(bytes(corrupt))


def _a_directory(path, good):
    path.mkdir()


def _other_arrays(path, good):
    with open(path, "wb") as file:
        np.savez(file, weights=np.zeros(3))


@pytest.mark.parametrize("spoil, reason", [
    (_truncated, "not a readable .npz"), (_random_bytes, "not a readable .npz"), (_empty, "not a readable .npz"),
    (_one_npy_array, "single .npy array"), (_pickled_object_inside, "'hidden.weight'.*Object arrays"),
    (_corrupt_entry, "not a readable .npz"), (_a_directory, "not a readable .npz"),
    (_other_arrays, "missing entries .*unexpected entries \\['weights'\\]"), (None, "No such file"),
], ids=["truncated", "random-bytes", "empty", "npy", "pickle", "corrupt", "directory", "other-model", "missing"])
def test_module_load_of_a_bad_file_is_one_value_error_naming_the_file(tmp_path, spoil, reason):
    model = TwoLayer(np.random.default_rng(0))
    model.save(tmp_path / "good.npz")
    path = tmp_path / "bad.npz"
    if spoil is not None:
        spoil(path, (tmp_path / "good.npz").read_bytes())
    before = model.state_dict()
    with pytest.raises(ValueError, match=reason) as error:
        model.load(path)
    message = str(error.value)
    assert message.startswith(f"{path}: ")
    assert "pickled data" not in message          # NumPy's word for any file without the npy magic
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


def test_flat_buffer_views_stay_in_sync_through_training_steps_and_loading():
    rng = np.random.default_rng(0)
    model = TwoLayer(rng)
    before = {name: value.copy() for name, value in model.state_dict().items()}
    flat = FlatParameters(model.parameters())
    # the vector is the parameters laid end to end, in registration order
    np.testing.assert_array_equal(flat.data, np.concatenate([v.ravel() for v in before.values()]))
    for opt in (optim.SGD([flat.as_parameter()], lr=0.1, momentum=0.9),
                optim.Adam([flat.as_parameter()], lr=0.01), optim.Adagrad([flat.as_parameter()], lr=0.1)):
        for _ in range(3):
            flat.zero_grad()
            F.mse_loss(model(Tensor(rng.standard_normal((5, 3)))), rng.standard_normal((5, 2))).backward()
            assert np.any(flat.grad != 0)
            opt.step()
    assert flat.in_sync()
    np.testing.assert_array_equal(flat.data, np.concatenate([p.data.ravel() for p in model.parameters()]))
    np.testing.assert_array_equal(flat.grad, np.concatenate([p.grad.ravel() for p in model.parameters()]))
    model.load_state_dict(before)
    assert flat.in_sync()
    np.testing.assert_array_equal(flat.data, np.concatenate([v.ravel() for v in before.values()]))


def _param(values, grad):
    p = nn.Parameter(np.array(values, dtype=np.float64))
    p.grad = np.array(grad, dtype=np.float64)
    return p


def test_sgd_momentum_nesterov_and_weight_decay_match_hand_computed_steps():
    # w = 1, g = 0.5 constant, lr = 0.1, momentum 0.9, weight decay 0.1 (g_eff = 0.5 + 0.1 w)
    p = _param([1.0], [0.5])
    opt = optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.1)
    opt.step()                                # g = 0.6, v = 0.6, w = 1 - 0.06 = 0.94
    assert p.data[0] == pytest.approx(0.94)
    opt.step()                                # g = 0.594, v = 0.54 + 0.594 = 1.134, w = 0.94 - 0.1134
    assert p.data[0] == pytest.approx(0.8266)
    q = _param([1.0], [0.5])
    opt = optim.SGD([q], lr=0.1, momentum=0.9, nesterov=True)
    opt.step()                                # v = 0.5, step = 0.5 + 0.45 = 0.95
    assert q.data[0] == pytest.approx(0.905)


def test_adagrad_matches_dean_et_al_per_parameter_rate():
    p = _param([0.0, 0.0], [1.0, 2.0])
    opt = optim.Adagrad([p], lr=0.5, eps=0.0)
    opt.step()                                 # w -= 0.5 * g / |g| = 0.5 each
    np.testing.assert_allclose(p.data, [-0.5, -0.5])
    p.grad[...] = [3.0, 0.0]
    opt.step()                                 # sums 10 and 4: w0 -= 0.5 * 3 / sqrt(10); w1 unchanged
    np.testing.assert_allclose(p.data, [-0.5 - 1.5 / np.sqrt(10), -0.5])


def test_adam_first_step_moves_each_parameter_by_lr():
    p = _param([1.0, -2.0], [0.3, -7.0])
    optim.Adam([p], lr=0.01, eps=0.0).step()   # bias-corrected m / sqrt(v) = sign(g)
    np.testing.assert_allclose(p.data, [0.99, -1.99])


def _dense_bfgs_inverse(s_history, y_history, gamma):
    """H_k from H_0 = gamma I by the explicit BFGS inverse update, the formula the two loops factor."""
    n = s_history[0].size
    h = gamma * np.eye(n)
    for s, y in zip(s_history, y_history):
        rho = 1.0 / (y @ s)
        v = np.eye(n) - rho * np.outer(y, s)
        h = v.T @ h @ v + rho * np.outer(s, s)
    return h


@given(n=st.integers(2, 6), pairs=st.integers(1, 4), seed=strategies.seeds)
def test_two_loop_recursion_equals_the_dense_bfgs_inverse_times_the_gradient(n, pairs, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n))
    hessian = a @ a.T + n * np.eye(n)            # SPD, so <s, y> = s' H s > 0
    s_history = [rng.standard_normal(n) for _ in range(pairs)]
    y_history = [hessian @ s for s in s_history]
    grad = rng.standard_normal(n)
    gamma = (s_history[-1] @ y_history[-1]) / (y_history[-1] @ y_history[-1])
    expected = -_dense_bfgs_inverse(s_history, y_history, gamma) @ grad
    np.testing.assert_allclose(two_loop_direction(grad, s_history, y_history), expected, rtol=1e-8, atol=1e-10)


def test_lbfgs_reaches_the_least_squares_optimum():
    from minidl.data import least_squares
    problem = least_squares(200, 5, np.random.default_rng(0))
    w = nn.Parameter(np.zeros(5))

    def closure():
        w.grad = None
        residual = F.matmul(Tensor(problem.x), F.reshape(w, (5, 1))) - Tensor(problem.y[:, None])
        loss = F.mean(residual * residual) * 0.5
        loss.backward()
        return loss

    opt = optim.LBFGS([w], history_size=5, max_iter=50)
    opt.step(closure)
    np.testing.assert_allclose(w.data, problem.w_star, atol=1e-6)   # well conditioned: converges to ~1e-8


@pytest.mark.parametrize("k", [1, 3, 5])
def test_lbfgs_takes_the_last_evaluated_step_when_every_backtrack_fails(k):
    # f(w) = w^2 / 2 from w = 1: g = 1, d = -g = -1, slope <g, d> = -1, the first trial step is
    # t = lr min(1, 1/|g|_1) = lr, and Armijo, (1 - t)^2 / 2 <= 1/2 - 1e-4 t, holds iff t <= 2 - 2e-4.
    # With lr = 3 * 2^(k-1) the k trials lr, lr/2, ..., 3 all fail; with max_backtracks = k the
    # step taken is the last one evaluated, t = lr / 2^(k-1) = 3: w = 1 - 3 = -2, f = 2, exactly.
    w = nn.Parameter(np.array([1.0]))
    calls = []

    def closure():
        w.grad = w.data.copy()
        calls.append(float(w.data[0]))
        return 0.5 * float(w.data[0]) ** 2

    opt = optim.LBFGS([w], lr=3.0 * 2 ** (k - 1), max_iter=1, max_backtracks=k)
    loss = opt.step(closure)
    assert calls == [1.0] + [1.0 - 3.0 * 2 ** j for j in reversed(range(k))]   # w, then the k trial points
    assert w.data[0] == -2.0 and loss == 2.0                                   # the last trial, as evaluated


@pytest.mark.parametrize("make", [lambda p: optim.SGD(p, lr=-1), lambda p: optim.SGD(p, lr=0.1, momentum=-0.5),
                                  lambda p: optim.Adagrad(p, lr=0), lambda p: optim.LBFGS(p, history_size=0),
                                  lambda p: optim.LBFGS(p, max_backtracks=0),
                                  lambda p: optim.SGD(p, lr=0.1, nesterov=True)])
def test_bad_hyperparameters_are_refused(make):
    with pytest.raises(ValueError):
        make([_param([1.0], [1.0])])


def test_optimizer_state_round_trips():
    p = _param([1.0, 2.0], [0.5, 0.5])
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    opt.step()
    state = opt.state_dict()
    q = _param([1.0, 2.0], [0.5, 0.5])
    other = optim.SGD([q], lr=0.1, momentum=0.9)
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.state[0]["momentum"], opt.state[0]["momentum"])
    assert other.steps == 1


def _optimizers(params):
    return {"SGD": optim.SGD(params, lr=0.1, momentum=0.9), "Adagrad": optim.Adagrad(params, lr=0.1),
            "Adam": optim.Adam(params, lr=0.1), "LBFGS": optim.LBFGS(params)}


def _two_params():
    return [_param([1.0, 2.0, 3.0], [0.5, -0.5, 1.0]), _param([[1.0, 2.0]], [[0.25, 1.0]])]


def _stepped(name):
    """Optimizer ``name`` on two parameters after two ``step()`` calls (its state has every buffer)."""
    params = _two_params()
    opt = _optimizers(params)[name]
    for _ in range(2):
        if name == "LBFGS":
            opt.step(lambda: float(sum((p.data * p.grad).sum() for p in params)))
        else:
            opt.step()
    return opt


OPTIMIZERS = ["SGD", "Adagrad", "Adam", "LBFGS"]


@pytest.mark.parametrize("name", ["SGD", "Adagrad", "Adam"])      # LBFGS's state_dict holds only 'steps'
def test_optimizer_state_dict_loads_into_a_fresh_optimizer_that_then_steps_identically(name):
    opt = _stepped(name)
    params = _two_params()
    for param, trained in zip(params, opt.params):
        param.data[...] = trained.data
    other = _optimizers(params)[name]
    state = opt.state_dict()
    other.load_state_dict(state)
    for key in state:
        state[key][...] = 0                     # the optimizers hold copies, not the dict's arrays
    assert other.steps == opt.steps == 2
    opt.step()
    other.step()
    for param, trained in zip(params, opt.params):
        np.testing.assert_array_equal(param.data, trained.data)


def _bad_states(name):
    """(name, description, spoil(state), the key the error must name) for optimizer ``name``."""
    buffer = {"SGD": "momentum", "Adagrad": "sum_sq", "Adam": "m", "LBFGS": None}[name]
    cases = [("unknown key", lambda state: state.update(bogus=np.zeros(3)), "bogus"),
             ("unknown buffer", lambda state: state.update({"velocity.0": np.zeros(3)}), "velocity.0"),
             ("no steps", lambda state: state.pop("steps"), "steps"),
             ("steps not one integer", lambda state: state.update(steps=np.array([1.5])), "steps")]
    if buffer:
        cases += [("index out of range", lambda state: state.update({f"{buffer}.2": np.zeros(3)}), f"{buffer}.2"),
                  ("index not a number", lambda state: state.update({f"{buffer}.x": np.zeros(3)}), f"{buffer}.x"),
                  ("wrong shape", lambda state: state.update({f"{buffer}.1": np.zeros((2, 1))}), f"{buffer}.1"),
                  ("not numbers", lambda state: state.update({f"{buffer}.0": np.array(["a", "b", "c"])}),
                   f"{buffer}.0")]
    if name == "Adam":                      # m without v for one parameter: half a state
        cases.append(("buffer missing", lambda state: state.pop("v.1"), "v.1"))
    return [(name, *case) for case in cases]


BAD_STATES = [case for name in OPTIMIZERS for case in _bad_states(name)]


@pytest.mark.parametrize("name, description, spoil, key", BAD_STATES,
                         ids=[f"{name}-{description}" for name, description, _, _ in BAD_STATES])
def test_optimizer_load_state_dict_refuses_a_bad_entry_naming_its_key_and_changes_nothing(
        name, description, spoil, key):
    opt = _stepped(name)
    state = opt.state_dict()
    spoil(state)
    before = opt.state_dict()
    with pytest.raises(ValueError, match=f"{name}.load_state_dict: .*'{key}'"):
        opt.load_state_dict(state)
    after = opt.state_dict()
    assert after.keys() == before.keys() and all(np.array_equal(after[k], before[k]) for k in before)
