"""minidl: a small define-by-run deep-learning library on NumPy or CuPy (no MPI in here).

    from minidl import Tensor, nn, functional as F, optim

    tensor.py        Tensor: it records how it was made; its operators' operations and their backward passes
    autograd.py      the chain rule over the recorded graph (``backward``) and ``no_grad``
    broadcasting.py  broadcasting's check and its chain rule (a gradient summed back to its operand's shape)
    functional.py    the other operations with hand-written backward passes (conv2d, pooling, losses, ...)
    pool.py          max and average pooling kernels
    local.py         locally connected layers' kernel (DistBelief's unshared weights) and its direct loop
    nn.py            layers as Modules (Linear, Conv2d, LocallyConnected2d, MaxPool2d, ReLU, Flatten, ...), .npz files
    models.py        the MLP, the small CNN, LeNet-5, the wide MLP and the small CNN's locally connected twin
    flat.py          one flat parameter vector and one flat gradient vector, views for each layer
    optim.py         SGD with momentum, Adagrad, Adam, L-BFGS
    recompute.py     checkpointed segments: activations recomputed in the backward
    gradcheck.py     finite differences in float64 against the backward passes
    backend.py       NumPy or CuPy (``xp``), and the allocator settings minidl keeps
    tuning.py        the user's tuning file: the conv kernel's settings measured on this machine, read at import
    tune/            ``python -m minidl.tune``: measures those settings (and runs collectives' tuning) and writes them
    conv/            the convolution kernels: direct, im2col, FFT, Winograd, chosen by name
    data/            the embedded digits, the IDX reader, synthetic problems, sharding and batching
    bench/           ``python -m minidl.bench``: minidl beside PyTorch and the GEMM rate
"""
from minidl import backend, functional, models, nn, optim
from minidl.backend import get_backend, set_backend
from minidl.flat import FlatParameters, flatten
from minidl.gradcheck import gradcheck
from minidl.recompute import Checkpoint, checkpoint, checkpointed
from minidl.tensor import Parameter, Tensor, no_grad

backend.keep_freed_memory()

__all__ = ["Tensor", "Parameter", "no_grad", "gradcheck", "checkpoint", "Checkpoint", "checkpointed",
           "FlatParameters", "flatten", "backend", "functional", "models", "nn", "optim", "get_backend", "set_backend"]
