"""Modules: layers that own their parameters, in the style of PyTorch's ``nn.Module``.

Assigning a ``Parameter`` or a ``Module`` to an attribute registers it, in assignment order, so
``named_parameters()`` walks the model without any bookkeeping by the layer's author:

    class TwoLayer(Module):
        def __init__(self, rng):
            super().__init__()
            self.hidden = Linear(64, 32, rng=rng)      # registered as 'hidden'
            self.out = Linear(32, 10, rng=rng)

Initialisation is seeded: every layer with weights takes ``rng``, a ``numpy.random.Generator``,
and draws He (ReLU layers; variance 2 / fan_in) or Glorot (variance 2 / (fan_in + fan_out))
normal weights from it. Biases start at zero.
"""

import zipfile
import zlib

import numpy

from minidl import backend, functional as F
from minidl.tensor import Parameter


class Module:
    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def forward(self, *inputs):
        raise NotImplementedError

    def __call__(self, *inputs):
        return self.forward(*inputs)

    def named_parameters(self, prefix=""):
        for name, parameter in self._parameters.items():
            yield prefix + name, parameter
        for name, module in self._modules.items():
            yield from module.named_parameters(prefix + name + ".")

    def parameters(self):
        return [parameter for _, parameter in self.named_parameters()]

    def modules(self):
        yield self
        for module in self._modules.values():
            yield from module.modules()

    def train(self, mode=True):
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=False):
        for parameter in self.parameters():
            parameter.zero_grad(set_to_none)

    def num_parameters(self):
        return sum(parameter.size for parameter in self.parameters())

    # ---- saving and loading without pickle -------------------------------------------------
    def state_dict(self):
        """{name: NumPy copy of the parameter}, in registration order."""
        return {name: backend.to_numpy(parameter.data).copy() for name, parameter in self.named_parameters()}

    def load_state_dict(self, state):
        """Copy ``state`` into the parameters *in place* (flat-buffer views stay views).

        Missing, unexpected, wrongly shaped or non-numeric entries raise one ValueError naming all of them.
        """
        own = dict(self.named_parameters())
        missing = [name for name in own if name not in state]
        unexpected = [name for name in state if name not in own]
        if missing or unexpected:
            raise ValueError(f"load_state_dict: missing entries {missing}, unexpected entries {unexpected}")
        wrong = [f"{name}: expected {own[name].shape}, got {tuple(numpy.shape(state[name]))}"
                 for name in own if tuple(numpy.shape(state[name])) != own[name].shape]
        wrong += [f"{name}: expected numbers, got dtype {numpy.asarray(state[name]).dtype}"
                  for name in own if numpy.asarray(state[name]).dtype.kind not in "biuf"]
        if wrong:
            raise ValueError("load_state_dict: wrong entries: " + "; ".join(wrong))
        xp = backend.xp()
        for name, parameter in own.items():
            parameter.data[...] = xp.asarray(state[name], dtype=parameter.dtype)

    def save(self, path):
        """Write the parameters to an ``.npz`` file (plain arrays, no pickle)."""
        numpy.savez(path, **self.state_dict())

    def load(self, path):
        """Load a ``save``d file; any problem is one ValueError that names ``path``."""
        state = read_npz(path)
        try:
            self.load_state_dict(state)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    def __repr__(self):
        inner = "".join(f"\n  ({name}): " + repr(module).replace("\n", "\n  ")
                        for name, module in self._modules.items())
        return f"{type(self).__name__}({self.extra_repr()}{inner}{chr(10) if inner else ''})"

    def extra_repr(self):
        return ""


def read_npz(path):
    """{name: NumPy array} from an ``.npz`` file of plain arrays (no pickle).

    Every way the file can be unreadable (missing, truncated, not an .npz archive, a pickled
    object inside) is one ValueError that names ``path``. NumPy's own messages for these name no
    file, and for random bytes say "Cannot load file containing pickled data", which misleads.
    """
    try:
        archive = numpy.load(path, allow_pickle=False)
    except OSError as error:                                        # missing, a directory
        raise ValueError(f"{path}: not a readable .npz file ({error.strerror or error})") from None
    except (ValueError, EOFError, zipfile.BadZipFile):              # NumPy found no archive here
        raise ValueError(f"{path}: not a readable .npz file (truncated, or not an .npz archive)") from None
    if not isinstance(archive, numpy.lib.npyio.NpzFile):
        raise ValueError(f"{path}: not a readable .npz file (it holds a single .npy array)")
    with archive:
        arrays = {}
        for name in archive.files:
            try:
                arrays[name] = archive[name]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
                raise ValueError(f"{path}: not a readable .npz file (entry {name!r}: {error})") from None
    return arrays


def init_weight(shape, fan_in, fan_out, rng, init, dtype):
    """He (std sqrt(2 / fan_in)) or Glorot (std sqrt(2 / (fan_in + fan_out))) normal weights from ``rng``."""
    if not isinstance(rng, numpy.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (e.g. numpy.random.default_rng(seed)), "
                        f"got {type(rng).__name__}")
    if init == "he":
        std = numpy.sqrt(2.0 / fan_in)
    elif init == "glorot":
        std = numpy.sqrt(2.0 / (fan_in + fan_out))
    else:
        raise ValueError(f"init must be 'he' or 'glorot', got {init!r}")
    return backend.xp().asarray(rng.standard_normal(shape) * std, dtype=dtype)


def _check_dtype(dtype):
    dtype = numpy.dtype(dtype)
    if dtype not in (numpy.float32, numpy.float64):
        raise TypeError(f"parameters must be float32 or float64, got {dtype}")
    return dtype


class Linear(Module):
    """y = x @ weight + bias, with x (N, in_features), weight (in_features, out_features)."""

    def __init__(self, in_features, out_features, *, rng, bias=True, init="he", dtype="float32"):
        super().__init__()
        dtype = _check_dtype(dtype)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(init_weight((in_features, out_features), in_features, out_features, rng, init, dtype))
        self.bias = Parameter(backend.xp().zeros(out_features, dtype=dtype)) if bias else None

    def forward(self, x):
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"Linear({self.in_features}, {self.out_features}): input shape {x.shape} "
                             f"is not (batch, {self.in_features})")
        return F.linear(x, self.weight, self.bias)          # (N, in) @ (in, out) + (out,)

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}"


class Conv2d(Module):
    """2-D convolution, weight (out_channels, in_channels, k, k); see ``functional.conv2d``."""

    def __init__(self, in_channels, out_channels, kernel_size, *, rng, stride=1, padding=0, bias=True,
                 init="he", algorithm="im2col", dtype="float32"):
        super().__init__()
        dtype = _check_dtype(dtype)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.stride, self.padding, self.algorithm = stride, padding, algorithm
        fan_in, fan_out = in_channels * kernel_size ** 2, out_channels * kernel_size ** 2
        shape = (out_channels, in_channels, kernel_size, kernel_size)
        self.weight = Parameter(init_weight(shape, fan_in, fan_out, rng, init, dtype))
        self.bias = Parameter(backend.xp().zeros(out_channels, dtype=dtype)) if bias else None

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.algorithm)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class LocallyConnected2d(Module):
    """DistBelief's locally connected layer (Dean et al. 2012, Figure 1): a convolution's k x k windows,
    each output position with weights of its own, weight (Ho, Wo, F, C, k, k) and bias (Ho, Wo, F); the
    input's (H, W) fixes the positions. See ``functional.locally_connected2d``."""

    def __init__(self, in_channels, out_channels, kernel_size, input_size, *, rng, stride=1, padding=0, bias=True,
                 init="he", dtype="float32"):
        super().__init__()
        dtype = _check_dtype(dtype)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.stride, self.padding, self.input_size = stride, padding, tuple(input_size)
        out_h, out_w = ((size + 2 * padding - kernel_size) // stride + 1 for size in input_size)
        fan_in, fan_out = in_channels * kernel_size ** 2, out_channels * kernel_size ** 2
        shape = (out_h, out_w, out_channels, in_channels, kernel_size, kernel_size)
        self.weight = Parameter(init_weight(shape, fan_in, fan_out, rng, init, dtype))
        self.bias = Parameter(backend.xp().zeros((out_h, out_w, out_channels), dtype=dtype)) if bias else None

    def forward(self, x):
        return F.locally_connected2d(x, self.weight, self.bias, self.stride, self.padding)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"input_size={self.input_size}, stride={self.stride}, padding={self.padding}")


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}"


class AvgPool2d(MaxPool2d):
    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding)


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class Flatten(Module):
    """(N, ...) -> (N, prod(...))."""

    def forward(self, x):
        return F.reshape(x, (x.shape[0], -1))


class Dropout(Module):
    """Inverted dropout with probability ``p``, active only in training mode; masks drawn from ``rng``."""

    def __init__(self, p, *, rng):
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p, self.rng = p, rng

    def forward(self, x):
        return F.dropout(x, self.p, self.training, self.rng)

    def extra_repr(self):
        return f"p={self.p}"


class Sequential(Module):
    """Layers applied in order; registered as '0', '1', ..."""

    def __init__(self, *layers):
        super().__init__()
        for index, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential: entry {index} is a {type(layer).__name__}, not a Module")
            setattr(self, str(index), layer)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        return list(self._modules.values())[index]

    def __len__(self):
        return len(self._modules)

    def forward(self, x):
        for layer in self._modules.values():
            x = layer(x)
        return x
