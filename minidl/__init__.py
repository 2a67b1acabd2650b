"""minidl: a small define-by-run deep-learning library on NumPy or CuPy (no MPI in here).

    from minidl import Tensor, nn, functional as F, optim
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
