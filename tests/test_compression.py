"""Gradient compressors (collectives/compression/compress.py) and compressed synchronous SGD
(algorithms/compressed_sgd.py).

Run: python tests/run.py --max-ranks 3 -- tests/test_compression.py

- The unbiased quantizers (QSGD, stochastic rounding, TernGrad) average to the gradient within a
  Hoeffding bound derived below; QSGD's variance is the one its definition implies, within the
  paper's bound min(n / s^2, sqrt(n) / s) ||g||^2, and 0 on a 1-sparse vector; every message is as
  many bytes as its formula says; the compressors that draw refuse to run without a generator.
- Error feedback loses nothing: sum over steps of what was sent + the final residual = sum of
  the gradients (exactly for top-k and random-k on integer-valued gradients, to rounding for 1-bit).
- ``--compressor none`` is allreduce SGD bit for bit; top-k at density 1 is allreduce SGD up to
  the order of additions; the log's bytes are the wire formula's; bad flags, and flags the chosen
  compressor would ignore, stop every rank before the first message.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import allreduce_sgd, compressed_sgd
from algorithms.core.cli import SettingError
from collectives.compression import compress
from tests.helpers import EQUAL_UP_TO_ROUNDING, assert_stopped, float64_mlp, launch, parallel_assert_close, tiny_digits

# ---- unbiasedness -----------------------------------------------------------------------------------
# Each decoded entry of one draw lies in an interval of width w that does not depend on the draw:
# two neighbouring levels, ||bucket||_2 / s apart for QSGD and 2 m / (2^b - 1) for stochastic
# rounding, or {0, m sign(g)} (w = m) for TernGrad, m the bucket's max |g|. Hoeffding: the mean of
# R independent draws is further than t = w sqrt(ln(2 n / delta) / (2 R)) from its expectation g
# with probability at most delta / n, so (union bound over the n entries) all n entries are within
# t with probability >= 1 - delta.
DRAWS, DELTA = 600, 1e-9


def mean_of_draws(compressor, grad, seed):
    rng = np.random.default_rng(seed)
    total = np.zeros_like(grad)
    for _ in range(DRAWS):
        total += compressor.decompress(compressor.compress(grad, rng))
    return total / DRAWS


def per_bucket(grad, bucket, reduce):
    """reduce(row) of each bucket of ``bucket`` entries (the last one short), repeated for each entry."""
    return np.concatenate([np.full(len(row), reduce(row)) for row in np.split(grad, range(bucket, len(grad), bucket))])


@settings(max_examples=12)
@given(n=st.integers(1, 300), scale=st.sampled_from([1e-6, 1.0, 1e4]), bits=st.integers(1, 4),
       kind=st.sampled_from(["qsgd", "rounding", "terngrad"]), seed=st.integers(0, 2 ** 16))
def test_qsgd_stochastic_rounding_and_terngrad_are_unbiased_within_a_hoeffding_bound(n, scale, bits, kind, seed):
    grad = np.random.default_rng(seed).normal(size=n) * scale
    levels = 2 ** bits - 1                                   # qsgd's s: 1, 3, 7, 15
    compressor = compress.make(kind, bits=bits, levels=levels, bucket=64)
    m = per_bucket(grad, 64, lambda row: np.abs(row).max())
    w = {"qsgd": per_bucket(grad, 64, np.linalg.norm) / levels, "rounding": 2 * m / levels, "terngrad": m}[kind]
    bound = w * math.sqrt(math.log(2 * n / DELTA) / (2 * DRAWS))
    error = np.abs(mean_of_draws(compressor, grad, seed) - grad)
    assert np.all(error <= bound + 1e-12 * m), f"max error / bound {np.max(error / np.maximum(bound, 1e-300)):.2f}"


# ---- QSGD as Alistarh et al. define it ------------------------------------------------------------------

def test_qsgd_sends_each_entry_as_its_sign_and_one_of_the_two_levels_of_the_norm_around_it():
    # Q(g)_i = ||g|| sign(g_i) xi_i with xi_i in {l / s, (l + 1) / s}, l = floor(|g_i| / ||g|| s): zero stays zero
    grad = np.array([3.0, -4.0, 0.0, 0.5, -0.0, 1e-3, 12.0])
    s, norm = 4, np.linalg.norm(grad)
    r = np.abs(grad) / norm * s
    low, high = norm * np.floor(r) / s, norm * (np.floor(r) + 1) / s
    qsgd = compress.make("qsgd", levels=s)
    rng = np.random.default_rng(5)
    for _ in range(200):
        # to a few ulps (rtol 1e-15): the code computes the norm as max |g| * ||g / max |g|||
        magnitude = np.abs(decoded := qsgd.decompress(qsgd.compress(grad, rng)))
        assert np.all(np.isclose(magnitude, low, rtol=1e-15, atol=0) | np.isclose(magnitude, high, rtol=1e-15, atol=0))
        assert np.all(np.sign(decoded) * np.sign(grad) >= 0) and decoded[2] == 0 and decoded[4] == 0


def qsgd_variance(grad, s, bucket):
    """The exact E||Q(g) - g||^2 of QSGD, its largest and smallest value over draws, and the spread of
    ||Q(g) - g||^2 (its variance): each entry is off by f w or (1 - f) w, w = ||bucket|| / s, with
    probabilities 1 - f and f, f = r - floor(r) its rounding fraction."""
    w = per_bucket(grad, bucket, np.linalg.norm) / s
    r = np.abs(grad) / np.where(w > 0, w, 1)
    f = r - np.floor(r)
    mean = np.sum(w ** 2 * f * (1 - f))
    spread = np.sum(w ** 4 * f * (1 - f) * (1 - 2 * f) ** 2)
    return mean, np.sum(w ** 2 * np.maximum(f, 1 - f) ** 2), np.sum(w ** 2 * np.minimum(f, 1 - f) ** 2), spread


VARIANCE_DRAWS, VARIANCE_DELTA = 2000, 1e-6


@pytest.mark.parametrize("shape, n, s, bucket", [("normal", 100, 1, 512), ("normal", 100, 4, 512),
                                                 ("normal", 1000, 16, 1000), ("5-sparse", 400, 2, 512),
                                                 ("normal", 300, 2, 64), ("uniform", 64, 8, 64)])
def test_qsgd_variance_is_its_definitions_and_within_the_papers_bound(shape, n, s, bucket):
    # Lemma 3.1: E||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2 for each bucket v of d entries.
    # Tolerance (Bernstein): the R draws of X = ||Q(g) - g||^2 are independent, within M = hi - lo of
    # their mean and of variance sigma^2 (all from qsgd_variance), so their mean is further than
    # t = (2 M L / 3 + sqrt((2 M L / 3)^2 + 8 R sigma^2 L)) / (2 R), L = ln(2 / delta), from the exact
    # E X with probability at most delta = 1e-6.
    rng = np.random.default_rng(n + s)
    grad = {"normal": rng.normal(size=n), "uniform": rng.uniform(-1, 1, size=n),
            "5-sparse": np.zeros(n)}[shape]
    if shape == "5-sparse":
        grad[rng.choice(n, 5, replace=False)] = rng.normal(size=5)
    qsgd = compress.make("qsgd", levels=s, bucket=bucket)
    draws = [np.sum((qsgd.decompress(qsgd.compress(grad, rng)) - grad) ** 2) for _ in range(VARIANCE_DRAWS)]
    exact, hi, lo, spread = qsgd_variance(grad, s, bucket)
    big = 2 * (hi - lo) * math.log(2 / VARIANCE_DELTA) / 3
    t = (big + math.sqrt(big ** 2 + 8 * VARIANCE_DRAWS * spread * math.log(2 / VARIANCE_DELTA))) / (2 * VARIANCE_DRAWS)
    d = min(bucket, n)
    bound = min(d / s ** 2, math.sqrt(d) / s) * np.sum(grad ** 2)
    assert abs(np.mean(draws) - exact) <= t + 1e-12 * exact, (np.mean(draws), exact, t)
    assert np.mean(draws) <= bound + t, (np.mean(draws), bound)
    assert exact > 0                                     # not a vector QSGD sends exactly: the check has teeth


@pytest.mark.parametrize("dtype, value", [(np.float64, 3.0), (np.float64, -1e-300), (np.float64, 7e300),
                                          (np.float64, -0.1), (np.float32, -0.1), (np.float32, 3e38),
                                          (np.float32, 1e-40)])
@pytest.mark.parametrize("s, bucket", [(1, 512), (4, 512), (16, 8), (32767, 10 ** 9)])
def test_qsgd_sends_a_one_sparse_vector_exactly(dtype, value, s, bucket):
    # |g_i| / ||g|| = 1: the top level, with no rounding to do, so every draw is g itself (variance 0;
    # the affine grid of --compressor rounding has 511, 56.7, 2.27 ||g||^2 at 1, 2, 4 bits), also
    # where g_i^2 would underflow or overflow
    grad = np.zeros(50, dtype=dtype)
    grad[17] = value
    qsgd = compress.make("qsgd", levels=s, bucket=bucket, dtype=dtype)
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert np.array_equal(qsgd.decompress(qsgd.compress(grad, rng)), grad)


def test_a_bucket_longer_than_the_vector_is_one_bucket():
    grad = np.random.default_rng(3).normal(size=1000)
    whole, huge = compress.make("qsgd", bucket=1000), compress.make("qsgd", bucket=2 ** 31 - 1)
    assert huge.wire_bytes(1000) == whole.wire_bytes(1000) == 1000 + 8
    one = huge.compress(grad, np.random.default_rng(1))
    assert np.array_equal(one.codes, whole.compress(grad, np.random.default_rng(1)).codes)
    assert one.scales.shape == (1,) and one.scales[0] == pytest.approx(np.linalg.norm(grad), rel=1e-14)


def test_one_bit_is_biased_and_deterministic():
    # the bound above is no formality: 1-bit's decoded mean is off by far more than it
    grad = np.linspace(-1, 3, 200)
    onebit = compress.make("onebit", bucket=64)
    once = onebit.decompress(onebit.compress(grad))
    assert np.allclose(mean_of_draws(onebit, grad, 0), once, rtol=1e-12, atol=0)
    assert np.max(np.abs(once - grad)) > 0.5


# ---- bytes on the wire --------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 513, 6090])
def test_every_message_is_as_many_bytes_as_its_formula(n):
    grad = np.random.default_rng(n).normal(size=n).astype(np.float32)
    rng = np.random.default_rng(0)
    buckets = -(-n // 512)
    k = -(-n // 100)
    expected = {"none": 4 * n, "terngrad": -(-2 * n // 8) + 4 * buckets, "onebit": -(-n // 8) + 8 * buckets,
                "topk": 8 * k, "randomk": 8 * k}
    for bits in (1, 3, 8, 16):
        expected[f"rounding {bits}"] = -(-bits * n // 8) + 4 * buckets
    # QSGD's simple encoding: a sign bit and ceil(log2(s + 1)) level bits per entry, a float32 norm per bucket
    for levels, bits in {1: 2, 2: 3, 3: 3, 4: 4, 127: 8, 128: 9, 32767: 16}.items():
        expected[f"qsgd {levels}"] = -(-bits * n // 8) + 4 * buckets
    for name, nbytes in expected.items():
        kind, _, setting = name.partition(" ")
        compressor = compress.make(kind, bits=int(setting or 8), levels=int(setting or 1), density=0.01,
                                   dtype=np.float32)
        message = compressor.compress(grad, rng)
        assert compressor.wire_bytes(n) == nbytes, name
        assert message.nbytes == nbytes, name
        if kind == "topk":                                      # the largest magnitudes, nothing else
            left_out = np.delete(np.abs(grad), message.index)
            assert left_out.size == 0 or np.abs(message.values).min() >= left_out.max()
        if isinstance(compressor, compress.Quantizer):          # the packed buffer, decoded again
            buffer = compressor.pack(message)
            assert buffer.nbytes == nbytes
            assert np.array_equal(compressor.decompress(compressor.unpack(buffer, n)),
                                  compressor.decompress(message)), name


@pytest.mark.parametrize("kind", ["qsgd", "rounding", "terngrad", "randomk"])
def test_compressors_that_draw_refuse_to_run_without_a_generator(kind):
    grad = np.random.default_rng(0).normal(size=100)
    compressor = compress.make(kind, density=0.1)
    for rng in (None, 0, np.random.RandomState(0)):
        with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
            compressor.compress(grad, rng)
    with pytest.raises(TypeError, match="rng must be"):
        compressor.compress(grad)
    with pytest.raises(TypeError, match="rng must be"):
        compress.ErrorFeedback(compressor, 100).step(grad)
    # the deterministic ones need none, and give the same message with or without one
    for name in ("none", "onebit", "topk"):
        plain = compress.make(name, density=0.1)
        assert np.array_equal(plain.decompress(plain.compress(grad)),
                              plain.decompress(plain.compress(grad, np.random.default_rng(1))))


def test_bad_compressor_settings_are_refused_naming_the_flag():
    for bits in (0, 17, 2.5, True):
        with pytest.raises(ValueError, match="--bits"):
            compress.make("rounding", bits=bits)
    for levels in (0, 2 ** 15, 1.5, True):
        with pytest.raises(ValueError, match="--levels"):
            compress.make("qsgd", levels=levels)
    for density in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="--density"):
            compress.make("topk", density=density)
    with pytest.raises(ValueError, match="--k"):
        compress.make("randomk", k=0)
    with pytest.raises(ValueError, match="--k 5 and --density 0.1 both given"):
        compress.make("topk", k=5, density=0.1)
    for bucket in (0, 2 ** 31, 10 ** 12, 1.0):
        with pytest.raises(ValueError, match="--bucket"):
            compress.make("qsgd", bucket=bucket)


# ---- error feedback: nothing is lost ------------------------------------------------------------------

@pytest.mark.task("8.1")
@pytest.mark.parametrize("kind", ["topk", "randomk"])
def test_error_feedback_sends_every_gradient_in_the_end_exactly(kind):
    # integer-valued gradients: every sum below is exact in float64, so the identity holds bit for bit
    rng = np.random.default_rng(1)
    grads = rng.integers(-50, 50, size=(30, 97)).astype(np.float64)
    codec = compress.ErrorFeedback(compress.make(kind, density=0.05), 97)
    sent_total = np.zeros(97)
    for step, grad in enumerate(grads):
        _, sent = codec.step(grad, np.random.default_rng(step))
        assert np.count_nonzero(sent) <= 5
        sent_total += sent
    assert np.array_equal(sent_total + codec.residual, grads.sum(axis=0))
    assert np.any(codec.residual != 0)                      # something was held back: not a tautology


@pytest.mark.task("8.1")
def test_one_bit_error_feedback_sends_every_gradient_in_the_end():
    # 1-bit's means are not exact, so each step rounds twice (grad + residual, corrected - sent), each
    # by at most half an ulp of numbers below 4 max|g| in size: K steps stay below 4 K eps max|g|.
    rng = np.random.default_rng(2)
    steps, n = 40, 300
    grads = rng.normal(size=(steps, n))
    codec = compress.ErrorFeedback(compress.make("onebit", bucket=64), n)
    sent_total = np.zeros(n)
    for grad in grads:
        sent_total += codec.step(grad)[1]
    error = np.max(np.abs(sent_total + codec.residual - grads.sum(axis=0)))
    assert error <= 4 * steps * np.finfo(np.float64).eps * np.abs(grads).max() * 4
    without = compress.NoFeedback(compress.make("onebit", bucket=64))
    lost = sum(without.step(grad)[1] for grad in grads) - grads.sum(axis=0)
    assert np.max(np.abs(lost)) > 1.0                       # without feedback the error is not kept


# ---- compressed SGD -----------------------------------------------------------------------------------

@pytest.mark.task("8.2")
@pytest.mark.parallel(nprocs=[2, 3])
def test_compressed_sgd_without_compression_is_allreduce_sgd_bit_for_bit():
    comm = MPI.COMM_WORLD
    common = dict(model=float64_mlp, data=tiny_digits(), epochs=1, lr=0.1, momentum=0.9, batch_size=3,
                  allreduce="mpi", quiet=True)
    plain, _ = allreduce_sgd.train(comm, **common)
    compressed, history = compressed_sgd.train(comm, compressor="none", **common)
    parallel_assert(bool(np.array_equal(plain, compressed)), "--compressor none differs from allreduce_sgd")
    parallel_assert(history[-1]["bytes"] > 0, "nothing was sent")


@pytest.mark.parallel(nprocs=[3])
def test_top_k_at_density_one_is_allreduce_sgd_and_the_log_counts_the_wire_formula():
    comm, p = MPI.COMM_WORLD, MPI.COMM_WORLD.size
    data = tiny_digits()
    common = dict(model=float64_mlp, data=data, epochs=1, lr=0.1, momentum=0.9, batch_size=3, quiet=True)
    plain, _ = allreduce_sgd.train(comm, allreduce="mpi", **common)
    everything, _ = compressed_sgd.train(comm, compressor="topk", density=1.0, **common)
    parallel_assert_close(everything, plain, EQUAL_UP_TO_ROUNDING, "top-k at density 1")
    # rounding, 4 bits: each step every rank sends its message to the p - 1 others; the 8-byte non-finite
    # check runs after every step and once more at the epoch's end
    quantized, history = compressed_sgd.train(comm, compressor="rounding", bits=4, **common)
    n = plain.size
    message = -(-4 * n // 8) + 8 * -(-n // 512)
    steps = -(-len(data.y_train) // (p * 3))
    check = 2 * (p - 1) * 8 // p                           # CountingComm's estimate for an 8-byte Allreduce
    parallel_assert(history[-1]["bytes"] == p * (steps * (p - 1) * message + (steps + 1) * check),
                    f"bytes {history[-1]['bytes']} against the formula")
    first = comm.bcast(quantized if comm.rank == 0 else None)
    parallel_assert(bool(np.array_equal(first, quantized)), "rounding: replicas differ across ranks")


# flags the chosen compressor would ignore, or that contradict each other, and bad values
REFUSED = [(dict(compressor="rounding", bits=0), "--bits must be"), (dict(compressor="topk", density=1.5), "--density"),
           (dict(compressor="topk", k=0), "--k must be"), (dict(compressor="qsgd", levels=0), "--levels must be"),
           (dict(compressor="topk", k=5, density=0.1), "--k 5 and --density 0.1 both given"),
           (dict(compressor="qsgd", bucket=10 ** 12), "--bucket must be"),
           (dict(compressor="topk", bits=4), "--bits has no effect with --compressor topk"),
           (dict(compressor="qsgd", bits=4), "--bits has no effect with --compressor qsgd"),
           (dict(compressor="qsgd", density=0.1), "--density has no effect with --compressor qsgd"),
           (dict(compressor="onebit", k=3), "--k has no effect with --compressor onebit"),
           (dict(compressor="rounding", levels=3), "--levels has no effect with --compressor rounding"),
           (dict(compressor="randomk", bucket=64), "--bucket has no effect with --compressor randomk"),
           (dict(compressor="none", bucket=64), "--bucket has no effect with --compressor none"),
           (dict(compressor="terngrad", allreduce="tree"), "--allreduce has no effect with --compressor terngrad"),
           (dict(compressor="none", error_feedback=True), "--error-feedback has no effect with --compressor none"),
           (dict(compressor="none", error_feedback=False), "--no-error-feedback has no effect with --compressor none")]


@pytest.mark.parallel(nprocs=[1])
def test_bad_settings_raise_before_training():
    for flags, name in REFUSED:
        with pytest.raises(SettingError, match=name):
            compressed_sgd.train(MPI.COMM_WORLD, epochs=1, quiet=True, **flags)


@pytest.mark.parametrize("flags, message", [
    (["--compressor", "rounding", "--bits", "17"], "--bits must be"),
    (["--compressor", "topk", "--k", "0"], "--k must be"),
    (["--compressor", "topk", "--k", "5", "--density", "0.1"], "--k 5 and --density 0.1 both given"),
    (["--compressor", "qsgd", "--bucket", "1000000000000"], "--bucket must be an integer >= 1 and <= 2147483647"),
    (["--compressor", "topk", "--bits", "4"], "--bits has no effect with --compressor topk"),
    (["--compressor", "qsgd", "--density", "0.1"], "--density has no effect with --compressor qsgd"),
    (["--compressor", "onebit", "--allreduce", "tree"], "--allreduce has no effect with --compressor onebit"),
    (["--compressor", "none", "--error-feedback"], "--error-feedback has no effect with --compressor none")])
def test_bad_flags_stop_every_rank_with_one_error_line(flags, message):
    # 3 ranks, a 60-second timeout (a hang fails the test): exit 2, the line on every rank, no training
    assert_stopped(launch("compressed_sgd", "--epochs", "1", *flags), message)


@pytest.mark.parametrize("flags", [["--compressor", "qsgd", "--levels", "3", "--bucket", "64"],
                                   ["--compressor", "rounding", "--bits", "4"],
                                   ["--compressor", "topk", "--k", "20", "--no-error-feedback"],
                                   ["--compressor", "none", "--allreduce", "tree"]])
def test_the_flags_a_compressor_uses_are_accepted_from_the_command_line(flags):
    # the other side of the refusals above: a flag left out is not mistaken for one given
    done = launch("compressed_sgd", "--epochs", "1", *flags)
    assert done.returncode == 0 and "error" not in done.stderr, done.stderr
    assert "epoch 1" in done.stdout
