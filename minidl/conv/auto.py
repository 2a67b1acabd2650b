"""``algorithm="auto"``: pick the fastest supported convolution algorithm for the shape.

A fixed rule, not a timing at run time (so the same shape always takes the same path and the
result is reproducible bit for bit). The thresholds were measured with
``python -m minidl.bench conv`` (forward + both gradients, float32, NumPy + OpenBLAS, one thread,
process CPU time, minimum of 5 runs, on the 2-core AMD EPYC machine this project was developed on;
the full table is in tutorials/02_convolution.md):

    winograd  for 3x3, stride 1, when in_channels and out_channels are both >= WINOGRAD_MIN_CHANNELS.
              Channel sweep (batch 16, 32x32): Winograd/im2col time 0.70x at 8 channels, 0.92x at
              16, 1.12x faster at 32, 1.13x at 64, 1.59x at 128 (below 32 the tile transforms,
              which are memory-bound passes, cost more than the saved multiplications).
    fft       for kernels of FFT_MIN_KERNEL or more on a side. Kernel sweep (batch 8, 16 -> 16
              channels, 64x64, "same" padding): FFT first wins at 5x5 (1.17x), by 1.9x at 7x7 and
              5x at 11x11; but on LeNet's 5x5 layers (14x14 and 28x28 images, 1 or 6 channels)
              im2col still wins, so the rule starts at 7.
    im2col    otherwise (the default; direct was never the fastest).

On another machine (or on a GPU, where cuDNN-like libraries make other choices) the crossovers
move: ``measure`` times every supported algorithm for one shape, and the benchmark prints the
rule's choice beside the measured fastest so a disagreement is visible.
"""
import time

from minidl import conv

WINOGRAD_MIN_CHANNELS = 32
FFT_MIN_KERNEL = 7


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
