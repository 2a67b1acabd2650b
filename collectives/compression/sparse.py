"""Sparse allreduce (SparCML): recursive doubling on (index, value) pairs, dense once that is cheaper.

Paper: Renggli, Ashkboos, Aghagolzadeh, Alistarh & Hoefler, "SparCML: High-Performance Sparse
Communication for Machine Learning" (SC 2019), the recursive-doubling sparse allreduce with a
switch to a dense representation; Ben-Nun & Hoefler 2019 ("Communication optimizations").

Each rank holds a sparse vector of length n: k distinct indices (int32, 4 bytes) and k values of
s bytes, so k (4 + s) bytes against n s for the dense vector. The butterfly's schedule
(collectives/butterfly.py) runs on these: at the round with distance d, rank r swaps its vector
with r XOR d and both merge (union of the indices, values summed where they meet), so the
merged vector can only grow. The *break-even rule*: a vector with k nonzeros travels dense when

    k (4 + s) >= n s,   i.e. density k / n >= s / (4 + s)   (2/3 for float64, 1/2 for float32)

and once dense it stays dense (a dense vector merged with anything is dense). So a message is
never bigger than the dense vector, and the receiver tells the two apart by its size alone: a
message of exactly n s bytes is dense, anything shorter is k (4 + s) bytes of pairs.

    p = 4, each rank 2 nonzeros of n = 16 (float64: dense from k = 11 on)
    distance 1:  0<->1  2<->3   each sends 2 pairs = 24 B; merged: <= 4 pairs
    distance 2:  0<->2  1<->3   each sends <= 4 pairs = 48 B; merged: <= 8 pairs

Non-powers of two fold in first as in MPICH (collectives/fold.py's picture): even ranks below
2 rem send their pairs to rank + 1 and sit out; odd ones merge; the result goes back at the end.

Cost: with k_j the nonzeros of this rank's merged vector before round j (k_0 = its own k),
each of the lg pof2 rounds costs alpha + min(k_j (4 + s), n s) beta + (merge) gamma. k_j lies
between max_i k_i (every rank has the same support: random-k with a shared seed) and
min(2^j k, n) (disjoint supports). For supports drawn independently at density delta, the
expected merged density after j rounds is 1 - (1 - delta)^(2^j) (``expected_cost``).
Against the dense butterfly (lg p (alpha + n s beta)) it saves bytes as long as the supports
stay sparse; against the ring (2 (p-1)/p n s beta) only while k p (4 + s) is well below 2 n s.

``allgather`` (below) is the exchange for quantized messages, which have one fixed size and
cannot be summed without decoding: every rank sends its block straight to every other rank,
p - 1 Sendrecv rounds, (p - 1) m bytes per rank for m-byte blocks.

Deadlock-freedom: every round is one Sendrecv with one partner, and the fold's Send/Recv pairs
have no cycle of waits (as in fold.py).

Arguments, checked before any pair moves (``sparse_allreduce`` and ``allgather``, check=True as
the dense collectives): each rank refuses its own indices if they are not integers (an empty list
is fine), fall outside 0..n-1 (a negative one would wrap to the end; one beyond 2^31 - 1 would
wrap in int32), or repeat (a repeated index is refused, not summed: merge and dense() would keep
only one of its values); n must be an integer in 0..2^31; values a supported dtype, as long as
the indices. Any integer index dtype is accepted (int32 here, int64 there sum correctly: both
become int32 after the range check). Then the ranks agree on n and the values' dtype (allgather:
on the block's length) with check.agree: one max of 5 int64 (allgather: 3) by MPI's own Allreduce (no point-to-point
message of ours, and no task's code), and every rank raises MismatchError if any rank has a problem or a different
n, dtype or length. So a bad argument on one rank stops every rank instead of a wrong sum, a truncation error on one
rank or a hang. Locally it costs the sort the allreduce needs anyway and O(k) comparisons.
check=False (the training loops) skips the agreement: this rank's own problems still raise
ValueError before it sends, but the same n, dtype and length on every rank are the caller's promise.

    mpiexec -n 4 python -m collectives.compression.sparse
"""
import math

import numpy as np
from mpi4py import MPI

from ..check import Problem, agree, dtype_code, dtype_problem
from ..fold import largest_power_of_two, world_rank
from ..tags import DIRECT_GATHER, SPARSE_EXCHANGE, SPARSE_FOLD_IN, SPARSE_FOLD_OUT
from .compress import INDEX, Sparse

# ---- representation: sparse pairs or a dense vector -----------------------------------------------

def is_dense_cheaper(count, n, itemsize):
    """The break-even rule: k (4 + s) >= n s (and n > 0)."""
    return n > 0 and count * (INDEX.itemsize + itemsize) >= n * itemsize


def message_bytes(count, n, itemsize):
    """Bytes on the wire for a merged vector with ``count`` nonzeros: min(k (4 + s), n s)."""
    return n * itemsize if is_dense_cheaper(count, n, itemsize) else count * (INDEX.itemsize + itemsize)


def settle(vector):
    """The cheaper representation of ``vector`` (a Sparse or a dense ndarray) by the break-even rule."""
    if isinstance(vector, Sparse) and is_dense_cheaper(len(vector.index), vector.n, vector.values.itemsize):
        return vector.dense()
    return vector


def merge(lower, higher):
    """lower + higher (the lower rank's vector first, so both partners make the same call and get
    the same bits), sparse while the union of their indices stays below the break-even point."""
    if isinstance(lower, Sparse) and isinstance(higher, Sparse):
        index = np.union1d(lower.index, higher.index).astype(INDEX)
        values = np.zeros(len(index), dtype=lower.values.dtype)
        values[np.searchsorted(index, lower.index)] = lower.values
        values[np.searchsorted(index, higher.index)] += higher.values
        return settle(Sparse(index, values, lower.n))
    total = lower.copy() if not isinstance(lower, Sparse) else lower.dense()
    if isinstance(higher, Sparse):
        total[higher.index] += higher.values
    else:
        total += higher
    return total


def encode(vector):
    """The bytes to send: the dense vector, or the indices followed by the values."""
    if isinstance(vector, Sparse):          # int32 indices whatever the caller's integer dtype
        return np.concatenate([vector.index.astype(INDEX, copy=False).view(np.uint8), vector.values.view(np.uint8)])
    return vector.view(np.uint8)


def decode(buffer, n, dtype):
    """The inverse of ``encode``: n s bytes are a dense vector, fewer are k (4 + s) bytes of pairs."""
    dtype = np.dtype(dtype)
    if len(buffer) == n * dtype.itemsize:
        return buffer.view(dtype).copy()
    count = len(buffer) // (INDEX.itemsize + dtype.itemsize)
    cut = count * INDEX.itemsize
    return Sparse(buffer[:cut].view(INDEX).copy(), buffer[cut:].view(dtype).copy(), n)


def swap(comm, vector, partner, n, dtype, tag=SPARSE_EXCHANGE):
    """Send ``vector`` to ``partner`` and receive theirs (one Sendrecv; its length read from the status)."""
    incoming = np.empty(n * np.dtype(dtype).itemsize, dtype=np.uint8)     # the largest possible message
    status = MPI.Status()
    comm.Sendrecv(encode(vector), partner, tag, incoming, partner, tag, status)
    return decode(incoming[:status.Get_count(MPI.BYTE)], n, dtype)


def receive(comm, source, n, dtype, tag):
    incoming = np.empty(n * np.dtype(dtype).itemsize, dtype=np.uint8)
    status = MPI.Status()
    comm.Recv(incoming, source, tag, status)
    return decode(incoming[:status.Get_count(MPI.BYTE)], n, dtype)


# ---- the allreduce ---------------------------------------------------------------------------------

def sparse_allreduce_recursive_doubling(comm, vector):
    """The heart: fold in, lg pof2 rounds of swap-and-merge, fold out. Returns the sum over ranks
    (a Sparse, or a dense ndarray once the break-even point was crossed), the same bits on every rank.
    ``vector`` is trusted (sorted, distinct, in range, the same n and dtype everywhere): sparse_allreduce checks."""
    rank, size = comm.Get_rank(), comm.Get_size()
    pof2 = largest_power_of_two(size)
    rem = size - pof2
    n = vector.n if isinstance(vector, Sparse) else len(vector)
    dtype = vector.values.dtype if isinstance(vector, Sparse) else vector.dtype
    # BEGIN SOLUTION
    mine = settle(vector)
    # fold-in: an even rank below 2 rem hands its vector to rank + 1 and sits out
    if rank < 2 * rem and rank % 2 == 0:
        comm.Send(encode(mine), rank + 1, SPARSE_FOLD_IN)
        newrank = None
    elif rank < 2 * rem:
        mine = merge(receive(comm, rank - 1, n, dtype, SPARSE_FOLD_IN), mine)
        newrank = rank // 2
    else:
        newrank = rank - rem
    if newrank is not None:
        # recursive doubling: swap with newrank XOR distance, merge (lower rank's vector first)
        distance = 1
        while distance < pof2:
            partner = world_rank(newrank ^ distance, rem)
            theirs = swap(comm, mine, partner, n, dtype)
            mine = merge(theirs, mine) if newrank & distance else merge(mine, theirs)
            distance *= 2
    # fold-out: the result back to the ranks that sat out
    if rank < 2 * rem and rank % 2 == 0:
        mine = receive(comm, rank + 1, n, dtype, SPARSE_FOLD_OUT)
    elif rank < 2 * rem:
        comm.Send(encode(mine), rank - 1, SPARSE_FOLD_OUT)
    # END SOLUTION
    return mine


def sparse_allreduce(comm, index, values, n, check=True):
    """The sum over ranks of the sparse vectors (index, values) of length n, as a dense ndarray.

    ``index``: distinct integers in 0..n-1 (any order, any integer dtype; sorted here), ``values``
    beside them, the same dtype and n on every rank. check=True: a problem on any rank raises
    MismatchError on every rank before any pair is sent; check=False: ValueError on that rank only.
    """
    vector, problem = own_vector(index, values, n)
    if check:
        agree(comm, "sparse_allreduce", {"n": n if vector else -1,
                                         "dtype": dtype_code(vector.values.dtype) if vector else -1}, problem)
    elif problem:
        raise ValueError(f"sparse_allreduce on rank {comm.Get_rank()}: {problem.text}")
    if comm.Get_size() == 1:
        return vector.dense()
    result = sparse_allreduce_recursive_doubling(comm, vector)
    return result.dense() if isinstance(result, Sparse) else result


def own_vector(index, values, n):
    """(the Sparse vector, None) from this rank's arguments, sorted by index; or (None, the Problem)."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or not 0 <= n <= 2 ** 31:
        return None, Problem("an invalid vector length n", f"n must be an integer in 0..2^31, got {n!r}")
    index, values = np.asarray(index), np.asarray(values)
    if index.ndim != 1 or values.ndim != 1:
        return None, Problem("a buffer that is not 1-D", f"index and values must be 1-D, got shapes "
                                                         f"{index.shape} and {values.shape}")
    if len(index) and not np.issubdtype(index.dtype, np.integer):
        return None, Problem("indices that are not integers", f"index has dtype {index.dtype}; indices must "
                                                              f"be integers")
    unsupported = dtype_problem(values.dtype)
    if unsupported:
        return None, Problem("an unsupported dtype", f"values has {unsupported}")
    if len(index) != len(values):
        return None, Problem("a buffer of the wrong length", f"index has {len(index)} entries but values "
                                                             f"has {len(values)}")
    order = np.argsort(index, kind="stable")
    index = index[order]
    if len(index) and (index[0] < 0 or index[-1] >= n):
        wrong = index[0] if index[0] < 0 else index[-1]
        return None, Problem("an index out of range", f"index {wrong} is outside 0..{n - 1} (n = {n})")
    repeated = np.flatnonzero(index[1:] == index[:-1])
    if len(repeated):
        return None, Problem("duplicate indices", f"index {index[repeated[0]]} appears more than once (a "
                                                  f"sparse vector's indices must be distinct: add their values first)")
    return Sparse(index.astype(INDEX), values[order], n), None


# ---- the exchange for quantized messages -----------------------------------------------------------

def allgather(comm, block, check=True):
    """Every rank's ``block`` (1-D uint8, the same length everywhere), in rank order: p - 1 Sendrecv
    rounds, at round j to rank + j and from rank - j. (p - 1) m bytes sent per rank.

    check=True: blocks of different lengths, or a block that is not 1-D contiguous uint8 on any
    rank, raise MismatchError on every rank before any block is sent (check=False: ValueError for
    this rank's own block only; each block comes back as long as its message, read from the status).
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    problem = block_problem(block)
    if check:
        agree(comm, "sparse.allgather", {"length": -1 if problem else len(block)}, problem)
    elif problem:
        raise ValueError(f"sparse.allgather on rank {rank}: {problem.text}")
    blocks = [None] * size
    blocks[rank] = block
    for step in range(1, size):
        incoming, status = np.empty_like(block), MPI.Status()
        comm.Sendrecv(block, (rank + step) % size, DIRECT_GATHER, incoming, (rank - step) % size, DIRECT_GATHER,
                      status)
        blocks[(rank - step) % size] = incoming[:status.Get_count(MPI.BYTE)]
    return blocks


def block_problem(block):
    """Why ``block`` cannot be gathered (a Problem), or None."""
    if not isinstance(block, np.ndarray):
        return Problem("a buffer that is not an array", f"block must be a numpy array, not {type(block).__name__}")
    if block.ndim != 1:
        return Problem("a buffer that is not 1-D", f"block must be 1-D, got shape {block.shape}")
    if not block.flags.c_contiguous:
        return Problem("a non-contiguous buffer", "block must be contiguous (a strided view cannot be sent)")
    if block.dtype != np.uint8:
        return Problem("an unsupported dtype", f"block has dtype {block.dtype}; allgather moves bytes: pass "
                                               f"block.view(numpy.uint8)")
    return None


# ---- cost ------------------------------------------------------------------------------------------

def expected_cost(p, n, density, itemsize, alpha, beta, gamma=0.0):
    """Predicted seconds of the sparse allreduce when every rank's support is drawn independently
    at ``density``: per round alpha + min(k_j (4 + s), n s) beta + gamma for merging what arrived,
    k_j = n (1 - (1 - density)^(2^j)); plus the fold for p not a power of two."""
    pof2 = largest_power_of_two(p)
    rounds = pof2.bit_length() - 1

    def bytes_at(groups):                      # the message of a vector merged from `groups` ranks
        return message_bytes(math.ceil(n * (1 - (1 - density) ** groups)), n, itemsize)
    seconds = 0.0
    if p > pof2:                               # fold-in and fold-out: one vector each way
        seconds += 2 * alpha + beta * (bytes_at(1) + bytes_at(p)) + gamma * bytes_at(1)
    start = 2 if p > pof2 else 1               # a folded survivor already holds two ranks' support
    for j in range(rounds):
        message = bytes_at(start * 2 ** j)
        seconds += alpha + beta * message + gamma * message
    return seconds


if __name__ == "__main__":
    world = MPI.COMM_WORLD
    length, own = 1000, np.random.default_rng(world.rank).choice(1000, size=10, replace=False)
    total = sparse_allreduce(world, own, np.ones(10), length)
    check = np.zeros(length)
    for r in range(world.size):
        check[np.random.default_rng(r).choice(1000, size=10, replace=False)] += 1
    if world.rank == 0:
        print(f"sparse allreduce on {world.size} ranks: {int(np.count_nonzero(total))} nonzeros of {length}, "
              f"equal to the dense sum: {bool(np.array_equal(total, check))}")
