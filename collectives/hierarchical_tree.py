"""The tree form of the hierarchical allreduce: reduce inside each node, allreduce across the nodes'
leaders, broadcast inside. (collectives.hierarchical is the form real libraries run; this is the
simpler one, kept to be set beside it.)

Papers: Ben-Nun & Hoefler (ACM CSUR 2019), hierarchical and topology-aware collectives;
Thakur, Rabenseifner & Gropp (IJHPCA 2005) for the ring and Rabenseifner's algorithm used across
nodes; the binomial reduce and broadcast of collectives.tree inside a node. Horovod's hierarchical
allreduce (Sergeev & Del Balso 2018) falls back to this form on nodes of unequal size: reduce to one
rank of each node, allreduce across those ranks, broadcast.

Why: inside a node a message is a copy through shared memory (small alpha, small beta); between
nodes it crosses the network (alpha and beta several times larger). A flat ring pays the network's
alpha 2 (p - 1) times however many ranks share a node; the hierarchy sends across the network only
between one leader per node, so the slow link's latency term counts nodes, not ranks. What it
costs: the whole vector moves 2 ceil(lg c) times inside the node, where collectives.hierarchical
moves 2 (c - 1)/c of it.

Layout (collectives.nodes): p ranks on nodes of c consecutive ranks (node k: ranks k c .. k c + c - 1;
the last node holds p mod c ranks when c does not divide p), N = ceil(p / c) nodes, the node's first
rank its leader. p = 6, c = 2:

    node:            0          1          2
    ranks:         0   1      2   3      4   5
    1. reduce:     0 <- 1     2 <- 3     4 <- 5        binomial tree inside each node
    2. allreduce:  0 <-----> 2 <-----> 4              ring (or Rabenseifner) over the N leaders
    3. broadcast:  0 -> 1     2 -> 3     4 -> 5        binomial tree inside each node

Cost, with alpha_i, beta_i inside a node and alpha_e, beta_e between nodes, n bytes, c' = min(c, p):

    2 ceil(lg c') (alpha_i + n beta_i) + ceil(lg c') n gamma          steps 1 and 3
    + 2 (N - 1) alpha_e + 2 (N - 1)/N n beta_e + (N - 1)/N n gamma    step 2 by the ring
      (2 lg N alpha_e + ... by Rabenseifner, N a power of two)

(collectives.model.two_level.predict_hierarchical_tree). Only the leaders use the network, so a
node's shared NIC never delays it. Across nodes the leaders run Rabenseifner when N is a power
of two (the ring's bandwidth term with lg N latency) and the ring otherwise (Rabenseifner would
add its fold-in, 2 alpha_e + 2 n beta_e); `across` picks one explicitly.
Deadlock-freedom: each step is a tree or a ring of blocking calls, each deadlock-free on its own;
a rank takes part in step 2 only between its own steps 1 and 3.

    mpiexec -n 4 python -m collectives.hierarchical_tree
    MINIDL_RANKS_PER_NODE=2 mpiexec -n 6 python -m algorithms.allreduce_sgd --allreduce hierarchical_tree
    python -m collectives.simulate --ranks 64 --ranks-per-node 8 --bytes 1M --algorithms ring,hierarchical_tree
"""
from mpi4py import MPI

from .hierarchical import ACROSS, run_two_level
from .model.two_level import across_nodes
from .nodes import Ranks, node_size
from .tree import tree_broadcast_in_place, tree_reduce_in_place

HEARTS_WITHOUT_A_TASK = ("hierarchical_tree_allreduce_in_place",)     # task 10.1 is the form real libraries run


def hierarchical_tree_allreduce_in_place(comm, data, op, source=None, ranks_per_node=None, across=None):
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
    and across: see hierarchical_tree_allreduce_in_place)."""
    return run_two_level(hierarchical_tree_allreduce_in_place, comm, sendbuf, recvbuf, op, check, ranks_per_node,
                         across, "hierarchical allreduce (tree form)")


if __name__ == "__main__":
    from .demo import demo
    demo(allreduce, MPI.COMM_WORLD, "hierarchical_tree")
