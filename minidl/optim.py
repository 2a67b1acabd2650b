"""Optimizers: the serial update rules that the distributed algorithms are tested against.

Every update is in place (``data -= ...``), so parameters that are views into one flat vector
(``minidl.flat``) stay views. Each optimizer works on a list of tensors with ``.data`` and
``.grad``; pass ``[flat.as_parameter()]`` to update a whole model as one vector.
"""
import math

import numpy

from minidl import backend
from minidl.tensor import no_grad


def _positive(name, value, allow_zero=False):
    if not isinstance(value, (int, float)) or math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a number {bound}, got {value!r}")


class Optimizer:
    buffers = ()        # names of the per-parameter state arrays, e.g. ("m", "v") for Adam

    def __init__(self, params):
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        self.state = [{} for _ in self.params]
        self.steps = 0

    def zero_grad(self, set_to_none=False):
        """Zero every parameter's gradient (``Tensor.zero_grad``); with ``set_to_none`` drop them, so
        the next ``backward()`` makes them afresh (``step()`` still needs one for every parameter)."""
        for param in self.params:
            param.zero_grad(set_to_none)

    def _grads(self):
        for index, param in enumerate(self.params):
            if param.grad is None:
                raise RuntimeError(f"{type(self).__name__}.step(): parameter {index} (shape {param.shape}) "
                                   "has no gradient; call loss.backward() first")
            yield param, param.grad, self.state[index]

    def state_dict(self):
        """{'steps': ..., '<buffer>.<index>': array} as NumPy copies (for ``.npz`` files).

        Copies, because ``step()`` updates the buffers in place: a state_dict is a snapshot.
        """
        out = {"steps": numpy.asarray(self.steps)}
        for index, state in enumerate(self.state):
            for key, value in state.items():
                out[f"{key}.{index}"] = numpy.array(backend.to_numpy(value), copy=True)
        return out

    def _buffer_and_index(self, key):
        """('m', 3) for the key 'm.3' if this optimizer keeps such a buffer, else (None, None)."""
        buffer, _, index = key.rpartition(".")
        if buffer in self.buffers and index.isdigit() and str(int(index)) == index and int(index) < len(self.params):
            return buffer, int(index)
        return None, None

    def load_state_dict(self, state):
        """The inverse of ``state_dict``. Nothing changes unless every entry fits: a missing or
        non-integer 'steps', an unknown key, a wrongly shaped or non-numeric array, or a parameter
        with only some of its buffers is a ValueError that names the key."""
        where = f"{type(self).__name__}.load_state_dict"
        if "steps" not in state:
            raise ValueError(f"{where}: no 'steps' entry")
        steps = numpy.asarray(state["steps"])
        if steps.shape != () or steps.dtype.kind not in "iu" or steps < 0:
            raise ValueError(f"{where}: 'steps' must be one integer >= 0, got {steps!r}")
        loaded = [{} for _ in self.params]
        for key, value in state.items():
            if key == "steps":
                continue
            buffer, index = self._buffer_and_index(key)
            if buffer is None:
                keeps = (f"'steps' and '<buffer>.<index>' with buffer in {list(self.buffers)} and "
                         f"index < {len(self.params)}") if self.buffers else "only 'steps'"
                raise ValueError(f"{where}: unexpected entry {key!r} ({type(self).__name__} keeps {keeps})")
            if not hasattr(value, "dtype"):         # a list or a number; NumPy and CuPy arrays stay as they are
                value = numpy.asarray(value)
            if tuple(value.shape) != self.params[index].shape:
                raise ValueError(f"{where}: {key!r} has shape {tuple(value.shape)}, "
                                 f"parameter {index} has shape {self.params[index].shape}")
            if value.dtype.kind not in "biuf":
                raise ValueError(f"{where}: {key!r} has dtype {value.dtype}, not numbers")
            loaded[index][buffer] = value
        for index, buffers in enumerate(loaded):
            missing = [f"{buffer}.{index}" for buffer in self.buffers if buffers and buffer not in buffers]
            if missing:
                raise ValueError(f"{where}: {missing[0]!r} is missing (parameter {index} has "
                                 f"{sorted(f'{buffer}.{index}' for buffer in buffers)})")
        xp = backend.xp()
        self.steps = int(steps)
        self.state = [{buffer: xp.array(value, dtype=param.dtype, copy=True) for buffer, value in buffers.items()}
                      for param, buffers in zip(self.params, loaded)]     # copies: step() updates in place


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov momentum and weight decay.

        g <- grad + weight_decay * w
        v <- momentum * v + g                  (v = g on the first step)
        w <- w - lr * (g + momentum * v)       if nesterov, else  w <- w - lr * v

    With momentum = 0 this is w <- w - lr * g (Ben-Nun & Hoefler 2019).
    """

    buffers = ("momentum",)

    def __init__(self, params, lr, momentum=0.0, nesterov=False, weight_decay=0.0):
        super().__init__(params)
        _positive("lr", lr)
        _positive("momentum", momentum, allow_zero=True)
        _positive("weight_decay", weight_decay, allow_zero=True)
        if nesterov and momentum == 0:
            raise ValueError("nesterov=True needs momentum > 0")
        self.lr, self.momentum, self.nesterov, self.weight_decay = lr, momentum, nesterov, weight_decay

    def step(self):
        with no_grad():
            for param, grad, state in self._grads():
                if self.weight_decay:
                    grad = grad + self.weight_decay * param.data
                if self.momentum:
                    if "momentum" not in state:
                        state["momentum"] = grad.copy()
                    else:
                        state["momentum"] *= self.momentum
                        state["momentum"] += grad
                    velocity = state["momentum"]
                    grad = grad + self.momentum * velocity if self.nesterov else velocity
                param.data -= self.lr * grad
        self.steps += 1


class Adagrad(Optimizer):
    """Adagrad, as Downpour's parameter servers use it (Dean et al. 2012, section 4.1):

        sum_sq <- sum_sq + grad^2
        w      <- w - lr * grad / (sqrt(sum_sq) + eps)

    i.e. parameter i's rate at step K is lr / sqrt(sum_{j <= K} grad_{i,j}^2) (the paper's gamma = lr).
    """

    buffers = ("sum_sq",)

    def __init__(self, params, lr, eps=1e-10, initial_accumulator=0.0):
        super().__init__(params)
        _positive("lr", lr)
        _positive("eps", eps, allow_zero=True)
        _positive("initial_accumulator", initial_accumulator, allow_zero=True)
        self.lr, self.eps, self.initial_accumulator = lr, eps, initial_accumulator

    def step(self):
        xp = backend.xp()
        with no_grad():
            for param, grad, state in self._grads():
                if "sum_sq" not in state:
                    state["sum_sq"] = xp.full(param.shape, self.initial_accumulator, dtype=param.dtype)
                state["sum_sq"] += grad * grad
                param.data -= self.lr * grad / (xp.sqrt(state["sum_sq"]) + self.eps)
        self.steps += 1


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015):

        m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
        w <- w - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    """

    buffers = ("m", "v")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params)
        _positive("lr", lr)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        _positive("eps", eps, allow_zero=True)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay

    def step(self):
        xp = backend.xp()
        beta1, beta2 = self.betas
        t = self.steps + 1
        with no_grad():
            for param, grad, state in self._grads():
                if self.weight_decay:
                    grad = grad + self.weight_decay * param.data
                if "m" not in state:
                    state["m"] = xp.zeros_like(param.data)
                    state["v"] = xp.zeros_like(param.data)
                state["m"] *= beta1
                state["m"] += (1 - beta1) * grad
                state["v"] *= beta2
                state["v"] += (1 - beta2) * grad * grad
                m_hat = state["m"] / (1 - beta1 ** t)
                v_hat = state["v"] / (1 - beta2 ** t)
                param.data -= self.lr * m_hat / (xp.sqrt(v_hat) + self.eps)
        self.steps += 1


def two_loop_direction(grad, s_history, y_history, dot=None):
    """L-BFGS search direction d = -H grad by the two-loop recursion (Nocedal & Wright, alg. 7.4).

        q = grad
        for i = k-1 .. k-m:  rho_i = 1 / <y_i, s_i>;  a_i = rho_i <s_i, q>;  q -= a_i y_i
        r = (<s_{k-1}, y_{k-1}> / <y_{k-1}, y_{k-1}>) q
        for i = k-m .. k-1:  b = rho_i <y_i, r>;  r += (a_i - b) s_i
        d = -r

    ``dot(a, b)`` defaults to the plain inner product; Sandblaster L-BFGS (Dean et al. 2012,
    section 4.2) passes one that sums shard-local partial products, since only dot products need
    communication: every other line is a local axpy on each shard.
    """
    dot = dot or (lambda a, b: float((a * b).sum()))
    q = grad.copy()
    alphas, rhos = [], []
    for s, y in zip(reversed(s_history), reversed(y_history)):
        rho = 1.0 / dot(y, s)
        alpha = rho * dot(s, q)
        q -= alpha * y
        alphas.append(alpha)
        rhos.append(rho)
    if s_history:
        q *= dot(s_history[-1], y_history[-1]) / dot(y_history[-1], y_history[-1])
    for s, y, alpha, rho in zip(s_history, y_history, reversed(alphas), reversed(rhos)):
        beta = rho * dot(y, q)
        q += (alpha - beta) * s
    return -q


class LBFGS(Optimizer):
    """Limited-memory BFGS on the full batch, with a backtracking (Armijo) line search.

    ``step(closure)`` runs up to ``max_iter`` iterations; ``closure()`` must zero the gradients,
    compute the full-batch loss, call ``backward()`` and return the loss. Each iteration:
    d = two_loop_direction(g), then the largest t in {lr, lr/2, ...} with
    f(w + t d) <= f(w) + 1e-4 t <g, d>, trying at most ``max_backtracks`` of them; if every
    trial fails, the last one evaluated (t = lr / 2^(max_backtracks - 1)) is taken, so the loss
    and gradient carried on are the ones measured there (not the best trial's: keeping the best
    would mean keeping a gradient per trial, and Sandblaster's shards would have to as well);
    then (s, y) = (w_new - w, g_new - g) joins the history (kept only if <s, y> > 1e-10, which
    keeps the implied Hessian positive definite).
    """

    def __init__(self, params, lr=1.0, history_size=10, max_iter=20, tolerance_grad=1e-7,
                 tolerance_change=1e-12, max_backtracks=30):
        super().__init__(params)
        _positive("lr", lr)
        if not isinstance(history_size, int) or history_size < 1:
            raise ValueError(f"history_size must be an integer >= 1, got {history_size!r}")
        if not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
        if not isinstance(max_backtracks, int) or max_backtracks < 1:
            raise ValueError(f"max_backtracks must be an integer >= 1, got {max_backtracks!r}")
        self.lr, self.history_size, self.max_iter = lr, history_size, max_iter
        self.tolerance_grad, self.tolerance_change = tolerance_grad, tolerance_change
        self.max_backtracks = max_backtracks
        self.s_history, self.y_history = [], []

    def _gather(self, attribute):
        xp = backend.xp()
        return xp.concatenate([getattr(param, attribute).reshape(-1) for param in self.params])

    def _scatter(self, vector):
        start = 0
        for param in self.params:
            param.data[...] = vector[start:start + param.size].reshape(param.shape)
            start += param.size

    def _evaluate(self, closure):
        loss = closure()
        return float(loss.item() if hasattr(loss, "item") else loss), self._gather("grad")

    def step(self, closure):
        w = self._gather("data")
        loss, g = self._evaluate(closure)
        for _ in range(self.max_iter):
            if float(abs(g).max()) <= self.tolerance_grad:
                break
            d = two_loop_direction(g, self.s_history, self.y_history)
            slope = float((g * d).sum())
            if slope >= 0:                      # not a descent direction: restart from -g
                self.s_history, self.y_history = [], []
                d, slope = -g, -float((g * g).sum())
            t = self.lr if self.s_history else min(1.0, 1.0 / float(abs(g).sum())) * self.lr
            for trial in range(self.max_backtracks):
                t = t if trial == 0 else 0.5 * t    # halved only before a trial: t is always an evaluated step
                self._scatter(w + t * d)
                new_loss, new_g = self._evaluate(closure)
                if new_loss <= loss + 1e-4 * t * slope:
                    break
            s, y = t * d, new_g - g
            if float((s * y).sum()) > 1e-10:
                self.s_history.append(s)
                self.y_history.append(y)
                if len(self.s_history) > self.history_size:
                    self.s_history.pop(0)
                    self.y_history.pop(0)
            w, g = w + s, new_g
            change, loss = abs(new_loss - loss), new_loss
            self.steps += 1
            if change <= self.tolerance_change:
                break
        self._scatter(w)
        return loss
