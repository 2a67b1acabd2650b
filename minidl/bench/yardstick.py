"""The PyTorch side, only as a yardstick: the same cases as nn.Conv2d, nn.MaxPool2d, nn.Linear and two models.

PyTorch is imported here (inside the worker, never at import time) and nowhere else in minidl.
"""
from minidl.bench.cases import SUITES
from minidl.bench.rounds import serve
from minidl.bench.timing import best_ms, gemm_gflops


def torch_step(case, torch, device="cpu"):
    nn_ = torch.nn
    generator = torch.Generator().manual_seed(0)

    def array(*shape, grad=False):
        return torch.randn(*shape, generator=generator).to(device).requires_grad_(grad)

    if case["kind"] in ("conv", "pool", "linear"):
        if case["kind"] == "conv":
            n, c, f, side, k, stride, padding = case["shape"]
            layer, x = nn_.Conv2d(c, f, k, stride=stride, padding=padding), array(n, c, side, side, grad=True)
        elif case["kind"] == "pool":
            n, c, side, k = case["shape"]
            layer, x = nn_.MaxPool2d(k), array(n, c, side, side, grad=True)
        else:
            n, i, o = case["shape"]
            layer, x = nn_.Linear(i, o), array(n, i, grad=True)
        layer = layer.to(device)
        grad = torch.randn(layer(x).shape, generator=generator).to(device)

        def step():
            layer.zero_grad(set_to_none=True)
            x.grad = None
            layer(x).backward(grad)
        return step
    if case["model"] == "lenet5":
        model = nn_.Sequential(nn_.Conv2d(1, 6, 5, padding=2), nn_.ReLU(), nn_.MaxPool2d(2),
                               nn_.Conv2d(6, 16, 5), nn_.ReLU(), nn_.MaxPool2d(2), nn_.Flatten(),
                               nn_.Linear(400, 120), nn_.ReLU(), nn_.Linear(120, 84), nn_.ReLU(), nn_.Linear(84, 10))
    else:
        model = nn_.Sequential(nn_.Flatten(), nn_.Linear(784, 256), nn_.ReLU(), nn_.Linear(256, 256), nn_.ReLU(),
                               nn_.Linear(256, 10))
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, labels = array(case["batch"], 1, 28, 28), torch.randint(0, 10, (case["batch"],), generator=generator).to(device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        nn_.functional.cross_entropy(model(x), labels).backward()
        optimizer.step()
    return step


def torch_worker(suite, quick, repeats, threads, clock, device="cpu"):
    """Serve PyTorch's times (rounds.serve); ``device="cuda"`` is the yardstick for the CuPy rows (wall
    time, synchronized)."""
    import torch
    torch.set_num_threads(threads)
    sync = lambda: None                                           # noqa: E731
    if device == "cuda":
        sync, clock = torch.cuda.synchronize, "wall"
    cases = SUITES[suite](quick)
    built = {}

    def matmul_of(size):
        a = torch.randn(size, size).to(device)
        return lambda: a @ a
    meta = {"version": torch.__version__, "gemm_gflops": gemm_gflops(matmul_of, 256 if quick else 2048, repeats, clock,
                                                                     sync)}
    if device == "cuda":
        meta["device_name"] = torch.cuda.get_device_name()

    def answer(request):
        index = request["case"]
        if index not in built:
            built.clear()
            built[index] = torch_step(cases[index], torch, device)
            best_ms(built[index], 1, sync, warmup=2, clock=clock)                 # a warm-up
        return {"ms": best_ms(built[index], repeats, sync, warmup=0, clock=clock)}
    serve(meta, answer)
