"""``algorithm="auto"``: pick the fastest supported convolution algorithm for the shape.

A fixed rule, not a timing at run time (so the same shape always takes the same path and the
result is reproducible bit for bit). The thresholds were measured with
``python -m minidl.bench conv`` and the per-pass sweep below (forward + both gradients, float32,
NumPy + OpenBLAS, one thread, process CPU time, minimum of 5 runs):

    winograd  for 3x3, stride 1, when in_channels and out_channels are both >= WINOGRAD_MIN_CHANNELS.
              Channel sweep (batch 16, 32x32), im2col / Winograd time, forward, input gradient,
              weight gradient, on a 2-core Intel Xeon machine, against the im2col of that time:
              64 channels 0.69, 0.60, 0.92 (Winograd slower in every pass); 128 channels 0.78,
              0.76, 1.12; 256 channels 0.84, 1.23, 1.34, the whole layer 1.10x faster with
              Winograd. Hence 256. (On an AMD EPYC machine with OpenBLAS's SkylakeX kernels the
              whole layer was 1.12x faster with Winograd at 64 channels and 1.59x at 128: the tile
              transforms are memory-bound passes, and how much of the saved multiplications they
              eat depends on the machine's memory system. Chapter 2's latest run, on an AMD EPYC
              with the cache-sized blocks, has Winograd about even at 64 channels and faster at
              128, so there the rule picks im2col where Winograd would win.)
    fft       for kernels of FFT_MIN_KERNEL or more on a side. Kernel sweep (batch 8, 16 -> 16
              channels, 64x64, "same" padding), im2col / FFT time: 0.70 at 5x5, 1.34 at 7x7, 1.98
              at 9x9 on the Intel machine (the AMD one: 0.93, 1.55, 3.1); on LeNet's 5x5 layers
              (14x14 and 28x28 images, 1 or 6 channels) im2col wins, so the rule starts at 7.
    im2col    otherwise (the default; direct was never the fastest).

On another machine (or on a GPU, where cuDNN-like libraries make other choices) the crossovers
move: ``measure`` times every supported algorithm for one shape, and the benchmark prints the
rule's choice beside the measured fastest so a disagreement is visible. ``python -m minidl.tune``
measures both crossovers on this machine (the channel sweep at 32, 64 and 128 channels, the kernel
sweep at 5, 7 and 9) and writes them to the tuning file (``minidl/tuning.py``), which sets the two
thresholds below at import; the numbers above are the shipped defaults.
"""
import time

from minidl import tuning
from minidl.conv import kernels

WINOGRAD_MIN_CHANNELS = tuning.ACTIVE.winograd_min_channels      # shipped: 256
FFT_MIN_KERNEL = tuning.ACTIVE.fft_min_kernel                    # shipped: 7


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
    return kernels.get(name, x_shape, weight_shape, stride, padding)


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
        kernel = kernels.by_name(name)
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
