"""Scratch arrays the kernels reuse from call to call (``workspace``), instead of allocating them afresh."""
import sys
import threading

_workspaces = {}
_workspace_lock = threading.Lock()
_BUFFERS_PER_SHAPE = 4


def release():
    """Forget every pooled buffer (each is freed once nothing else holds it): the next calls allocate
    afresh. For measuring what a step allocates (``algorithms.memory``); never needed for correctness."""
    with _workspace_lock:
        _workspaces.clear()


def workspace(xp, shape, dtype, zero=False):
    """A reusable scratch array of ``shape`` and ``dtype`` (uninitialised unless ``zero``).

    Why: a fresh 75 MB array costs page faults on first touch, every call (about as long as the
    copy into it). A buffer is handed out again only when nothing but this pool refers to it
    (``sys.getrefcount``): no autograd cache, no view, no caller still holds it, so reuse can never
    overwrite data someone will read. At most a few buffers per shape are kept.
    The count is taken of ``buffers[index]``, an expression, never of a local name: an expression's
    value is a reference of its own on every Python version, so a buffer that only the list holds
    counts exactly 2. A name can be loaded without one (Python 3.14 "borrows" it), and a count of
    it would then be one lower and hand out a buffer that a cache still reads.
    """
    key = (xp.__name__, tuple(shape), xp.dtype(dtype))      # a dtype object: str(dtype) costs about 2 us a call
    with _workspace_lock:
        buffers = _workspaces.setdefault(key, [])
        free = [index for index in range(len(buffers))
                if sys.getrefcount(buffers[index]) == 2]      # the list's reference and the expression's
        if free:
            buffer = buffers[free[0]]
        else:
            buffer = xp.empty(shape, dtype=dtype)
            if len(buffers) < _BUFFERS_PER_SHAPE:
                buffers.append(buffer)
    if zero:
        buffer.fill(0)
    return buffer
