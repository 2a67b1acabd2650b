"""One flat buffer: a model's parameters (and gradients) as views into one contiguous vector.

Distributed algorithms move parameters and gradients as one vector: a data-parallel step is
one allreduce on ``flat.grad``, a parameter-server shard is a slice ``flat.data[start:stop]``,
and an optimizer can update everything at once through ``flat.as_parameter()``. Layers keep
their shaped arrays, which after flattening are *views* into the vectors:

    flat = FlatParameters(model.parameters())
    model.weight.data is a view of flat.data[0:k]    (reshaped)
    model.weight.grad is a view of flat.grad[0:k]

Views survive only in-place updates (``data[...] = ``, ``-=``, ``+=``); every optimizer,
``zero_grad`` and ``load_state_dict`` in minidl updates in place. ``in_sync()`` checks it.

A vector that comes and goes: ``point(parameters, vector)`` makes the parameters views into any
vector of their total size, and ``release(parameters)`` lets go of it, leaving a stand-in of the
right shape (``absent``) that holds no memory. ZeRO-3 (``algorithms.zero``) gathers a layer's
weights into a fresh vector before each use and releases them after it; the layers never notice.
"""
from minidl import backend
from minidl.tensor import Parameter


class FlatParameters:
    def __init__(self, parameters):
        self.parameters = list(parameters)
        if not self.parameters:
            raise ValueError("FlatParameters: no parameters given")
        dtypes = {str(parameter.dtype) for parameter in self.parameters}
        if len(dtypes) != 1:
            raise TypeError(f"FlatParameters: all parameters must share one dtype, got {sorted(dtypes)}")
        if len({id(parameter) for parameter in self.parameters}) != len(self.parameters):
            raise ValueError("FlatParameters: a parameter appears twice")
        xp = backend.xp()
        total = sum(parameter.size for parameter in self.parameters)
        self.data = xp.empty(total, dtype=self.parameters[0].dtype)
        self.grad = xp.zeros(total, dtype=self.parameters[0].dtype)
        self.offsets = []
        start = 0
        for parameter in self.parameters:
            stop = start + parameter.size
            self.data[start:stop] = parameter.data.reshape(-1)
            if parameter.grad is not None:
                self.grad[start:stop] = parameter.grad.reshape(-1)
            parameter.data = self.data[start:stop].reshape(parameter.shape)
            parameter.grad = self.grad[start:stop].reshape(parameter.shape)
            self.offsets.append((start, stop))
            start = stop

    @property
    def size(self):
        return self.data.size

    def as_parameter(self):
        """A single Parameter whose data and grad are the flat vectors (for optimizers)."""
        whole = Parameter(self.data)
        whole.grad = self.grad
        return whole

    def buckets(self, nbytes):
        """The gradient cut into buckets for overlapping communication with backward (as PyTorch DDP).

        Returns a list of ``(start, stop, members)``: ``flat.grad[start:stop]`` is contiguous and
        ``members`` are the indices (into ``self.parameters``) of the whole parameters it holds.
        Buckets run in reverse parameter order, because backward finishes the last layer's
        gradients first; each is filled with whole parameters until it holds at least ``nbytes``
        bytes (the last one may be smaller), so a parameter is never split.
        """
        if not nbytes > 0:
            raise ValueError(f"FlatParameters.buckets: nbytes must be > 0, got {nbytes!r}")
        itemsize = self.grad.dtype.itemsize
        plan, members, stop = [], [], None
        for index in reversed(range(len(self.parameters))):
            start, end = self.offsets[index]
            stop = end if stop is None else stop
            members.append(index)
            if (stop - start) * itemsize >= nbytes or index == 0:
                plan.append((start, stop, tuple(members)))
                members, stop = [], None
        return plan

    def zero_grad(self):
        self.grad[...] = 0

    def in_sync(self):
        """True if every parameter's data and grad still share memory with the flat vectors."""
        xp = backend.get_array_module(self.data)
        return all(xp.shares_memory(parameter.data, self.data) and xp.shares_memory(parameter.grad, self.grad)
                   for parameter in self.parameters)


def flatten(model):
    """Flatten ``model``'s parameters in place; returns the ``FlatParameters``."""
    return FlatParameters(model.parameters())


def absent(shape, dtype):
    """A stand-in for an array that is not here: read-only, of ``shape``, one nan broadcast (no
    memory). Computing with it gives nan, writing into it raises: a forgotten gather shows."""
    xp = backend.xp()
    return xp.broadcast_to(xp.full((), xp.nan, dtype=dtype), tuple(shape))


def point(parameters, vector, attribute="data"):
    """Make each parameter's ``data`` (or ``grad``) its piece of ``vector``, in order and reshaped:
    views, so the layers compute with the vector's values (``data``) or their backward accumulates
    into it (``grad``, in place). ``vector`` holds exactly the parameters' values, no more."""
    start = 0
    for parameter in parameters:
        stop = start + parameter.size
        setattr(parameter, attribute, vector[start:stop].reshape(parameter.shape))
        start = stop
    if start != vector.size:
        raise ValueError(f"point: the parameters hold {start} values, the vector {vector.size}")


def release(parameters, attribute="data"):
    """Let go of the parameters' ``data`` (each becomes ``absent``) or ``grad`` (None): the vector
    they were views into is freed once nothing else holds it."""
    for parameter in parameters:
        if attribute == "data":
            parameter.data = absent(parameter.shape, parameter.dtype)
        else:
            parameter.grad = None
