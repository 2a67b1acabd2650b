"""``algorithm="auto"``: pick the fastest supported convolution algorithm for the shape.

A fixed rule, not a timing at run time (so the same shape always takes the same path and the
result is reproducible bit for bit). The thresholds were measured with
``python -m minidl.bench conv`` (forward + both gradients, float32, NumPy + OpenBLAS, one thread,
the AMD EPYC machine this project was developed on; the table is in tutorials/02_convolution.md):

    winograd  for 3x3, stride 1, when in_channels and out_channels are both >= WINOGRAD_MIN_CHANNELS
              (below that the 16 small products and the tile transforms cost more than they save)
    fft       for kernels of FFT_MIN_KERNEL or more on a side (the measured crossover with im2col)
    im2col    otherwise (the default; direct is never the fastest)

On another machine (or on a GPU, where cuDNN-like libraries make other choices) the crossovers
move: ``measure`` times every supported algorithm for one shape, and the benchmark prints the
rule's choice beside the measured fastest so a disagreement is visible.
"""
import time

from minidl import conv

WINOGRAD_MIN_CHANNELS = 32
FFT_MIN_KERNEL = 13


def choose_name(x_shape, weight_shape, stride, padding):
    """The name of the algorithm the rule picks for this shape."""
    f, c, kh, kw = weight_shape
    if kh == kw == 3 and stride == 1 and min(c, f) >= WINOGRAD_MIN_CHANNELS:
        return "winograd"
    if min(kh, kw) >= FFT_MIN_KERNEL:
        return "fft"
    return "im2col"


def choose(x_shape, weight_shape, stride, padding):
    """The kernel module the rule picks (it always supports the shape)."""
    name = choose_name(x_shape, weight_shape, stride, padding)
    return conv.get(name, x_shape, weight_shape, stride, padding)


# the kernel interface, so that "auto" can be used wherever a kernel module can
def supports(x_shape, weight_shape, stride, padding):
    return None


def forward(x, weight, stride, padding):
    kernel = choose(x.shape, weight.shape, stride, padding)
    out, cache = kernel.forward(x, weight, stride, padding)
    return out, {"kernel": kernel, "inner": cache}


def backward(grad_out, cache, need_x=True, need_weight=True):
    return cache["kernel"].backward(grad_out, cache["inner"], need_x, need_weight)


def measure(x, weight, stride, padding, repeats=3, algorithms=("im2col", "winograd", "fft", "direct")):
    """{name: best seconds of forward + both gradients} for every supported algorithm on these arrays."""
    times = {}
    for name in algorithms:
        kernel = conv._module(name)
        if kernel.supports(x.shape, weight.shape, stride, padding):
            continue
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            out, cache = kernel.forward(x, weight, stride, padding)
            kernel.backward(out, cache)
            best = min(best, time.perf_counter() - start)
        times[name] = best
    return times
