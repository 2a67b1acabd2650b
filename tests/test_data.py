"""minidl.data: the embedded digits, the IDX reader, synthetic convex problems, sharding, batching.

Expected values come from something other than the code under test: the digits' first image as
scikit-learn's documentation prints it, IDX files assembled byte by byte with ``struct``,
``numpy.array_split`` for sharding, the normal equations for least squares, and central
differences for gradients.
"""
import gzip
import re
import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st

from minidl.data import (
    LeastSquares,
    LogisticRegression,
    batches,
    digits_split,
    least_squares,
    load_digits,
    load_mnist,
    logistic_regression,
    read_idx,
    shard,
    shard_sizes,
    train_test_split,
)
from tests import strategies

# ---------------------------------------------------------------------------------------------
# the embedded digits


def test_digits_have_the_documented_shapes_dtypes_and_range():
    images, labels = load_digits()
    assert images.shape == (1797, 1, 8, 8) and images.dtype == np.float32
    assert labels.shape == (1797,) and labels.dtype == np.int64
    assert images.min() == 0.0 and images.max() == 1.0
    # the stored values are counts 0..16, so every pixel is a multiple of 1/16
    assert np.array_equal(images * 16, np.round(images * 16))


def test_digits_are_the_uci_data_first_image_matches_the_published_one():
    # digits.images[0] as printed in scikit-learn's documentation (a zero); labels cycle 0..9 at first
    first = np.array([[0, 0, 5, 13, 9, 1, 0, 0], [0, 0, 13, 15, 10, 15, 5, 0],
                      [0, 3, 15, 2, 0, 11, 8, 0], [0, 4, 12, 0, 0, 8, 8, 0],
                      [0, 5, 8, 0, 0, 9, 8, 0], [0, 4, 11, 0, 1, 12, 7, 0],
                      [0, 2, 14, 5, 10, 12, 0, 0], [0, 0, 6, 13, 10, 0, 0, 0]])
    images, labels = load_digits()
    assert np.array_equal(images[0, 0] * 16, first)
    assert list(labels[:10]) == list(range(10))


def test_digits_have_ten_classes_of_about_180_each():
    _, labels = load_digits()
    counts = np.bincount(labels)
    assert len(counts) == 10
    assert counts.sum() == 1797 and counts.min() >= 170 and counts.max() <= 190


def test_load_digits_returns_fresh_arrays_each_call():
    images, _ = load_digits()
    images[0] = 7.0
    assert load_digits()[0][0].max() <= 1.0


def _rows(images, labels):
    """Each (image, label) pair as one sortable row, to compare collections as multisets."""
    rows = np.concatenate([images.reshape(len(images), -1), labels[:, None]], axis=1)
    return rows[np.lexsort(rows.T[::-1])]


def test_digits_split_is_deterministic_per_seed_and_sized_by_test_fraction():
    first, again, other = digits_split(seed=3), digits_split(seed=3), digits_split(seed=4)
    assert [a.shape[0] for a in first] == [1438, 1438, 359, 359]         # round(0.2 * 1797) = 359
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[3], other[3])
    # 0.5 * 1797 = 898.5 rounds half to even (Python's round): 898 test rows
    assert [a.shape[0] for a in digits_split(test_fraction=0.5)] == [899, 899, 898, 898]


def test_digits_split_is_disjoint_and_covering():
    images, labels = load_digits()
    x_train, y_train, x_test, y_test = digits_split(seed=0)
    together = _rows(np.concatenate([x_train, x_test]), np.concatenate([y_train, y_test]))
    assert np.array_equal(together, _rows(images, labels))
    assert set(np.unique(y_test)) == set(range(10))


@given(n=st.integers(2, 200), fraction=st.floats(0.05, 0.95), seed=strategies.seeds)
def test_split_keeps_pairs_together_and_is_a_partition(n, fraction, seed):
    ids = np.arange(n)
    images, labels = np.stack([ids, -ids], axis=1), 1000 + ids     # row i carries i, -i, 1000+i
    n_test = int(round(fraction * n))
    if n_test in (0, n):
        with pytest.raises(ValueError, match="non-empty"):
            train_test_split(images, labels, fraction, np.random.default_rng(seed))
        return
    rng = np.random.default_rng(seed)
    x_train, y_train, x_test, y_test = train_test_split(images, labels, fraction, rng)
    assert len(y_test) == n_test and len(y_train) == n - n_test
    for x, y in ((x_train, y_train), (x_test, y_test)):
        assert np.array_equal(x[:, 0], y - 1000) and np.array_equal(x[:, 1], -(y - 1000))
    assert np.array_equal(np.sort(np.concatenate([y_train, y_test])), labels)


def test_split_rejects_bad_input_naming_it():
    x, y = np.zeros((10, 3)), np.zeros(10)
    with pytest.raises(ValueError, match=r"\(10, 3\).*\(9,\)"):
        train_test_split(x, y[:9])
    for fraction in (0, 1, 1.5, -0.1):
        with pytest.raises(ValueError, match=f"test_fraction.*{fraction}"):
            train_test_split(x, y, fraction)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator.*'seed'"):
        train_test_split(x, y, 0.2, rng="seed")
    same = train_test_split(x, np.arange(10), 0.2, rng=7), train_test_split(x, np.arange(10), 0.2, rng=None)
    assert np.array_equal(same[0][3], train_test_split(x, np.arange(10), 0.2, np.random.default_rng(7))[3])
    assert np.array_equal(same[1][3], train_test_split(x, np.arange(10), 0.2, np.random.default_rng(0))[3])


# ---------------------------------------------------------------------------------------------
# sharding and batching


@given(n=strategies.lengths, size=st.one_of(strategies.rank_counts, st.integers(1, 400)))
def test_shards_are_disjoint_contiguous_and_cover_every_row_once(n, size):
    parts = [shard(n, rank, size) for rank in range(size)]
    assert np.array_equal(np.concatenate(parts), np.arange(n))       # disjoint, covering, in order
    for part in parts:
        assert part.dtype == np.int64
        assert len(part) == 0 or np.array_equal(part, np.arange(part[0], part[-1] + 1))   # contiguous
    lengths = np.array([len(part) for part in parts])
    assert lengths.max() - lengths.min() <= 1
    assert np.array_equal(lengths, shard_sizes(n, size))
    # numpy's array_split uses the same convention: the first n % size blocks are the longer ones
    assert all(np.array_equal(a, b) for a, b in zip(parts, np.array_split(np.arange(n), size)))


def test_shard_sizes_by_hand():
    assert list(shard_sizes(10, 4)) == [3, 3, 2, 2]
    assert list(shard(10, 2, 4)) == [6, 7]
    assert list(shard_sizes(2, 5)) == [1, 1, 0, 0, 0]                # size > n: empty ranks
    assert len(shard(2, 4, 5)) == 0
    assert list(shard_sizes(0, 3)) == [0, 0, 0]


@pytest.mark.parametrize("args, error, message", [
    ((10, 0, 0), ValueError, "size must be >= 1, got 0"),
    ((10, 4, 4), ValueError, r"rank must be in \[0, 4\).*got 4"),
    ((10, -1, 4), ValueError, "rank.*got -1"),
    ((-1, 0, 4), ValueError, "n must be >= 0, got -1"),
    ((10.0, 0, 4), TypeError, "n must be an integer, got 10.0"),
    ((10, True, 4), TypeError, "rank must be an integer"),
])
def test_shard_rejects_bad_arguments_naming_them(args, error, message):
    with pytest.raises(error, match=message):
        shard(*args)


@given(n=strategies.lengths, batch_size=st.integers(1, 64), seed=strategies.seeds)
def test_batches_visit_every_index_once_per_epoch_and_repeat_per_seed(n, batch_size, seed):
    epoch = list(batches(n, batch_size, np.random.default_rng(seed)))
    assert np.array_equal(np.sort(np.concatenate(epoch + [np.empty(0, np.int64)])), np.arange(n))
    assert all(len(batch) == batch_size for batch in epoch[:-1])
    assert len(epoch) == -(-n // batch_size)
    again = list(batches(n, batch_size, np.random.default_rng(seed)))
    assert all(np.array_equal(a, b) for a, b in zip(epoch, again)) and len(epoch) == len(again)

    full = list(batches(n, batch_size, np.random.default_rng(seed), drop_last=True))
    assert len(full) == n // batch_size and all(len(batch) == batch_size for batch in full)
    seen = np.concatenate(full + [np.empty(0, np.int64)])
    assert len(np.unique(seen)) == len(seen)


def test_batches_shuffle_with_a_generator_and_keep_order_without():
    assert [list(b) for b in batches(7, 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    rng = np.random.default_rng(0)
    first, second = np.concatenate(list(batches(100, 10, rng))), np.concatenate(list(batches(100, 10, rng)))
    assert not np.array_equal(first, np.arange(100))
    assert not np.array_equal(first, second)                          # each epoch a fresh order
    other = np.concatenate(list(batches(100, 10, np.random.default_rng(1))))
    assert not np.array_equal(first, other)


def test_batches_reject_bad_arguments_when_called():
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        batches(10, 0)                                               # no next() needed
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        batches(10, 2, rng=0)
    with pytest.raises(ValueError, match="n must be >= 0, got -3"):
        batches(-3, 2)


# ---------------------------------------------------------------------------------------------
# IDX files

IDX_CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C,
             np.float32: 0x0D, np.float64: 0x0E}


def idx_bytes(array, code=None):
    """An IDX file's bytes, built with struct: magic, big-endian dims, big-endian payload."""
    code = IDX_CODES[array.dtype.type] if code is None else code
    header = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


@given(dtype=st.sampled_from(list(IDX_CODES)), shape=strategies.shapes(1, 4, 0, 5),
       seed=strategies.seeds, compress=st.booleans())
def test_idx_round_trip_for_every_dtype_and_rank(tmp_path, dtype, shape, seed, compress):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        array = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)
    else:
        array = rng.standard_normal(shape).astype(dtype)
    data = idx_bytes(array)
    path = tmp_path / "file.idx"
    path.write_bytes(gzip.compress(data) if compress else data)
    result = read_idx(path)
    assert result.dtype == dtype and result.dtype.isnative and result.shape == shape
    assert np.array_equal(result, array)


def test_idx_payload_is_big_endian(tmp_path):
    # header 00 00 0B (int16) 01 (one dim), dim 2, then 0x0102 = 258 and 0xFFFE = -2
    path = tmp_path / "short.idx"
    path.write_bytes(bytes([0, 0, 0x0B, 1, 0, 0, 0, 2, 0x01, 0x02, 0xFF, 0xFE]))
    assert read_idx(path).tolist() == [258, -2]


def test_gzip_is_detected_by_magic_bytes_not_by_name(tmp_path):
    array = np.arange(12, dtype=np.uint8).reshape(3, 4)
    (tmp_path / "plain.gz").write_bytes(idx_bytes(array))
    (tmp_path / "packed.idx").write_bytes(gzip.compress(idx_bytes(array)))
    assert np.array_equal(read_idx(tmp_path / "plain.gz"), array)
    assert np.array_equal(read_idx(str(tmp_path / "packed.idx")), array)


GOOD = idx_bytes(np.arange(24, dtype=np.int32).reshape(2, 3, 4))


@pytest.mark.parametrize("data, problem", [
    (b"\x01" + GOOD[1:], "magic"),                                  # first magic byte not zero
    (GOOD[:1] + b"\x08" + GOOD[2:], "magic"),                       # second magic byte not zero
    (GOOD[:2] + b"\x0A" + GOOD[3:], "dtype code 0x0A"),             # no such dtype
    (GOOD[:3] + b"\x00", "0 dimensions"),
    (GOOD[:3], "too short"),
    (GOOD[:10], "truncated header"),                                 # 3 dims need 16 header bytes
    (GOOD[:-1], "truncated payload"),
    (GOOD[:-4 * 7], "truncated payload"),
    (GOOD + b"\x00", "1 trailing bytes"),
    (GOOD[:3] + b"\x02" + GOOD[4:], "trailing bytes"),              # ndim 2 reads dims 2 x 3 only
    (gzip.compress(GOOD, mtime=0)[:-8], "gzip"),    # truncated gzip stream (mtime 0: the same test id in every process)
])
def test_corrupt_idx_files_raise_value_error_naming_file_and_problem(tmp_path, data, problem):
    path = tmp_path / "broken-file-idx3-ubyte"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=problem) as error:
        read_idx(path)
    assert "broken-file-idx3-ubyte" in str(error.value)


def write_mnist(directory, prefix, images, labels, compress=False):
    for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
        data = idx_bytes(array)
        name = f"{prefix}-{kind}-ubyte" + (".gz" if compress else "")
        (directory / name).write_bytes(gzip.compress(data) if compress else data)


@pytest.mark.parametrize("kind, prefix, compress", [("train", "train", False), ("test", "t10k", True)])
def test_load_mnist_reads_the_standard_file_names(tmp_path, kind, prefix, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    images[0, 0, 0], images[0, 0, 1] = 0, 255
    labels = np.array([3, 0, 9, 1, 7], dtype=np.uint8)
    write_mnist(tmp_path, prefix, images, labels, compress)
    x, y = load_mnist(tmp_path, kind=kind)
    assert x.shape == (5, 1, 28, 28) and x.dtype == np.float32
    assert y.dtype == np.int64 and y.tolist() == [3, 0, 9, 1, 7]
    assert x[0, 0, 0, 0] == 0.0 and x[0, 0, 0, 1] == 1.0
    assert np.allclose(x[:, 0] * 255, images, atol=1e-4)


def test_load_mnist_rejects_mismatched_counts_naming_both_files(tmp_path):
    write_mnist(tmp_path, "train", np.zeros((5, 28, 28), np.uint8), np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match="counts differ") as error:
        load_mnist(tmp_path)
    message = str(error.value)
    assert "train-images-idx3-ubyte" in message and "train-labels-idx1-ubyte" in message
    assert "5 images" in message and "4 labels" in message


def test_load_mnist_rejects_wrong_contents_missing_files_and_unknown_kind(tmp_path):
    write_mnist(tmp_path, "train", np.zeros((5, 28, 28), np.uint8), np.full(5, 10, np.uint8))
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte.*0..9"):
        load_mnist(tmp_path)
    write_mnist(tmp_path, "train", np.zeros((5, 28, 28), np.float32), np.zeros(5, np.uint8))
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.*uint8"):
        load_mnist(tmp_path)
    with pytest.raises(ValueError, match="kind must be 'train' or 'test', got 'valid'"):
        load_mnist(tmp_path, kind="valid")


def test_load_mnist_without_its_directory_or_files_is_a_value_error_naming_the_path(tmp_path):
    # ValueError, not FileNotFoundError: the algorithms turn ValueError into a one-line "error: ..."
    missing = tmp_path / "no-such-directory"
    with pytest.raises(ValueError, match=f"^{re.escape(str(missing))}: does not exist"):
        load_mnist(missing)
    a_file = tmp_path / "a-file"
    a_file.write_bytes(b"")
    with pytest.raises(ValueError, match=f"^{re.escape(str(a_file))}: is not a directory"):
        load_mnist(a_file)
    write_mnist(tmp_path, "train", np.zeros((5, 28, 28), np.uint8), np.zeros(5, np.uint8))
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path))}: neither t10k-images-idx3-ubyte nor "
                                         f"t10k-images-idx3-ubyte.gz"):
        load_mnist(tmp_path, kind="test")
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(ValueError, match="neither train-labels-idx1-ubyte nor train-labels-idx1-ubyte.gz"):
        load_mnist(tmp_path)


def test_read_idx_of_a_missing_file_or_a_directory_is_a_value_error_naming_the_path(tmp_path):
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'missing'))}: cannot read"):
        read_idx(tmp_path / "missing")
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path))}: cannot read"):
        read_idx(tmp_path)


# ---------------------------------------------------------------------------------------------
# synthetic convex problems

problem_sizes = st.tuples(st.integers(1, 8), st.integers(0, 60)).map(lambda dm: (dm[0] + dm[1], dm[0]))


def central_differences(f, w, h=1e-6):
    """Gradient of scalar f at w by (f(w + h e_j) - f(w - h e_j)) / 2h, one coordinate at a time."""
    grad = np.zeros_like(w)
    for j in range(len(w)):
        step = np.zeros_like(w)
        step[j] = h
        grad[j] = (f(w + step) - f(w - step)) / (2 * h)
    return grad


@given(size=problem_sizes, seed=strategies.seeds)
def test_least_squares_w_star_solves_the_normal_equations(size, seed):
    n, d = size
    problem = least_squares(n, d, np.random.default_rng(seed))
    x, y = problem.x, problem.y
    assert x.shape == (n, d) and y.shape == (n,) and x.dtype == y.dtype == np.float64
    # The normal equations X^T X w = X^T y, solved another way, give the same w. Tolerance: both
    # are backward stable, so they agree to ~ eps * cond(X^T X); Gaussian X with n >= d is
    # well conditioned except when n is close to d, hence a relative 1e-6 rather than 1e-12.
    normal = np.linalg.solve(x.T @ x, x.T @ y)
    assert np.allclose(problem.w_star, normal, rtol=1e-6, atol=1e-6 * np.abs(normal).max())
    # The gradient at the lstsq solution is rounding only: X^T r / n with r orthogonal to X's
    # columns up to ~ eps * cond(X) * ||X|| ||y||, tiny next to ||X^T y|| / n.
    scale = np.linalg.norm(x.T @ y) / n
    assert np.linalg.norm(problem.grad(problem.w_star)) <= 1e-8 * scale


def test_least_squares_without_noise_recovers_the_generating_weights():
    problem = least_squares(50, 4, np.random.default_rng(1), noise=0.0)
    assert np.allclose(problem.w_star, problem.w_true, atol=1e-12)
    assert problem.loss(problem.w_star) < 1e-25
    noisy = least_squares(50, 4, np.random.default_rng(1), noise=0.5)
    assert not np.allclose(noisy.w_star, noisy.w_true, atol=1e-3)


def test_least_squares_loss_and_grad_by_hand():
    problem = LeastSquares(x=np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]), y=np.array([1.0, 2.0, 3.0]),
                           w_star=np.zeros(2), w_true=np.zeros(2))
    w = np.array([1.0, 1.0])
    # residuals x w - y = (0, 0, -1): loss = 1/(2*3) * 1, grad = 1/3 * X^T r = (-1/3, -1/3)
    assert problem.loss(w) == pytest.approx(1 / 6)
    assert np.allclose(problem.grad(w), [-1 / 3, -1 / 3])
    # over rows [1, 2]: residuals (0, -1): grad = 1/2 * (-1, -1)
    assert np.allclose(problem.grad(w, np.array([1, 2])), [-0.5, -0.5])


@given(size=problem_sizes, seed=strategies.seeds)
def test_logistic_regression_w_star_satisfies_the_optimality_condition(size, seed):
    n, d = size
    problem = logistic_regression(n, d, np.random.default_rng(seed), l2=1e-2)
    x, y, w = problem.x, problem.y, problem.w_star
    assert set(np.unique(y)) <= {0.0, 1.0}
    # first-order condition written out independently of the class: X^T (sigma(Xw) - y) / n + l2 w = 0.
    # Newton stops at ||grad|| <= 1e-12; a second evaluation differs from the first by rounding
    # (~ eps * ||X|| ||sigma - y|| / sqrt(n) ~ 1e-15 here), so 1e-10 leaves a wide margin.
    condition = x.T @ (1 / (1 + np.exp(-(x @ w))) - y) / n + 1e-2 * w
    assert np.linalg.norm(condition) <= 1e-10
    assert np.linalg.norm(problem.grad(w)) <= 1e-10


def test_logistic_regression_loss_by_hand():
    problem = LogisticRegression(x=np.array([[1.0], [-2.0]]), y=np.array([1.0, 0.0]), l2=0.5,
                                 w_star=np.zeros(1), w_true=np.zeros(1))
    w = np.array([0.5])
    # z = (0.5, -1): mean of log(1 + e^0.5) - 0.5 and log(1 + e^-1), plus 0.5/2 * 0.25
    expected = 0.5 * (np.log(1 + np.exp(0.5)) - 0.5 + np.log(1 + np.exp(-1.0))) + 0.0625
    assert problem.loss(w) == pytest.approx(expected, rel=1e-14)
    # z = (1e4, -2e4): both data terms vanish (no overflow, no warning); only 0.5/2 * 1e8 is left
    assert problem.loss(np.array([1e4])) == pytest.approx(2.5e7, rel=1e-14)


@pytest.mark.parametrize("make", [least_squares, logistic_regression])
@given(size=problem_sizes, seed=strategies.seeds)
def test_grad_matches_central_differences_of_loss(make, size, seed):
    n, d = size
    rng = np.random.default_rng(seed)
    problem = make(n, d, rng)
    w = rng.standard_normal(d)
    idx = rng.choice(n, size=max(1, n // 2), replace=False)
    # central differences with h = 1e-6: truncation O(h^2 f''') ~ 1e-12, rounding ~ eps |f| / h ~ 1e-10
    # for these O(1..10) losses, so 1e-6 relative to the gradient's size is far above both.
    for rows in (None, idx):
        numeric = central_differences(lambda v: problem.loss(v, rows), w)
        assert np.allclose(problem.grad(w, rows), numeric, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("make", [least_squares, logistic_regression])
@given(seed=strategies.seeds)
def test_w_star_is_a_minimum_every_small_step_away_costs(make, seed):
    rng = np.random.default_rng(seed)
    problem = make(40, 5, rng)
    best = problem.loss(problem.w_star)
    # Strong convexity: loss(w_star + e) - loss(w_star) >= mu/2 |e|^2 with mu >= l2 = 1e-2
    # (least squares: mu = smallest eigenvalue of X^T X / n, ~0.2 here), so at |e| = 1e-4 the
    # increase is >= 5e-11, far above the ~1e-16 rounding of a loss of size ~1.
    for _ in range(20):
        step = rng.standard_normal(5)
        step *= 1e-4 / np.linalg.norm(step)
        assert problem.loss(problem.w_star + step) > best


def test_logistic_hessian_matches_differences_of_grad():
    problem = logistic_regression(30, 4, np.random.default_rng(2))
    w = np.random.default_rng(3).standard_normal(4)
    numeric = np.stack([central_differences(lambda v: problem.grad(v)[i], w) for i in range(4)])
    assert np.allclose(problem.hess(w), numeric, atol=1e-7)


def test_synthetic_problems_are_reproducible_per_seed():
    for make in (least_squares, logistic_regression):
        a, b, c = (make(20, 3, np.random.default_rng(s)) for s in (5, 5, 6))
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y) and np.array_equal(a.w_star, b.w_star)
        assert not np.array_equal(a.x, c.x)


def test_synthetic_problems_reject_bad_input_naming_it():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="n must be >= d.*n=3, d=5"):
        least_squares(3, 5, rng)
    with pytest.raises(ValueError, match="l2 must be.*> 0.*got 0"):
        logistic_regression(10, 2, rng, l2=0)
    with pytest.raises(ValueError, match="noise.*-1"):
        least_squares(10, 2, rng, noise=-1)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        least_squares(10, 2, 0)
    problem = least_squares(10, 2, rng)
    with pytest.raises(ValueError, match=r"w must have shape \(2,\), got \(3,\)"):
        problem.grad(np.zeros(3))
    with pytest.raises(ValueError, match="non-empty"):
        problem.grad(np.zeros(2), np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match=r"idx must lie in \[0, 10\)"):
        problem.loss(np.zeros(2), np.array([3, 10]))
