"""Convolution kernels behind one interface, selected by name.

Every algorithm module here provides the same three functions:

    supports(x_shape, weight_shape, stride, padding) -> None, or a sentence saying why not
    forward(x, weight, stride, padding)              -> (out, cache)
    backward(grad_out, cache, need_x, need_weight)   -> (grad_x, grad_weight)  (None where not needed)

with x (N, C, H, W), weight (F, C, kh, kw), out (N, F, Ho, Wo) and

    Ho = (H + 2 padding - kh) // stride + 1,   Wo = (W + 2 padding - kw) // stride + 1.

``cache`` is a dict of what backward needs (named entries, not a positional tuple). Bias is
added outside (``minidl.functional.conv2d``), since it is the same for every algorithm; so is the
weight's keeping: conv2d takes ``cache["weight"]`` out after the forward and gives the backward the
layer's ``weight.data`` of that moment, so no array of the weight is held in between (as Linear).

The algorithms (Ben-Nun & Hoefler 2019): ``direct`` (the definition, the test oracle),
``im2col`` (one GEMM, the default), ``fft`` (products of spectra), ``winograd`` (F(2x2, 3x3),
3x3 stride 1 only), and ``auto`` (a measured rule picks one of them per shape). ``cost.py``
gives each one's multiply count and extra memory.

Around the kernels: ``shapes.py`` (output size, shape checks, padding), ``scratch.py`` (the
reused scratch arrays), ``kernels.py`` (the kernels by name), ``budget.py`` (the bytes of columns
a layer may keep for backward: ``set_column_budget``); ``im2col.py`` is the textbook algorithm
that ``im2col_blocked.py``, the kernel ``"im2col"`` names, is built from (with ``batch_inner.py``,
its columns in a layout with the batch innermost, and ``per_image.py``, every image's columns a
matrix of its own).
"""
from minidl.conv import auto, kernels
from minidl.conv.budget import set_column_budget
from minidl.conv.kernels import ALGORITHMS
from minidl.conv.scratch import workspace
from minidl.conv.shapes import check_shapes, output_size, pad

__all__ = ["ALGORITHMS", "get", "check_shapes", "output_size", "pad", "set_column_budget", "workspace"]


def get(name, x_shape, weight_shape, stride, padding):
    """The kernel module for ``name``; raises ValueError naming the limitation if it can't do this case."""
    if name == "auto":
        return auto.choose(x_shape, weight_shape, stride, padding)
    return kernels.get(name, x_shape, weight_shape, stride, padding)
