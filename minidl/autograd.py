"""The chain rule over the recorded graph (``backward``), and the switch that stops recording (``no_grad``).

Every operation (``minidl.tensor``, ``minidl.functional``) records its result as a node of a
graph: ``_parents`` (the Tensors it was made from) and ``_backward`` (a closure: the gradient of
the result -> the gradients of the parents). ``backward`` visits the nodes in reverse topological
order, so that each node's closure runs once, with its gradient complete, and adds the gradients
that reach a leaf (a node without ``_backward``) into the leaf's ``grad``. ``Tensor.backward()``
calls it.

Each ``backward()`` visits a leaf once, after every path to it is done, so at that moment the
leaf's gradient for this backward is final while the rest of the graph (the layers nearer the
input) is still being differentiated: a hook registered with ``Tensor.register_accumulate_hook``
runs then, and data parallelism starts summing a gradient over ranks there
(``collectives.nonblocking``).
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


def grad_enabled():
    """Whether operations record the graph now (False inside ``no_grad()``)."""
    return _grad_enabled


def backward(root, grads):
    """Accumulate d(root)/d(leaf) into ``leaf.grad`` for every leaf behind ``root`` with requires_grad.

    ``grads`` is ``{id(root): the gradient flowing into root}``, and the caller keeps no other
    reference to that array: only ``grads`` holds the engine's gradients, so that a leaf can
    adopt one as it is, without a copy (``_sole_holder``).
    """
    xp = backend.get_array_module(root.data)
    # reverse topological order, iteratively (deep graphs would overflow recursion)
    order, seen, stack = [], set(), [(root, False)]
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
