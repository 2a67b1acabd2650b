"""Hypothesis strategies shared by the test modules (shapes, rank counts, seeds, ...)."""
from hypothesis import strategies as st

seeds = st.integers(min_value=0, max_value=2**32 - 1)
lengths = st.integers(min_value=0, max_value=300)
rank_counts = st.integers(min_value=1, max_value=16)
small_dims = st.integers(min_value=1, max_value=5)
batch_sizes = st.integers(min_value=1, max_value=4)
float_dtypes = st.sampled_from(["float32", "float64"])


def shapes(min_dims=1, max_dims=3, min_side=1, max_side=5):
    """Array shapes with every side in [min_side, max_side]."""
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


@st.composite
def broadcastable_shapes(draw, max_dims=3, max_side=4):
    """Two shapes that broadcast against each other (numpy rules), e.g. (3, 1, 4) and (2, 1)."""
    shape = draw(shapes(1, max_dims, 1, max_side))
    other = []
    for side in shape[len(shape) - draw(st.integers(0, len(shape))):]:
        other.append(draw(st.sampled_from([side, 1])))
    return shape, tuple(other)


@st.composite
def conv_settings(draw, max_batch=3, max_channels=3, max_side=7):
    """(batch, in_channels, out_channels, height, width, kernel, stride, padding) with output >= 1."""
    kernel = draw(st.integers(1, 4))
    padding = draw(st.integers(0, 2))
    stride = draw(st.integers(1, 3))
    height = draw(st.integers(max(1, kernel - 2 * padding), max_side))
    width = draw(st.integers(max(1, kernel - 2 * padding), max_side))
    return (draw(st.integers(1, max_batch)), draw(st.integers(1, max_channels)),
            draw(st.integers(1, max_channels)), height, width, kernel, stride, padding)

# collectives (tests/test_collectives.py)
collective_dtypes = st.sampled_from(["float32", "float64", "int32", "int64"])
reduction_ops = st.sampled_from(["sum", "max", "min", "mean"])
