"""A two-level fat tree with a bisection limit: leaf switches of S nodes, K uplinks each to the spine.

The plain engine gives every rank its own ports and lets any number of messages cross the network
at once: a network with full bisection bandwidth. A real cluster's nodes hang off leaf switches,
and the leaves reach each other through a spine over a few uplinks: with S nodes of c ranks under
a leaf and K uplinks, at most K messages leave (and K enter) a leaf at once; K = S c is full
bisection, K < S c oversubscribed by S c / K (Leiserson 1985's fat tree; the "bisection limit").

    engine = FatTree(Topology(64, 1, intra, inter), nodes_per_switch=8, uplinks=2)
    seconds = engine.run(program, SimComm)

Rank r is on node r // c, under leaf switch r // (c S). A message between ranks under different
leaves starts only when, besides both ranks' ports, one uplink of the sending leaf and one downlink
of the receiving leaf are free (the earliest-free one of each), and holds them as long as it holds
the ranks' ports (its bytes, m G of the network link). Messages under one leaf are as before.
Each uplink is as fast as a node's link: the limit is on how many cross at once, not on their rate.

Checks (tests/test_simulate.py): with K = S c the times equal the plain engine's for every
allreduce; S ranks of one leaf sending m bytes each across at once with K = 1 finish at
L + S m G (they take turns); the ring in block order sends one message per leaf per step, so
even K = 1 leaves its time at the closed form.
"""
from .engine import Engine


class FatTree(Engine):
    def __init__(self, topology, nodes_per_switch, uplinks, **options):
        super().__init__(topology, **options)
        for name, value in (("nodes_per_switch", nodes_per_switch), ("uplinks", uplinks)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.per_leaf = self.c * nodes_per_switch               # ranks under one leaf switch
        leaves = -(-topology.ranks // self.per_leaf)
        self.up = [[0.0] * uplinks for _ in range(leaves)]      # when each uplink is free again
        self.down = [[0.0] * uplinks for _ in range(leaves)]

    def transfer(self, source, dest, tag, sent_buf, into_buf, sent, posted):
        a, b = source // self.per_leaf, dest // self.per_leaf
        if a == b:
            return super().transfer(source, dest, tag, sent_buf, into_buf, sent, posted)
        up, down = self.up[a], self.down[b]
        i, j = up.index(min(up)), down.index(min(down))
        self.send_free[source] = max(self.send_free[source], up[i])
        self.recv_free[dest] = max(self.recv_free[dest], down[j])
        times = super().transfer(source, dest, tag, sent_buf, into_buf, sent, posted)
        up[i] = down[j] = self.send_free[source]
        return times
