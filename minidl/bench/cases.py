"""The benchmark's cases: the main, conv, layers and sweep suites as lists of dicts, and their flop counts.

A case names what runs (``kind``: conv, pool, linear or a training ``step``), its shape, and,
where the chapter states one, the target its row is checked against.
"""
from minidl import conv

# the training steps' targets (minidl's time over PyTorch's, the median over rounds) and the conv layer's
# (over its floor), the same in the main suite and at every batch of the sweep
STEP_TARGETS = {"lenet5": 1.0, "mlp": 0.8}
FLOOR_TARGET = 1.10
# conv: (batch, in_channels, out_channels, side, kernel, stride, padding)
LARGE_CONV = (32, 64, 64, 32, 3, 1, 1)
LENET_CONV1 = (64, 1, 6, 28, 5, 1, 2)
LENET_CONV2 = (64, 6, 16, 14, 5, 1, 0)


def main_cases(quick):
    """The main suite: the large conv, LeNet-5's layers at batch 64, and two training steps."""
    large = (2, 8, 8, 8, 3, 1, 1) if quick else LARGE_CONV
    batch = 4 if quick else 64
    return [
        {"case": "conv2d large fwd+bwd", "kind": "conv", "shape": large, "algorithm": "im2col",
         "target_ratio": 1.5, "target_gemm_fraction": 0.8},
        {"case": "conv2d large fwd+bwd (auto)", "kind": "conv", "shape": large, "algorithm": "auto",
         "target_ratio": 1.3},
        {"case": "lenet conv1 fwd+bwd", "kind": "conv", "shape": (batch,) + LENET_CONV1[1:], "algorithm": "im2col"},
        {"case": "lenet pool1 fwd+bwd", "kind": "pool", "shape": (batch, 6, 28, 2)},
        {"case": "lenet conv2 fwd+bwd", "kind": "conv", "shape": (batch,) + LENET_CONV2[1:], "algorithm": "im2col"},
        {"case": "lenet pool2 fwd+bwd", "kind": "pool", "shape": (batch, 16, 10, 2)},
        {"case": "lenet fc1 fwd+bwd", "kind": "linear", "shape": (batch, 400, 120)},
        {"case": "lenet fc2 fwd+bwd", "kind": "linear", "shape": (batch, 120, 84)},
        {"case": "lenet fc3 fwd+bwd", "kind": "linear", "shape": (batch, 84, 10)},
        {"case": "lenet5 train step", "kind": "step", "model": "lenet5", "batch": batch,
         "target_ratio": STEP_TARGETS["lenet5"]},
        {"case": "mlp 784-256-256-10 train step", "kind": "step", "model": "mlp", "batch": batch,
         "target_ratio": STEP_TARGETS["mlp"]},
    ]


def conv_cases(quick):
    """The conv suite: every algorithm on the LeNet and large shapes, a channel sweep, a kernel sweep."""
    algorithms = ("direct", "im2col", "fft", "winograd", "auto")
    if quick:
        shapes = {"large": (2, 4, 4, 8, 3, 1, 1)}
        channels, kernels, kernel_side = (4, 8), (3, 5), 12
    else:
        shapes = {"lenet conv1": LENET_CONV1, "lenet conv2": LENET_CONV2, "large": LARGE_CONV}
        channels, kernels, kernel_side = (8, 16, 32, 64, 128), (3, 5, 7, 9, 11, 13, 15, 17, 21), 64
    cases = []
    for label, shape in shapes.items():
        cases += [{"case": f"{label}", "kind": "conv", "shape": shape, "algorithm": a} for a in algorithms
                  if _supported(a, shape)]
    for width in channels:        # Winograd's regime: 3x3, stride 1, channel count grows
        shape = (2 if quick else 16, width, width, 8 if quick else 32, 3, 1, 1)
        cases += [{"case": f"channels {width}", "kind": "conv", "shape": shape, "algorithm": a, "sweep": "channels",
                   "x": width} for a in ("im2col", "winograd", "fft")]
    for k in kernels:             # FFT's regime: the kernel grows, the image stays ("same" padding)
        shape = (2 if quick else 8, 4 if quick else 16, 4 if quick else 16, kernel_side, k, 1, k // 2)
        cases += [{"case": f"kernel {k}x{k}", "kind": "conv", "shape": shape, "algorithm": a, "sweep": "kernel", "x": k}
                  for a in ("im2col", "fft") + (("direct",) if k <= 7 else ())]
    return cases


def _supported(algorithm, shape):
    n, c, f, side, k, stride, padding = shape
    try:
        conv.get(algorithm, (n, c, side, side), (f, c, k, k), stride, padding)
    except ValueError:
        return False
    return True


def layers_cases(quick):
    """Hegde & Usmani 2016, section 4.2: a convolution layer and a fully connected layer over sizes."""
    channels = (4, 8) if quick else (16, 32, 64, 128)
    widths = (64, 128) if quick else (256, 512, 1024, 2048, 4096)
    batch_conv, side, batch_fc = (2, 8, 8) if quick else (32, 32, 128)
    cases = [{"case": f"conv {c}->{c} {side}x{side}", "kind": "conv", "shape": (batch_conv, c, c, side, 3, 1, 1),
              "algorithm": "im2col", "sweep": "conv", "x": c} for c in channels]
    cases += [{"case": f"fc {w}x{w}", "kind": "linear", "shape": (batch_fc, w, w), "sweep": "fc", "x": w}
              for w in widths]
    return cases


SWEEP_BATCHES = (16, 32, 64, 128, 256)
FLOOR_STAGES = ("GEMM", "im2col copy", "im2col copy (rebuilt)", "col2im", "zero-pad copy")


def sweep_cases(quick):
    """Every batch size: the LeNet-5 and MLP training steps and the 64-channel conv layer (with its floor)."""
    cases = []
    for batch in ((2, 4) if quick else SWEEP_BATCHES):
        conv_shape = (batch,) + ((4, 4, 8, 3, 1, 1) if quick else LARGE_CONV[1:])
        cases += [{"case": "lenet5 train step", "kind": "step", "model": "lenet5", "batch": batch,
                   "target_ratio": STEP_TARGETS["lenet5"]},
                  {"case": "mlp 784-256-256-10 train step", "kind": "step", "model": "mlp", "batch": batch,
                   "target_ratio": STEP_TARGETS["mlp"]},
                  {"case": "conv 64->64 32x32", "kind": "conv", "shape": conv_shape, "algorithm": "im2col",
                   "batch": batch, "target_floor": FLOOR_TARGET}]
    return cases


SUITES = {"main": main_cases, "conv": conv_cases, "layers": layers_cases, "sweep": sweep_cases}


def conv_flops(shape):
    """2 N F C kh kw Ho Wo per pass, times three passes (forward, grad_x, grad_weight)."""
    n, c, f, side, k, stride, padding = shape
    out = (side + 2 * padding - k) // stride + 1
    return 3 * 2 * n * f * c * k * k * out * out


def linear_flops(shape):
    n, i, o = shape
    return 3 * 2 * n * i * o
