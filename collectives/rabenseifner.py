"""Rabenseifner's allreduce: reduce-scatter by recursive halving, then allgather by recursive doubling.

Papers: Ben-Nun & Hoefler (ACM CSUR 2019), allreduce cost table, "RedScat+Gat"; Thakur,
Rabenseifner & Gropp (IJHPCA 2005), MPI_Allreduce for long messages (Rabenseifner's
algorithm), with the fold-in for non-powers of two (collectives/fold.py).

The pof2 survivors of the fold-in cut the vector into pof2 blocks (buffers.block_counts) and
each keeps a window [lo, hi) of blocks it is still responsible for, at first all of them.

    reduce-scatter, recursive halving, distance pof2/2, ..., 2, 1:
        split the window in two halves; two partners `distance` apart share out the halves,
        each sends the half it gives up and reduces the half it keeps. After lg pof2 rounds the window is the
        single block `newrank`, reduced over all ranks.
    allgather, recursive doubling, distance 1, 2, ..., pof2/2:
        partners swap their windows (copy, no reduction), so windows double back to the
        whole vector.

p = 4, n = 8 elements in blocks b0..b3 of 2 (the window each rank keeps after each round):

                 start      halving d=2   halving d=1   doubling d=1   doubling d=2
    newrank 0:   b0..b3     b0 b1         b0            b0 b1          b0..b3
    newrank 1:   b0..b3     b0 b1         b1            b0 b1          b0..b3
    newrank 2:   b0..b3     b2 b3         b2            b2 b3          b0..b3
    newrank 3:   b0..b3     b2 b3         b3            b2 b3          b0..b3

Cost (p a power of two): 2 lg p alpha + 2 (p - 1)/p n beta + (p - 1)/p n gamma: the ring's
bandwidth with the tree's latency. Exactly, with uneven blocks, survivor q sends n - c_q
elements while halving and sum_k S_k(q) while doubling, where S_k(q) is the size of the
aligned group of 2^k blocks holding block q; it reduces the same sum_k S_k(q) (see
collectives.model.cost). Other p add the fold-in's 2 alpha + 2 n beta + n gamma.
Restriction: the halving needs a power of two; other p fold in first.
Deadlock-freedom: every round is one Sendrecv with one partner.

    mpiexec -n 4 python -m collectives.rabenseifner
"""
from mpi4py import MPI

from .buffers import blocks, run_allreduce, scratch
from .fold import fold_in, fold_out, largest_power_of_two, world_rank
from .ops import combine
from .tags import ALLGATHER, REDUCE_SCATTER


def rabenseifner_allreduce_in_place(comm, data, op, source=None):
    """The heart: fold in, recursive halving, recursive doubling, fold out. `data` in place.

    source: this rank's input, if it is not already in `data` (an out-of-place allreduce; None:
    in place). The first halving round reads it, `mine(...)` (it sends one half and adds into the
    other), and the rounds after it and the allgather write every block of `data`, so nothing is
    copied in first. With a fold-in (p not a power of two) the input is copied into `data` first.
    """
    size = comm.Get_size()
    pof2 = largest_power_of_two(size)
    rem = size - pof2
    counts, offsets = blocks(len(data), pof2)    # the survivors' pof2 blocks; offsets[pof2] = len(data)
    if source is None or rem:
        if source is not None:
            data[...] = source
        source = data

    def span(first, last):                       # blocks first..last-1 as one slice of data
        return data[offsets[first]:offsets[last]]

    def mine(first, last):                       # the same blocks of my values: my input, then data
        return source[offsets[first]:offsets[last]]

    # BEGIN SOLUTION
    # fold-in: p - pof2 ranks hand their vectors to a partner and sit out
    newrank = fold_in(comm, data, op)            # None: this rank sits out until fold_out
    if newrank is not None:
        incoming = scratch(data)              # a cached receive buffer
        lo, hi = 0, pof2
        # reduce-scatter by recursive halving
        distance = pof2 // 2
        while distance >= 1:
            partner = world_rank(newrank ^ distance, rem)
            mid = (lo + hi) // 2
            if newrank & distance:
                (keep_lo, keep_hi), (give_lo, give_hi) = (mid, hi), (lo, mid)
            else:
                (keep_lo, keep_hi), (give_lo, give_hi) = (lo, mid), (mid, hi)
            kept = span(keep_lo, keep_hi)
            arrived = incoming[:len(kept)]
            comm.Sendrecv(mine(give_lo, give_hi), partner, REDUCE_SCATTER,
                          arrived, partner, REDUCE_SCATTER)
            combine(kept, arrived, op, mine(keep_lo, keep_hi))     # kept <- mine (op) arrived
            lo, hi = keep_lo, keep_hi
            distance //= 2
            source = data                        # from now on my values are the partial sums in data
        # allgather by recursive doubling: the partner's window is the twin of mine
        distance = 1
        while distance < pof2:
            partner = world_rank(newrank ^ distance, rem)
            width = hi - lo
            other_lo = lo - width if newrank & distance else hi
            comm.Sendrecv(span(lo, hi), partner, ALLGATHER,
                          span(other_lo, other_lo + width), partner, ALLGATHER)
            lo, hi = min(lo, other_lo), max(hi, other_lo + width)
            distance *= 2
    # fold-out: the result back to the ranks that sat out
    fold_out(comm, data)
    # END SOLUTION


def allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True):
    """recvbuf <- op over ranks of sendbuf, by Rabenseifner's algorithm (arguments: buffers.run_allreduce)."""
    return run_allreduce(rabenseifner_allreduce_in_place, comm, sendbuf, recvbuf, op, check, "rabenseifner allreduce")


if __name__ == "__main__":
    from .demo import demo
    demo(allreduce, MPI.COMM_WORLD, "rabenseifner")
