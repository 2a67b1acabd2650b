"""MPICH's fold-in for rank counts that are not a power of two.

Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in MPICH"
(IJHPCA 2005), the MPI_Allreduce section: butterfly-style algorithms pair rank r with
r XOR 2^k, which needs a power of two. With p = pof2 + rem (pof2 the largest power of two
<= p), the first 2*rem ranks pair up before the algorithm and after it:

    p = 6, pof2 = 4, rem = 2                 world rank:  0   1   2   3   4   5
    fold-in:  even rank sends all, sits out               0 ->1   2 ->3
    the pof2 survivors run the algorithm     new rank:      0       1   2   3
    fold-out: odd rank sends the result back              0<- 1   2<- 3

The rem extra vectors are reduced into a neighbour's before the algorithm and the result is
copied back to them after it, so the algorithm itself only ever sees pof2 ranks, renumbered
0 .. pof2 - 1 (`world_rank` maps a survivor's new rank back).

Cost added to the power-of-two algorithm: 2 alpha + 2 n beta + n gamma (one extra message
each way, one extra reduction), on the critical path of the folded pairs.

Blocking Send/Recv is safe here: each pair does one send matched by one receive, with no
cycle of waits, whatever MPI's eager/rendezvous switch decides.
"""
from .ops import array_module, combine
from .tags import FOLD_IN, FOLD_OUT


def largest_power_of_two(size):
    """pof2: the largest power of two <= size (size >= 1)."""
    return 1 << (size.bit_length() - 1)


def world_rank(newrank, rem):
    """The communicator rank of survivor `newrank` (inverse of the mapping in `fold_in`)."""
    return 2 * newrank + 1 if newrank < rem else newrank + rem


def fold_in(comm, data, op, tag=FOLD_IN):
    """Fold the p - pof2 extra ranks in. Returns this rank's new rank, or None if it sits out."""
    rank, size = comm.Get_rank(), comm.Get_size()
    # BEGIN SOLUTION
    rem = size - largest_power_of_two(size)
    # ranks from 2 rem on take no part in the fold: they renumber and go on
    if rank >= 2 * rem:
        return rank - rem
    # an even rank below 2 rem hands its whole vector to rank + 1 and sits out
    if rank % 2 == 0:
        comm.Send(data, dest=rank + 1, tag=tag)
        return None
    # an odd one reduces its partner's vector into its own and goes on as rank // 2
    incoming = array_module(data).empty_like(data)
    comm.Recv(incoming, source=rank - 1, tag=tag)
    combine(data, incoming, op)
    return rank // 2
    # END SOLUTION


def fold_out(comm, data, tag=FOLD_OUT):
    """Hand the finished vector back to the ranks that sat out."""
    rank, size = comm.Get_rank(), comm.Get_size()
    rem = size - largest_power_of_two(size)
    if rank >= 2 * rem:
        return
    if rank % 2 == 0:
        comm.Recv(data, source=rank + 1, tag=tag)
    else:
        comm.Send(data, dest=rank - 1, tag=tag)
