"""Convolution kernels behind one interface, selected by name.

Every algorithm module here provides the same three functions:

    supports(x_shape, weight_shape, stride, padding) -> None, or a sentence saying why not
    forward(x, weight, stride, padding)              -> (out, cache)
    backward(grad_out, cache, need_x, need_weight)   -> (grad_x, grad_weight)  (None where not needed)

with x (N, C, H, W), weight (F, C, kh, kw), out (N, F, Ho, Wo) and

    Ho = (H + 2 padding - kh) // stride + 1,   Wo = (W + 2 padding - kw) // stride + 1.

``cache`` is a dict of what backward needs (named entries, not a positional tuple). Bias is
added outside (``minidl.functional.conv2d``), since it is the same for every algorithm.

The algorithms (Ben-Nun & Hoefler 2019): ``direct`` (the definition, the test oracle),
``im2col`` (one GEMM, the default), ``fft`` (products of spectra), ``winograd`` (F(2x2, 3x3),
3x3 stride 1 only), and ``auto`` (a measured rule picks one of them per shape). ``cost.py``
gives each one's multiply count and extra memory.
"""
import importlib
import sys
import threading

ALGORITHMS = ("direct", "im2col", "fft", "winograd", "auto")
_registry = {}


def output_size(size, kernel, stride, padding):
    return (size + 2 * padding - kernel) // stride + 1


def check_shapes(x_shape, weight_shape, stride, padding):
    """Raise ValueError naming both shapes if this convolution is impossible."""
    if len(x_shape) != 4:
        raise ValueError(f"conv2d: input must be (N, C, H, W), got shape {tuple(x_shape)}")
    if len(weight_shape) != 4:
        raise ValueError(f"conv2d: weight must be (F, C, kh, kw), got shape {tuple(weight_shape)}")
    if x_shape[1] != weight_shape[1]:
        raise ValueError(f"conv2d: input shape {tuple(x_shape)} has {x_shape[1]} channels but weight "
                         f"shape {tuple(weight_shape)} expects {weight_shape[1]}")
    if not isinstance(stride, int) or stride < 1:
        raise ValueError(f"conv2d: stride must be an integer >= 1, got {stride!r}")
    if not isinstance(padding, int) or padding < 0:
        raise ValueError(f"conv2d: padding must be an integer >= 0, got {padding!r}")
    height, width = x_shape[2] + 2 * padding, x_shape[3] + 2 * padding
    if weight_shape[2] > height or weight_shape[3] > width:
        raise ValueError(f"conv2d: kernel {tuple(weight_shape[2:])} is larger than the padded input "
                         f"({height}, {width}) from input shape {tuple(x_shape)} and padding {padding}")


def _module(name):
    if name not in ALGORITHMS:
        raise ValueError(f"conv2d: unknown algorithm {name!r}; choose one of {ALGORITHMS}")
    if name not in _registry:
        module = "im2col_blocked" if name == "im2col" else name      # the kernel; im2col.py is its textbook
        _registry[name] = importlib.import_module(f"minidl.conv.{module}")
    return _registry[name]


def get(name, x_shape, weight_shape, stride, padding):
    """The kernel module for ``name``; raises ValueError naming the limitation if it can't do this case."""
    if name == "auto":
        return _module("auto").choose(x_shape, weight_shape, stride, padding)
    kernel = _module(name)
    reason = kernel.supports(x_shape, weight_shape, stride, padding)
    if reason:
        raise ValueError(f"conv2d: algorithm {name!r} cannot compute this case: {reason}")
    return kernel


def pad(x, padding):
    """Zero-pad the two spatial axes of (N, C, H, W)."""
    if padding == 0:
        return x
    from minidl.backend import get_array_module
    xp = get_array_module(x)
    n, c, h, w = x.shape
    out = xp.zeros((n, c, h + 2 * padding, w + 2 * padding), dtype=x.dtype)
    out[:, :, padding:padding + h, padding:padding + w] = x
    return out


_workspaces = {}
_workspace_lock = threading.Lock()
_BUFFERS_PER_SHAPE = 4


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
