"""Allreduce on nodes: NICs shared by a node's ranks (collectives.sim), the two-level allreduce
(collectives.hierarchical), and their closed forms (collectives.model.two_level).

The closed forms are checked against the simulator with alpha and beta only, exactly, on shapes
where they claim to be exact; the shared port's recurrence against its closed form for equal steps,
written out here; the NIC rule on messages timed by hand; the two-level allreduce's messages
against the tracer on real MPI ranks, its results against numpy's sums, and its bits against the
flat ring's where the two add in the same order.
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

import collectives
from collectives import hierarchical, nodes, ring, trace
from collectives.model import two_level
from collectives.sim import Engine, LogGP, SimComm, Sized, Topology
from collectives.table import HEARTS
from tests.helpers import fill

INTRA, INTER = (0.6e-6, 0.7e-10), (3.7e-6, 2.3e-10)
LINKS = LogGP(L=INTRA[0], G=INTRA[1]), LogGP(L=INTER[0], G=INTER[1])


def simulated(name, p, c, nics, count, data=False):
    """(seconds, engine, results by rank) of `name`'s heart on p ranks, c per node, `nics` NICs per node."""
    results = {}

    def program(comm):
        mine = fill(comm.rank, count, "float64") if data else Sized(count, np.float32)
        HEARTS[name](comm, mine, "sum")
        results[comm.rank] = mine
    engine = Engine(Topology(p, c, *LINKS, nics), move_data=data)
    return engine.run(program, SimComm), engine, results


# ---- the closed forms, exactly ------------------------------------------------------------------

SHAPES = [(8, 2), (16, 4), (32, 8), (64, 4), (12, 3), (24, 4), (16, 16), (6, 1)]


@pytest.mark.parametrize("p, c", SHAPES)
def test_every_algorithm_on_nodes_takes_its_closed_form_time_for_every_number_of_nics(p, c):
    count = 2 ** 6 * 3 * 5                       # equal blocks for every shape above
    claimed = 0
    for name in two_level.NODE_ALGORITHMS:
        if not two_level.exact_on_nodes(name, p, count, c):
            continue
        claimed += 1
        for nics in sorted({1, 2, c}):
            seconds, _, _ = simulated(name, p, c, nics, count)
            form = two_level.predict_on_nodes(name, p, 4 * count, c, INTRA, INTER, nics if nics < c else None)
            assert seconds == pytest.approx(form, rel=1e-12), (name, p, c, nics)
    powers = p % c == 0 and all(k & (k - 1) == 0 for k in (c, p // c))
    assert claimed == (7 if powers else 4 if c & (c - 1) else 5), claimed    # the form is claimed where it should be


@pytest.mark.parametrize("p", [6, 7, 10])
@pytest.mark.parametrize("nics", [1, 2])
def test_a_short_last_node_folds_in_through_its_shared_nics_in_the_closed_form_time(p, nics):
    # c = 4: p mod 4 = 2, 3, 2 folded ranks, ceil(f / K) of them one after another on a NIC each way
    c, count = 4, 4 * 2 * 3 * 5
    assert two_level.exact_on_nodes("hierarchical", p, count, c)
    seconds, _, _ = simulated("hierarchical", p, c, nics, count)
    form = two_level.predict_hierarchical(p, 4 * count, c, INTRA, INTER, nics_per_node=nics)
    assert seconds == pytest.approx(form, rel=1e-12), (p, nics)


def test_the_two_level_form_by_hand():
    # p = 8, c = 4, two nodes, one NIC: the node's ring, 3 steps of n/4 each way; across, Rabenseifner
    # on 2 nodes of n/4: a halving and a doubling step of n/8, the 4 ranks' 8 messages through one port
    a_i, b_i, a_e, b_e, n = 1.0, 0.01, 10.0, 0.1, 800
    wire = n / 8 * b_e                                      # 10: the port is busy 4 x 10 = 40 > 10 + 10
    shared = 2 * 4 * wire + a_e                             # bandwidth-bound: the port busy from first to last
    by_hand = 2 * 3 * (a_i + n / 4 * b_i) + shared
    assert two_level.predict_hierarchical(8, n, 4, (a_i, b_i), (a_e, b_e), nics_per_node=1) == pytest.approx(by_hand)
    assert two_level.predict_hierarchical(8, n, 4, (a_i, b_i), (a_e, b_e)) == pytest.approx(
        2 * 3 * (a_i + n / 4 * b_i) + 2 * (a_e + wire))     # a port per rank: the four at once


@pytest.mark.parametrize("steps, size, sharing", [(6, 1000, 4), (6, 10, 4), (1, 500, 8), (9, 300, 1), (4, 80, 3)])
def test_a_shared_port_takes_the_larger_of_its_ranks_chains_and_its_bytes(steps, size, sharing):
    alpha, beta = 5.0, 0.02
    wire = size * beta
    latency_bound = steps * (alpha + wire) + (sharing - 1) * wire
    bandwidth_bound = steps * sharing * wire + alpha
    assert two_level.shared_port([size] * steps, alpha, beta, sharing) == pytest.approx(
        max(latency_bound, bandwidth_bound))
    assert two_level.shared_port([size] * steps, alpha, beta, sharing) <= steps * (alpha + sharing * wire) + 1e-9


# ---- the NIC rule, by hand ------------------------------------------------------------------------

@pytest.mark.parametrize("nics, expected", [(1, (15.0, 25.0)), (2, (15.0, 15.0))])
def test_two_ranks_of_a_node_sending_off_it_at_once_take_turns_on_one_nic(nics, expected):
    # ranks 0, 1 on node 0 each send 100 bytes to ranks 2, 3 on node 1 at once; ranks 4, 5 (node 2)
    # talk inside their node meanwhile. L = 5 between nodes, G = 0.1: one message 5 + 10 = 15
    arrived = {}

    def program(comm):
        rank, message = comm.rank, np.zeros(25, np.float32)
        if rank in (0, 1, 4):
            comm.Send(message, {0: 2, 1: 3, 4: 5}[rank], 0)
        else:
            comm.Recv(message, {2: 0, 3: 1, 5: 4}[rank], 0)
        arrived[rank] = comm.engine.clock[rank]
    Engine(Topology(6, 2, LogGP(L=1.0, G=0.01), LogGP(L=5.0, G=0.1), nics)).run(program, SimComm)
    assert (min(arrived[2], arrived[3]), max(arrived[2], arrived[3])) == pytest.approx(expected)
    assert arrived[5] == pytest.approx(1.0 + 100 * 0.01)       # inside a node: no NIC


def test_as_many_nics_as_ranks_is_a_port_per_rank_and_one_nic_is_not():
    p, c, count = 32, 4, 32 * 1024
    for name in two_level.NODE_ALGORITHMS:
        own, _, _ = simulated(name, p, c, c, count)
        assert simulated(name, p, c, c + 3, count)[0] == own, name
    assert simulated("rabenseifner", p, c, 1, count)[0] > 1.5 * simulated("rabenseifner", p, c, c, count)[0]


# ---- the two-level allreduce: results, counts, bits ---------------------------------------------

@pytest.mark.parametrize("p, c", [(7, 3), (10, 4), (5, 2), (9, 4), (6, 6), (6, 8), (11, 1)])
def test_two_level_sums_are_exact_and_its_messages_are_its_counts_in_the_simulator(p, c):
    count, results = 23, {}

    def program(comm):
        mine = fill(comm.rank, count, "float64")
        hierarchical.hierarchical_allreduce_in_place(comm, mine, "sum", ranks_per_node=c)
        results[comm.rank] = mine
    engine = Engine(Topology(p, c, *LINKS), record=True)
    engine.run(program, SimComm)
    exact = np.sum([fill(rank, count, "float64") for rank in range(p)], axis=0)
    assert all(np.array_equal(results[rank], exact) for rank in range(p))
    for rank in range(p):
        sent = [m for m in engine.log if m[0] == rank]
        formula = two_level.per_rank_hierarchical(p, count, 8, rank, c)
        assert (len(sent), sum(m[3] for m in sent)) == (formula.messages, formula.bytes_sent), (rank, sent)


@pytest.mark.parallel(nprocs=[3, 4])
def test_two_level_messages_equal_the_per_rank_counts_on_real_ranks():
    comm = MPI.COMM_WORLD
    wrong = []
    for c in range(1, comm.size + 2):
        for across in (None, "ring", "rabenseifner"):
            for length, dtype in ((0, "float32"), (5, "float64"), (26, "int32")):
                traced = trace.TracedComm(comm)
                result = hierarchical.allreduce(traced, fill(comm.rank, length, dtype), ranks_per_node=c,
                                                across=across, check=False)
                formula = two_level.per_rank_hierarchical(comm.size, length, np.dtype(dtype).itemsize, comm.rank, c,
                                                          across)
                counted = trace.counts(traced.messages, comm.rank)
                exact = np.sum([fill(rank, length, dtype) for rank in range(comm.size)], axis=0).astype(dtype)
                if counted != (formula.messages, formula.bytes_sent, formula.bytes_reduced) or \
                        not np.array_equal(result, exact):
                    wrong.append((c, across, length, dtype, counted, formula))
    parallel_assert(not wrong, f"rank {comm.rank} (c, across, length, dtype, traced, formula): {wrong[:3]}")


@pytest.mark.parallel(nprocs=[3, 4])
def test_two_level_gives_the_flat_rings_bits_on_one_node_and_on_nodes_of_one():
    comm = MPI.COMM_WORLD
    mine = np.random.default_rng(comm.rank).standard_normal(37).astype(np.float32)
    flat = ring.allreduce(comm, mine)
    one_node = hierarchical.allreduce(comm, mine, ranks_per_node=comm.size)
    nodes_of_one = hierarchical.allreduce(comm, mine, ranks_per_node=1, across="ring")
    parallel_assert(flat.tobytes() == one_node.tobytes() == nodes_of_one.tobytes(),
                    f"rank {comm.rank}: ring {flat[:3]}, c = p {one_node[:3]}, c = 1 {nodes_of_one[:3]}")
    parallel_assert(collectives.ALGORITHMS[-2:] == ("hierarchical", "hierarchical_tree"), "both forms by name")


# ---- rank placement: the hierarchies assume blocks of consecutive ranks per node ----------------

@pytest.mark.parametrize("placement, blocks", [
    ("AAAABBBB", True), ("AAAABBB", True), ("AAAA", True), ("A", True), ("AABBCC", True),
    ("ABABABAB", False),                  # round robin (mpiexec --map-by node)
    ("AAABBBB", False),                   # the short node first: node k is not ranks k c .. k c + c - 1
    ("AABBAA", False),                    # a node in two runs
    ("AAAABBCC", False),                  # nodes of unequal size before the last
])
def test_block_placement_is_recognised_from_each_ranks_node(placement, blocks):
    assert nodes.in_blocks(list(placement)) is blocks


class _Rank:
    def __init__(self, rank):
        self.rank = rank

    def Get_rank(self):
        return self.rank


def test_round_robin_placement_warns_once_on_rank_0_only(monkeypatch, capsys):
    monkeypatch.setattr(nodes, "_WARNED", False)
    nodes.warn_unless_blocks(_Rank(1), [0, 1, 0, 1])
    nodes.warn_unless_blocks(_Rank(0), [0, 0, 2, 2])
    assert capsys.readouterr().err == ""
    nodes.warn_unless_blocks(_Rank(0), [0, 1, 0, 1])
    nodes.warn_unless_blocks(_Rank(0), [0, 1, 0, 1])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: ") and "MINIDL_RANKS_PER_NODE" in err and "block" in err
