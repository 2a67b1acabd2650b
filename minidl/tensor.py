"""A define-by-run autograd: ``Tensor`` records how it was made, ``backward()`` runs the chain rule.

Every operation computes its result and, when gradients are wanted, stores a small ``backward``
closure beside it: given the gradient of the final scalar with respect to the result, it returns
the gradients with respect to each input. ``backward()`` (``minidl.autograd``) visits the recorded
graph in reverse topological order and adds up those gradients. The operators (``+``, ``*``, ``@``,
``.sum()``, ...) are the operations at the bottom of this file; ``minidl.functional`` exports them
beside the others (``linear``, the losses, ``conv2d``, pooling).

    >>> from minidl.tensor import Tensor
    >>> x = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    >>> loss = (x * x).sum()             # loss = sum_ij x_ij^2
    >>> loss.item()
    91.0
    >>> loss.backward()                  # d loss / d x = 2 x
    >>> x.grad.tolist()
    [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]

Gradients accumulate: a leaf's ``grad`` is *added to* (in place) by every ``backward()``, until
``zero_grad()`` (which zeroes it, or with ``set_to_none=True`` drops it). In-place accumulation matters here: a
model's ``grad`` arrays can be views into
one flat gradient vector (``minidl.flat``), and an in-place add keeps them views.
"""
import numpy

from minidl import autograd, backend
from minidl.autograd import no_grad  # noqa: F401  (minidl.tensor.no_grad, as ever)
from minidl.broadcasting import check_broadcast, unbroadcast

_FLOAT_KINDS = "f"


class Tensor:
    """An array (``data``, NumPy or CuPy) with an optional gradient (``grad``, same shape)."""

    def __init__(self, data, requires_grad=False):
        if isinstance(data, Tensor):
            raise TypeError("Tensor(data): data is already a Tensor; use tensor.data or tensor.detach()")
        xp = backend.xp()
        if not isinstance(data, xp.ndarray):          # numbers, lists, NumPy scalars, host arrays
            typed = hasattr(data, "dtype")
            data = xp.asarray(data)
            if not typed and data.dtype.kind in "iubf":   # python numbers and lists: float32
                data = data.astype(xp.float32)
        if data.dtype.kind not in _FLOAT_KINDS:
            raise TypeError(f"Tensor needs a floating-point array, got dtype {data.dtype} "
                            "(labels and indices stay plain integer arrays)")
        self.data = data
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._parents = ()
        self._backward = None
        self.op = ""
        self._accumulate_hooks = ()

    # ---- array-like facts -------------------------------------------------------------
    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)

    def __len__(self): return len(self.data)

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor(shape={self.shape}, dtype={self.dtype}{grad}{', op=' + self.op if self.op else ''})"

    def item(self): return self.data.item()
    def numpy(self): return backend.to_numpy(self.data)

    def detach(self):
        """A Tensor sharing this data, cut off from the graph."""
        return Tensor(self.data)

    def zero_grad(self, set_to_none=False):
        """Zero ``grad`` in place, or with ``set_to_none`` forget it: the next ``backward()`` then
        makes the gradient array afresh instead of adding into zeros (one pass over it fewer, as
        PyTorch's ``zero_grad(set_to_none=True)``). A gradient that is a view into a flat vector
        (``minidl.flat``) is always zeroed in place, so the flat vector stays its storage."""
        if self.grad is None:
            return
        if set_to_none and getattr(self.grad, "base", None) is None:
            self.grad = None
        else:
            self.grad[...] = 0          # in place: grad may be a view into a flat vector

    # ---- operators: each one is an operation below, where its backward pass is written ------
    def __add__(self, other): return add(self, other)
    def __radd__(self, other): return add(other, self)
    def __sub__(self, other): return sub(self, other)
    def __rsub__(self, other): return sub(other, self)
    def __mul__(self, other): return mul(self, other)
    def __rmul__(self, other): return mul(other, self)
    def __truediv__(self, other): return div(self, other)
    def __rtruediv__(self, other): return div(other, self)
    def __neg__(self): return neg(self)
    def __pow__(self, exponent): return pow(self, exponent)
    def __matmul__(self, other): return matmul(self, other)
    def sum(self, axis=None, keepdims=False): return sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return mean(self, axis, keepdims)
    def exp(self): return exp(self)
    def log(self): return log(self)
    def relu(self): return relu(self)
    def tanh(self): return tanh(self)
    def sigmoid(self): return sigmoid(self)
    def transpose(self, *axes): return transpose(self, axes if axes else None)

    def reshape(self, *shape):
        """``t.reshape(2, 3)`` or ``t.reshape((2, 3))``, as in NumPy."""
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = shape[0]
        return reshape(self, shape)

    def register_accumulate_hook(self, hook):
        """Call ``hook(self)`` during ``backward()`` right after this leaf's ``grad`` was accumulated
        (the moment its gradient is final: see ``minidl.autograd``). A generic callable: minidl knows
        nothing of MPI."""
        self._accumulate_hooks = self._accumulate_hooks + (hook,)

    # ---- the chain rule -----------------------------------------------------------------
    def backward(self, grad=None):
        """Accumulate d(self)/d(leaf) into ``leaf.grad`` for every leaf with requires_grad (``minidl.autograd``).

        ``grad`` is the gradient flowing into ``self``; it defaults to 1 for a one-element tensor.
        """
        xp = backend.get_array_module(self.data)
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad "
                               "(no input had requires_grad=True, or it was made under no_grad())")
        if grad is None:
            if self.size != 1:
                raise RuntimeError(f"backward() without a gradient needs a one-element tensor, "
                                   f"got shape {self.shape}; pass grad= of that shape")
            grad = xp.ones_like(self.data)
        else:
            grad = grad.data if isinstance(grad, Tensor) else xp.asarray(grad, dtype=self.dtype)
            if grad.shape != self.shape:
                raise ValueError(f"backward(grad): grad has shape {grad.shape}, tensor has shape {self.shape}")
        grads, grad = {id(self): grad}, None       # only `grads` holds it now (see autograd._sole_holder)
        autograd.backward(self, grads)


class Parameter(Tensor):
    """A Tensor that a ``Module`` registers as one of its trainable parameters."""

    def __init__(self, data):
        super().__init__(data, requires_grad=True)

    def __repr__(self):
        return f"Parameter(shape={self.shape}, dtype={self.dtype})"


def result(data, parents, backward, op):
    """The output Tensor of an operation; records the graph only if some input needs a gradient."""
    out = Tensor(data)
    if autograd.grad_enabled() and any(parent.requires_grad for parent in parents):
        out.requires_grad = True
        out._parents = tuple(parents)
        out._backward = backward
        out.op = op
    return out


# ---- the operators' operations ------------------------------------------------------------
# Each computes its result and hands ``result`` a ``backward(grad)`` closure (the chain rule),
# written beside the forward. ``minidl.functional`` exports them with the other operations;
# ``sum`` and ``pow`` mean these operations in this file, never the builtins (see functional.py).
def as_tensor(value, like=None):
    """``value`` as a Tensor; python numbers and arrays become constants of ``like``'s dtype."""
    if isinstance(value, Tensor):
        return value
    xp = backend.xp()
    dtype = like.dtype if like is not None else None
    return Tensor(xp.asarray(value, dtype=dtype))


def as_tensors(a, b):
    """Both operands as Tensors; a plain number or array takes the other operand's dtype."""
    if isinstance(a, Tensor) and not isinstance(b, Tensor):
        return a, as_tensor(b, like=a)
    if isinstance(b, Tensor) and not isinstance(a, Tensor):
        return as_tensor(a, like=b), b
    return as_tensor(a), as_tensor(b)


# ---- elementwise arithmetic -------------------------------------------------------------
def add(a, b):
    a, b = as_tensors(a, b)
    check_broadcast("add", a, b)

    def backward(grad):
        return unbroadcast(grad, a.shape), unbroadcast(grad, b.shape)
    return result(a.data + b.data, (a, b), backward, "add")


def sub(a, b):
    a, b = as_tensors(a, b)
    check_broadcast("sub", a, b)

    def backward(grad):
        return unbroadcast(grad, a.shape), unbroadcast(-grad, b.shape)
    return result(a.data - b.data, (a, b), backward, "sub")


def mul(a, b):
    a, b = as_tensors(a, b)
    check_broadcast("mul", a, b)

    def backward(grad):
        return unbroadcast(grad * b.data, a.shape), unbroadcast(grad * a.data, b.shape)
    return result(a.data * b.data, (a, b), backward, "mul")


def div(a, b):
    a, b = as_tensors(a, b)
    check_broadcast("div", a, b)

    def backward(grad):
        grad_a = grad / b.data
        grad_b = -grad_a * a.data / b.data          # d(a/b)/db = -a / b^2
        return unbroadcast(grad_a, a.shape), unbroadcast(grad_b, b.shape)
    return result(a.data / b.data, (a, b), backward, "div")


def neg(a):
    a = as_tensor(a)
    return result(-a.data, (a,), lambda grad: (-grad,), "neg")


def pow(a, b):
    """a ** b; d/da = b a^(b-1), d/db = a^b log a (needs a > 0 where b needs a gradient)."""
    a, b = as_tensors(a, b)
    check_broadcast("pow", a, b)
    xp = backend.get_array_module(a.data)
    out = a.data ** b.data

    def backward(grad):
        grad_a = unbroadcast(grad * b.data * a.data ** (b.data - 1), a.shape) if a.requires_grad else None
        grad_b = unbroadcast(grad * out * xp.log(a.data), b.shape) if b.requires_grad else None
        return grad_a, grad_b
    return result(out, (a, b), backward, "pow")


# ---- matrix product and reductions ------------------------------------------------------
def matmul(a, b):
    """a @ b for (..., n, k) @ (..., k, m); batch axes broadcast."""
    a, b = as_tensor(a), as_tensor(b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul: needs operands with at least 2 dimensions, got shapes {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not match "
                         f"(inner dimensions {a.shape[-1]} != {b.shape[-2]})")
    xp = backend.get_array_module(a.data)

    def backward(grad):
        """(grad @ b^T, a^T @ grad), each summed back to its operand's shape; None where none is needed."""
        # BEGIN SOLUTION
        # d(a @ b)/da: (..., n, m) @ (..., m, k) -> (..., n, k); d/db: (..., k, n) @ (..., n, m) -> (..., k, m)
        grad_a = unbroadcast(xp.matmul(grad, xp.swapaxes(b.data, -1, -2)), a.shape) if a.requires_grad else None
        grad_b = unbroadcast(xp.matmul(xp.swapaxes(a.data, -1, -2), grad), b.shape) if b.requires_grad else None
        # END SOLUTION
        return grad_a, grad_b
    return result(xp.matmul(a.data, b.data), (a, b), backward, "matmul")


def _normalise_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ValueError(f"axis {ax} is out of range for a tensor with {ndim} dimensions")
    return tuple(sorted(ax % ndim for ax in axes))


def sum(a, axis=None, keepdims=False):
    a = as_tensor(a)
    axes = _normalise_axes(axis, a.ndim)
    xp = backend.get_array_module(a.data)

    def backward(grad):
        if not keepdims:
            grad = xp.expand_dims(grad, axes) if axes else grad
        return (xp.broadcast_to(grad, a.shape),)
    return result(a.data.sum(axis=axes, keepdims=keepdims), (a,), backward, "sum")


def mean(a, axis=None, keepdims=False):
    a = as_tensor(a)
    axes = _normalise_axes(axis, a.ndim)
    count = 1
    for ax in axes:
        count *= a.shape[ax]
    return div(sum(a, axis, keepdims), float(max(count, 1)))


def reshape(a, shape):
    a = as_tensor(a)
    try:
        out = a.data.reshape(shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape shape {a.shape} ({a.size} elements) into {shape}") from None
    return result(out, (a,), lambda grad: (grad.reshape(a.shape),), "reshape")


def transpose(a, axes=None):
    a = as_tensor(a)
    axes = tuple(reversed(range(a.ndim))) if axes is None else tuple(axes)
    if sorted(axes) != list(range(a.ndim)):
        raise ValueError(f"transpose: axes {axes} are not a permutation of the {a.ndim} axes of shape {a.shape}")
    inverse = tuple(numpy.argsort(axes))
    return result(a.data.transpose(axes), (a,), lambda grad: (grad.transpose(inverse),), "transpose")


# ---- elementwise functions --------------------------------------------------------------
def exp(a):
    a = as_tensor(a)
    xp = backend.get_array_module(a.data)
    out = xp.exp(a.data)
    return result(out, (a,), lambda grad: (grad * out,), "exp")


def log(a):
    a = as_tensor(a)
    xp = backend.get_array_module(a.data)
    return result(xp.log(a.data), (a,), lambda grad: (grad / a.data,), "log")


def relu(a):
    a = as_tensor(a)
    return result(backend.maximum_with_zero(a.data), (a,), lambda grad: (grad * (a.data > 0),), "relu")


def tanh(a):
    a = as_tensor(a)
    xp = backend.get_array_module(a.data)
    out = xp.tanh(a.data)
    return result(out, (a,), lambda grad: (grad * (1 - out * out),), "tanh")


def sigmoid(a):
    a = as_tensor(a)
    xp = backend.get_array_module(a.data)
    # 1 / (1 + e^-x) written so that neither branch overflows
    out = xp.where(a.data >= 0, 1 / (1 + xp.exp(-xp.abs(a.data))),
                   xp.exp(-xp.abs(a.data)) / (1 + xp.exp(-xp.abs(a.data))))
    return result(out, (a,), lambda grad: (grad * out * (1 - out),), "sigmoid")
