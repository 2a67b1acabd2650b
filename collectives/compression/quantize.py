"""Quantizers: fewer bits per gradient entry, each bucket of entries with its own scale.

The four quantizers of collectives/compression/compress.py (which holds the interface, the table of bytes on
the wire, the sparsifiers and error feedback). A flat gradient of n entries is cut into buckets
of d entries (default d = 512; a bucket of n or more entries is one bucket, the whole vector);
each bucket sends one or two scales in the gradient's dtype and every entry a code of ``bits``
bits, packed without gaps (``pack_codes``), so the bytes counted on the wire are the bytes of real
buffers (``pack`` / ``unpack``).

QSGD (Alistarh et al. 2017, section 3.1, with the bucketing of their section 5), in the code's
names: for a bucket v of d entries with norm = ||v||_2 and s = ``levels``,

    r_i   = |v_i| / norm * s,   l_i = floor(r_i)
    xi_i  = (l_i + 1) / s  with probability r_i - l_i,   else  l_i / s
    Q(v)_i = norm * sign(v_i) * xi_i

so E[Q(v)] = v and E||Q(v) - v||^2 = (norm / s)^2 sum_i (r_i - l_i)(1 - r_i + l_i)
<= min(d / s^2, sqrt(d) / s) ||v||^2 (their Lemma 3.1); a 1-sparse bucket is sent exactly. The
encoding counted is the paper's simple one, not its Elias coding: the norm as one float of the
gradient's dtype (4 bytes for float32, the paper's 32 bits; 8 for float64), then 1 sign bit and
ceil(log2(s + 1)) level bits for every entry, packed without gaps.

Stochastic rounding (Gupta et al. 2015) with a per-bucket scale m = max |g| rounds each entry
to one of the 2^b levels of an affine grid on [-m, m]: unbiased too, but with no sign bit and no
zero level, so zero entries come back as +-m / (2^b - 1). TernGrad (Wen et al. 2017) sends
m sign(g) Bernoulli(|g| / m); 1-bit SGD (Seide et al. 2014) the sign, decoded as the mean of the
bucket's entries of that sign (biased: run it with error feedback). Full references:
tutorials/references.md.

The quantizers that draw take ``rng``, a numpy.random.Generator, and refuse to run without one
(``generator``: a TypeError naming rng; no hidden default generator, so a seed fixes the bits).
"""
import math
from dataclasses import dataclass

import numpy as np

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



# ---- the quantizers ---------------------------------------------------------------------------------

@dataclass
class Quantized:
    """A quantizer's message: packed codes, and scales (one or two per bucket) in the gradient's dtype."""
    codes: np.ndarray        # uint8, packed
    scales: np.ndarray       # float, (buckets,) or (buckets, 2)
    n: int

    @property
    def nbytes(self):
        return self.codes.nbytes + self.scales.nbytes


class Quantizer:
    """A compressor whose message has a fixed size for a given n: codes of ``bits`` bits + scales
    (compress.py's interface: compress(grad, rng), decompress(message), wire_bytes(n))."""
    name, bits, scales_per_bucket = "?", 8, 1
    sparse = False                    # its messages are Quantized (gathered, decoded, added)
    same_on_every_rank = False        # its draws may differ from rank to rank

    def __init__(self, dtype=np.float64, bucket=BUCKET):
        self.dtype = np.dtype(dtype)
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

    def __repr__(self):
        return self.name


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
