"""What one rank trains: a network and its data, or a convex problem, as one flat parameter vector.

    data = objective.load_data("digits", seed)                 # the same split on every rank
    obj = objective.build(model="cnn", dataset="digits", seed=0, data=data)
    loss = obj.loss_and_grad(index)       # obj.grad <- mean gradient over rows ``index``
    obj.params                            # the flat parameter vector the optimizer steps
    obj.evaluate()                        # {"test_loss": ..., "test_accuracy": ...}

Every algorithm sees only ``params``, ``grad``, ``loss_and_grad`` and ``evaluate``, so the same
algorithm trains the CNN on the digits and a least-squares problem with a known optimum (the
property tests use the latter). ``params`` and ``grad`` are the vectors of a
``minidl.flat.FlatParameters`` in both cases: the layers' own arrays are views into them.
"""
import dataclasses
import math

import numpy

from algorithms.core import cli
from minidl import backend, data as datasets, functional as F, models
from minidl.flat import FlatParameters, flatten
from minidl.recompute import checkpointed
from minidl.tensor import Parameter, Tensor, no_grad


@dataclasses.dataclass
class Data:
    x_train: numpy.ndarray
    y_train: numpy.ndarray
    x_test: numpy.ndarray
    y_test: numpy.ndarray


def load_data(dataset="digits", seed=0, data_dir=None):
    """Train/test arrays on the host; the split depends only on ``seed``, so every rank agrees.

    A missing or unreadable MNIST folder or file, or a bad ``seed``, is a ValueError naming the flag.
    """
    cli.require("--seed", seed, integer=True, low=0)
    if dataset == "digits":
        if data_dir is not None:
            raise ValueError(f"--data-dir {data_dir}: only --dataset mnist reads files; the digits are embedded")
        return Data(*datasets.digits_split(seed=seed))
    if dataset == "mnist":
        if data_dir is None:
            raise ValueError("--dataset mnist needs --data-dir pointing at the IDX files")
        try:                                          # a ValueError naming the missing or corrupt file
            x_train, y_train = datasets.load_mnist(data_dir, kind="train")
            x_test, y_test = datasets.load_mnist(data_dir, kind="test")
        except ValueError as error:
            raise ValueError(f"--data-dir {error}") from None
        return Data(x_train, y_train, x_test, y_test)
    raise ValueError(f"unknown dataset {dataset!r}; choose 'digits' or 'mnist'")


def build_model(name, seed, dataset="digits"):
    """The model, initialised from Generator(seed): the same weights on every rank."""
    if dataset == "mnist" and name == "cnn":
        raise ValueError("--model cnn is for the 8x8 digits; use --model lenet5 (or mlp) with mnist")
    if dataset == "digits" and name == "lenet5":
        raise ValueError("--model lenet5 expects 28x28 images; use --model cnn (or mlp) with digits")
    if name not in models.MODELS:
        raise ValueError(f"unknown --model {name!r}; choose one of {', '.join(sorted(models.MODELS))}")
    rng = numpy.random.default_rng(seed)
    if name in ("mlp", "wide-mlp"):
        return models.MODELS[name](rng, in_features=784 if dataset == "mnist" else 64)
    return models.build(name, rng)


def loss_and_grad(model, x, y):
    """Mean softmax cross-entropy on (x, y); gradients *accumulate* into the parameters' .grad."""
    logits = model(Tensor(backend.asarray(x)))
    loss = F.softmax_cross_entropy(logits, backend.asarray(y))
    loss.backward()
    return float(loss.item())


def evaluate(model, x, y, batch_size=512):
    """(mean loss, accuracy) over (x, y), in eval mode and without a graph."""
    model.eval()
    total_loss, correct = 0.0, 0
    with no_grad():
        for start in range(0, len(x), batch_size):
            logits = model(Tensor(backend.asarray(x[start:start + batch_size])))
            labels = backend.asarray(y[start:start + batch_size])
            total_loss += float(F.softmax_cross_entropy(logits, labels).item()) * len(labels)
            correct += int((logits.data.argmax(axis=1) == labels).sum())
    model.train()
    return total_loss / max(len(x), 1), correct / max(len(x), 1)


class NetworkObjective:
    """A network and its data: ``loss_and_grad(index)`` sets ``grad`` to the mean gradient over
    training rows ``index`` and returns the mean loss."""

    def __init__(self, net, data):
        self.net, self.data = net, data
        self.flat = flatten(net)
        self.params, self.grad = self.flat.data, self.flat.grad
        self.n, self.labels = len(data.x_train), data.y_train

    def loss_and_grad(self, index):
        self.flat.zero_grad()
        return loss_and_grad(self.net, self.data.x_train[index], self.data.y_train[index])

    def evaluate(self):
        test_loss, accuracy = evaluate(self.net, self.data.x_test, self.data.y_test)
        return {"test_loss": test_loss, "test_accuracy": accuracy}

    def predict(self, x):
        """Class probabilities (softmax of the logits), (len(x), classes)."""
        self.net.eval()
        with no_grad():
            logits = self.net(Tensor(backend.asarray(x))).data
        self.net.train()
        xp = backend.get_array_module(logits)
        shifted = xp.exp(logits - logits.max(axis=1, keepdims=True))
        return shifted / shifted.sum(axis=1, keepdims=True)


class ConvexObjective:
    """A synthetic convex problem (``minidl.data.least_squares`` / ``logistic_regression``): w
    (float64, starting at 0) is the flat parameter vector, ``problem.grad`` the gradient.
    Evaluation reports the full-data loss and the distance to the known optimum ``w_star``."""

    def __init__(self, problem):
        self.problem = problem
        self.flat = FlatParameters([Parameter(numpy.zeros(problem.d))])
        self.params, self.grad = self.flat.data, self.flat.grad
        self.n, self.labels = problem.n, problem.y

    def loss_and_grad(self, index):
        self.grad[...] = self.problem.grad(self.params, index)
        return self.problem.loss(self.params, index)

    def evaluate(self):
        return {"loss": self.problem.loss(self.params),
                "distance_to_optimum": float(numpy.linalg.norm(self.params - self.problem.w_star))}


def build(model="cnn", dataset="digits", seed=0, data=None, data_dir=None, problem=None, model_seed=None,
          recompute=False):
    """The objective one rank trains: ``problem`` (a synthetic convex problem) if given, else a network.

    ``model`` is a name in ``minidl.models`` or a function returning a fresh ``Module`` (tests pass
    float64 models); it is built from ``model_seed`` (default ``seed``), so every rank starts from
    the same weights unless an algorithm (ensembles) asks otherwise. ``recompute``: the network in
    checkpointed segments (``minidl.recompute``): the same gradients, fewer activations kept.
    """
    if problem is not None:
        return ConvexObjective(problem)
    data = data or load_data(dataset, seed, data_dir)
    seed = seed if model_seed is None else model_seed
    net = model() if callable(model) else build_model(model, seed, dataset)
    if recompute:                # --recompute: about sqrt(layers) segments (Chen et al. 2016); the same parameters
        net = checkpointed(net, max(1, round(math.sqrt(len(net)))))
    return NetworkObjective(net, data)


def evaluate_at(objective, params):
    """objective.evaluate() with ``params`` swapped in (the consensus of a decentralized run); the
    rank's own parameters are put back afterwards."""
    own = objective.params.copy()
    objective.params[...] = backend.asarray(params, dtype=objective.params.dtype)
    try:
        return objective.evaluate()
    finally:
        objective.params[...] = own


def split_validation(data, fraction):
    """(training Data, held-out x, held-out y): the last ``fraction`` of the training rows are held
    out for the ranking; the test set stays untouched for the final report."""
    keep = len(data.x_train) - max(1, int(round(fraction * len(data.x_train))))
    train = Data(data.x_train[:keep], data.y_train[:keep], data.x_test, data.y_test)
    return train, data.x_train[keep:], data.y_train[keep:]
