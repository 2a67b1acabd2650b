"""Binomial tree allreduce: reduce to rank 0 along a binomial tree, then broadcast down the same tree.

Papers: Ben-Nun & Hoefler (ACM CSUR 2019), allreduce cost table, "Tree"; Thakur, Rabenseifner
& Gropp (IJHPCA 2005), binomial-tree MPI_Reduce and MPI_Bcast (MPICH's short-message choice).

Schedule, p = 8 (`relative` rank = rank - root mod p; the step is `mask` = 1, 2, 4):

    reduce:     mask 1          mask 2          mask 4
                1 -> 0          2 -> 0          4 -> 0
                3 -> 2          6 -> 4
                5 -> 4
                7 -> 6
    broadcast:  mask 4          mask 2          mask 1
                0 -> 4          0 -> 2          0 -> 1
                                4 -> 6          2 -> 3
                                                4 -> 5, 6 -> 7

In the reduce, at every step half of the ranks that still hold a partial result hand it to a
partner and drop out, so after ceil(lg p) steps the root holds the whole reduction. The broadcast
walks the same edges backwards. Any p works: a rank whose partner does not exist waits a step.

Cost: 2 ceil(lg p) alpha + 2 ceil(lg p) n beta + ceil(lg p) n gamma (the root receives
ceil(lg p) vectors and sends ceil(lg p)). Latency logarithmic, but every message carries the
whole vector, so it is the choice for small vectors only.
Deadlock-freedom: blocking Send/Recv along tree edges: the waits form a tree, never a cycle.

    mpiexec -n 4 python -m collectives.tree

Building blocks, public and tested on their own: `reduce(comm, sendbuf, recvbuf, op, root)`
and `broadcast(comm, buf, root)`.
"""
from mpi4py import MPI

from .buffers import allreduce_arguments, from_mpi, run_allreduce, scratch, to_mpi, validate
from .ops import array_module, base_op, combine, finish
from .tags import BROADCAST, REDUCE


def tree_reduce_in_place(comm, data, op, root=0, source=None):
    """Binomial-tree reduce of `data` to `root`; on other ranks `data` ends as a partial result.

    source: this rank's input, when it is not in `data` yet (None: in place). It is read where it
    is, never written: my subtree's partial result is `source` until the first reduction writes
    it into `data` (a leaf sends `source` itself, and its `data` is left as it was).
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    partial = data if source is None else source   # my subtree's result so far
    # BEGIN SOLUTION
    relative = (rank - root) % size               # the tree is drawn with the root as relative 0
    incoming = scratch(data)                      # a cached receive buffer
    mask = 1
    while mask < size:
        if relative & mask:
            # my subtree is complete: hand it to my parent and stop
            comm.Send(partial, dest=(relative - mask + root) % size, tag=REDUCE)
            break
        # otherwise reduce my child's subtree into mine, if that child exists
        child = relative + mask
        if child < size:
            comm.Recv(incoming, source=(child + root) % size, tag=REDUCE)
            combine(data, incoming, op, partial)  # data <- partial (op) incoming
            partial = data
        mask *= 2
    # END SOLUTION


def tree_broadcast_in_place(comm, data, root=0):
    """Binomial-tree broadcast of `data` from `root` (the reduce's edges, walked backwards)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    # BEGIN SOLUTION
    relative = (rank - root) % size
    # receive from my parent: the lowest set bit of `relative` names the edge
    mask = 1
    while mask < size:
        if relative & mask:
            comm.Recv(data, source=(relative - mask + root) % size, tag=BROADCAST)
            break
        mask *= 2
    # send to my children, the largest subtree first
    mask //= 2
    while mask > 0:
        if relative + mask < size:
            comm.Send(data, dest=(relative + mask + root) % size, tag=BROADCAST)
        mask //= 2
    # END SOLUTION


def tree_allreduce_in_place(comm, data, op, source=None):
    """The heart: reduce to rank 0, then broadcast from rank 0 (source: see tree_reduce_in_place;
    the broadcast writes every rank's `data`, so rank 0 ends with its reduction in `data`)."""
    tree_reduce_in_place(comm, data, op, root=0, source=source)
    tree_broadcast_in_place(comm, data, root=0)


def allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True):
    """recvbuf <- op over ranks of sendbuf, by binomial reduce + broadcast (arguments: buffers.run_allreduce)."""
    return run_allreduce(tree_allreduce_in_place, comm, sendbuf, recvbuf, op, check, "tree allreduce")


def reduce(comm, sendbuf, recvbuf=None, op="sum", root=0, check=True):
    """recvbuf on `root` <- op over ranks of sendbuf (binomial tree). Returns recvbuf on root, None elsewhere.

    Other ranks may pass recvbuf=None; sendbuf may be MPI.IN_PLACE on the root (recvbuf holds
    the root's input then). `sendbuf` itself is never modified.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank != root or recvbuf is None:
        # only the root's recvbuf matters: elsewhere the subtree is reduced in a scratch copy
        if sendbuf is MPI.IN_PLACE:
            sendbuf = recvbuf
        recvbuf = array_module(sendbuf).empty_like(sendbuf) if hasattr(sendbuf, "dtype") else sendbuf
    in_place = allreduce_arguments(comm, "reduce", sendbuf, recvbuf, op, check, root=root)
    if not in_place:
        recvbuf[...] = sendbuf
    data = to_mpi(recvbuf)
    if size > 1 and data.size > 0:
        tree_reduce_in_place(comm, data, base_op(op), root)
    if rank != root:
        return None
    finish(data, op, size)
    from_mpi(data, recvbuf)
    return recvbuf


def broadcast(comm, buf, root=0, check=True):
    """buf on every rank <- buf on `root` (binomial tree), in place. Returns buf."""
    # only the ranks other than the root write into buf
    validate(comm, "broadcast", [(buf, "buf", None, comm.Get_rank() != root)], "sum", check, root=root)
    data = to_mpi(buf)
    if comm.Get_size() > 1 and data.size > 0:
        tree_broadcast_in_place(comm, data, root)
    from_mpi(data, buf)
    return buf


if __name__ == "__main__":
    from .demo import demo
    demo(allreduce, MPI.COMM_WORLD, "tree")
