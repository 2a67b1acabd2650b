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
    qsgd      QSGD with v levels: per bucket its norm ||g||_2, per      ceil(n (1 + ceil(log2(v + 1))) / 8)
              entry a sign bit and a level l in 0..v, decoded as        + buckets s
              ||g|| sign(g_i) l / v (unbiased)
    rounding  stochastic rounding of each g_i to 2^b levels on [-m, m], ceil(n b / 8) + buckets s
              m = max |g| of its bucket (unbiased; no sign bit, no zero)
    terngrad  m * sign(g_i) * Bernoulli(|g_i| / m), m as above          ceil(2 n / 8) + buckets s
              (unbiased)
    onebit    the sign of g_i, decoded as the mean of its bucket's      ceil(n / 8) + 2 buckets s
              non-negative (or negative) entries (biased)
    topk      the k entries of largest |g_i|, as (index, value) pairs   k (4 + s)
    randomk   k entries at indices drawn from a generator that every    k (4 + s)
              rank seeds alike, as (index, value) pairs

QSGD (Alistarh et al. 2017, section 3.1, with the bucketing of their section 5), in the code's
names: for a bucket v of d entries with norm = ||v||_2 and ``levels`` = s,

    r_i   = |v_i| / norm * s,   l_i = floor(r_i)
    xi_i  = (l_i + 1) / s  with probability r_i - l_i,   else  l_i / s
    Q(v)_i = norm * sign(v_i) * xi_i

so E[Q(v)] = v and E||Q(v) - v||^2 = (norm / s)^2 sum_i (r_i - l_i)(1 - r_i + l_i)
<= min(d / s^2, sqrt(d) / s) ||v||^2 (their Lemma 3.1); a 1-sparse bucket is sent exactly. The
encoding counted is the paper's simple one, not its Elias coding: the norm as one float of the
gradient's dtype (s bytes: the paper's 32 bits for float32), then 1 sign bit and
ceil(log2(s + 1)) level bits for every entry, packed without gaps.

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

Pure NumPy (host arrays). The quantizers' codes are packed b bits per entry with numpy.packbits,
so the bytes counted on the wire are the bytes of real buffers (``pack`` / ``unpack``).
"""
import math
from dataclasses import dataclass

import numpy as np

NAMES = ("none", "qsgd", "rounding", "terngrad", "onebit", "topk", "randomk")
INDEX = np.dtype(np.int32)           # indices on the wire: 4 bytes (n < 2^31)
BUCKET = 512                         # elements per bucket scale
MAX_BUCKET = 2 ** 31 - 1             # no vector is longer (int32 indices); any longer bucket is one bucket


# ---- packing b-bit codes into bytes ----------------------------------------------------------------

def pack_codes(codes, bits):
    """Codes 0 .. 2^bits - 1 (one per entry) -> ceil(len * bits / 8) bytes, little-endian bit order."""
    planes = (codes.astype(np.uint32)[:, None] >> np.arange(bits, dtype=np.uint32)) & 1   # (n, bits)
    return np.packbits(planes.astype(np.uint8).ravel(), bitorder="little")


def unpack_codes(packed, n, bits):
    """The inverse of ``pack_codes``: n codes of ``bits`` bits each."""
    planes = np.unpackbits(packed, count=n * bits, bitorder="little").reshape(n, bits)
    return planes.astype(np.uint32) @ (np.uint32(1) << np.arange(bits, dtype=np.uint32))


def buckets(vector, size):
    """``vector`` as a (ceil(n / size), size) matrix, the last row padded with zeros (a copy).

    A ``size`` of n or more is one row of n entries: a bucket longer than the vector is the vector."""
    size = max(1, min(size, len(vector)))
    rows = max(1, math.ceil(len(vector) / size))
    matrix = np.zeros(rows * size, dtype=vector.dtype)
    matrix[:len(vector)] = vector
    return matrix.reshape(rows, size)


def generator(rng, name):
    """``rng`` if it is a numpy.random.Generator; a TypeError naming rng otherwise (no hidden default)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"{name}.compress(grad, rng) draws at random: rng must be a numpy.random.Generator "
                        f"(e.g. numpy.random.default_rng(seed)), got {rng!r}")
    return rng


# ---- the messages ----------------------------------------------------------------------------------

@dataclass
class Quantized:
    """A quantizer's message: packed codes, and scales (one or two per bucket) in the gradient's dtype."""
    codes: np.ndarray        # uint8, packed
    scales: np.ndarray       # float, (buckets,) or (buckets, 2)
    n: int

    @property
    def nbytes(self):
        return self.codes.nbytes + self.scales.nbytes


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


class Quantizer(Compressor):
    """A compressor whose message has a fixed size for a given n: codes of ``bits`` bits + scales."""
    bits, scales_per_bucket = 8, 1

    def __init__(self, dtype=np.float64, bucket=BUCKET):
        super().__init__(dtype)
        if not (isinstance(bucket, int) and not isinstance(bucket, bool) and 1 <= bucket <= MAX_BUCKET):
            raise ValueError(f"--bucket must be an integer from 1 to {MAX_BUCKET}, got {bucket!r}")
        self.bucket = bucket

    def wire_bytes(self, n):
        """ceil(n bits / 8) + buckets * scales_per_bucket * s."""
        rows = max(1, math.ceil(n / min(self.bucket, max(n, 1))))
        return math.ceil(n * self.bits / 8) + rows * self.scales_per_bucket * self.dtype.itemsize

    def pack(self, message):
        """The message as one uint8 buffer of wire_bytes(n) bytes: codes, then scales."""
        return np.concatenate([message.codes, message.scales.ravel().view(np.uint8)])

    def unpack(self, buffer, n):
        code_bytes = math.ceil(n * self.bits / 8)
        scales = buffer[code_bytes:].view(self.dtype)
        if self.scales_per_bucket > 1:
            scales = scales.reshape(-1, self.scales_per_bucket)
        return Quantized(buffer[:code_bytes], scales, n)


class QSGD(Quantizer):
    """Alistarh et al. 2017: per bucket its norm, per entry a sign bit and one of ``levels`` + 1 levels
    0, 1/s, ..., 1 of it, rounded at random so that E[decoded] = g (see the module docstring)."""
    name = "qsgd"

    def __init__(self, levels=127, dtype=np.float64, bucket=BUCKET):
        super().__init__(dtype, bucket)
        if not (isinstance(levels, int) and not isinstance(levels, bool) and 1 <= levels <= 2 ** 15 - 1):
            raise ValueError(f"--levels must be an integer from 1 to {2 ** 15 - 1}, got {levels!r}")
        self.levels = levels
        self.level_bits = levels.bit_length()                   # ceil(log2(s + 1))
        self.bits = 1 + self.level_bits                          # the sign, then the level

    def compress(self, grad, rng=None):
        rng, s = generator(rng, self.name), self.levels
        matrix = buckets(grad, self.bucket)
        biggest = np.abs(matrix).max(axis=1, keepdims=True)
        safe = np.where(biggest > 0, biggest, 1)
        # ||v||_2 as max |v| * ||v / max |v|||_2: no overflow or underflow, and exact for a 1-sparse bucket
        norm = (biggest * np.sqrt(((matrix / safe) ** 2).sum(axis=1, keepdims=True))).astype(self.dtype)
        r = np.abs(matrix) / np.where(norm > 0, norm, 1) * s     # in [0, s]: the norm the receivers see
        low = np.floor(r)
        level = np.minimum(low + (rng.random(r.shape) < r - low), s)   # xi = level / s
        codes = (2 * level + (matrix < 0)).ravel()[:len(grad)]          # bit 0: the sign; above: the level
        return Quantized(pack_codes(codes, self.bits), norm.ravel(), len(grad))

    def decompress(self, message):
        codes = buckets(unpack_codes(message.codes, message.n, self.bits), self.bucket)
        sign = 1 - 2 * (codes & 1).astype(self.dtype)
        xi = (codes >> 1).astype(self.dtype) / self.levels                  # level / s: exactly 1 at the top
        return (message.scales[:, None] * sign * xi).ravel()[:message.n]


class StochasticRounding(Quantizer):
    """Stochastic rounding to a uniform grid: each entry rounded at random to one of 2^b levels on
    [-m, m], m its bucket's max |g| (Gupta et al. 2015's rounding with a per-bucket scale).

    With levels L = 2^b - 1 intervals of width 2 m / L, x = (g + m) / (2 m) * L lies in [0, L];
    the code is floor(x) + 1 with probability x - floor(x), else floor(x). So E[code] = x and
    E[decoded] = E[code] * 2 m / L - m = g: unbiased, with variance at most (m / L)^2 per entry.
    Not QSGD: the grid is affine, with no sign bit, and 0 is never one of its levels (-m + 2 m j / L
    with L odd), so even a 1-sparse vector comes back noisy.
    """
    name = "rounding"

    def __init__(self, bits=8, dtype=np.float64, bucket=BUCKET):
        super().__init__(dtype, bucket)
        if not (isinstance(bits, int) and not isinstance(bits, bool) and 1 <= bits <= 16):
            raise ValueError(f"--bits must be an integer from 1 to 16, got {bits!r}")
        self.bits = bits

    def compress(self, grad, rng=None):
        rng, levels = generator(rng, self.name), 2 ** self.bits - 1
        matrix = buckets(grad, self.bucket)
        scale = np.abs(matrix).max(axis=1)                               # m per bucket
        safe = np.where(scale > 0, scale, 1)[:, None]
        x = (matrix + safe) / (2 * safe) * levels                        # in [0, L]
        low = np.floor(x)
        codes = low + (rng.random(x.shape) < x - low)                    # stochastic rounding
        codes = np.clip(codes, 0, levels).ravel()[:len(grad)]
        return Quantized(pack_codes(codes, self.bits), scale.astype(self.dtype), len(grad))

    def decompress(self, message):
        levels = 2 ** self.bits - 1
        codes = buckets(unpack_codes(message.codes, message.n, self.bits).astype(self.dtype), self.bucket)
        scale = message.scales[:, None]
        return (codes * (2 * scale / levels) - scale).ravel()[:message.n]


class TernGrad(Quantizer):
    """Wen et al. 2017: m * sign(g) * Bernoulli(|g| / m), m the bucket's max |g|; E = g. 2 bits an entry."""
    name, bits = "terngrad", 2

    def compress(self, grad, rng=None):
        rng = generator(rng, self.name)
        matrix = buckets(grad, self.bucket)
        scale = np.abs(matrix).max(axis=1)
        safe = np.where(scale > 0, scale, 1)[:, None]
        keep = rng.random(matrix.shape) < np.abs(matrix) / safe        # Bernoulli(|g| / m)
        ternary = np.sign(matrix) * keep                                # -1, 0, +1
        codes = (ternary + 1).ravel()[:len(grad)]                       # 0, 1, 2 on the wire
        return Quantized(pack_codes(codes, 2), scale.astype(self.dtype), len(grad))

    def decompress(self, message):
        ternary = buckets(unpack_codes(message.codes, message.n, 2).astype(self.dtype) - 1, self.bucket)
        return (ternary * message.scales[:, None]).ravel()[:message.n]


class OneBit(Quantizer):
    """Seide et al. 2014: one bit an entry (g >= 0), decoded as the mean of its bucket's entries with
    that sign (two scales per bucket). Deterministic and biased: run it with error feedback."""
    name, bits, scales_per_bucket = "onebit", 1, 2

    def compress(self, grad, rng=None):
        matrix = buckets(grad, self.bucket)
        length = len(grad)
        real = (np.arange(matrix.size) < length).reshape(matrix.shape)   # not the padding
        positive = (matrix >= 0) & real
        negative = (matrix < 0) & real
        means = np.zeros((matrix.shape[0], 2), dtype=self.dtype)
        means[:, 0] = (matrix * positive).sum(axis=1) / np.maximum(positive.sum(axis=1), 1)
        means[:, 1] = (matrix * negative).sum(axis=1) / np.maximum(negative.sum(axis=1), 1)
        return Quantized(pack_codes(positive.ravel()[:length], 1), means, length)

    def decompress(self, message):
        bit = buckets(unpack_codes(message.codes, message.n, 1), self.bucket).astype(bool)
        means = message.scales
        return np.where(bit, means[:, :1], means[:, 1:]).ravel()[:message.n].astype(self.dtype)


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
