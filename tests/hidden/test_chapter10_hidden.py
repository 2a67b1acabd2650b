"""Hidden: chapter 10's tasks (10.1 the two-level allreduce's heart, 10.2 the LogGP times of one
message) from angles the visible tests do not take.

10.1 on p = 5 and 6 ranks (the last node short, node sizes 1 .. p + 2), every op on float64 and
int32, the heart called with a `source` and a `data` full of garbage, lengths below p and around
2p; and the messages, counted by hand: on full nodes every rank sends 2 (c - 1) messages inside its
node (the ring's reduce-scatter and allgather) and the messages of the ring (N not a power of two)
or Rabenseifner's algorithm (N a power of two) on N ranks across nodes, only to its own local rank
on the others; a rank of a short last node sends one message, its vector, to the same local rank on
the node before. Expected values come from numpy over every rank's fill.
10.2 against the LogGP rules written out here, on 300 drawn messages, including messages of zero
bytes (the gap alone holds the ports) and links whose gap outlasts the wire.
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from collectives.hierarchical import hierarchical_allreduce_in_place
from collectives.sim.network import LogGP, message_times
from collectives.trace import TracedComm

OPS = {"sum": np.sum, "max": np.max, "min": np.min}


def fill(rank, length, dtype):
    """Small integers in -2..2, each index's extremes on different ranks."""
    return ((np.arange(length) * 7 + rank * 3) % 5 - 2).astype(dtype)


@pytest.mark.task("10.1")
@pytest.mark.parallel(nprocs=[5, 6])
def test_hierarchical_heart_on_awkward_ranks_dtypes_ops_and_a_separate_source():
    comm = MPI.COMM_WORLD
    p, wrong = comm.size, []
    cases = [(c, across) for c in (1, 2, 3, p - 1, p + 2) for across in (None, "ring", "rabenseifner")]
    for number, (c, across) in enumerate(cases):          # each call goes to the sandbox: a few dozen
        dtype, op = ("float64", "int32")[number % 2], list(OPS)[number % 3]
        for length in (p - 1, 2 * p + 3):
            exact = OPS[op](np.stack([fill(rank, length, dtype) for rank in range(p)]), axis=0)
            source = fill(comm.rank, length, dtype)
            data = np.full(length, 99, dtype)
            hierarchical_allreduce_in_place(comm, data, op, source=source, ranks_per_node=c, across=across)
            if not np.array_equal(data, exact.astype(dtype)):
                wrong.append((c, across, dtype, op, length))
    parallel_assert(not wrong, f"rank {comm.rank} wrong for (c, across, dtype, op, length): {wrong[:4]}")


@pytest.mark.task("10.1")
@pytest.mark.parallel(nprocs=[6])
def test_every_rank_sends_its_rings_messages_in_the_node_and_its_own_across():
    comm = MPI.COMM_WORLD
    problems = []
    # c = 2: 3 nodes, the ring across (4 messages); c = 3: 2 nodes, Rabenseifner (2); c = 4: 1 full node
    # and ranks 4, 5 on a short one
    for c, across in ((2, 4), (3, 2), (4, 0)):
        traced = TracedComm(comm)
        data = fill(comm.rank, 17, "float64")
        hierarchical_allreduce_in_place(traced, data, "sum", ranks_per_node=c)
        sent = [message.peer for message in traced.messages if message.direction == "send"]
        inside = [peer for peer in sent if peer // c == comm.rank // c]
        crossing = [peer for peer in sent if peer // c != comm.rank // c]
        short = comm.rank >= comm.size // c * c
        twin = comm.size // c * c <= comm.rank + c < comm.size    # its twin on the short node folds in
        if short and sent != [comm.rank - c]:
            problems.append((c, "a rank of the short node should send its vector once, to", comm.rank - c, sent))
        if not short and len(inside) != 2 * (c - 1):
            problems.append((c, f"{len(inside)} messages inside the node, not the ring's {2 * (c - 1)}"))
        if not short and (len(crossing) != across + twin or any(peer % c != comm.rank % c for peer in crossing)):
            problems.append((c, f"across nodes to {crossing}: {across + twin} messages to its own local rank"))
    parallel_assert(not problems, f"rank {comm.rank}: {problems}")


def by_the_rules(link, nbytes, sent, posted, send_free, receive_free):
    start = max(sent, posted, send_free, receive_free)
    wire = nbytes * link.G
    arrived = start + link.L + wire
    return start, start + max(link.g, wire), arrived, arrived + link.o


@pytest.mark.task("10.2")
def test_message_times_follow_the_loggp_rules_on_drawn_messages():
    rng = np.random.default_rng(10)
    for case in range(300):
        link = LogGP(*(float(x) for x in rng.uniform(0, 5, 4) * (rng.random(4) < 0.7)))
        nbytes = int(rng.integers(0, 3)) if case % 5 == 0 else int(rng.integers(0, 1 << 20))
        times = [float(x) for x in rng.uniform(0, 100, 4)]
        got = message_times(link, nbytes, *times)
        assert len(got) == 4 and got == pytest.approx(by_the_rules(link, nbytes, *times), rel=1e-12, abs=1e-12), \
            (link, nbytes, times)


@pytest.mark.task("10.2")
def test_a_zero_byte_message_costs_latency_and_holds_the_ports_for_the_gap():
    link = LogGP(L=4.0, o=0.5, g=2.0, G=1.0)
    assert message_times(link, 0, 3.0, 1.0, 2.0, 0.0) == pytest.approx((3.0, 5.0, 7.0, 7.5))
