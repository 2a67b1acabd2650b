"""Gradient compressors (collectives/compress.py) and compressed synchronous SGD (algorithms/compressed_sgd.py).

Run: python tests/run.py --max-ranks 3 -- tests/test_compression.py

- The unbiased quantizers (stochastic rounding, TernGrad) average to the gradient within a
  Hoeffding bound derived below; every message is as many bytes as its formula says.
- Error feedback loses nothing: sum over steps of what was sent + the final residual = sum of
  the gradients (exactly for top-k and random-k on integer-valued gradients, to rounding for 1-bit).
- ``--compressor none`` is allreduce SGD bit for bit; top-k at density 1 is allreduce SGD up to
  the order of additions; the log's bytes are the wire formula's; bad flags stop every rank.
"""
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import allreduce_sgd, compressed_sgd
from algorithms.cli import SettingError
from collectives import compress
from tests.test_sync_sgd import EQUAL_UP_TO_ROUNDING, float64_mlp, relative_error, tiny_digits

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT))


# ---- unbiasedness -----------------------------------------------------------------------------------
# Each decoded entry of one draw lies in an interval of width w that does not depend on the draw:
# two neighbouring levels 2 m / (2^b - 1) apart for stochastic rounding, {0, m sign(g)} (w = m) for
# TernGrad, m the bucket's max |g|. Hoeffding: the mean of R independent draws is further than
# t = w sqrt(ln(2 n / delta) / (2 R)) from its expectation g with probability at most delta / n, so
# (union bound over the n entries) all n entries are within t with probability >= 1 - delta.
DRAWS, DELTA = 600, 1e-9


def mean_of_draws(compressor, grad, seed):
    rng = np.random.default_rng(seed)
    total = np.zeros_like(grad)
    for _ in range(DRAWS):
        total += compressor.decompress(compressor.compress(grad, rng))
    return total / DRAWS


@settings(max_examples=8)
@given(n=st.integers(1, 300), scale=st.sampled_from([1e-6, 1.0, 1e4]), bits=st.integers(1, 4),
       kind=st.sampled_from(["qsgd", "terngrad"]), seed=st.integers(0, 2 ** 16))
def test_stochastic_rounding_and_terngrad_are_unbiased_within_a_hoeffding_bound(n, scale, bits, kind, seed):
    grad = np.random.default_rng(seed).normal(size=n) * scale
    compressor = compress.make(kind, bits=bits, bucket=64)
    m = np.abs(compress.buckets(grad, 64)).max(axis=1).repeat(64)[:n]      # each entry's bucket max
    w = 2 * m / (2 ** bits - 1) if kind == "qsgd" else m
    bound = w * math.sqrt(math.log(2 * n / DELTA) / (2 * DRAWS))
    error = np.abs(mean_of_draws(compressor, grad, seed) - grad)
    assert np.all(error <= bound + 1e-12 * m), f"max error / bound {np.max(error / np.maximum(bound, 1e-300)):.2f}"


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
        expected[f"qsgd {bits}"] = -(-bits * n // 8) + 4 * buckets
    for name, nbytes in expected.items():
        kind, _, bits = name.partition(" ")
        compressor = compress.make(kind, bits=int(bits or 8), density=0.01, dtype=np.float32)
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


def test_bad_compressor_settings_are_refused_naming_the_flag():
    for bits in (0, 17, 2.5, True):
        with pytest.raises(ValueError, match="--bits"):
            compress.make("qsgd", bits=bits)
    for density in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="--density"):
            compress.make("topk", density=density)
    with pytest.raises(ValueError, match="--k"):
        compress.make("randomk", k=0)


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
    error = relative_error(everything, plain)
    parallel_assert(error < EQUAL_UP_TO_ROUNDING, f"top-k at density 1: relative error {error:.2e}")
    # qsgd, 4 bits: each step every rank sends its message to the p - 1 others; the 8-byte non-finite
    # check runs after every step and once more at the epoch's end
    quantized, history = compressed_sgd.train(comm, compressor="qsgd", bits=4, **common)
    n = plain.size
    message = -(-4 * n // 8) + 8 * -(-n // 512)
    steps = -(-len(data.y_train) // (p * 3))
    check = 2 * (p - 1) * 8 // p                           # CountingComm's estimate for an 8-byte Allreduce
    parallel_assert(history[-1]["bytes"] == p * (steps * (p - 1) * message + (steps + 1) * check),
                    f"bytes {history[-1]['bytes']} against the formula")
    first = comm.bcast(quantized if comm.rank == 0 else None)
    parallel_assert(bool(np.array_equal(first, quantized)), "qsgd: replicas differ across ranks")


@pytest.mark.parallel(nprocs=[1])
def test_bad_settings_raise_before_training():
    for flags, name in [(dict(compressor="qsgd", bits=0), "--bits"), (dict(compressor="topk", density=1.5), "--density"),
                        (dict(compressor="topk", k=0), "--k")]:
        with pytest.raises(SettingError, match=name):
            compressed_sgd.train(MPI.COMM_WORLD, epochs=1, quiet=True, **flags)


@pytest.mark.parametrize("flags, message", [(["--compressor", "qsgd", "--bits", "17"], "--bits must be"),
                                            (["--compressor", "topk", "--k", "0"], "--k must be")])
def test_bad_flags_stop_every_rank_with_one_error_line(flags, message):
    done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "algorithms.compressed_sgd", "--epochs", "1",
                           *flags], capture_output=True, text=True, timeout=60, env=ENV, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "epoch" not in done.stdout, done.stderr
    assert done.stderr.count("error: ") == 2 and done.stderr.count(message) == 2, done.stderr
