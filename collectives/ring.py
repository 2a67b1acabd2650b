"""Ring allreduce: a reduce-scatter in p - 1 steps, then an allgather in p - 1 steps.

Papers: Ben-Nun & Hoefler (ACM CSUR 2019), allreduce cost table, "Pipeline"; Ueno
(Preferred Networks blog, 2018: "process p sends chunk[p] to the next process, while it
receives chunk[p-1] from the previous process"); Thakur, Rabenseifner & Gropp (IJHPCA 2005),
ring allgather; Patarasuk & Yuan (2009) for the bandwidth optimality. Full references in
tutorials/references.md.

Picture: the vector is cut into p blocks (buffers.block_counts), and the ranks sit in a ring,
each sending to `right` = rank + 1 and receiving from `left` = rank - 1. Imagine a p x p grid,
ranks as rows and blocks as columns. In the reduce-scatter, at every step each rank passes one
partial block to the right and receives another from the left, adding its own values into it;
each block travels once around the ring collecting every rank's contribution and lands
complete at the rank that shares its number. In the allgather
the complete blocks travel around once more and are copied instead of added. p = 4
(entries: the block each rank sends at each step):

                reduce-scatter           allgather
    step:       0    1    2              0    1    2
    rank 0:     b3   b2   b1   owns b0   b0   b3   b2
    rank 1:     b0   b3   b2   owns b1   b1   b0   b3
    rank 2:     b1   b0   b3   owns b2   b2   b1   b0
    rank 3:     b2   b1   b0   owns b3   b3   b2   b1

Cost: 2 (p - 1) alpha + 2 (p - 1)/p n beta + (p - 1)/p n gamma. Each rank sends 2 (p - 1)
blocks of n/p: the bandwidth term matches the lower bound, whatever p; the latency term grows
linearly with p. Exactly, with uneven blocks c_0..c_{p-1} (c_i = n // p or n // p + 1), rank r
sends n - c_r elements in the reduce-scatter, n - c_{r+1} in the allgather, and reduces
n - c_{r-1}: see collectives.model.cost.
Restrictions: none. Any p (no fold-in needed), any n, including n < p (empty blocks are
sent as zero-byte messages, so the schedule never depends on n).
Deadlock-freedom: each step is one Sendrecv (send right, receive left): every rank sends and
receives at once, so the ring of waits cannot lock whatever MPI's eager/rendezvous switch.

    mpiexec -n 4 python -m collectives.ring

Building blocks, public and tested on their own: `reduce_scatter(comm, sendbuf, recvbuf, op)`
(rank r gets block r of the reduced vector) and `allgather(comm, sendbuf, recvbuf)`.
"""
import numpy as np
from mpi4py import MPI

from .buffers import block_counts, block_offsets, blocks, copy_into, from_mpi, run_allreduce, scratch, to_mpi, validate
from .ops import array_module, base_op, combine, finish
from .tags import ALLGATHER, REDUCE_SCATTER

# ---- the heart: the ring's two loops ----------------------------------------------------------

def ring_reduce_scatter_in_place(comm, data, op, source=None):
    """p - 1 steps; afterwards block `rank` of `data` holds the reduction over all ranks.

    source: this rank's input, when it is not in `data` (an out-of-place allreduce; None: in
    place). `mine(i)` is block i of the input, `block(i)` block i of `data`: every block of the
    input is read once, at the step that sends it or adds into it, so nothing needs copying
    into `data` first. Blocks this loop does not write are left as they were.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    counts, offsets = blocks(len(data), size)
    source = data if source is None else source

    def block(i):
        return data[offsets[i]:offsets[i] + counts[i]]

    def mine(i):                                 # in place: the same as block(i) until it is written
        return source[offsets[i]:offsets[i] + counts[i]]

    # BEGIN SOLUTION
    right, left = (rank + 1) % size, (rank - 1) % size
    incoming = scratch(data, max(counts))    # a cached receive buffer
    # reduce-scatter: each step passes one partial block right and adds my values into the one from the left
    for step in range(size - 1):
        send_block = (rank - step - 1) % size     # my partial sum of it, received last step (step 0: my own)
        recv_block = (rank - step - 2) % size     # left neighbour's partial sum of this one
        arrived = incoming[:counts[recv_block]]
        comm.Sendrecv(mine(send_block) if step == 0 else block(send_block), right, REDUCE_SCATTER,
                      arrived, left, REDUCE_SCATTER)
        combine(block(recv_block), arrived, op, mine(recv_block))    # block <- mine (op) arrived
    # END SOLUTION


def ring_allgather_in_place(comm, data):
    """p - 1 steps; block `rank` of `data` goes to every rank, so all blocks end everywhere."""
    rank, size = comm.Get_rank(), comm.Get_size()
    counts, offsets = blocks(len(data), size)

    def block(i):
        return data[offsets[i]:offsets[i] + counts[i]]

    # BEGIN SOLUTION
    right, left = (rank + 1) % size, (rank - 1) % size
    # allgather: the complete blocks travel once around the ring, copied, not added
    for step in range(size - 1):
        send_block = (rank - step) % size         # complete: my own, or received last step
        recv_block = (rank - step - 1) % size     # complete at the left neighbour; copy it in
        comm.Sendrecv(block(send_block), right, ALLGATHER, block(recv_block), left, ALLGATHER)
    # END SOLUTION


def ring_allreduce_in_place(comm, data, op, source=None):
    """Ring allreduce of `data` in place: reduce-scatter, then allgather.

    source: this rank's input, if it is not already in `data`: the reduce-scatter reads it
    there and writes every block but one, and the allgather writes that one, so `data` needs
    no copy of it first (MPI's Allreduce makes that copy: a whole pass over memory).
    """
    ring_reduce_scatter_in_place(comm, data, op, source)
    ring_allgather_in_place(comm, data)

# ---- end of the heart -------------------------------------------------------------------------


def allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True):
    """recvbuf <- op over ranks of sendbuf, by the ring (arguments: buffers.run_allreduce)."""
    return run_allreduce(ring_allreduce_in_place, comm, sendbuf, recvbuf, op, check, "ring allreduce")


def reduce_scatter(comm, sendbuf, recvbuf=None, op="sum", check=True):
    """recvbuf <- block `rank` of (op over ranks of sendbuf), by the ring's first loop.

    sendbuf: the full vector, n elements, the same n on every rank; recvbuf: block_counts(n, p)
    [rank] elements (allocated if None). sendbuf is not modified. Returns recvbuf.
    sendbuf MPI.IN_PLACE (as allgather's): recvbuf is the full vector, and block `rank` of the
    result lands at its own place in it (the other blocks are left holding partial sums): no copy
    of the vector, only the ring's cached receive block (ZeRO's gradient, unit by unit).
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    if sendbuf is MPI.IN_PLACE:
        validate(comm, "reduce_scatter", [(recvbuf, "recvbuf", None, True)], op, check)
        counts = block_counts(recvbuf.size, size)
        start = block_offsets(counts)[rank]
        data = to_mpi(recvbuf)
        if size > 1 and data.size > 0:
            ring_reduce_scatter_in_place(comm, data, base_op(op))
        finish(data[start:start + counts[rank]], op, size)
        from_mpi(data, recvbuf)
        return recvbuf
    counts = block_counts(max(getattr(sendbuf, "size", 0), 0), size)
    if recvbuf is None and hasattr(sendbuf, "dtype"):
        recvbuf = array_module(sendbuf).empty(counts[rank], dtype=sendbuf.dtype)
    validate(comm, "reduce_scatter", [(sendbuf, "sendbuf", None, False),
                                      (recvbuf, "recvbuf", counts[rank], True)], op, check)
    if size > 1 and sendbuf.size > 0 and type(sendbuf) is np.ndarray:
        data = np.empty_like(sendbuf)          # the loop reads sendbuf itself: no copy of it first
        ring_reduce_scatter_in_place(comm, data, base_op(op), source=sendbuf)
    else:
        data = to_mpi(sendbuf.copy())
        if size > 1 and data.size > 0:
            ring_reduce_scatter_in_place(comm, data, base_op(op))
    start = block_offsets(counts)[rank]
    mine = data[start:start + counts[rank]]
    finish(mine, op, size)
    copy_into(recvbuf, mine)
    return recvbuf


def allgather(comm, sendbuf, recvbuf, check=True):
    """recvbuf <- the blocks of every rank, in rank order, by the ring's second loop.

    recvbuf: n elements, the same n on every rank; sendbuf: this rank's block_counts(n, p)[rank]
    elements, or MPI.IN_PLACE when they already sit at their place in recvbuf. Returns recvbuf.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    counts = block_counts(max(getattr(recvbuf, "size", 0), 0), size)
    buffers = [(recvbuf, "recvbuf", None, True)]
    if sendbuf is not MPI.IN_PLACE:
        buffers.append((sendbuf, "sendbuf", counts[rank], False))
    validate(comm, "allgather", buffers, "sum", check)
    start = block_offsets(counts)[rank]
    if sendbuf is not MPI.IN_PLACE:
        recvbuf[start:start + counts[rank]] = sendbuf
    data = to_mpi(recvbuf)
    if size > 1 and data.size > 0:
        ring_allgather_in_place(comm, data)
    from_mpi(data, recvbuf)
    return recvbuf


if __name__ == "__main__":
    from .demo import demo
    demo(allreduce, MPI.COMM_WORLD, "ring")
