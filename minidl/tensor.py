"""A define-by-run autograd: ``Tensor`` records how it was made, ``backward()`` runs the chain rule.

Every operation in ``minidl.functional`` computes its result and, when gradients are wanted,
stores a small ``backward`` closure beside it: given the gradient of the final scalar with
respect to the result, it returns the gradients with respect to each input. ``backward()``
visits the recorded graph in reverse topological order and adds up those gradients.
The operators (``+``, ``*``, ``@``, ``.sum()``, ...) below are those same functions.

    >>> from minidl.tensor import Tensor
    >>> x = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    >>> loss = (x * x).sum()             # loss = sum_ij x_ij^2
    >>> loss.item()
    91.0
    >>> loss.backward()                  # d loss / d x = 2 x
    >>> x.grad.tolist()
    [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]

Gradients accumulate: a leaf's ``grad`` is *added to* (in place) by every ``backward()``, until
``zero_grad()`` (which zeroes it, or with ``set_to_none=True`` drops it). In-place accumulation matters here: a model's ``grad`` arrays can be views into
one flat gradient vector (``minidl.flat``), and an in-place add keeps them views.
"""
import contextlib

import sys

from minidl import backend

_grad_enabled = True


@contextlib.contextmanager
def no_grad():
    """Inside this block operations record no graph (evaluation, optimizer updates)."""
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, False
    try:
        yield
    finally:
        _grad_enabled = previous


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

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor(shape={self.shape}, dtype={self.dtype}{grad}{', op=' + self.op if self.op else ''})"

    def item(self):
        return self.data.item()

    def numpy(self):
        return backend.to_numpy(self.data)

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

    # ---- operators: each one is a function of minidl.functional, where its backward pass is ----
    def __add__(self, other):
        return functional.add(self, other)

    def __radd__(self, other):
        return functional.add(other, self)

    def __sub__(self, other):
        return functional.sub(self, other)

    def __rsub__(self, other):
        return functional.sub(other, self)

    def __mul__(self, other):
        return functional.mul(self, other)

    def __rmul__(self, other):
        return functional.mul(other, self)

    def __truediv__(self, other):
        return functional.div(self, other)

    def __rtruediv__(self, other):
        return functional.div(other, self)

    def __neg__(self):
        return functional.neg(self)

    def __pow__(self, exponent):
        return functional.pow(self, exponent)

    def __matmul__(self, other):
        return functional.matmul(self, other)

    def sum(self, axis=None, keepdims=False):
        return functional.sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return functional.mean(self, axis, keepdims)

    def reshape(self, *shape):
        """``t.reshape(2, 3)`` or ``t.reshape((2, 3))``, as in NumPy."""
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = shape[0]
        return functional.reshape(self, shape)

    def transpose(self, *axes):
        return functional.transpose(self, axes if axes else None)

    def exp(self):
        return functional.exp(self)

    def log(self):
        return functional.log(self)

    def relu(self):
        return functional.relu(self)

    def tanh(self):
        return functional.tanh(self)

    def sigmoid(self):
        return functional.sigmoid(self)

    def register_accumulate_hook(self, hook):
        """Call ``hook(self)`` during ``backward()`` right after this leaf's ``grad`` was accumulated.

        Each ``backward()`` visits a leaf once, after every path to it is done, so at that moment
        the leaf's gradient for this backward is final while the rest of the graph (the layers
        nearer the input) is still being differentiated: data parallelism starts summing a
        gradient over ranks there (``collectives.nonblocking``). A generic callable: minidl
        knows nothing of MPI.
        """
        self._accumulate_hooks = self._accumulate_hooks + (hook,)

    # ---- the chain rule -----------------------------------------------------------------
    def backward(self, grad=None):
        """Accumulate d(self)/d(leaf) into ``leaf.grad`` for every leaf with requires_grad.

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

        # reverse topological order, iteratively (deep graphs would overflow recursion)
        order, seen, stack = [], set(), [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            # leaves pushed first, so popped last: each leaf then comes right after its last user in
            # the backward order below, and its gradient is final (and its hooks run) as early as
            # possible. The order of the other nodes, and so every sum, is the same either way.
            parents = [parent for parent in node._parents if parent.requires_grad]
            stack.extend((parent, False) for parent in parents if parent._backward is None)
            stack.extend((parent, False) for parent in parents if parent._backward is not None)

        grads = {id(self): grad}
        grad = None                 # from here on only `grads` holds the engine's gradients (see _sole_holder)
        for node in reversed(order):
            key = id(node)
            if key not in grads:
                continue
            if node._backward is None:                      # a leaf: accumulate
                if node.grad is None and _sole_holder(grads, key, node.dtype):
                    node.grad = grads.pop(key)              # nobody else holds it: no copy needed
                elif node.grad is None:
                    node.grad = xp.array(grads.pop(key), dtype=node.dtype, copy=True)
                else:
                    node.grad += grads.pop(key)
                for hook in node._accumulate_hooks:         # this backward's gradient for node is final
                    hook(node)
                continue
            node_grad = grads.pop(key)
            for parent, parent_grad in zip(node._parents, node._backward(node_grad)):
                if parent_grad is None or not parent.requires_grad:
                    continue
                if id(parent) in grads:
                    grads[id(parent)] = grads[id(parent)] + parent_grad
                else:
                    grads[id(parent)] = parent_grad
            node_grad = parent_grad = None      # a name of this loop would count as a holder in _sole_holder


def _sole_holder(grads, key, dtype):
    """Whether ``grads[key]`` can become a leaf's .grad as it is: a fresh array of the right dtype that
    owns its memory and that nothing but ``grads`` refers to (no operation's cache, no view, no user
    array, no other leaf's .grad; then copying it, e.g. 8 MB for a 32-image conv input, would only
    cost time).

    The count is taken of ``grads[key]``, an expression, never of a local name: the value of an
    expression is a new reference on every Python version, so an array that only ``grads`` holds
    counts exactly 2 (the dict's and the expression's). A local name or an argument can be loaded
    without a reference of its own (Python 3.14 "borrows" them), so a count of one differs between
    versions and would let a shared array through; any real holder (a name, a cache, a view's
    base, another dict) holds a reference of its own and makes the count larger, so the check
    errs only towards a copy.
    """
    array = grads[key]
    if getattr(array, "base", 0) is not None or array.dtype != dtype or not getattr(array.flags, "writeable", True):
        return False
    array = None
    return sys.getrefcount(grads[key]) == 2


class Parameter(Tensor):
    """A Tensor that a ``Module`` registers as one of its trainable parameters."""

    def __init__(self, data):
        super().__init__(data, requires_grad=True)

    def __repr__(self):
        return f"Parameter(shape={self.shape}, dtype={self.dtype})"


def result(data, parents, backward, op):
    """The output Tensor of an operation; records the graph only if some input needs a gradient."""
    out = Tensor(data)
    if _grad_enabled and any(parent.requires_grad for parent in parents):
        out.requires_grad = True
        out._parents = tuple(parents)
        out._backward = backward
        out.op = op
    return out


# Last, because functional imports Tensor and result from this module: whichever of the two is
# imported first, both are complete before any operator above runs.
from minidl import functional  # noqa: E402
