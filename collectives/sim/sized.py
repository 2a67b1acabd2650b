"""A vector that has a length and a dtype but no elements: the simulator's sizes-only mode.

At p = 1024 and 1 MiB per rank the inputs alone would be 1 GiB, and every reduction a pass over
memory; the timing needs neither. A heart runs unchanged on a `Sized` in place of its numpy
vector: slicing gives a shorter `Sized`, `data[...] = x` does nothing, and the reductions do
nothing either. Its `nbytes` is what the engine charges a message for.

How a heart's calls reach a `Sized` without doing arithmetic. collectives.ops.array_module asks an
array that is neither numpy's nor CuPy's for its namespace (the array API standard's
`__array_namespace__`); a Sized answers with NAMESPACE, whose add, maximum and minimum return
their `out` untouched and whose empty and empty_like make another Sized. So `ops.combine` and
`buffers.scratch` cost a method call, and a heart's receive buffer is a Sized too: p = 16,384
ranks at 1 MiB allocate nothing. numpy's own functions called on a Sized do the same
(`__array_ufunc__`, `__array_function__`: np.add(a, b, out=c) returns c, np.empty_like gives a Sized).

Slices of one length are one shared object (they hold nothing and nothing changes them), so a
ring step's slicing costs a dictionary look-up, not an allocation. A vector made by the
constructor, empty or empty_like is always new: hearts compare whole vectors by identity
(`mine is data`), never slices.
"""
import numpy as np

_SLICES = {}          # dtype -> {size: the shared Sized of that size}


class Sized:
    """`size` elements of `dtype`, none of them stored."""
    __slots__ = ("size", "dtype", "nbytes", "slices")
    ndim = 1

    def __init__(self, size, dtype):
        self.dtype = np.dtype(dtype)
        self.size, self.nbytes = size, size * self.dtype.itemsize
        self.slices = _SLICES.setdefault(self.dtype, {})

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def shape(self):
        return (self.size,)

    def __len__(self):
        return self.size

    def __repr__(self):
        return f"Sized({self.size}, {self.dtype})"

    def __array_namespace__(self, api_version=None):
        return NAMESPACE

    def __getitem__(self, index):
        if type(index) is slice:
            start, stop, step = index.indices(self.size)
            if step == 1:
                size = stop - start if stop > start else 0
                part = self.slices.get(size)
                if part is None:
                    part = self.slices[size] = Sized(size, self.dtype)
                return part
            return Sized(len(range(start, stop, step)), self.dtype)
        if index is Ellipsis:
            return self
        raise TypeError(f"a Sized vector has no elements to index with {index!r}")

    def __setitem__(self, index, value):
        pass

    def copy(self):
        return Sized(self.size, self.dtype)

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if out:
            return out[0] if len(out) == 1 else out
        return Sized(self.size, self.dtype)

    def __array_function__(self, function, types, args, kwargs):
        if function in (np.empty_like, np.zeros_like, np.copy):
            return Sized(self.size, kwargs.get("dtype") or self.dtype)
        if function is np.copyto:
            return None
        return NotImplemented


class Namespace:
    """The array functions the collectives call, for Sized vectors: nothing is computed."""

    @staticmethod
    def _result(first, second, out=None):
        return out if out is not None else Sized(len(first), first.dtype)

    add = maximum = minimum = _result

    @staticmethod
    def empty(shape, dtype=np.float64):
        return Sized(shape if isinstance(shape, int) else int(np.prod(shape)), dtype)

    @staticmethod
    def empty_like(like, dtype=None):
        return Sized(len(like), dtype or like.dtype)

    zeros_like = empty_like

    @staticmethod
    def copyto(target, source):
        return None

    @staticmethod
    def shares_memory(first, second):
        return first is second


NAMESPACE = Namespace()
