"""Rank sharding and mini-batching: which rows of the data set each rank, and each step, sees.

Sharding splits ``n`` rows into ``size`` contiguous blocks whose lengths differ by at most one;
the first ``n % size`` ranks get the longer blocks::

    n = 10, size = 4:   rank 0: 0 1 2 | rank 1: 3 4 5 | rank 2: 6 7 | rank 3: 8 9

Contiguous blocks (rather than a stride ``rank::size``) keep each shard a plain slice, which is
what a parameter server's "shard of the flat parameter vector" also is, so the same function
serves both. Shuffle the data once (with a seeded generator) before sharding if the rows are
sorted by class.
"""
import dataclasses
import math

import numpy as np

from minidl.data._checks import check_generator, check_int


def shard_sizes(n, size):
    """Length of each of the ``size`` blocks of ``n`` rows: ``n // size`` plus one for the first ``n % size``.

    Returns an int64 array of length ``size`` that sums to ``n``. When ``size > n`` the last
    ``size - n`` entries are 0 (those ranks get no rows); algorithms that cannot run with an
    empty shard must reject that themselves.
    """
    n = check_int("n", n, minimum=0)
    size = check_int("size", size, minimum=1)
    base, extra = divmod(n, size)
    sizes = np.full(size, base, dtype=np.int64)
    sizes[:extra] += 1
    return sizes


def shard(n, rank, size):
    """Indices (int64, ascending) of the rows that rank ``rank`` of ``size`` ranks owns out of ``n``.

    Rank ``r`` owns ``[start, start + n // size + (r < n % size))`` with
    ``start = r * (n // size) + min(r, n % size)``. Over all ranks the blocks are disjoint and
    cover ``0 .. n-1`` exactly once, for any ``n >= 0`` and ``size >= 1``. When ``size > n``
    ranks ``n .. size-1`` get an empty array; algorithms that need every rank to hold data must
    check for that themselves.
    """
    n = check_int("n", n, minimum=0)
    size = check_int("size", size, minimum=1)
    rank = check_int("rank", rank)
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}) for size={size}, got {rank}")
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    stop = start + base + (1 if rank < extra else 0)
    return np.arange(start, stop, dtype=np.int64)


def batches(n, batch_size, rng=None, drop_last=False):
    """Iterate over one epoch of ``n`` rows as int64 index arrays of length ``batch_size``.

    With ``rng`` (a ``numpy.random.Generator``) the order is ``rng.permutation(n)``, so the same
    seed gives the same batches and each call draws a fresh order (call once per epoch). Without
    ``rng`` the order is ``0 .. n-1``. The last batch is shorter when ``batch_size`` does not
    divide ``n``; ``drop_last=True`` leaves it out, so every batch has exactly ``batch_size`` rows.
    Arguments are checked when the function is called, not at the first ``next()``.
    """
    n = check_int("n", n, minimum=0)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    rng = check_generator("rng", rng, allow_none=True)
    if not isinstance(drop_last, (bool, np.bool_)):
        raise TypeError(f"drop_last must be a bool, got {drop_last!r}")
    order = np.arange(n, dtype=np.int64) if rng is None else rng.permutation(n).astype(np.int64)
    stop = n - n % batch_size if drop_last else n
    return (order[start:start + batch_size] for start in range(0, stop, batch_size))


# ---- the data-parallel batch plan --------------------------------------------------------------

PARTITIONS = ("global", "shards", "sorted", "replicated")


def epoch_order(n, seed, epoch):
    """The order of the n training rows in ``epoch``: a permutation from Generator((seed, epoch)).

    Serial SGD visits its batches in this order; every distributed algorithm cuts the same
    permutation, so one rank reproduces serial SGD exactly.
    """
    return np.random.default_rng([seed, epoch]).permutation(n)


@dataclasses.dataclass
class Batch:
    """One step of one rank: its rows and the size of the step's global batch."""
    index: np.ndarray     # rows of the training set this rank uses at this step (may be empty)
    total: int            # rows used by all ranks together at this step (the global batch)


def rank_batches(n, batch_size, rank, size, seed, epoch, partition="global", labels=None):
    """This rank's batches for one epoch; every rank gets the same number of them (some may be empty).

    global      epoch_order(n, seed, epoch) (serial SGD's permutation) is cut into global batches
                of size * batch_size rows, and global batch k into ``size`` consecutive pieces
                (``shard(m, rank, size)``): rank r's piece is rows [r b, (r+1) b) of it. So the
                union of the pieces at step k is exactly serial SGD's batch k at batch size p b:

                    p ranks x batch b  ==  serial SGD at batch p b   (the last, shorter batch too)

    shards      rank r owns ``shard(n, r, size)`` (a contiguous block of the already shuffled
                training set) for the whole run and visits it in the order
                epoch_order(len(block), seed, epoch): Zinkevich's "each machine its own data".
                With one rank this is serial SGD's order exactly.
    sorted      as shards, but the rows are first sorted by label (``labels``), so each rank
                sees a few classes only: the non-iid case where model averaging struggles.
    replicated  every rank visits all n rows, in the order epoch_order(n, seed + rank, epoch)
                (ensembles: independent members; rank 0's order is serial SGD's).
    """
    if partition not in PARTITIONS:
        raise ValueError(f"unknown --partition {partition!r}; choose one of {', '.join(PARTITIONS)}")
    if partition == "global":
        order, step_rows = epoch_order(n, seed, epoch), size * batch_size
        pieces = []
        for start in range(0, n, step_rows):
            global_batch = order[start:start + step_rows]
            pieces.append(Batch(global_batch[shard(len(global_batch), rank, size)], len(global_batch)))
        return pieces
    if partition == "replicated":
        order = epoch_order(n, seed + rank, epoch)
        return [Batch(order[start:start + batch_size], size * len(order[start:start + batch_size]))
                for start in range(0, n, batch_size)]
    if partition == "sorted" and labels is None:
        raise ValueError("--partition sorted needs labels: it is for classification data")
    rows = np.arange(n) if partition == "shards" else np.argsort(labels, kind="stable")
    sizes = shard_sizes(n, size)
    block = rows[shard(n, rank, size)]
    block = block[epoch_order(len(block), seed, epoch)]
    steps = -(-int(sizes.max()) // batch_size)         # the longest shard sets the step count
    pieces = []
    for step in range(steps):
        start = step * batch_size
        total = int(np.clip(sizes - start, 0, batch_size).sum())
        pieces.append(Batch(block[start:start + batch_size], total))
    return pieces


class Stream:
    """A member's endless global batches, for population-based training: its own shuffled epochs
    (Generator([seed, member, epoch])) cut into batches of whatever size the member has now; this
    rank reads piece ``piece`` of ``pieces`` of each, as ``rank_batches`` does (partition "global").
    A round need not end at an epoch's end: every member reads the same number of examples per
    round whatever its batch size.

        stream = Stream(n, seed, member, piece, pieces)
        batch = stream.next(batch_size, limit=rows_left)     # any batch size, changing as it goes
    """

    def __init__(self, n, seed, member, piece, pieces):
        self.n, self.seed, self.member, self.piece, self.pieces = n, seed, member, piece, pieces
        self.epoch, self.position = 0, 0
        self.order = self.shuffle()

    def shuffle(self):
        return np.random.default_rng([self.seed, self.member, self.epoch]).permutation(self.n)

    def next(self, batch_size, limit=None):
        """The next global batch of ``pieces`` x ``batch_size`` rows (fewer at an epoch's end, and at
        most ``limit`` rows)."""
        if self.position >= self.n:
            self.epoch, self.position = self.epoch + 1, 0
            self.order = self.shuffle()
        rows = self.order[self.position:self.position + min(self.pieces * batch_size, limit or math.inf)]
        self.position += len(rows)
        return Batch(rows[shard(len(rows), self.piece, self.pieces)], len(rows))
