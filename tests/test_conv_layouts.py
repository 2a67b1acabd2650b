"""The im2col kernel's fast paths agree with the textbook im2col (minidl.conv.im2col) on the benchmark's shapes.

The layer (minidl.conv.im2col_blocked) takes one of these paths, by the shape and two settings:
- kept columns, in blocks of images, whenever they fit the column budget: per image
  (minidl.conv.per_image) for LeNet-5's conv1 (columns of 25 rows), batch innermost
  (minidl.conv.batch_inner) for conv2 (output rows of 10 pixels), in im2col.im2col's order for
  wider layers with rows of 16 pixels or more;
- blocks of one image with the output gradient's columns serving both gradients (the 64-channel
  layer: F <= C, one image's columns fill a cache block);
- blocks with rebuilt columns and col2im on planes (LeNet's layers with the budget at 0).

Shapes: the sweep's (python -m minidl.bench sweep): LeNet's conv1 (1 -> 6, 28x28, 5x5, padding 2)
and conv2 (6 -> 16, 14x14, 5x5) at batch 64, which the 2 MiB blocks set here cut into 3 and 2
blocks (float32; 5 and 4 in float64) with a shorter last one; the 64-channel 32x32 3x3 layer at batch 3 (three
1-image blocks).

Tolerances (max|path - textbook| <= tol * max|textbook| per array):
- float64, both sides: 1e-11, as tests/test_conv_algorithms.py. Both compute the same sums of the
  same products; only their order differs (blocks, GEMM layout), so the gap is rounding: float64's
  eps 1.1e-16 times the sums' lengths (at most 64*28*28 = 50176 terms, the weight gradient) is
  5.6e-12 in the worst case, and what is measured is at most 1.3e-15.
- float32 path against the float64 textbook: 5e-6 (test_conv_algorithms.FLOAT32_TOL, about 40
  float32 epsilons); measured on these shapes at most 5e-7 (float32 sums in blocks of a few
  hundred terms, the error growing about as the square root of the number of blocks).
A planted off-by-one kernel offset in batch_inner.columns, batch_inner.col2im or per_image.forward
(j + 1 for j), or a block's columns read from the wrong offset of the kept buffer, gives errors of order 1.
"""
import numpy as np
import pytest

from minidl.conv import batch_inner, budget, im2col, im2col_blocked, per_image, set_column_budget

SWEEP_SHAPES = {            # (n, c, f, side, k, padding): stride 1, as in the benchmark
    "lenet conv1": (64, 1, 6, 28, 5, 2),
    "lenet conv2": (64, 6, 16, 14, 5, 0),
    "conv 64->64": (3, 64, 64, 32, 3, 1),
}
FLOAT64_TOL, FLOAT32_TOL = 1e-11, 5e-6


def relative_error(actual, expected):
    assert actual.shape == expected.shape
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def arrays(shape, dtype, seed=3):
    n, c, f, side, k, padding = shape
    rng = np.random.default_rng(seed)
    out_side = side + 2 * padding - k + 1
    return tuple(rng.standard_normal(s).astype(dtype)
                 for s in ((n, c, side, side), (f, c, k, k), (n, f, out_side, out_side)))


def textbook(x, weight, grad_out, padding):
    """The textbook im2col (one GEMM for the whole batch, col2im) in float64: the oracle."""
    x, weight, grad_out = (a.astype(np.float64) for a in (x, weight, grad_out))
    out, cache = im2col.forward(x, weight, 1, padding)
    return (out.copy(),) + tuple(a.copy() for a in im2col.backward(grad_out, cache))


def layer(x, weight, grad_out, padding):
    out, cache = im2col_blocked.forward(x, weight, 1, padding)
    return (out,) + im2col_blocked.backward(grad_out, cache), cache


@pytest.fixture
def two_mib_blocks(monkeypatch):
    """Blocks of 2 MiB of float32 columns (what a 1 MiB L2 gives), whatever this machine's cache."""
    monkeypatch.setattr(im2col_blocked, "BLOCK_BYTES", 2 << 20)
    monkeypatch.setattr(budget, "COLUMN_BUDGET", 64 << 20)


@pytest.mark.parametrize("name", SWEEP_SHAPES)
@pytest.mark.parametrize("budget_bytes", [64 << 20, 0])
@pytest.mark.parametrize("dtype, tolerance", [("float64", FLOAT64_TOL), ("float32", FLOAT32_TOL)])
def test_every_path_equals_the_textbook_im2col_on_the_sweep_shapes(two_mib_blocks, monkeypatch, name, budget_bytes,
                                                                   dtype, tolerance):
    shape = SWEEP_SHAPES[name]
    monkeypatch.setattr(budget, "COLUMN_BUDGET", budget_bytes)
    x, weight, grad_out = arrays(shape, dtype)
    got, cache = layer(x, weight, grad_out, shape[-1])
    # the path taken is the one named in the header: kept columns for LeNet under the budget only,
    # batch innermost for conv2's rows of 10 pixels, per image for conv1's 25 rows of columns
    assert (cache.get("layout") == "batch inner") == (budget_bytes > 0 and name == "lenet conv2")
    assert (cache.get("layout") == "per image") == (budget_bytes > 0 and name == "lenet conv1")
    assert "kept" not in cache or "layout" in cache
    # 2 MiB // one image's columns (C kh kw Ho Wo numbers): conv1 26 (float32) / 13 (float64) images,
    # conv2 34 / 17, the 64-channel layer 1 / 1
    assert len(cache["blocks"]) == {"lenet conv1": (3, 5), "lenet conv2": (2, 4), "conv 64->64": (3, 3)}[name][
        dtype == "float64"]
    for label, actual, expected in zip(("out", "grad_x", "grad_weight"), got, textbook(x, weight, grad_out, shape[-1])):
        assert actual.dtype == np.dtype(dtype)
        assert relative_error(actual, expected) <= tolerance, f"{label} of {name}, budget {budget_bytes}, {dtype}"


@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 1), (3, 2)])
def test_batch_inner_in_uneven_blocks_with_strides_equals_the_textbook(stride, padding):
    """Strides above 1 (col2im's windows then skip pixels) and blocks of 1, 3 and 1 images."""
    rng = np.random.default_rng(stride)
    x, weight = rng.standard_normal((5, 3, 9, 8)), rng.standard_normal((4, 3, 3, 2))
    out, cache = batch_inner.forward(x, weight, stride, padding, [(0, 1), (1, 4), (4, 5)])
    want, want_cache = im2col.forward(x, weight, stride, padding)
    assert relative_error(out, want) <= FLOAT64_TOL
    grad_out = rng.standard_normal(out.shape)
    for got, expected in zip(batch_inner.backward(grad_out, cache), im2col.backward(grad_out, want_cache)):
        assert relative_error(got, expected) <= FLOAT64_TOL


@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 1), (3, 2)])
def test_kept_columns_in_im2col_order_with_strides_equal_the_textbook(monkeypatch, stride, padding):
    """Rows of 16 pixels or more and columns of more than PER_IMAGE_ROWS rows (here 3 * 3 * 4 = 36) keep
    their columns in im2col.im2col's order, built in two passes of copies; here with strides, in blocks
    of 2, 2 and 1 images."""
    rng = np.random.default_rng(stride)
    x, weight = rng.standard_normal((5, 3, 40, 37 * stride)), rng.standard_normal((3, 3, 3, 4))
    out_h, out_w = (40 + 2 * padding - 3) // stride + 1, (37 * stride + 2 * padding - 4) // stride + 1
    monkeypatch.setattr(im2col_blocked, "BLOCK_BYTES", 2 * 3 * 3 * 4 * out_h * out_w * 8)
    monkeypatch.setattr(budget, "COLUMN_BUDGET", 64 << 20)
    out, cache = im2col_blocked.forward(x, weight, stride, padding)
    assert "kept" in cache and cache["blocks"] == [(0, 2), (2, 4), (4, 5)] and out_w >= im2col_blocked.SHORT_ROW
    assert 3 * 3 * 4 > im2col_blocked.PER_IMAGE_ROWS
    want, want_cache = im2col.forward(x, weight, stride, padding)
    assert relative_error(out, want) <= FLOAT64_TOL
    grad_out = rng.standard_normal(out.shape)
    for got, expected in zip(im2col_blocked.backward(grad_out, cache), im2col.backward(grad_out, want_cache)):
        assert relative_error(got, expected) <= FLOAT64_TOL


@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 1), (3, 2)])
def test_per_image_columns_in_uneven_blocks_with_strides_equal_the_textbook(stride, padding):
    """Columns kept per image (minidl.conv.per_image), with strides, in blocks of 1, 3 and 1 images;
    two runs give the same bits, and need_x / need_weight False leave that gradient out (None)."""
    rng = np.random.default_rng(stride)
    x, weight = rng.standard_normal((5, 3, 9, 8)), rng.standard_normal((4, 3, 3, 2))
    blocks = [(0, 1), (1, 4), (4, 5)]
    out, cache = per_image.forward(x, weight, stride, padding, blocks)
    want, want_cache = im2col.forward(x, weight, stride, padding)
    assert relative_error(out, want) <= FLOAT64_TOL
    grad_out = rng.standard_normal(out.shape)
    first = (out.copy(),) + tuple(a.copy() for a in per_image.backward(grad_out, cache))
    for got, expected in zip(first[1:], im2col.backward(grad_out, want_cache)):
        assert relative_error(got, expected) <= FLOAT64_TOL
    out, cache = per_image.forward(x, weight, stride, padding, blocks)
    assert all(np.array_equal(a, b) for a, b in zip(first, (out,) + per_image.backward(grad_out, cache)))
    assert per_image.backward(grad_out, cache, need_x=False)[0] is None
    assert per_image.backward(grad_out, cache, need_weight=False)[1] is None


def test_the_same_input_gives_the_same_bits_and_only_needed_gradients():
    """A fixed summation order (one GEMM per block, blocks added in order): two runs agree to the
    bit. need_x / need_weight False leave that gradient out (None)."""
    x, weight, grad_out = arrays((40, 6, 16, 14, 5, 0), "float32")
    blocks = [(0, 17), (17, 34), (34, 40)]
    first = [batch_inner.forward(x, weight, 1, 0, blocks)]
    first = (first[0][0].copy(),) + batch_inner.backward(grad_out, first[0][1])
    out, cache = batch_inner.forward(x, weight, 1, 0, blocks)
    second = (out,) + batch_inner.backward(grad_out, cache)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    assert batch_inner.backward(grad_out, cache, need_x=False)[0] is None
    assert batch_inner.backward(grad_out, cache, need_weight=False)[1] is None


def test_the_column_budget_decides_what_is_kept(monkeypatch):
    """The budget counts the whole batch's columns: LeNet's conv1 at batch 64 has 64 * 25 * 784 * 4
    = 5,017,600 bytes of them (3 blocks); the 64-channel layer keeps none (one image fills a block),
    and neither does one block (it keeps its own columns, the textbook way)."""
    monkeypatch.setattr(im2col_blocked, "BLOCK_BYTES", 2 << 20)
    conv1 = ((64, 1, 28, 28), (6, 1, 5, 5), 1, 2, 4)
    conv2 = ((64, 6, 14, 14), (16, 6, 5, 5), 1, 0, 4)
    previous = set_column_budget(5_017_600)
    try:
        assert im2col_blocked.kept_layout(*conv1, 3) == "per image"
        assert im2col_blocked.kept_layout(*conv2, 2) == "batch inner"
        assert im2col_blocked.kept_layout(*conv1, 1) is None
        assert set_column_budget(5_017_599) == 5_017_600
        assert im2col_blocked.kept_layout(*conv1, 3) is None
        set_column_budget(1 << 40)
        assert im2col_blocked.kept_layout((2, 64, 32, 32), (64, 64, 3, 3), 1, 1, 4, 2) is None
        for bad in (-1, 2.5, "64", True):
            with pytest.raises(ValueError, match="whole number of bytes"):
                set_column_budget(bad)
    finally:
        set_column_budget(previous)
    monkeypatch.setenv("MINIDL_CONV_COLUMN_BYTES", "1000")
    assert budget.from_environment() == 1000
    monkeypatch.setenv("MINIDL_CONV_COLUMN_BYTES", "")
    assert budget.from_environment() == 64 << 20
    for bad in ("64M", "-1"):
        monkeypatch.setenv("MINIDL_CONV_COLUMN_BYTES", bad)
        with pytest.raises(ValueError, match="MINIDL_CONV_COLUMN_BYTES"):
            budget.from_environment()
