"""The backend switch says what is wrong instead of failing somewhere deeper."""
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


def test_tensor_data_is_an_array_of_the_active_backend():
    t = Tensor([1.0, 2.0])
    assert isinstance(t.data, backend.xp().ndarray) and t.dtype == np.float32
