"""A simulated network: the real allreduce hearts on p simulated ranks, timed by LogGP.

On one machine a "message" is two memory copies and p stops at the number of cores, so the
papers' claims about hundreds of machines cannot be measured here. They can be simulated: the
hearts use nothing of MPI but point-to-point calls on buffers (Send, Recv, Sendrecv, Isend,
Irecv, Wait), so a communicator that answers those calls from a model of a network runs them
unchanged, at any p.

    network.py   LogGP link parameters (L, o, g, G) and the topology: p ranks on nodes of c ranks,
                 one link inside a node, another between nodes
    engine.py    the discrete-event engine: one greenlet (coroutine) per rank, a heap of wake-up
                 times; message matching, LogGP timing, data movement
    comm.py      SimComm: Get_rank, Get_size, Send, Recv, Sendrecv, Isend, Irecv, Barrier, Split
    sized.py     Sized: a vector with a length but no elements, for sizes-only runs at large p
    fattree.py   FatTree: the engine on leaf switches with a few uplinks each (a bisection limit)
    simulate.py  ``python -m collectives.sim``: every allreduce on p simulated ranks, beside the closed form

    from collectives.sim import Engine, SimComm, alpha_beta
    engine = Engine(alpha_beta(ranks=64, alpha=2e-6, beta=1e-10))
    seconds = engine.run(lambda comm: ring.ring_allreduce_in_place(comm, vector(comm), "sum"), SimComm)

`python -m collectives.sim` runs every allreduce this way and prints its simulated time
beside collectives.model.cost's closed form. With only alpha and beta set (L = alpha, G = beta,
o = g = 0) the two agree exactly, which is what ties the engine to the model (tests/test_simulate.py).

What the simulation leaves out: computation (a reduction costs no time: gamma = 0), the memory
bus and caches that make a message on one node cost more than alpha + m beta, contention inside the
network (two messages on different ports never slow each other; FatTree limits how many cross
between leaf switches at once), and MPI's eager protocol (every
message waits for its receive: a rendezvous).
"""
from .comm import SimComm
from .engine import Deadlock, Engine
from .fattree import FatTree
from .network import LogGP, Topology, alpha_beta
from .sized import Sized

__all__ = ["Engine", "FatTree", "SimComm", "Deadlock", "LogGP", "Topology", "alpha_beta", "Sized"]
