"""The four convolution algorithms (and ``auto``) compute the same thing as ``direct``.

Ben-Nun & Hoefler 2019: direct, im2col, FFT and Winograd are four ways to compute
one convolutional layer. Each is checked against ``direct`` (itself checked against a naive loop
and finite differences in tests/test_layers.py): forward and both gradients, under hypothesis-drawn
batch sizes, channels, image sizes, kernels, paddings and the strides the algorithm supports.

Tolerances, as max|algorithm - reference| <= tol * max|reference| per array:
- float64: 1e-11. Every algorithm is exact in exact arithmetic (FFT and Winograd are identities,
  not approximations), so only rounding is left: measured <= ~2e-15 on these shapes.
- float32 (against the float64 ``direct``): 5e-6, about 40 float32 epsilons. The same norm is
  measured by ``tutorials/figures/make_02_figures.py --only precision`` on 300 random shapes and
  two wide layers (64 channels 3x3, 16 channels 11x11) and written to
  tutorials/figures/out/02_precision.json (chapter 2, section 4, quotes it), with the largest ratio,
  shape by shape, of Winograd's and FFT's errors to im2col's. There the worst case of all three is
  im2col's, about a third of the bound, which leaves headroom for other BLAS/FFT libraries and sums
  up to a few thousand terms; tests/test_chapter_numbers.py checks that every worst case in that
  file stays below the bound.
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from minidl import Tensor, backend, conv, functional as F, gradcheck
from minidl.conv import auto, cost, direct

# Each algorithm's items belong to the course task whose code they run (tutorials/assignments/tasks.toml):
# im2col's forward and backward need im2col and col2im (1.3, 1.4), FFT's need its forward (2.1; the
# backward is no task), Winograd's need its forward and backward (2.2, 2.3). auto picks one of them.
BY_ALGORITHM = [pytest.param("im2col", marks=pytest.mark.task("1.4")),
                pytest.param("fft", marks=pytest.mark.task("2.1")),
                pytest.param("winograd", marks=pytest.mark.task("2.3")),
                "auto"]
FORWARD_TASKS = [pytest.param("im2col", marks=pytest.mark.task("1.3")),
                 pytest.param("fft", marks=pytest.mark.task("2.1")),
                 pytest.param("winograd", marks=pytest.mark.task("2.2"))]
FLOAT64_TOL = 1e-11
FLOAT32_TOL = 5e-6


@st.composite
def shapes_for(draw, algorithm, max_channels=4, max_side=9):
    """(n, c, f, h, w, k, stride, padding) that ``algorithm`` supports, with an output of at least 1x1."""
    kernel = 3 if algorithm == "winograd" else draw(st.integers(1, 5))
    stride = 1 if algorithm == "winograd" else draw(st.integers(1, 3))
    padding = draw(st.integers(0, 2))
    h = draw(st.integers(max(1, kernel - 2 * padding), max_side))
    w = draw(st.integers(max(1, kernel - 2 * padding), max_side))
    return (draw(st.integers(1, 3)), draw(st.integers(1, max_channels)), draw(st.integers(1, max_channels)),
            h, w, kernel, stride, padding)


def run(name, x, weight, grad_out, stride, padding):
    """(out, grad_x, grad_weight) of algorithm ``name`` through the kernel interface, as NumPy arrays."""
    kernel = conv.get(name, x.shape, weight.shape, stride, padding)
    out, cache = kernel.forward(x, weight, stride, padding)
    grad_x, grad_weight = kernel.backward(grad_out, cache, need_x=True, need_weight=True)
    return tuple(backend.to_numpy(a) for a in (out, grad_x, grad_weight))


def reference(x, weight, grad_out, stride, padding):
    """``direct`` in float64 on the host: the oracle."""
    x, weight, grad_out = (backend.to_numpy(a).astype(np.float64) for a in (x, weight, grad_out))
    out, cache = direct.forward(x, weight, stride, padding)
    return (out,) + direct.backward(grad_out, cache, need_x=True, need_weight=True)


def relative_error(actual, expected, floor=1e-30):
    """max |actual - expected| over max |expected|; ``floor`` keeps the denominator off zero."""
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), floor))


def one_term(x, weight, grad_out):
    """The size of one product in each of (out, grad_x, grad_weight)'s sums, as the floor of the error's
    denominator. An output that sees only padding is exactly 0 in the reference, and FFT's round-off
    there (2.9e-10 in float32 through cuFFT on one drawn shape) has no scale of its own to be relative to."""
    big = [float(np.abs(backend.to_numpy(a)).max()) for a in (x, weight, grad_out)]
    return big[0] * big[1], big[2] * big[1], big[0] * big[2]


def draw_arrays(setting, seed, dtype):
    n, c, f, h, w, k, stride, padding = setting
    xp, rng = backend.xp(), np.random.default_rng(seed)
    out_h, out_w = conv.output_size(h, k, stride, padding), conv.output_size(w, k, stride, padding)
    return tuple(xp.asarray(rng.standard_normal(shape), dtype=dtype)
                 for shape in ((n, c, h, w), (f, c, k, k), (n, f, out_h, out_w)))


@pytest.mark.parametrize("algorithm", BY_ALGORITHM)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_every_algorithm_equals_direct_forward_and_both_gradients_in_float64(backend_name, algorithm, data, seed):
    setting = data.draw(shapes_for(algorithm))
    stride, padding = setting[6], setting[7]
    x, weight, grad_out = draw_arrays(setting, seed, "float64")
    for name, actual, expected, floor in zip(("out", "grad_x", "grad_weight"),
                                             run(algorithm, x, weight, grad_out, stride, padding),
                                             reference(x, weight, grad_out, stride, padding),
                                             one_term(x, weight, grad_out)):
        assert relative_error(actual, expected, floor) <= FLOAT64_TOL, f"{algorithm} {name} for setting {setting}"


@pytest.mark.parametrize("algorithm", BY_ALGORITHM)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_float32_error_against_float64_direct_is_within_the_measured_bound(backend_name, algorithm, data, seed):
    setting = data.draw(shapes_for(algorithm, max_channels=16, max_side=12))
    stride, padding = setting[6], setting[7]
    x, weight, grad_out = draw_arrays(setting, seed, "float32")
    results = run(algorithm, x, weight, grad_out, stride, padding)
    assert all(a.dtype == np.float32 for a in results), "float32 in, float32 out"
    for name, actual, expected, floor in zip(("out", "grad_x", "grad_weight"), results,
                                             reference(x, weight, grad_out, stride, padding),
                                             one_term(x, weight, grad_out)):
        assert relative_error(actual, expected, floor) <= FLOAT32_TOL, f"{algorithm} {name} for setting {setting}"


@pytest.mark.parametrize("algorithm", [
    pytest.param("im2col", marks=pytest.mark.task("1.3")),     # F <= C, stride 1: grad_x without col2im
    pytest.param("fft", marks=pytest.mark.task("2.1")),
    pytest.param("winograd", marks=pytest.mark.task("2.3")),
])
def test_winograd_and_fft_on_a_wide_layer_in_float32(algorithm):
    """A 64-channel 3x3 layer: the shape Winograd is for, and longer sums than hypothesis draws."""
    setting = (2, 64, 64, 12, 12, 3, 1, 1)
    x, weight, grad_out = draw_arrays(setting, 7, "float32")
    expected = reference(x, weight, grad_out, 1, 1)
    for actual, wanted in zip(run(algorithm, x, weight, grad_out, 1, 1), expected):
        assert relative_error(actual, wanted) <= FLOAT32_TOL, algorithm


@pytest.mark.parametrize("algorithm", FORWARD_TASKS)
@pytest.mark.parametrize("dtype, tolerance", [pytest.param("float64", FLOAT64_TOL, id="float64"),
                                              pytest.param("float32", FLOAT32_TOL, id="float32")])
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_every_forward_pass_alone_equals_direct(backend_name, algorithm, dtype, tolerance, data, seed):
    """The forward pass without any backward: im2col and Winograd's forward are tasks of their own."""
    setting = data.draw(shapes_for(algorithm))
    stride, padding = setting[6], setting[7]
    x, weight, _ = draw_arrays(setting, seed, dtype)
    out, _ = conv.get(algorithm, x.shape, weight.shape, stride, padding).forward(x, weight, stride, padding)
    assert out.dtype == np.dtype(dtype), f"{dtype} in, {out.dtype} out"
    expected, _ = direct.forward(*(backend.to_numpy(a).astype(np.float64) for a in (x, weight)), stride, padding)
    # relative to max(|expected|, 1): an output of padding alone is exactly 0 (e.g. a 1x1 kernel at
    # stride 2 on a 1x1 image with padding 1), where FFT's rounding leaves ~1e-18
    error = float(np.abs(backend.to_numpy(out) - expected).max() / max(np.abs(expected).max(), 1.0))
    assert out.shape == expected.shape and error <= tolerance, f"{algorithm} for setting {setting}"


def test_the_check_rejects_a_true_convolution_and_a_one_pixel_shift():
    """The comparison can fail: a flipped kernel (convolution, not correlation) or a shifted output is caught."""
    setting = (2, 3, 4, 8, 8, 3, 1, 1)
    x, weight, grad_out = draw_arrays(setting, 3, "float64")
    expected = reference(x, weight, grad_out, 1, 1)[0]
    flipped = run("fft", x, weight[:, :, ::-1, ::-1].copy(), grad_out, 1, 1)[0]
    shifted = np.roll(run("winograd", x, weight, grad_out, 1, 1)[0], 1, axis=3)
    assert relative_error(flipped, expected) > 1e-2
    assert relative_error(shifted, expected) > 1e-2


@pytest.mark.parametrize("algorithm", [pytest.param("fft", marks=pytest.mark.task("2.1")),
                                       pytest.param("winograd", marks=pytest.mark.task("2.3"))])
def test_conv2d_through_autograd_matches_finite_differences(algorithm):
    rng = np.random.default_rng(5)
    stride = 2 if algorithm == "fft" else 1
    x = Tensor(rng.standard_normal((2, 2, 6, 5)), requires_grad=True)
    weight = Tensor(rng.standard_normal((3, 2, 3, 3)), requires_grad=True)
    bias = Tensor(rng.standard_normal(3), requires_grad=True)
    assert gradcheck(lambda a, b, c: F.conv2d(a, b, c, stride, 1, algorithm), [x, weight, bias])


@pytest.mark.parametrize("kernel_size, stride, words", [(3, 2, "stride 1"), (5, 1, "3x3"), (1, 1, "3x3")])
def test_winograd_refuses_what_it_cannot_do_and_names_the_limitation(kernel_size, stride, words):
    x = Tensor(np.zeros((1, 2, 8, 8), dtype=np.float32))
    weight = Tensor(np.zeros((2, 2, kernel_size, kernel_size), dtype=np.float32))
    with pytest.raises(ValueError, match=words):
        F.conv2d(x, weight, stride=stride, algorithm="winograd")


@pytest.mark.parametrize("shape, expected", [
    (((8, 256, 16, 16), (256, 256, 3, 3), 1, 1), "winograd"),
    (((8, 256, 16, 16), (256, 256, 3, 3), 2, 1), "im2col"),       # Winograd cannot stride
    (((8, 64, 16, 16), (64, 64, 3, 3), 1, 1), "im2col"),          # slower with Winograd on the CI machine
    (((8, 8, 16, 16), (8, 8, 3, 3), 1, 1), "im2col"),             # too few channels to pay
    (((2, 4, 40, 40), (4, 4, auto.FFT_MIN_KERNEL, auto.FFT_MIN_KERNEL), 1, 0), "fft"),
    (((64, 1, 28, 28), (6, 1, 5, 5), 1, 2), "im2col"),            # LeNet's first layer
])
def test_auto_follows_its_measured_rule(shape, expected):
    assert auto.choose_name(*shape) == expected
    assert conv.get("auto", *shape) is conv.get(expected, *shape)


def test_cost_counts_im2col_as_the_definition_and_winograd_as_sixteen_products_per_tile():
    x_shape, weight_shape = (2, 3, 8, 10), (4, 3, 3, 3)              # Ho, Wo = 8, 10 with padding 1
    assert cost.cost("im2col", x_shape, weight_shape, 1, 1)["multiplies"] == 2 * 4 * 3 * 9 * 8 * 10
    tiles = 2 * 4 * 5
    winograd = cost.cost("winograd", x_shape, weight_shape, 1, 1)
    assert winograd["multiplies"] == 16 * 4 * 3 * tiles + 42 * 4 * 3       # + G g G^T (six 1/2 entries)
    # the product terms alone give Lavin & Gray's 36/16 = 2.25
    assert (2 * 4 * 3 * 9 * 8 * 10) / (16 * 4 * 3 * tiles) == 2.25


def test_cost_of_fft_does_not_grow_with_the_kernel_but_im2col_does():
    x_shape, small, large = (2, 4, 46, 46), (4, 4, 3, 3), (4, 4, 15, 15)     # same transform size
    fft_small, fft_large = (cost.cost("fft", x_shape, w, 1, 0)["multiplies"] for w in (small, large))
    im2col_small, im2col_large = (cost.cost("im2col", x_shape, w, 1, 0)["multiplies"] for w in (small, large))
    assert fft_small == fft_large
    assert im2col_large == im2col_small * (15 * 15 * 32 * 32) // (3 * 3 * 44 * 44)
    with pytest.raises(ValueError, match="no cost model"):
        cost.cost("auto", x_shape, small, 1, 1)


# ---- im2col in blocks of images (minidl.conv.im2col_blocked.image_blocks) ---------------------
@pytest.mark.task("1.4")
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), block_bytes=st.integers(1, 4000),
       budget=st.sampled_from([0, 1 << 30]))
def test_im2col_in_blocks_of_images_equals_direct(monkeypatch, data, seed, block_bytes, budget):
    """Batches cut into blocks (of a drawn size, a last block shorter) give direct's output and both
    gradients. Budget 0: the weight gradient summed over blocks from rebuilt columns, grad_x by col2im
    per block (stride > 1 or more outputs than inputs) or by the flipped-kernel convolution, itself
    in blocks. A budget that holds the columns: they are kept (per image for columns of at most 32
    rows, batch innermost for rows under 16 pixels), wherever a block holds two images."""
    from minidl.conv import im2col_blocked
    monkeypatch.setattr(im2col_blocked, "BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(conv.budget, "COLUMN_BUDGET", budget)
    setting = data.draw(shapes_for("im2col"))
    n, c, f, h, w, k, stride, padding = setting
    setting = (n + 3,) + setting[1:]                       # at least 4 images, so a cut is possible
    x, weight, grad_out = draw_arrays(setting, seed, "float64")
    blocks = im2col_blocked.image_blocks(x.shape, weight.shape, stride, padding, 8)
    assert blocks[0][0] == 0 and blocks[-1][1] == len(x) and all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    for name, actual, expected in zip(("out", "grad_x", "grad_weight"),
                                      run("im2col", x, weight, grad_out, stride, padding),
                                      reference(x, weight, grad_out, stride, padding)):
        assert relative_error(actual, expected) <= FLOAT64_TOL, f"{name} for setting {setting}, blocks {blocks}"


def test_im2col_blocks_follow_the_cache_and_the_budget_keeps_lenets_columns(monkeypatch):
    """With 2 MiB blocks (a 1 MiB L2): the large bench layer (2.25 MiB of columns per image) runs one
    image per block and keeps no columns; LeNet-5's layers at batch 64 keep theirs (4.8 and 3.7 MiB,
    under the 64 MiB budget) and build them 26 and 34 images at a time."""
    from minidl.conv import im2col_blocked
    monkeypatch.setattr(im2col_blocked, "BLOCK_BYTES", 2 << 20)
    monkeypatch.setattr(conv.budget, "COLUMN_BUDGET", 64 << 20)
    large = ((32, 64, 32, 32), (64, 64, 3, 3), 1, 1, 4)
    assert im2col_blocked.image_blocks(*large) == [(i, i + 1) for i in range(32)]
    assert im2col_blocked.kept_layout(*large, 32) is None
    conv1, conv2 = ((64, 1, 28, 28), (6, 1, 5, 5), 1, 2, 4), ((64, 6, 14, 14), (16, 6, 5, 5), 1, 0, 4)
    assert im2col_blocked.image_blocks(*conv1) == [(0, 26), (26, 52), (52, 64)]
    assert im2col_blocked.image_blocks(*conv2) == [(0, 34), (34, 64)]
    assert im2col_blocked.kept_layout(*conv1, 3) == "per image"            # columns of 25 rows
    assert im2col_blocked.kept_layout(*conv2, 2) == "batch inner"          # rows of 10


def test_im2col_one_block_and_many_blocks_agree_in_float32(monkeypatch):
    """Same layer, one block against one image per block: equal to float32 rounding (BLAS may order a
    product's sums differently for another number of columns, and the weight gradient is summed by block)."""
    from minidl.conv import im2col_blocked
    setting = (5, 6, 4, 7, 7, 3, 1, 1)
    x, weight, grad_out = draw_arrays(setting, 11, "float32")
    whole = run("im2col", x, weight, grad_out, 1, 1)
    monkeypatch.setattr(im2col_blocked, "BLOCK_BYTES", 1)
    assert len(im2col_blocked.image_blocks(x.shape, weight.shape, 1, 1, 4)) == 5
    cut = run("im2col", x, weight, grad_out, 1, 1)
    for actual, expected in zip(cut, whole):
        assert relative_error(actual, expected) <= FLOAT32_TOL


@pytest.mark.task("1.4")          # col2im is the oracle here
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_plane_col2im_gives_the_bits_of_col2im(data, seed):
    """Stride 1: col2im_planes (each image's columns as long as its padded plane, one contiguous
    += per kernel offset) adds the same products in the same order as
    col2im does, so on the same columns grad_x agrees to the last bit: the extra columns' zero
    gradients change nothing, also where a shifted run crosses into the next plane. (Whether BLAS
    gives a column the same bits in a wider product is BLAS's business; the end-to-end comparison
    with direct is test_every_algorithm_equals_direct...)."""
    from minidl.conv import im2col, im2col_blocked
    n, c, f, h, w, k, _, padding = data.draw(shapes_for("im2col"))
    x, weight, grad_out = draw_arrays((n, c, f, h, w, k, 1, padding), seed, "float64")
    padded = (n, c, h + 2 * padding, w + 2 * padding)
    out_h, out_w = grad_out.shape[2:]
    planes = np.zeros((f, n) + padded[2:])
    planes[:, :, :out_h, :out_w] = grad_out.transpose(1, 0, 2, 3)
    rows = weight.transpose(2, 3, 1, 0).reshape(k * k * c, f)                     # the kernel's row order
    grad_cols = (rows @ planes.reshape(f, -1)).reshape(k, k, c, n, padded[2], padded[3]).transpose(2, 0, 1, 3, 4, 5)
    expected = im2col.col2im(grad_cols[..., :out_h, :out_w].transpose(3, 0, 1, 2, 4, 5), padded, 1)
    expected = expected[:, :, padding:padding + h, padding:padding + w]
    got = im2col_blocked.col2im_planes(grad_out, weight, padded, padding)
    assert np.array_equal(got, expected)


def test_workspace_hands_a_buffer_out_again_only_when_nobody_else_holds_it():
    """A buffer still read by an autograd cache (a dict) or by a view must never be handed out for
    new data; once they let go, the same buffer is reused instead of allocating another."""
    from minidl.conv import workspace
    shape = (7, 11, 13)                                      # a shape no other test asks for
    first, second = workspace(np, shape, np.float32), workspace(np, shape, np.float32)
    assert first is not second
    cache, view = {"cols": first}, second[1:]
    ids = {id(first), id(second)}
    del first, second
    third = workspace(np, shape, np.float32)
    assert id(third) not in ids                              # both still held: a third buffer
    cache.clear()
    del view
    fourth = workspace(np, shape, np.float32)
    assert id(fourth) in ids and fourth is not third         # a freed one again
