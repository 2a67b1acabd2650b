"""The network the simulator times messages on: LogGP parameters per link, ranks on nodes.

LogGP (Alexandrov, Ionescu, Schauser & Scheiman 1995; the simulator's form follows Hoefler,
Schneider & Lumsdaine's LogGOPSim, 2010) describes a link by four numbers:

    L   latency: seconds from the first byte leaving the sender to it arriving
    o   overhead: seconds of the CPU spent posting a message (at the sender) and taking one in
        (at the receiver); the CPU can do nothing else meanwhile
    g   gap: the least time between the starts of two messages on one port (a rate of messages)
    G   gap per byte: seconds per byte a port needs to push a long message out (1 / bandwidth)

A message of m bytes that starts at t has left its sender at t + m G and has arrived at
t + L + m G; the receiver holds it at t + L + m G + o. (LogGP writes (m - 1) G: the first byte
costs L alone. Here every byte costs G, so that with o = g = 0, L = alpha and G = beta a message
costs alpha + m beta, Hockney's model, which collectives.model.cost uses.)

Topology: p ranks on nodes of c ranks (rank r on node r // c; the last node holds p mod c ranks
when c does not divide p). Two ranks on one node talk over the `intra` link (shared memory),
two on different nodes over the `inter` link (the network). Every rank has one send port and
one receive port (full duplex): a port carries one message at a time. Every node has K network
cards (NICs, `nics_per_node`, default 1), each with a send and a receive port of its own, shared
by the node's ranks (local rank i = r mod c uses NIC i mod K): a message between nodes holds its
ranks' ports and the two NICs' (engine.py). K >= c gives every rank a NIC of its own.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class LogGP:
    """One kind of link: L, o, g in seconds, G in seconds per byte."""
    L: float = 0.0
    o: float = 0.0
    g: float = 0.0
    G: float = 0.0

    def __post_init__(self):
        for name in ("L", "o", "g", "G"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value < float("inf")):
                raise ValueError(f"LogGP {name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class Topology:
    """p ranks, c per node, K NICs per node, and the link inside a node and the one between nodes."""
    ranks: int
    ranks_per_node: int = None          # None: every rank on one node
    intra: LogGP = LogGP()
    inter: LogGP = LogGP()
    nics_per_node: int = 1              # the node's network ports, shared by its ranks; >= c: one per rank

    def __post_init__(self):
        if not (isinstance(self.ranks, int) and self.ranks >= 1):
            raise ValueError(f"ranks must be an integer >= 1, got {self.ranks!r}")
        if self.ranks_per_node is None:
            object.__setattr__(self, "ranks_per_node", self.ranks)
        if not (isinstance(self.ranks_per_node, int) and self.ranks_per_node >= 1):
            raise ValueError(f"ranks_per_node must be an integer >= 1, got {self.ranks_per_node!r}")
        if not (isinstance(self.nics_per_node, int) and self.nics_per_node >= 1):
            raise ValueError(f"nics_per_node must be an integer >= 1, got {self.nics_per_node!r}")

    @property
    def nodes(self):
        return -(-self.ranks // self.ranks_per_node)

    def link(self, a, b):
        """The LogGP parameters of the link from rank a to rank b."""
        c = self.ranks_per_node
        return self.intra if a // c == b // c else self.inter


def message_times(link, nbytes, sent, posted, send_free, receive_free):
    """The LogGP times of one matched message of `nbytes` bytes on `link` (a LogGP).

    sent: when the sender posted it (its overhead o already spent); posted: when the receiver posted
    its receive; send_free, receive_free: when the sender's send port and the receiver's receive port
    are free. Returns (start, free, send_done, receive_done): the message starts once both sides
    are posted and both ports free (a rendezvous), holds both ports until `free` (at least the gap g,
    at most its bytes' m G), has arrived at send_done (L + m G after its start), and the receiver
    has taken it in at receive_done (o later).
    """
    # BEGIN SOLUTION
    # 1. a rendezvous: nothing moves before both sides are posted and both ports are free
    start = max(sent, posted, send_free, receive_free)
    # 2. the bytes leave at G seconds each; the ports take another message after max(g, m G)
    wire = nbytes * link.G
    free = start + (wire if wire > link.g else link.g)
    # 3. the last byte arrives L after it left; the receiver's CPU spends o taking the message in
    send_done = start + link.L + wire
    return start, free, send_done, send_done + link.o
    # END SOLUTION

def alpha_beta(ranks, alpha, beta, ranks_per_node=None, intra_alpha=None, intra_beta=None, nics_per_node=1):
    """A Topology with only alpha (= L) and beta (= G) set, o = g = 0: the closed forms' model.
    The intra-node link defaults to the inter-node one."""
    inter = LogGP(L=alpha, G=beta)
    intra = LogGP(L=alpha if intra_alpha is None else intra_alpha, G=beta if intra_beta is None else intra_beta)
    return Topology(ranks, ranks_per_node, intra, inter, nics_per_node)
