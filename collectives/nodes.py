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

Block placement is assumed: node k holds ranks k c .. k c + c - 1, as mpiexec places ranks by
default (--map-by core, or slot). Under round-robin placement (--map-by node) the "nodes" formed
are not the machine's and every hop may cross the network: the result is the same, the speed is
lost. So when c comes from the shared-memory split, the split's nodes are checked (`in_blocks`) and
rank 0 warns once on stderr if they are not blocks of c consecutive ranks (a short last one allowed).
"""
import os
import sys
from collections import Counter

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


def in_blocks(nodes):
    """Whether `nodes` (rank r's node: any label, one per rank) lays the ranks in blocks: every node a run
    of consecutive ranks, all of the largest node's size c but the last, which may be shorter (folded in)."""
    runs = []                                            # (label, length) of each run of equal labels
    for label in nodes:
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    c = max((length for _, length in runs), default=0)
    labels = [label for label, _ in runs]
    return len(set(labels)) == len(labels) and all(length == c for _, length in runs[:-1])


_WARNED = False


def warn_unless_blocks(comm, nodes):
    """On rank 0, once per process: a `warning:` line on stderr when `nodes` (each rank's node) is not in_blocks."""
    global _WARNED
    if _WARNED or comm.Get_rank() != 0 or in_blocks(nodes):
        return
    _WARNED = True
    sys.stderr.write("warning: the ranks are not placed in blocks of consecutive ranks per node, so the "
                     "hierarchical allreduce's nodes are not the machine's (right results, lost speed); "
                     "place ranks in blocks (mpiexec's default, --map-by core) or set MINIDL_RANKS_PER_NODE\n")


def shared_memory_size(comm):
    """The largest number of ranks of `comm` sharing one node's memory (MPI_Comm_split_type), cached
    on the communicator as an MPI attribute: a collective call the first time only, which also checks
    that the nodes are blocks of consecutive ranks (warn_unless_blocks)."""
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval()
    size = comm.Get_attr(_KEYVAL)
    if size is None:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        first = node.allreduce(comm.Get_rank(), op=MPI.MIN)     # a node's label: its lowest rank
        nodes = comm.allgather(first)
        node.Free()
        size = max(Counter(nodes).values())
        warn_unless_blocks(comm, nodes)
        comm.Set_attr(_KEYVAL, size)
    return size
