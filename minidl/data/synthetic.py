"""Synthetic convex problems with a known optimum, for testing optimizers and distributed SGD.

Each problem holds the data ``x`` (n, d) and ``y`` (n,) in float64, its exact minimiser
``w_star``, and ``loss(w, idx)`` / ``grad(w, idx)`` as means over the rows ``idx`` (all rows by
default), so a mini-batch gradient is ``grad(w, batch)`` and the full-batch optimum is known.
``w_star`` is the optimum of the generated data (not the weights used to generate it), so
``grad(w_star)`` is zero up to rounding and an algorithm can be checked against it.
``SparseLogistic`` (for Hogwild!) stores its samples sparsely instead, as columns and values.
"""
from dataclasses import dataclass, field

import numpy as np

from minidl.data._checks import check_generator, check_int


class _Problem:
    """What both problems share: checks on ``w`` and ``idx``."""

    def _check(self, w, idx):
        w = np.asarray(w, dtype=np.float64)
        if w.shape != (self.d,):
            raise ValueError(f"w must have shape ({self.d},), got {w.shape}")
        if idx is None:
            return w, self.x, self.y
        idx = np.asarray(idx)
        if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"idx must be a non-empty 1-D integer array of row indices, "
                             f"got dtype {idx.dtype} shape {idx.shape}")
        if idx.min() < 0 or idx.max() >= self.n:
            raise ValueError(f"idx must lie in [0, {self.n}), got values {idx.min()}..{idx.max()}")
        return w, self.x[idx], self.y[idx]

    @property
    def n(self):
        return self.x.shape[0]

    @property
    def d(self):
        return self.x.shape[1]


@dataclass(eq=False)
class LeastSquares(_Problem):
    """Least squares: ``loss(w) = 1/(2|I|) * sum_{i in I} (x_i . w - y_i)^2``.

    ``grad(w) = 1/|I| * X_I^T (X_I w - y_I)``. The minimiser over all rows solves the normal
    equations ``X^T X w = X^T y``; it is unique because ``n >= d`` and Gaussian ``X`` has full
    column rank with probability one.
    """
    x: np.ndarray
    y: np.ndarray
    w_star: np.ndarray
    w_true: np.ndarray = field(repr=False)   # the generating weights; w_star differs by the noise

    def loss(self, w, idx=None):
        w, x, y = self._check(w, idx)
        residual = x @ w - y                                    # (m,)
        return 0.5 * float(residual @ residual) / len(y)

    def grad(self, w, idx=None):
        w, x, y = self._check(w, idx)
        return x.T @ (x @ w - y) / len(y)                       # (d, m) @ (m,) -> (d,)


@dataclass(eq=False)
class LogisticRegression(_Problem):
    """L2-regularised logistic regression with labels ``y_i`` in {0, 1} (stored as float64).

    With ``z_i = x_i . w`` and ``sigma(z) = 1 / (1 + exp(-z))``::

        loss(w) = 1/|I| * sum_{i in I} [log(1 + exp(z_i)) - y_i z_i] + l2/2 * ||w||^2
        grad(w) = 1/|I| * X_I^T (sigma(X_I w) - y_I) + l2 * w
        hess(w) = 1/n * X^T diag(sigma(z) (1 - sigma(z))) X + l2 * I

    The Hessian is positive definite (``l2 > 0``), so the loss is strongly convex and the optimum
    ``w_star`` unique; it is found by damped Newton's method to a gradient norm of 1e-12.
    """
    x: np.ndarray
    y: np.ndarray
    w_star: np.ndarray
    l2: float
    w_true: np.ndarray = field(repr=False)

    def loss(self, w, idx=None):
        w, x, y = self._check(w, idx)
        z = x @ w
        # log(1 + exp(z)) as logaddexp(0, z): no overflow for large z
        return float(np.mean(np.logaddexp(0.0, z) - y * z)) + 0.5 * self.l2 * float(w @ w)

    def grad(self, w, idx=None):
        w, x, y = self._check(w, idx)
        return x.T @ (_sigmoid(x @ w) - y) / len(y) + self.l2 * w

    def hess(self, w):
        w, x, _ = self._check(w, None)
        p = _sigmoid(x @ w)
        return (x.T * (p * (1.0 - p))) @ x / self.n + self.l2 * np.eye(self.d)


def _sigmoid(z):
    """1 / (1 + exp(-z)) written as exp(-log(1 + exp(-z))), which never overflows."""
    return np.exp(-np.logaddexp(0.0, -z))


def _check_shape(n, d):
    n = check_int("n", n, minimum=1)
    d = check_int("d", d, minimum=1)
    if n < d:
        raise ValueError(f"n must be >= d for a unique optimum, got n={n}, d={d}")
    return n, d


def least_squares(n, d, rng, noise=0.1):
    """A least-squares problem: ``x ~ N(0, 1)`` (n, d), ``y = x @ w_true + noise * N(0, 1)``.

    ``w_star`` is ``numpy.linalg.lstsq(x, y)``, the exact minimiser of the generated data.
    """
    n, d = _check_shape(n, d)
    rng = check_generator("rng", rng)
    if not np.isfinite(noise) or noise < 0:
        raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
    x = rng.standard_normal((n, d))
    w_true = rng.standard_normal(d)
    y = x @ w_true + noise * rng.standard_normal(n)
    w_star = np.linalg.lstsq(x, y, rcond=None)[0]
    return LeastSquares(x=x, y=y, w_star=w_star, w_true=w_true)


def logistic_regression(n, d, rng, l2=1e-2):
    """A logistic-regression problem: ``x ~ N(0, 1)`` (n, d), ``y_i ~ Bernoulli(sigma(x_i . w_true))``.

    ``w_star`` minimises the regularised loss (see ``LogisticRegression``), found by Newton's
    method ``w <- w - t * hess(w)^{-1} grad(w)`` from ``w = 0``, with ``t`` halved until the loss
    decreases (so it converges from anywhere), stopped when ``||grad(w)|| <= 1e-12``.
    """
    n, d = _check_shape(n, d)
    rng = check_generator("rng", rng)
    if not np.isfinite(l2) or l2 <= 0:
        raise ValueError(f"l2 must be a finite number > 0 (it makes the optimum unique), got {l2!r}")
    x = rng.standard_normal((n, d))
    w_true = rng.standard_normal(d)
    y = (rng.random(n) < _sigmoid(x @ w_true)).astype(np.float64)
    problem = LogisticRegression(x=x, y=y, w_star=np.zeros(d), l2=float(l2), w_true=w_true)
    problem.w_star = _newton(problem, tolerance=1e-12)
    return problem


def _newton(problem, tolerance, max_steps=100):
    """Damped Newton's method on a strongly convex ``problem``, from ``w = 0``."""
    w = np.zeros(problem.d)
    for _ in range(max_steps):
        g = problem.grad(w)
        if np.linalg.norm(g) <= tolerance:
            return w
        step = np.linalg.solve(problem.hess(w), g)
        decrement = float(g @ step)          # Newton decrement squared: the predicted decrease x 2
        t = 1.0
        if decrement > 1e-10:
            # far from the optimum: halve t until the loss drops enough (Armijo). Close to it the
            # full step is right and the loss change is lost in rounding, so no search there.
            current = problem.loss(w)
            while problem.loss(w - t * step) > current - 0.25 * t * decrement and t > 1e-10:
                t *= 0.5
        w = w - t * step
    raise RuntimeError(f"Newton's method did not reach gradient norm {tolerance} in {max_steps} "
                       f"steps (last norm {np.linalg.norm(problem.grad(w)):.3e})")


@dataclass(eq=False)
class SparseLogistic:
    """L2-regularised logistic regression on sparse samples, split per sample for Hogwild!.

    Sample ``e`` has ``nnz`` nonzeros: columns ``index[e]`` (n, nnz) with values ``value[e]``
    (n, nnz), label ``y[e]`` in {0, 1}; ``features`` columns in all. With ``z_e = x_e . w``::

        loss(w) = 1/|I| * sum_{e in I} [log(1 + exp(z_e)) - y_e z_e] + l2/2 * ||w||^2

    as ``LogisticRegression`` (``grad`` and ``hess`` likewise), computed on the nonzeros only.
    Hogwild! (Niu et al. 2011) updates one sample's coordinates at a time, so the regulariser is
    split over the samples as in the paper's sparse SVM: with deg_v the number of samples touching
    coordinate v,

        f_e(w) = log(1 + exp(z_e)) - y_e z_e + sum_{v in e} (n l2 / (2 deg_v)) w_v^2

    and (1/n) sum_e f_e(w) = loss(w) wherever every coordinate is touched (an untouched one has no
    f_e to update it; it stays at its starting 0, which is also its optimum). ``sample_grad``
    is the gradient of f_e on its support.
    """
    index: np.ndarray
    value: np.ndarray
    y: np.ndarray
    features: int
    l2: float
    w_star: np.ndarray = None

    def __post_init__(self):
        self.degree = np.bincount(self.index.ravel(), minlength=self.features)
        # per-coordinate weight of the split regulariser: n l2 / deg_v (0 where no sample touches v)
        self.reg = np.where(self.degree > 0, self.n * self.l2 / np.maximum(self.degree, 1), 0.0)

    @property
    def n(self):
        return len(self.y)

    @property
    def d(self):
        return self.features

    def dense(self):
        """The samples as a dense (n, features) matrix (for tests and small problems)."""
        x = np.zeros((self.n, self.features))
        np.add.at(x, (np.arange(self.n)[:, None], self.index), self.value)
        return x

    def _rows(self, idx):
        return slice(None) if idx is None else np.asarray(idx)

    def loss(self, w, idx=None):
        rows = self._rows(idx)
        z = (self.value[rows] * w[self.index[rows]]).sum(axis=1)
        return float(np.mean(np.logaddexp(0.0, z) - self.y[rows] * z)) + 0.5 * self.l2 * float(w @ w)

    def grad(self, w, idx=None):
        rows = self._rows(idx)
        index, value = self.index[rows], self.value[rows]
        residual = _sigmoid((value * w[index]).sum(axis=1)) - self.y[rows]          # (m,)
        # X_I^T residual without forming X: sample e adds residual_e * value_e on its columns
        total = np.bincount(index.ravel(), (value * residual[:, None]).ravel(), minlength=self.features)
        return total / len(residual) + self.l2 * w

    def hess(self, w):
        """1/n * X^T diag(s) X + l2 * I, s = sigma(z) (1 - sigma(z)): sample e adds s_e x_e x_e^T,
        an nnz x nnz block, so the cost is n nnz^2 (plus the features^2 matrix itself)."""
        p = _sigmoid((self.value * w[self.index]).sum(axis=1))
        block = (p * (1.0 - p))[:, None, None] * self.value[:, :, None] * self.value[:, None, :]
        cells = self.index[:, :, None] * self.features + self.index[:, None, :]      # (n, nnz, nnz)
        h = np.bincount(cells.ravel(), block.ravel(), minlength=self.features ** 2) / self.n
        return h.reshape(self.features, self.features) + self.l2 * np.eye(self.features)

    def sample_grad(self, w_e, e):
        """grad of f_e on its support, given w_e = w[index[e]]."""
        z = float(self.value[e] @ w_e)
        sigma = 1.0 / (1.0 + np.exp(-z)) if z >= 0 else np.exp(z) / (1.0 + np.exp(z))
        return (sigma - self.y[e]) * self.value[e] + self.reg[self.index[e]] * w_e

    def conflicts(self):
        """(Delta, an upper bound on rho) of Niu et al.: how often two samples share a coordinate.

        Delta = the largest fraction of samples touching one coordinate; rho = the largest fraction
        of samples whose support meets a given sample's, at most sum_{v in e} deg_v / n.
        """
        delta = self.degree.max() / self.n
        rho = self.degree[self.index].sum(axis=1).max() / self.n
        return float(delta), float(min(rho, 1.0))


def sparse_logistic_regression(n, features, nnz, rng, l2=1e-3):
    """A random ``SparseLogistic`` problem: each sample's ``nnz`` columns drawn without replacement,
    values ~ N(0, 1), ``y_e ~ Bernoulli(sigma(x_e . w_true))``; ``w_star`` by ``_newton`` (as for
    ``logistic_regression``; the sparse Hessian keeps it cheap: n nnz^2 + features^3)."""
    n = check_int("n", n, minimum=1)
    features = check_int("features", features, minimum=1)
    nnz = check_int("nnz", nnz, minimum=1)
    if nnz > features:
        raise ValueError(f"nnz must lie in [1, features = {features}], got {nnz}")
    rng = check_generator("rng", rng)
    if not np.isfinite(l2) or l2 <= 0:
        raise ValueError(f"l2 must be a finite number > 0 (it makes the optimum unique), got {l2!r}")
    index = np.stack([rng.choice(features, nnz, replace=False) for _ in range(n)])
    value = rng.standard_normal((n, nnz))
    w_true = rng.standard_normal(features)
    y = (rng.random(n) < _sigmoid((value * w_true[index]).sum(axis=1))).astype(np.float64)
    problem = SparseLogistic(index, value, y, features, float(l2))
    problem.w_star = _newton(problem, tolerance=1e-12)
    return problem
