"""A vector that has a length and a dtype but no elements: the simulator's sizes-only mode.

At p = 1024 and 1 MiB per rank the inputs alone would be 1 GiB, and every reduction a pass over
memory; the timing needs neither. A heart runs unchanged on a `Sized` in place of its numpy
vector: slicing gives a shorter `Sized`, `data[...] = x` does nothing, and a numpy ufunc
(`combine`'s np.add(a, b, out=c), np.maximum, ...) with a `Sized` among its operands does
nothing and returns its output (`__array_ufunc__`), so no arithmetic runs. np.empty_like of one
is another (`__array_function__`). Its `nbytes` is what the engine charges a message for.

What a heart makes for itself stays real: buffers.scratch(data) allocates a numpy vector of
len(data) elements, which the engine never writes in this mode (the operating system hands out
untouched pages lazily, so they cost address space, not memory).
"""
import numpy as np


class Sized:
    """`size` elements of `dtype`, none of them stored."""
    __slots__ = ("size", "dtype")
    ndim = 1

    def __init__(self, size, dtype):
        self.size, self.dtype = size, np.dtype(dtype)

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

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

    def __getitem__(self, index):
        if type(index) is slice:
            start, stop = index.start, index.stop           # the hearts' slices: [a:b], a, b >= 0
            if index.step is None and type(start) is int and type(stop) is int and 0 <= start and 0 <= stop:
                part = object.__new__(Sized)
                part.size = max(0, min(stop, self.size) - min(start, self.size))
                part.dtype = self.dtype
                return part
            return Sized(len(range(*index.indices(self.size))), self.dtype)
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
