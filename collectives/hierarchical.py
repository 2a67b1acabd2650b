"""Hierarchical allreduce in two levels: reduce-scatter inside each node, c allreduces of n/c across
the nodes at once, allgather inside each node. The form Horovod's hierarchical allreduce and the
2D-torus allreduce run.

Papers: Mikami et al. (2018), the 2D-torus allreduce: ranks on a grid, a reduce-scatter along each
row, an allreduce along each column, an allgather along each row; Sergeev & Del Balso (2018),
Horovod, whose hierarchical allreduce is a reduce-scatter among a node's GPUs (NCCL), an MPI
allreduce of each GPU's share with the same local rank of every other node, all of them at once,
and an allgather in the node; Ben-Nun & Hoefler (ACM CSUR 2019), hierarchical collectives;
Thakur, Rabenseifner & Gropp (IJHPCA 2005) for the ring and Rabenseifner's algorithm.

Why: a node's c ranks share its network cards, and inside the node a message is a copy through
shared memory. Flat, every rank's bytes cross the network; in the tree form (collectives.
hierarchical_tree) only the leaders cross, but the whole vector moves 2 lg c times inside the node
and only one rank feeds the network. Here each of the c ranks carries 1/c of the vector across, so
the network sees the leader's bytes (2 (N-1)/N n per node) from all c ranks at once, and inside the
node each rank moves 2 (c-1)/c of the vector, the bandwidth lower bound.

Layout (collectives.nodes): p ranks on nodes of c consecutive ranks, local rank i = r mod c,
N = p // c full nodes. p = 6, c = 3, the vector in c = 3 blocks b0 b1 b2 (a row of the grid is a
node, a column the ranks with one local rank):

    node 0: ranks 0 1 2     1. reduce-scatter in the node (the ring): local rank i holds block i
    node 1: ranks 3 4 5        of its node's sum
                            2. allreduce of block i across the nodes, among ranks i, i + c, ...
    local rank:   0  1  2      (the ring, or Rabenseifner for N a power of two): c of them at once
    columns:      0  1  2   3. allgather in the node (the ring): every rank gets every block
                  3  4  5

A last node of p mod c ranks (p not a multiple of c) is folded in, as MPICH folds the ranks beyond a
power of two: its rank r sends its vector to rank r - c (the same local rank on the last full node)
before step 1 and gets the result back after step 3. (Horovod runs the tree form on unequal nodes.)

Cost, alpha_i, beta_i inside a node and alpha_e, beta_e between nodes, n bytes, c | p, every rank
its own network port:

    2 (c-1) alpha_i + 2 (c-1)/c n beta_i + (c-1)/c n gamma            steps 1 and 3 (the ring)
    + 2 (N-1) alpha_e + 2 (N-1)/N (n/c) beta_e + (N-1)/N (n/c) gamma   step 2 by the ring
      (2 lg N alpha_e + ... by Rabenseifner, N a power of two)

With K NICs per node, c/K ranks share each one in step 2, and the LogGP port holds a message for
its bytes only, so their messages leave one after another while earlier ones are still in flight:
collectives.model.two_level.predict_hierarchical has the exact time, the larger of the ring's steps
at alpha_e + m beta_e and c/K messages per step through one port.
Bitwise: c = 1 is the flat ring (or Rabenseifner) across p ranks, and c = p the flat ring, bit for
bit; otherwise each block is summed first inside the node, then across nodes, another order of
the same additions (exact on integers).
Deadlock-freedom: each step is a ring (or Rabenseifner) of blocking calls on disjoint ranks, each
deadlock-free on its own; the fold is one send matched by one receive before and after them.

    mpiexec -n 4 python -m collectives.hierarchical
    MINIDL_RANKS_PER_NODE=2 mpiexec -n 6 python -m algorithms.allreduce_sgd --allreduce hierarchical
    python -m collectives.simulate --ranks 64 --ranks-per-node 8 --bytes 1M --algorithms ring,hierarchical
"""
from mpi4py import MPI

from .buffers import blocks, run_allreduce, scratch
from .model.two_level import across_nodes
from .nodes import Ranks, node_size
from .ops import combine
from .rabenseifner import rabenseifner_allreduce_in_place
from .ring import ring_allgather_in_place, ring_allreduce_in_place, ring_reduce_scatter_in_place
from .tags import FOLD_IN, FOLD_OUT

ACROSS = {"ring": ring_allreduce_in_place, "rabenseifner": rabenseifner_allreduce_in_place}


def hierarchical_allreduce_in_place(comm, data, op, source=None, ranks_per_node=None, across=None):
    """The heart: reduce-scatter in the node, allreduce of my block across the nodes, allgather in the node.

    source: this rank's input, when it is not in `data` yet (None: in place); the fold-in or the
    node's reduce-scatter reads it there. ranks_per_node: c (None: node_size). across: "ring" or
    "rabenseifner" between nodes (None: Rabenseifner when the number of full nodes is a power of two).
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    c = min(node_size(comm, ranks_per_node), size)
    full = size // c                             # nodes of c ranks; the p mod c beyond them fold in
    across = across or across_nodes(full)
    local, first = rank % c, rank - rank % c
    counts, offsets = blocks(len(data), c)        # block i: local rank i's share
    # BEGIN SOLUTION
    if rank >= full * c:                         # on the short last node: fold in, wait for the result
        comm.Send(data if source is None else source, rank - c, FOLD_IN)
        comm.Recv(data, rank - c, FOLD_OUT)
        return
    folded = full * c <= rank + c < size         # my twin on the short node hands me its vector
    if folded:
        incoming = scratch(data)
        comm.Recv(incoming, rank + c, FOLD_IN)
        combine(data, incoming, op, source)      # data <- mine (op) my twin's
        source = None
    node = Ranks(comm, range(first, first + c))
    if c == 1 and source is not None:
        data[...] = source                       # a node of one: no reduce-scatter writes data
    # 1. reduce-scatter in the node: local rank i ends with block i of the node's sum
    ring_reduce_scatter_in_place(node, data, op, source)
    # 2. allreduce of block i across the nodes, with local rank i of every node (c of these at once)
    mine = data[offsets[local]:offsets[local] + counts[local]]
    if full > 1 and counts[local]:
        ACROSS[across](Ranks(comm, range(local, full * c, c)), mine, op)
    # 3. allgather in the node: every block to every rank
    ring_allgather_in_place(node, data)
    if folded:
        comm.Send(data, rank + c, FOLD_OUT)
    # END SOLUTION


def check_across(across):
    """ValueError unless `across` is None or one of ACROSS's names."""
    if across is not None and across not in ACROSS:
        raise ValueError(f"unknown across={across!r}; choose one of {tuple(ACROSS)}")


def run_two_level(heart, comm, sendbuf, recvbuf, op, check, ranks_per_node, across, name):
    """buffers.run_allreduce of a two-level heart, with its node size and its algorithm across nodes."""
    check_across(across)
    if ranks_per_node is not None or across is not None:
        def bound(comm, data, op, source=None):
            heart(comm, data, op, source, ranks_per_node, across)
        return run_allreduce(bound, comm, sendbuf, recvbuf, op, check, name)
    return run_allreduce(heart, comm, sendbuf, recvbuf, op, check, name)


def allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True, ranks_per_node=None, across=None):
    """recvbuf <- op over ranks of sendbuf, in two levels (arguments: buffers.run_allreduce; ranks_per_node
    and across: see hierarchical_allreduce_in_place)."""
    return run_two_level(hierarchical_allreduce_in_place, comm, sendbuf, recvbuf, op, check, ranks_per_node,
                         across, "hierarchical allreduce")


if __name__ == "__main__":
    from .demo import demo
    demo(allreduce, MPI.COMM_WORLD, "hierarchical")
