"""The minidl side: one layer's forward + backward, or one training step, as a function to time.

``minidl_worker`` serves a suite from its own process (``python -m minidl.bench ... --worker minidl``,
``rounds.py``): the GEMM rate when it starts, then each case's time, the conv layer's floor (sweep)
and the per-stage breakdown (main) as the parent asks for them, round after round.
"""
import numpy

from minidl import Tensor, backend, functional as F, models, nn, optim, tuning
from minidl.bench.breakdown import breakdown, conv_stages
from minidl.bench.cases import FLOOR_STAGES, SUITES
from minidl.bench.rounds import serve
from minidl.bench.timing import best_ms, gemm_gflops
from minidl.conv import budget


def minidl_step(case, rng):
    """A no-argument function that runs ``case`` once with minidl on the active backend."""
    xp = backend.xp()

    def array(*shape):
        return xp.asarray(rng.standard_normal(shape), dtype=xp.float32)

    if case["kind"] == "conv":
        n, c, f, side, k, stride, padding = case["shape"]
        layer = nn.Conv2d(c, f, k, stride=stride, padding=padding, rng=rng, algorithm=case["algorithm"])
        x = Tensor(array(n, c, side, side), requires_grad=case.get("input_grad", True))    # False: a first layer
        out_side = (side + 2 * padding - k) // stride + 1
        grad = array(n, f, out_side, out_side)
        return lambda: _forward_backward(layer, x, grad)
    if case["kind"] == "pool":
        n, c, side, k = case["shape"]
        layer = nn.MaxPool2d(k)
        x = Tensor(array(n, c, side, side), requires_grad=True)
        grad = array(n, c, side // k, side // k)
        return lambda: _forward_backward(layer, x, grad)
    if case["kind"] == "linear":
        n, i, o = case["shape"]
        layer = nn.Linear(i, o, rng=rng)
        x = Tensor(array(n, i), requires_grad=True)
        grad = array(n, o)
        return lambda: _forward_backward(layer, x, grad)
    # a training step: forward, loss, backward, SGD update
    batch = case["batch"]
    if case["model"] == "lenet5":
        model = models.lenet5(rng)
    else:
        model = models.mlp(rng, in_features=784, hidden=(256, 256))
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    x = Tensor(array(batch, 1, 28, 28))
    labels = xp.asarray(rng.integers(0, 10, batch))

    def step():
        optimizer.zero_grad(set_to_none=True)                  # as the PyTorch step below
        F.softmax_cross_entropy(model(x), labels).backward()
        optimizer.step()
    return step


def _forward_backward(layer, x, grad):
    for parameter in layer.parameters():
        parameter.grad = None
    x.grad = None
    layer(x).backward(grad)


def minidl_worker(suite, quick, repeats, clock):
    """Serve ``suite``'s cases (rounds.serve): each request's case timed as the minimum of ``repeats``
    calls; for the sweep's conv rows on NumPy, its floor on request; the main suite's breakdown."""
    rng = numpy.random.default_rng(0)
    sync = lambda: None                                           # noqa: E731
    if backend.get_backend() == "cupy":
        import cupy
        sync = cupy.cuda.Device().synchronize
        clock = "wall"                                            # GPU time is not this process's CPU time
    xp = backend.xp()
    cases = SUITES[suite](quick)
    built = {}                               # the case asked for last: its step and its floor's stages

    def matmul_of(size):
        a = xp.asarray(rng.standard_normal((size, size)), dtype=xp.float32)
        return lambda: a @ a
    gemm = gemm_gflops(matmul_of, 256 if quick else 2048, repeats, clock, sync)

    def answer(request):
        if request.get("breakdown"):
            return breakdown(quick, repeats, clock, gemm)
        index = request["case"]
        if index not in built:
            built.clear()
            built[index] = {"step": minidl_step(cases[index], rng)}
            best_ms(built[index]["step"], 1, sync, warmup=2, clock=clock)          # a warm-up
        if not request.get("floor"):
            return {"ms": best_ms(built[index]["step"], repeats, sync, warmup=0, clock=clock)}
        # the conv layer's floor: its GEMMs and im2col/col2im copies, each timed alone (the stages of
        # the CPU's blocks of images: on a GPU the layer runs as one block, so they are no floor there)
        stages = built[index].setdefault("stages", [(fn, scale) for _, stage, fn, _, scale in
                                                    conv_stages(cases[index]["shape"], rng, xp)
                                                    if stage in FLOOR_STAGES])
        return {"ms": sum(best_ms(fn, repeats, sync, warmup=1, clock=clock) * scale for fn, scale in stages)}
    serve({"gemm_gflops": gemm, "backend": backend.get_backend(), "tuning": tuning.ACTIVE.source,
           "settings": settings_in_force()}, answer)


def settings_in_force():
    """The settings that decide bits and speed, as this process reads them: a worker reports its own, since
    a tuning file accepted here may be refused where the environment differs (``--blas native``)."""
    active = tuning.ACTIVE
    return {"block_bytes": active.block_bytes, "column_bytes": budget.current(), "layouts": active.layouts,
            "winograd_min_channels": active.winograd_min_channels, "fft_min_kernel": active.fft_min_kernel}
