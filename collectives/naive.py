"""Naive allreduce: every rank sends its vector to one root, the root reduces, sends the result back.

Paper: the baseline that Ueno (Preferred Networks blog, 2018, "Technologies behind Distributed
Deep Learning: AllReduce") sets against the ring: "select one process as a master, gather all
arrays into the master, perform reduction operations locally in the master, and then
distribute the resulting array" (see tutorials/references.md).
Ben-Nun & Hoefler (ACM CSUR 2019) set the decentralised reductions below against this kind of
centralised exchange; Thakur, Rabenseifner & Gropp (IJHPCA 2005) is where the others come from.

Schedule, p = 4, root 0 (each arrow one whole vector of n elements):

    step:     gather 0  gather 1  gather 2  send-back 0  send-back 1  send-back 2
    rank 0:   <- 1      <- 2      <- 3      -> 1         -> 2         -> 3
    rank 1:   -> 0                          <- 0
    rank 2:             -> 0                             <- 0
    rank 3:                       -> 0                                <- 0

The root receives p - 1 vectors, reducing each as it arrives (in rank order, so the result is
deterministic), then sends p - 1 copies: its link carries 2 (p - 1) n bytes while every other
rank's carries 2 n. That is why the root's traffic, and the time, grows linearly with p.

Cost (critical path = the root): 2 (p - 1) alpha + 2 (p - 1) n beta + (p - 1) n gamma.
Restrictions: none (any p, any n); root 0.
Deadlock-freedom: blocking Send/Recv only between the root and one other rank at a time; the
root posts every receive and every send in a fixed order that each other rank follows.

    mpiexec -n 4 python -m collectives.naive
"""
from mpi4py import MPI

from .buffers import run_allreduce, scratch
from .ops import combine
from .tags import GATHER, SEND_BACK

ROOT = 0


def naive_allreduce_in_place(comm, data, op, source=None):
    """The heart: gather to the root, reduce there, send the result back. `data` in place.

    source: this rank's input, when it is not in `data` yet (an out-of-place allreduce; None: in
    place). It is read where it is, never written: the first reduction reads it, and so does the
    send to the root, so `data` needs no copy of it first.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = data if source is None else source  # my input, until the first reduction writes `data`
    # BEGIN SOLUTION
    if rank == ROOT:
        incoming = scratch(data)                # a cached receive buffer
        # gather and reduce: the root's link carries (p - 1) vectors in
        for sender in range(size):
            if sender != ROOT:
                comm.Recv(incoming, source=sender, tag=GATHER)
                combine(data, incoming, op, mine)   # data <- mine (op) incoming
                mine = data
        # send back: and (p - 1) vectors out
        for dest in range(size):
            if dest != ROOT:
                comm.Send(data, dest=dest, tag=SEND_BACK)
    else:
        # every other rank: its vector to the root, the result back
        comm.Send(mine, dest=ROOT, tag=GATHER)
        comm.Recv(data, source=ROOT, tag=SEND_BACK)
    # END SOLUTION


def allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True):
    """recvbuf <- op over ranks of sendbuf, by the naive root algorithm (arguments: buffers.run_allreduce)."""
    return run_allreduce(naive_allreduce_in_place, comm, sendbuf, recvbuf, op, check, "naive allreduce")


if __name__ == "__main__":
    from .demo import demo
    demo(allreduce, MPI.COMM_WORLD, "naive")
