"""Gradient compressors: what a rank sends instead of its full gradient, and how many bytes it is.

Ben-Nun & Hoefler 2019 ("Communication optimizations": quantization, sparsification, "use lossy
compression when sending, accumulate error locally"). Each compressor is a small class with

    message = compressor.compress(grad, rng)    # what goes on the wire (arrays; see `layout`)
    g_hat   = compressor.decompress(message)    # what the receivers add up
    compressor.wire_bytes(n)                     # the bytes of one message, by formula

for a flat gradient of n elements of itemsize s bytes (8 for float64, 4 for float32), cut into
ceil(n / d) buckets of d elements (default d = 512; a bucket of n or more entries is one bucket,
the whole vector) that each get their own scale:

    name      what is sent                                              bytes on the wire
    none      grad itself                                               n s
    qsgd      QSGD with q levels (its s): per bucket its norm ||g||_2,  ceil(n (1 + ceil(log2(q + 1))) / 8)
              per entry a sign bit and a level l in 0..q, decoded as    + buckets s
              ||g|| sign(g_i) l / q (unbiased)
    rounding  stochastic rounding of each g_i to 2^b levels on [-m, m], ceil(n b / 8) + buckets s
              m = max |g| of its bucket (unbiased; no sign bit, no zero)
    terngrad  m * sign(g_i) * Bernoulli(|g_i| / m), m as above          ceil(2 n / 8) + buckets s
              (unbiased)
    onebit    the sign of g_i, decoded as the mean of its bucket's      ceil(n / 8) + 2 buckets s
              non-negative (or negative) entries (biased)
    topk      the k entries of largest |g_i|, as (index, value) pairs   k (4 + s)
    randomk   k entries at indices drawn from a generator that every    k (4 + s)
              rank seeds alike, as (index, value) pairs

Papers: Gupta et al. 2015 (stochastic rounding: E[round(x)] = x); Alistarh et al. 2017 (QSGD);
Wen et al. 2017 (TernGrad); Seide et al. 2014 (1-bit SGD with
error feedback: "accumulate the quantization error locally"); Strom 2015 and Lin et al. 2018
(Deep Gradient Compression: send only the largest entries, keep the rest as a residual);
Stich et al. 2018 (top-k and random-k with memory). Full references: tutorials/references.md.

Randomness: the compressors that draw (qsgd, rounding, terngrad, randomk) take ``rng``, a
numpy.random.Generator, and refuse to run without one (TypeError naming rng): there is no hidden
default generator, so the same seed gives the same bits.

Error feedback (``ErrorFeedback.step``, the heart): compress what the gradient *and* the residual
left over from earlier steps add up to, and keep what was not sent:

    corrected = grad + residual
    sent      = decompress(compress(corrected))
    residual  = corrected - sent

so over K steps  sum_k sent_k + residual_K = sum_k grad_k: nothing is lost, only delayed. The
biased compressors (onebit, topk, randomk) need it to converge to what SGD finds; the unbiased
ones (qsgd, rounding, terngrad) are usually run without it.

Pure NumPy (host arrays). The quantizers (qsgd, rounding, terngrad, onebit: QSGD's definition,
packing codes into bytes, buckets) are in collectives/compression/quantize.py.
"""
import math
from dataclasses import dataclass

import numpy as np

# the quantizers live in quantize.py; compress.<name> is their public place too
from .quantize import (  # noqa: F401
    BUCKET,
    MAX_BUCKET,
    QSGD,
    OneBit,
    Quantized,
    Quantizer,
    StochasticRounding,
    TernGrad,
    buckets,
    generator,
    pack_codes,
    unpack_codes,
)

NAMES = ("none", "qsgd", "rounding", "terngrad", "onebit", "topk", "randomk")
INDEX = np.dtype(np.int32)           # indices on the wire: 4 bytes (n < 2^31)


# ---- the messages, the interface, the sparsifiers ---------------------------------------------------

@dataclass
class Sparse:
    """(index, value) pairs of a sparse vector of length n; indices sorted and distinct."""
    index: np.ndarray        # int32
    values: np.ndarray
    n: int

    @property
    def nbytes(self):
        return self.index.nbytes + self.values.nbytes

    def dense(self):
        vector = np.zeros(self.n, dtype=self.values.dtype)
        vector[self.index] = self.values
        return vector


class Compressor:
    """The interface: compress(grad, rng) -> message; decompress(message) -> vector; wire_bytes(n)."""
    name = "?"
    sparse = False                    # its messages are Sparse (summed by a sparse allreduce)
    same_on_every_rank = False        # compress needs a generator seeded alike on every rank

    def __init__(self, dtype=np.float64):
        self.dtype = np.dtype(dtype)

    def __repr__(self):
        return self.name


class NoCompression(Compressor):
    """Sends the gradient itself: n s bytes."""
    name = "none"

    def compress(self, grad, rng=None):
        return grad.copy()

    def decompress(self, message):
        return message

    def wire_bytes(self, n):
        return n * self.dtype.itemsize


class Sparsifier(Compressor):
    """Sends k = ceil(density * n) (or a given k) entries as (index, value) pairs: k (4 + s) bytes.
    Give ``density`` or ``k``, not both (neither: density 0.01)."""
    sparse = True

    def __init__(self, density=None, k=None, dtype=np.float64):
        super().__init__(dtype)
        if k is not None and density is not None:
            raise ValueError(f"--k {k} and --density {density} both given: give one (--k entries, or a "
                             f"fraction --density of them)")
        if k is not None:
            if not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
                raise ValueError(f"--k must be an integer >= 1, got {k!r}")
        else:
            density = 0.01 if density is None else density
            if not (isinstance(density, (int, float)) and not isinstance(density, bool)
                    and math.isfinite(density) and 0 < density <= 1):
                raise ValueError(f"--density must be in (0, 1], got {density!r}")
        self.density, self.k = density, k

    def count(self, n):
        return min(n, self.k) if self.k is not None else min(n, math.ceil(self.density * n))

    def wire_bytes(self, n):
        return self.count(n) * (INDEX.itemsize + self.dtype.itemsize)

    def decompress(self, message):
        return message.dense()

    def message(self, grad, index):
        index = np.sort(index).astype(INDEX)
        return Sparse(index, grad[index].copy(), len(grad))


class TopK(Sparsifier):
    """The k entries of largest magnitude, found by a partial sort (numpy.argpartition: O(n), where a
    full sort would cost O(n log n); ties at the k-th magnitude are broken the same way every run)."""
    name = "topk"

    def compress(self, grad, rng=None):
        k = self.count(len(grad))
        if k == len(grad):
            return self.message(grad, np.arange(k))
        return self.message(grad, np.argpartition(-np.abs(grad), k - 1)[:k])


class RandomK(Sparsifier):
    """k entries at indices drawn without replacement. ``rng`` must be seeded alike on every rank, so
    every rank picks the same indices and their sum stays k-sparse (Stich et al. 2018)."""
    name = "randomk"
    same_on_every_rank = True

    def compress(self, grad, rng=None):
        rng = generator(rng, self.name)
        return self.message(grad, rng.choice(len(grad), size=self.count(len(grad)), replace=False))


def make(name, bits=8, density=None, k=None, dtype=np.float64, bucket=BUCKET, levels=127):
    """The compressor called ``name`` (one of NAMES). Bad settings raise ValueError naming the flag.

    ``levels`` is qsgd's s, ``bits`` rounding's b, ``density`` or ``k`` topk's and randomk's, ``bucket``
    the quantizers' (qsgd, rounding, terngrad, onebit); a compressor ignores the others."""
    if name == "none":
        return NoCompression(dtype)
    if name == "qsgd":
        return QSGD(levels, dtype, bucket)
    if name == "rounding":
        return StochasticRounding(bits, dtype, bucket)
    if name == "terngrad":
        return TernGrad(dtype, bucket)
    if name == "onebit":
        return OneBit(dtype, bucket)
    if name == "topk":
        return TopK(density, k, dtype)
    if name == "randomk":
        return RandomK(density, k, dtype)
    raise ValueError(f"unknown --compressor {name!r}; choose one of {', '.join(NAMES)}")


# ---- error feedback --------------------------------------------------------------------------------

class ErrorFeedback:
    """A compressor with memory: what it did not send is added to the next step's gradient."""

    def __init__(self, compressor, n):
        self.compressor = compressor
        self.residual = np.zeros(n, dtype=compressor.dtype)

    def step(self, grad, rng=None):
        """(message, sent): compress grad + residual, keep what was not sent in ``self.residual``.

        ``sent`` is the decompressed message, what the receivers will add up.
        """
        # BEGIN SOLUTION
        # add what earlier steps left out
        corrected = grad + self.residual
        # compress, and see what the receivers will decode
        message = self.compressor.compress(corrected, rng)
        sent = self.compressor.decompress(message)
        # keep the difference for the next step: sum of sent + residual = sum of gradients
        self.residual[...] = corrected - sent
        # END SOLUTION
        return message, sent


class NoFeedback:
    """The same interface without memory: what is not sent is lost."""

    def __init__(self, compressor, n=None):
        self.compressor = compressor

    def step(self, grad, rng=None):
        message = self.compressor.compress(grad, rng)
        return message, self.compressor.decompress(message)
