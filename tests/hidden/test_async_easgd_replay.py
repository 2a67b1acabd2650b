"""Hidden: a deterministic asynchronous EASGD run is its server log replayed (task 7.2).

The replay (tests/hidden/easgd_replay.py) re-implements the worker's exchange (algorithm 2 of Zhang
et al. 2015), so it stays out of student trees.
"""
import numpy as np
import pytest

from minidl.data import least_squares
from tests.hidden.easgd_replay import check_against_its_replay


@pytest.mark.task("7.2")
@pytest.mark.parallel(nprocs=[3, 4])
@pytest.mark.parametrize("seed", [0, 7])
def test_deterministic_async_easgd_equals_a_serial_replay_of_its_log(seed):
    check_against_its_replay(least_squares(96, 5, np.random.default_rng(3)), seed)
