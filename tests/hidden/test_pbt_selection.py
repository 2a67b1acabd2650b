"""Hidden: PBT's truncation selection (task 9.2) for hypothesis-drawn scores, NaN included.

The oracle ranks each member by counting the finite members better than it (higher score, or an
equal score and a lower index): an independent way to the same sets, but a solution of task 9.2,
so it stays out of student trees. tests/test_pbt.py checks hand-worked populations.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from algorithms import pbt


def better_count(scores, m):
    """How many finite members rank above member m (higher score, or equal score and lower index)."""
    return sum(1 for other, value in enumerate(scores) if math.isfinite(value)
               and (value > scores[m] or (value == scores[m] and other < m)))


@pytest.mark.task("9.2")
@settings(max_examples=30)
@given(scores=st.lists(st.one_of(st.floats(-5, 5), st.sampled_from([0.0, 1.0, math.nan])), min_size=2, max_size=12),
       fraction=st.sampled_from([0.1, 0.25, 0.3, 0.5]), seed=st.integers(0, 3))
def test_truncation_selection_replaces_the_bottom_and_nan_members_by_top_ones(scores, fraction, seed):
    members = len(scores)
    q = max(1, int(fraction * members))
    finite = [m for m in range(members) if math.isfinite(scores[m])]
    top = {m for m in finite if better_count(scores, m) < q}
    bottom = {m for m in finite if better_count(scores, m) >= len(finite) - q} | set(range(members)) - set(finite)
    pairs = pbt.truncation_selection(scores, fraction, np.random.default_rng(seed))
    if not finite:
        assert pairs == []
        return
    losers = [loser for loser, _ in pairs]
    assert sorted(losers) == sorted(bottom - top), (scores, pairs)
    assert all(winner in top for _, winner in pairs), (scores, pairs)
    assert all(math.isfinite(scores[winner]) for _, winner in pairs)
    again = pbt.truncation_selection(scores, fraction, np.random.default_rng(seed))
    assert again == pairs                                       # the same draws on every rank
