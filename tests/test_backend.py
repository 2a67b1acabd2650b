"""The backend switch says what is wrong instead of failing somewhere deeper, and Tensor follows it."""
import types

import numpy as np
import pytest

from minidl import Tensor, backend, nn


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        backend.set_backend("tpu")
    assert backend.get_backend() == "numpy"


def test_cupy_backend_without_a_gpu_says_so():
    if backend.cupy_available():
        pytest.skip("a CUDA GPU with CuPy is present, so the cupy backend works here")
    with pytest.raises(RuntimeError, match="CuPy package and a CUDA GPU"):
        backend.set_backend("cupy")
    assert backend.get_backend() == "numpy"


def test_unsupported_parameter_dtype_is_named():
    with pytest.raises(TypeError, match="float16"):
        nn.Linear(2, 2, rng=np.random.default_rng(0), dtype="float16")
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        nn.Linear(2, 2, rng=0)


@pytest.mark.parametrize("data, dtype", [
    ([1.0, 2.0], np.float32), (3, np.float32), (2.5, np.float32), ([[1, 2], [3, 4]], np.float32),
    ([True, False], np.float32),                                    # python numbers and lists: float32
    (np.ones(2, dtype=np.float64), np.float64), (np.float64(1.5), np.float64),
    (np.ones(2, dtype=np.float32), np.float32), (np.ones(2, dtype=np.float16), np.float16),  # typed: kept
])
def test_tensor_makes_python_numbers_float32_and_keeps_the_dtype_of_typed_arrays(backend_name, data, dtype):
    t = Tensor(data)
    assert t.dtype == dtype
    assert type(t.data).__module__.split(".")[0] == backend_name     # numpy, or cupy on the cupy backend
    np.testing.assert_array_equal(backend.to_numpy(t.data), np.asarray(data, dtype=dtype))


@pytest.mark.parametrize("data", [np.arange(3), np.array([True]), np.array(["a"]), np.array([1 + 2j])])
def test_tensor_refuses_typed_arrays_that_are_not_floating_point(data):
    with pytest.raises(TypeError, match=f"floating-point array, got dtype {data.dtype}"):
        Tensor(data)


class StandInArray(np.ndarray):
    """The array type of a stand-in backend: lets the test below see which module Tensor asked."""


def test_tensor_takes_its_arrays_from_the_active_backend_not_from_numpy(monkeypatch):
    # Without a GPU, a stand-in module plays CuPy's part: if Tensor called numpy directly, or
    # kept a host array, its data would be a plain ndarray instead of this backend's array type.
    stand_in = types.SimpleNamespace(ndarray=StandInArray, float32=np.float32,
                                     asarray=lambda data, dtype=None: np.asarray(data, dtype).view(StandInArray))
    monkeypatch.setattr(backend, "xp", lambda: stand_in)
    for data in ([1.0, 2.0], np.ones(2, dtype=np.float64), 1.5):
        t = Tensor(data)
        assert type(t.data) is StandInArray, f"Tensor({data!r}).data is a {type(t.data).__name__}"
    already = np.ones(2, dtype=np.float64).view(StandInArray)
    assert Tensor(already).data is already                          # the backend's own array: no copy


_FAULTS = """
import resource, sys
if sys.argv[1] == "minidl":
    import minidl  # noqa: F401  (its import sets malloc's thresholds)
import numpy

def step():                      # a training step's pattern: 8 arrays of 3 MiB made and freed
    arrays = [numpy.ones(3 << 18, dtype=numpy.float32) for _ in range(8)]
    del arrays

for _ in range(5):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_importing_minidl_keeps_freed_arrays_memory_so_steps_do_not_page_fault():
    """backend.keep_freed_memory: with glibc's default thresholds every such step returns its 24 MiB
    to the kernel and page-faults it back (6144 faults a step); after ``import minidl`` it reuses it."""
    import platform
    import subprocess
    import sys
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("keep_freed_memory sets glibc's malloc; this C library is not glibc")
    env = {k: v for k, v in __import__("os").environ.items()
           if not k.startswith("MALLOC_") and k != "MINIDL_KEEP_FREED_MEMORY"}
    faults = {}
    for label, first, extra in [("numpy", "numpy", {}), ("minidl", "minidl", {}),
                                ("minidl, opted out", "minidl", {"MINIDL_KEEP_FREED_MEMORY": "0"})]:
        out = subprocess.run([sys.executable, "-c", _FAULTS, first], capture_output=True, text=True,
                             env=dict(env, **extra), check=True, timeout=60)
        faults[label] = int(out.stdout)
    assert faults["numpy"] > 20 * 1000, faults             # glibc's default: the pages come back every step
    assert faults["minidl"] < 20 * 50, faults              # kept: a few stray faults at most
    assert faults["minidl, opted out"] > 20 * 1000, faults     # MINIDL_KEEP_FREED_MEMORY=0: glibc's defaults


SPECIAL_FLOATS = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-45, -1e-45, 1.0, -1.0, 3e38, -3e38]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (0, 5), (7,), (128, 6, 28, 28), (9, 16, 10, 10), (33, 120), (5, 3, 700)])
def test_maximum_with_zero_has_the_bits_of_maximum_with_the_scalar_zero(shape, dtype):
    rng = np.random.default_rng(sum(shape) + 1)
    array = rng.standard_normal(shape).astype(dtype)
    flat = array.reshape(-1)
    flat[rng.integers(0, max(flat.size, 1), min(flat.size, 60))] = rng.choice(SPECIAL_FLOATS, min(flat.size, 60))
    for case in (array, array.T, array[..., ::2] if array.ndim else array):   # C-contiguous, and the plain path's
        fast = backend.maximum_with_zero(case)
        plain = np.maximum(case, 0)
        assert fast.shape == plain.shape and fast.dtype == plain.dtype
        assert np.ascontiguousarray(fast).tobytes() == np.ascontiguousarray(plain).tobytes()
