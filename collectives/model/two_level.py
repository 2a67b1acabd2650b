"""The cost of an allreduce on nodes: c ranks per node, one link inside a node and another between
nodes, and each node's network ports (K NICs) shared by its ranks; the two hierarchies' costs.

Exactly the times collectives.sim gives with alpha and beta only (L = alpha, G = beta, o = g = 0),
where `exact_on_nodes` says so (tests/test_two_level.py checks every algorithm against the simulator).
p ranks in block order (rank r on node r // c), N = p / c nodes, (alpha_i, beta_i) inside a node and
(alpha_e, beta_e) between nodes, n bytes, q = ceil(c / K) ranks on each NIC (q = 1: a port per rank).

A shared port. LogGP (and the simulator) holds a port for a message's bytes, m G, not for its
latency: while one message is in flight the next may leave. So q ranks that each send one message
per step through one NIC, each step once its previous message has arrived, all starting together,
do not cost each step's q messages one after another (alpha + q m beta per step, an upper bound);
message i of step s starts at

    start(i, s) = max(start(i, s - 1) + alpha + m_{s-1} beta,    its own previous message arrived
                      the end of the message before it on the port: start(i - 1, s) + m_s beta,
                      or, for i = 0, start(q - 1, s - 1) + m_{s-1} beta)

and the phase ends when the last arrives (`shared_port`). For S steps of m bytes (w = m beta):

    max(S (alpha + w) + (q - 1) w,    latency-bound: each rank's own chain, the q - 1 before it once
        S q w + alpha)                bandwidth-bound: the port busy from the first byte to the last

the second when alpha < (q - 1) w. q = 1 is S (alpha + w), the per-rank-port form.

Each algorithm, c | p (the ring and naive: any c; the tree: c a power of two, any p):

    naive         2 (c-1) (alpha_i + n beta_i) + 2 (p-c) (alpha_e + n beta_e)    the root's messages, one at a time
    ring          2 (p-1) max(alpha_i + n/p beta_i, alpha_e + n/p beta_e)    in block order one message per node
                  per step crosses, always from the node's last rank, and every step waits for it
    tree          2 lg c (alpha_i + n beta_i) + 2 lg N (alpha_e + n beta_e)   only first ranks cross
    butterfly     lg c (alpha_i + n beta_i) + shared_port(lg N steps of n)   (c, N powers of two)
    rabenseifner  shared_port(halving: n/2, n/4, .., n/N) + 2 sum_k (alpha_i + n/(N 2^k) beta_i)
                  + shared_port(doubling: n/N, .., n/2)   (c, N powers of two; the node's steps in between
                  bring its ranks together again: each pairs with all the others within lg c steps)
    hierarchical  2 (c-1) (alpha_i + n/c beta_i) + shared_port(the ring's 2 (N-1) steps of n/(c N),
                  or Rabenseifner's on n/c for N a power of two)         (collectives.hierarchical; any p:
                  a short last node of f = p mod c ranks adds 2 (alpha_e + ceil(f / K) n beta_e), its fold)
    hierarchical_tree  2 ceil(lg c) (alpha_i + n beta_i) + the ring's (Rabenseifner's) time on N ranks of n
                  bytes at alpha_e, beta_e: only one rank per node crosses (collectives.hierarchical_tree)

each with blocks of equal size (n a multiple of the blocks it is cut into). gamma adds each
algorithm's reduced bytes on the critical path (collectives.model.cost; the hierarchies here).
"""
from ..fold import largest_power_of_two
from .cost import RankCost, ceil_lg, critical_path, per_rank, predict

NODE_ALGORITHMS = ("naive", "tree", "butterfly", "ring", "rabenseifner", "hierarchical", "hierarchical_tree")


def across_nodes(nodes):
    """The allreduce the hierarchies run across nodes: Rabenseifner on a power of two of nodes, the
    ring otherwise (no fold-in)."""
    return "rabenseifner" if nodes == largest_power_of_two(nodes) else "ring"


def shared_port(sizes, alpha, beta, sharing=1, start=0.0):
    """When the last of `sharing` ranks on one port ends a phase of len(sizes) steps, each step one
    message of sizes[s] bytes (see the header), all starting at `start`."""
    ready, free = [start] * sharing, start       # each rank's previous message arrived; the port free
    for nbytes in sizes:
        wire = nbytes * beta
        for i in range(sharing):
            begin = ready[i] if ready[i] > free else free
            free = begin + wire
            ready[i] = free + alpha
    return max(ready)


def across_sizes(algorithm, nodes, nbytes):
    """The bytes of each step of `algorithm` on `nodes` ranks (one message per rank per step), blocks equal."""
    if nodes == 1 or nbytes == 0:
        return []
    if algorithm == "ring":
        return [nbytes / nodes] * (2 * (nodes - 1))
    halving = [nbytes / 2 ** k for k in range(1, ceil_lg(nodes) + 1)]       # rabenseifner, nodes a power of two
    return halving + halving[::-1]


def predict_hierarchical(p, nbytes, ranks_per_node, intra, inter, gamma=0.0, across=None, nics_per_node=None):
    """Seconds of collectives.hierarchical; intra, inter: (alpha, beta); nics_per_node: K (None: a port
    per rank). A short last node (c not dividing p) adds its fold, 2 (alpha_e + ceil(f / K) n beta_e) + n gamma:
    its f = p mod c ranks' vectors in and the results out, on f of the last full node's ranks, whose
    NICs (rank % c % K) carry ceil(f / K) of them one after another each way."""
    if p == 1 or nbytes == 0:
        return 0.0
    c = min(ranks_per_node, p)
    nodes = p // c
    across = across or across_nodes(nodes)
    sharing = 1 if nics_per_node is None else -(-c // nics_per_node)
    inside = 2 * (c - 1) * (intra[0] + nbytes / c * intra[1]) + (c - 1) / c * nbytes * gamma
    block = nbytes / c
    crossing = shared_port(across_sizes(across, nodes, block), inter[0], inter[1], sharing)
    reduced = critical_path(across, nodes, block)[2] * gamma
    short = p % c                                        # the folded ranks; ceil(short / K) on the busiest NIC
    turns = 1 if nics_per_node is None else -(-short // min(nics_per_node, c))
    fold = 2 * (inter[0] + turns * nbytes * inter[1]) + nbytes * gamma if short else 0.0
    return inside + crossing + reduced + fold


def predict_hierarchical_tree(p, nbytes, ranks_per_node, intra, inter, gamma=0.0, across=None):
    """Seconds of collectives.hierarchical_tree; intra, inter: (alpha, beta); across: the leaders'
    algorithm (None: across_nodes). Only the leaders cross: shared NICs change nothing."""
    if p == 1 or nbytes == 0:
        return 0.0
    c = min(ranks_per_node, p)
    nodes = -(-p // c)
    lg = ceil_lg(c)
    inside = 2 * lg * (intra[0] + nbytes * intra[1]) + lg * nbytes * gamma
    return inside + predict(across or across_nodes(nodes), nodes, nbytes, inter[0], inter[1], gamma)


def predict_on_nodes(algorithm, p, nbytes, ranks_per_node, intra, inter, nics_per_node=None):
    """Seconds of `algorithm` (NODE_ALGORITHMS) with alpha and beta only, on nodes (see the header):
    the simulator's time exactly where exact_on_nodes(...) holds."""
    c = min(ranks_per_node, p)
    nodes, (a_i, b_i), (a_e, b_e), n = -(-p // c), intra, inter, nbytes
    if algorithm == "hierarchical":
        return predict_hierarchical(p, n, c, intra, inter, nics_per_node=nics_per_node)
    if algorithm == "hierarchical_tree":
        return predict_hierarchical_tree(p, n, c, intra, inter)
    if nodes == 1 or p == 1 or n == 0:
        return predict(algorithm, p, n, a_i, b_i)
    sharing = 1 if nics_per_node is None else -(-c // nics_per_node)
    if algorithm == "naive":
        return 2 * (c - 1) * (a_i + n * b_i) + 2 * (p - c) * (a_e + n * b_e)
    if algorithm == "ring":
        return 2 * (p - 1) * max(a_i + n / p * b_i, a_e + n / p * b_e)
    if algorithm == "tree":
        inside = ceil_lg(c)
        return 2 * inside * (a_i + n * b_i) + 2 * (ceil_lg(p) - inside) * (a_e + n * b_e)
    lg_c, lg_nodes = ceil_lg(c), ceil_lg(nodes)
    if algorithm == "butterfly":
        return lg_c * (a_i + n * b_i) + shared_port([n] * lg_nodes, a_e, b_e, sharing)
    if algorithm == "rabenseifner":
        halving = across_sizes("rabenseifner", nodes, n)[:lg_nodes]
        inside = sum(a_i + n / nodes / 2 ** k * b_i for k in range(1, lg_c + 1))
        return (shared_port(halving, a_e, b_e, sharing) + 2 * inside
                + shared_port(halving[::-1], a_e, b_e, sharing))
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {NODE_ALGORITHMS}")


def exact_on_nodes(algorithm, p, count, ranks_per_node):
    """Whether predict_on_nodes is the simulator's time to rounding for `count` elements (the header's
    conditions: blocks of equal size, c dividing p and powers of two where the header says so)."""
    c = min(ranks_per_node, p)
    nodes, full = -(-p // c), p // c
    if algorithm == "hierarchical":
        return count % c == 0 and (count // c) % full == 0      # any p: the short node's fold is exact too
    if algorithm == "hierarchical_tree":
        return count % nodes == 0
    if algorithm == "naive":
        return True
    if nodes == 1:                                        # one node: collectives.model.cost's forms
        return algorithm == "tree" or count % p == 0 and count % largest_power_of_two(p) == 0
    if algorithm == "ring":
        return count % p == 0
    if algorithm == "tree":
        return c == largest_power_of_two(c)
    powers = p % c == 0 and c == largest_power_of_two(c) and full == largest_power_of_two(full)
    return powers and (algorithm == "butterfly" or count % p == 0)


def per_rank_hierarchical(p, n, itemsize, rank, ranks_per_node, across=None):
    """RankCost of `rank` in collectives.hierarchical of n elements of `itemsize` bytes on p ranks: the
    fold, the node's ring (reduce-scatter and allgather on c ranks) and the allreduce of its block
    across the nodes, each counted by collectives.model.cost.per_rank, uneven blocks exactly."""
    if n == 0 or p == 1:
        return RankCost(0, 0, 0)
    c = min(ranks_per_node, p)
    nodes = p // c
    if rank >= nodes * c:                                 # on the short node: its vector out, the result in
        return RankCost(1, n * itemsize, 0)
    local = rank % c
    base, extra = divmod(n, c)
    block = base + (local < extra)                        # buffers.blocks: the first n % c one longer
    inside = per_rank("ring", c, n, itemsize, local)
    across = per_rank(across or across_nodes(nodes), nodes, block, itemsize, rank // c)
    folded = nodes * c <= rank + c < p
    return RankCost(inside.messages + across.messages + folded,
                    inside.bytes_sent + across.bytes_sent + folded * n * itemsize,
                    inside.bytes_reduced + across.bytes_reduced + folded * n * itemsize)
