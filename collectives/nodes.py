"""Ranks on nodes: how many share one (node_size), and a heart run on some of them (Ranks).

Both hierarchies (collectives.hierarchical and collectives.hierarchical_tree) lay p ranks on nodes of
c consecutive ranks (node k: ranks k c .. k c + c - 1) and run ordinary hearts on a node's ranks, or
on one rank of every node, through Ranks: point-to-point on a subset of a communicator, renumbered
0.. (no MPI communicator is made, so nothing collective is called to make one).

The node size c: the `ranks_per_node` argument if given; else the communicator's own (the
simulator's topology, collectives.sim); else MINIDL_RANKS_PER_NODE from the environment; else MPI's
shared-memory split (comm.Split_type(MPI.COMM_TYPE_SHARED), the largest node's size, asked once per
communicator and cached on it). Any c >= 1 gives the right result: c only decides which messages
go where, so a c that does not match the machine costs time, never correctness.
"""
import os

from mpi4py import MPI


class Ranks:
    """Point-to-point on a subset of a communicator's ranks, renumbered 0.. (a node, or one rank per node).

    `members` is a range of the communicator's ranks; a heart run on a Ranks sees only them.
    """

    def __init__(self, comm, members):
        self.comm, self.members = comm, members
        self.rank = members.index(comm.Get_rank())

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return len(self.members)

    def Send(self, buf, dest, tag=0):
        self.comm.Send(buf, self.members[dest], tag)

    def Recv(self, buf, source, tag, status=None):
        self.comm.Recv(buf, self.members[source], tag, status)

    def Sendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag, status=None):
        self.comm.Sendrecv(sendbuf, self.members[dest], sendtag, recvbuf, self.members[source], recvtag, status)


_KEYVAL = None


def node_size(comm, ranks_per_node=None):
    """c, the ranks per node (see the header for where it comes from)."""
    if ranks_per_node is None:
        ranks_per_node = getattr(comm, "ranks_per_node", None)          # the simulator's topology
    if ranks_per_node is None:
        ranks_per_node = environment_ranks_per_node()
    if ranks_per_node is None:
        ranks_per_node = shared_memory_size(comm)
    if not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be an integer >= 1, got {ranks_per_node!r}")
    return ranks_per_node


def environment_ranks_per_node():
    """MINIDL_RANKS_PER_NODE as an integer (None when unset or empty); ValueError if it is not one >= 1."""
    text = os.environ.get("MINIDL_RANKS_PER_NODE", "")
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"MINIDL_RANKS_PER_NODE must be an integer >= 1, got {text!r}")
    return int(text)


def shared_memory_size(comm):
    """The largest number of ranks of `comm` sharing one node's memory (MPI_Comm_split_type), cached
    on the communicator as an MPI attribute: a collective call the first time only."""
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval()
    size = comm.Get_attr(_KEYVAL)
    if size is None:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        size = comm.allreduce(node.Get_size(), op=MPI.MAX)
        node.Free()
        comm.Set_attr(_KEYVAL, size)
    return size
