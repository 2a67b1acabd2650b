"""Shared test set-up.

Hypothesis must draw the same examples on every MPI rank, or the ranks would disagree about
which test case they are running and deadlock. So examples are derandomized (a fixed sequence
derived from the test), nothing is read from an example database, and timing-based checks
(deadlines, the too-slow health check) are off, since ranks on an oversubscribed machine run
at different speeds and would otherwise fail on different examples.
"""
import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "minidl",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=list(HealthCheck),
    max_examples=int(os.environ.get("MINIDL_HYPOTHESIS_EXAMPLES", 25)),
)
settings.load_profile("minidl")


import pytest  # noqa: E402

from minidl import backend  # noqa: E402


@pytest.fixture(params=["numpy", "cupy"])
def backend_name(request):
    """Run a test on each backend; CuPy is skipped, saying why, where no GPU is present."""
    if request.param == "cupy" and not backend.cupy_available():
        pytest.skip("CuPy backend: no CuPy installation with a CUDA GPU on this machine")
    previous = backend.get_backend()
    backend.set_backend(request.param)
    yield request.param
    backend.set_backend(previous)
