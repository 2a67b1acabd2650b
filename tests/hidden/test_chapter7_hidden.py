"""Hidden: chapter 7's L-BFGS direction in closed form, and asynchronous EASGD on 5 to 7 ranks (tasks 7.1, 7.2).

7.1: the sharded two-loop recursion on 4, 5 and 7 shards of uneven length, against the BFGS
matrix recursion written out (H <- V^T H V + rho s s^T from gamma I: the same direction, computed
with no loop of the recursion's shape) and against the secant condition H y = s of the newest
pair. 7.2: the server log replay of tests/hidden/easgd_replay.py on 4 to 6 workers
whose shards differ in length.
"""
import numpy as np
import pytest

from minidl.data import least_squares
from tests.helpers import sharded
from tests.hidden.easgd_replay import check_against_its_replay

# ---- 7.1: the sharded two-loop recursion ------------------------------------------------------------

def history(rng, d, pairs):
    s_history = [rng.standard_normal(d) for _ in range(pairs)]
    y_history = [s + 0.4 * rng.standard_normal(d) for s in s_history]        # <s, y> > 0
    return s_history, y_history


def bfgs_matrix(s_history, y_history):
    """H after the BFGS updates of gamma I by each pair, oldest first (Nocedal & Wright, eq. 7.19)."""
    d = len(s_history[0])
    s, y = s_history[-1], y_history[-1]
    h = (s @ y) / (y @ y) * np.eye(d)
    for s, y in zip(s_history, y_history):
        rho = 1.0 / (y @ s)
        v = np.eye(d) - rho * np.outer(y, s)
        h = v.T @ h @ v + rho * np.outer(s, s)
    return h


@pytest.mark.task("7.1")
@pytest.mark.parametrize("servers,pairs", [(4, 1), (5, 3), (7, 4)])
def test_sharded_direction_is_minus_the_bfgs_matrix_times_g(servers, pairs):
    rng = np.random.default_rng([servers, pairs])
    d = 13                                                  # 13 over 4, 5, 7 shards: uneven slices
    s_history, y_history = history(rng, d, pairs)
    g = rng.standard_normal(d)
    direction, g_after = sharded(servers, g, s_history, y_history)
    expected = -bfgs_matrix(s_history, y_history) @ g
    np.testing.assert_allclose(direction, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(g_after, g)


@pytest.mark.task("7.1")
@pytest.mark.parametrize("servers,pairs", [(5, 1), (7, 3)])
def test_the_direction_of_the_newest_y_is_minus_the_newest_s(servers, pairs):
    # the secant condition: H y_{k-1} = s_{k-1}, whatever the older pairs
    rng = np.random.default_rng([7, servers])
    s_history, y_history = history(rng, 12, pairs)
    direction, _ = sharded(servers, y_history[-1].copy(), s_history, y_history)
    np.testing.assert_allclose(direction, -s_history[-1], rtol=1e-10, atol=1e-12)


@pytest.mark.task("7.1")
@pytest.mark.parametrize("servers", [4, 7])
def test_with_no_pairs_the_direction_is_minus_g_exactly(servers):
    g = np.random.default_rng(servers).standard_normal(10)
    direction, g_after = sharded(servers, g, [], [])
    np.testing.assert_array_equal(direction, -g)
    np.testing.assert_array_equal(g_after, g)


# ---- 7.2: the asynchronous EASGD worker ---------------------------------------------------------------

@pytest.mark.task("7.2")
@pytest.mark.parallel(nprocs=[5, 6, 7])
def test_async_easgd_on_p_ranks_with_uneven_shards_is_its_server_log_replayed():
    # 61 rows over 4, 5 or 6 workers: shards differ by a row, and their last batches are short
    check_against_its_replay(least_squares(61, 4, np.random.default_rng(5)), seed=3)
