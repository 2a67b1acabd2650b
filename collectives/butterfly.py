"""Butterfly (recursive doubling) allreduce: lg p rounds, each an exchange of whole vectors.

Papers: Ben-Nun & Hoefler (ACM CSUR 2019), allreduce cost table, "Butterfly"; Thakur,
Rabenseifner & Gropp (IJHPCA 2005), recursive doubling, MPICH's MPI_Allreduce for short
messages, with the fold-in for non-powers of two (collectives/fold.py).

Schedule, p = 8: at the round with `distance` d, rank r swaps its whole vector with
partner r XOR d and both reduce, so after round d every rank holds the reduction over its
aligned group of 2d ranks:

    distance 1:  0<->1  2<->3  4<->5  6<->7     each holds a sum over 2 ranks
    distance 2:  0<->2  1<->3  4<->6  5<->7     ... over 4 ranks
    distance 4:  0<->4  1<->5  2<->6  3<->7     ... over all 8

Both partners combine the same two partial results, and both make the same numpy call:
lower <- f(lower, higher), the lower rank's vector first and also the output, so on one
side the output is the vector it sent and on the other the one it received (the two swap
roles; a final copy puts the result into `data` where it ended in the scratch vector).
Not f(mine, theirs): numpy.maximum(+0.0, -0.0) is -0.0 but numpy.maximum(-0.0, +0.0) is +0.0,
and which NaN payload survives a + or max can depend on the operand order and on whether
the output is the first or the second operand. In this form every rank ends with identical
bits, whatever the op and the values.

Restriction: the exchange needs a power of two; other p fold in first (fold.py), which adds
2 alpha + 2 n beta + n gamma for the folded pairs.
Cost (p a power of two): lg p alpha + lg p n beta + lg p n gamma: the fewest rounds possible,
but each carries all n bytes, so it is the choice for small vectors.
Deadlock-freedom: each round is one Sendrecv with one partner; MPI pairs the two halves
internally whatever its eager/rendezvous switch decides.

    mpiexec -n 4 python -m collectives.butterfly
"""
from mpi4py import MPI

from .buffers import run_allreduce, scratch
from .fold import fold_in, fold_out, largest_power_of_two, world_rank
from .ops import combine
from .tags import EXCHANGE


def butterfly_allreduce_in_place(comm, data, op, source=None):
    """The heart: fold in, lg pof2 exchange rounds, fold out. `data` in place.

    source: this rank's input, when it is not in `data` yet (None: in place). For p a power of
    two the first round sends it from where it is and writes its reduction into `data`; with a
    fold-in (p not a power of two) it is copied into `data` first, as the fold-in reads `data`.
    """
    size = comm.Get_size()
    pof2 = largest_power_of_two(size)
    if source is not None and size != pof2:
        data[...] = source
        source = None
    # BEGIN SOLUTION
    # fold-in: p - pof2 ranks hand their vectors to a partner and sit out
    newrank = fold_in(comm, data, op)            # None: this rank sits out until fold_out
    if newrank is not None:
        # recursive doubling: lg pof2 rounds, distance 1, 2, 4, ...
        mine, theirs = (data if source is None else source), scratch(data)   # theirs: a cached receive buffer
        distance = 1
        while distance < pof2:
            partner = world_rank(newrank ^ distance, size - pof2)
            comm.Sendrecv(mine, partner, EXCHANGE, theirs, partner, EXCHANGE)
            # the same call on both partners: lower <- f(lower rank's vector, higher rank's)
            lower, higher = (theirs, mine) if newrank & distance else (mine, theirs)
            if mine is source:                   # round 1, out of place: the result into data
                combine(data, higher, op, lower)
                mine = data
            else:
                combine(lower, higher, op)
                mine, theirs = lower, higher
            distance *= 2
        if mine is not data:                     # the result sits in the scratch vector
            data[...] = mine
    # fold-out: the result back to the ranks that sat out
    fold_out(comm, data)
    # END SOLUTION


def allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True):
    """recvbuf <- op over ranks of sendbuf, by recursive doubling (arguments: buffers.run_allreduce)."""
    return run_allreduce(butterfly_allreduce_in_place, comm, sendbuf, recvbuf, op, check, "butterfly allreduce")


if __name__ == "__main__":
    from .demo import demo
    demo(allreduce, MPI.COMM_WORLD, "butterfly")
