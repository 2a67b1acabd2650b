"""Hierarchical allreduce: reduce inside each node, allreduce across the nodes' leaders, broadcast inside.

Papers: Ben-Nun & Hoefler (ACM CSUR 2019), hierarchical and topology-aware collectives;
Thakur, Rabenseifner & Gropp (IJHPCA 2005) for the ring and Rabenseifner's algorithm used across
nodes; the binomial reduce and broadcast of collectives.tree inside a node.

Why: inside a node a message is a copy through shared memory (small alpha, small beta); between
nodes it crosses the network (alpha and beta several times larger). A flat ring pays the network's
alpha 2 (p - 1) times however many ranks share a node; the hierarchy sends across the network only
between one leader per node, so the slow link's latency term counts nodes, not ranks.

Layout: p ranks on nodes of c consecutive ranks (node k: ranks k c .. k c + c - 1; the last node
holds p mod c ranks when c does not divide p), N = ceil(p / c) nodes, the node's first rank its
leader. p = 6, c = 2:

    node:            0          1          2
    ranks:         0   1      2   3      4   5
    1. reduce:     0 <- 1     2 <- 3     4 <- 5        binomial tree inside each node
    2. allreduce:  0 <-----> 2 <-----> 4              ring (or Rabenseifner) over the N leaders
    3. broadcast:  0 -> 1     2 -> 3     4 -> 5        binomial tree inside each node

Cost, with alpha_i, beta_i inside a node and alpha_e, beta_e between nodes, n bytes, c' = min(c, p):

    2 ceil(lg c') (alpha_i + n beta_i) + ceil(lg c') n gamma          steps 1 and 3
    + 2 (N - 1) alpha_e + 2 (N - 1)/N n beta_e + (N - 1)/N n gamma    step 2 by the ring
      (2 lg N alpha_e + ... by Rabenseifner, N a power of two)

(collectives.model.cost.predict_hierarchical). Across nodes the leaders run Rabenseifner when N is a power
of two (the ring's bandwidth term with lg N latency) and the ring otherwise (Rabenseifner would
add its fold-in, 2 alpha_e + 2 n beta_e); `across` picks one explicitly.

The node size c: the `ranks_per_node` argument if given; else the communicator's own (the
simulator's topology, collectives.sim); else MINIDL_RANKS_PER_NODE from the environment; else MPI's
shared-memory split (comm.Split_type(MPI.COMM_TYPE_SHARED), the largest node's size, asked once per
communicator and cached on it). The result is right for any c >= 1: c only decides which messages
go where, so a c that does not match the machine costs time, never correctness.
Deadlock-freedom: each step is a tree or a ring of blocking calls, each deadlock-free on its own;
a rank takes part in step 2 only between its own steps 1 and 3.

    mpiexec -n 4 python -m collectives.hierarchical
    MINIDL_RANKS_PER_NODE=2 mpiexec -n 6 python -m algorithms.allreduce_sgd --allreduce hierarchical
    python -m collectives.sim --ranks 64 --ranks-per-node 8 --bytes 1M --algorithms ring,hierarchical
"""
import os

from mpi4py import MPI

from .buffers import run_allreduce
from .model.cost import across_nodes
from .rabenseifner import rabenseifner_allreduce_in_place
from .ring import ring_allreduce_in_place
from .tree import tree_broadcast_in_place, tree_reduce_in_place

ACROSS = {"ring": ring_allreduce_in_place, "rabenseifner": rabenseifner_allreduce_in_place}


class Ranks:
    """Point-to-point on a subset of a communicator's ranks, renumbered 0.. (a node, or the leaders).

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


def hierarchical_allreduce_in_place(comm, data, op, source=None, ranks_per_node=None, across=None):
    """The heart: reduce in the node, allreduce across the leaders, broadcast in the node.

    source: this rank's input, when it is not in `data` yet (None: in place); the node's reduce reads
    it there (tree_reduce_in_place). ranks_per_node: c (None: node_size). across: "ring" or
    "rabenseifner" between leaders (None: Rabenseifner when the node count is a power of two).
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    c = min(node_size(comm, ranks_per_node), size)
    nodes = -(-size // c)
    across = across or across_nodes(nodes)
    first = rank - rank % c
    # BEGIN SOLUTION
    node = Ranks(comm, range(first, min(first + c, size)))
    # 1. reduce inside the node to its leader (the node's first rank)
    tree_reduce_in_place(node, data, op, root=0, source=source)
    if node.Get_size() == 1 and source is not None:
        data[...] = source                      # a node of one: nothing was reduced into data
    # 2. allreduce across the nodes, one leader each
    if rank == first and nodes > 1:
        ACROSS[across](Ranks(comm, range(0, size, c)), data, op)
    # 3. broadcast inside the node from its leader
    tree_broadcast_in_place(node, data, root=0)
    # END SOLUTION


def allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True, ranks_per_node=None, across=None):
    """recvbuf <- op over ranks of sendbuf, in two levels (arguments: buffers.run_allreduce; ranks_per_node
    and across: see hierarchical_allreduce_in_place)."""
    if across is not None and across not in ACROSS:
        raise ValueError(f"unknown across={across!r}; choose one of {tuple(ACROSS)}")
    if ranks_per_node is None and across is None:
        heart = hierarchical_allreduce_in_place
    else:
        def heart(comm, data, op, source=None):
            hierarchical_allreduce_in_place(comm, data, op, source, ranks_per_node, across)
    return run_allreduce(heart, comm, sendbuf, recvbuf, op, check, "hierarchical allreduce")


if __name__ == "__main__":
    from .demo import demo
    demo(allreduce, MPI.COMM_WORLD, "hierarchical")
