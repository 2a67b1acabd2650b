"""collectives.sim and collectives.sim.simulate: the hearts on a simulated LogGP network.

The simulated times are checked against collectives.model.cost's closed forms (alpha-beta only: L = alpha,
G = beta, o = g = 0), where the vector splits into equal blocks; the messages against the tracer's
record of the same allreduce on real MPI ranks; the results against the exact sum, computed here
with numpy from every rank's fill values. The engine's LogGP rules (o, g, port sharing) are checked
on hand-timed examples.
"""
import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mpi4py import MPI
from pytest_mpi import parallel_assert

import collectives
from algorithms.core import run as algorithm_run
from algorithms.core.cli import SettingError
from collectives import auto, hierarchical, hierarchical_tree, trace
from collectives.fold import largest_power_of_two
from collectives.model import cost, two_level
from collectives.sim import Deadlock, Engine, FatTree, LogGP, SimComm, Sized, Topology, alpha_beta, simulate
from collectives.table import HEARTS
from tests import strategies
from tests.helpers import ENV, fill, same_on_every_rank
from tests.test_collectives import expected_allreduce

ALPHA, BETA = 3.7e-6, 2.3e-10                 # between nodes (and everywhere, on one node)
INTRA_ALPHA, INTRA_BETA = 0.6e-6, 0.7e-10
FLAT = ("naive", "tree", "butterfly", "ring", "rabenseifner", "auto")
TWO_LEVEL = ("hierarchical", "hierarchical_tree")
MODULES = {"hierarchical": hierarchical, "hierarchical_tree": hierarchical_tree}


def run(topology, heart, count, dtype="float32", sizes_only=False, record=False):
    """(seconds, engine, results by rank): `heart` on every rank, rank r holding fill(r, count)."""
    results = {}

    def program(comm):
        rank = comm.Get_rank()
        data = Sized(count, dtype) if sizes_only else fill(rank, count, dtype)
        if topology.ranks > 1 and count:
            heart(comm, data, "sum")
        results[rank] = data

    engine = Engine(topology, move_data=not sizes_only, record=record)
    return engine.run(program, SimComm), engine, results


def even_count(p, size_class):
    """Elements that split evenly into p blocks and into pof2 blocks: small, middle, about 1 MiB."""
    unit = np.lcm(p, largest_power_of_two(p))
    return int(unit * {0: 1, 1: 5, 2: -(-(1 << 18) // unit)}[size_class])


# ---- times: the closed forms, exactly ---------------------------------------------------------

@pytest.mark.parametrize("p", range(2, 65))
def test_alpha_beta_simulation_equals_every_closed_form(p):
    count = even_count(p, p % 3)                 # each p one size; the sizes take turns over p
    nbytes = 4 * count
    topology = alpha_beta(p, ALPHA, BETA)
    for name in FLAT:
        seconds, _, _ = run(topology, HEARTS[name], count, sizes_only=True)
        model = auto.choose_name(nbytes, p) if name == "auto" else name
        assert seconds == pytest.approx(cost.predict(model, p, nbytes, ALPHA, BETA), rel=1e-12), (name, p, nbytes)
    for c in (3, 4) if p > 12 else sorted({1, 3, 4, p}):    # node sizes that divide p and that do not
        nodes = -(-p // c)
        count_h = int(np.lcm.reduce([count, nodes, c * (p // c)]))        # even blocks in and across nodes
        on_nodes = Topology(p, c, LogGP(L=INTRA_ALPHA, G=INTRA_BETA), LogGP(L=ALPHA, G=BETA))   # one NIC per node
        for name in TWO_LEVEL:
            if name == "hierarchical" and p % c:
                continue                             # a short last node folds in: no exact form (test_two_level.py)
            seconds, _, _ = run(on_nodes, HEARTS[name], count_h, sizes_only=True)
            expected = two_level.predict_on_nodes(name, p, 4 * count_h, c, (INTRA_ALPHA, INTRA_BETA), (ALPHA, BETA), 1)
            assert two_level.exact_on_nodes(name, p, count_h, c), (name, p, c, count_h)
            assert seconds == pytest.approx(expected, rel=1e-12), (name, p, c, count_h)


def test_the_tree_forms_closed_form_by_hand():
    # p = 10, c = 4: nodes of 4, 4, 2 ranks; ceil(lg 4) = 2 tree levels up and down; 3 leaders, a ring
    a_i, b_i, a_e, b_e, n = 1.0, 0.01, 10.0, 0.1, 300
    by_hand = 2 * 2 * (a_i + n * b_i) + 2 * 2 * a_e + 2 * 2 / 3 * n * b_e
    assert two_level.predict_hierarchical_tree(10, n, 4, (a_i, b_i), (a_e, b_e)) == pytest.approx(by_hand)
    # 4 nodes of 2: a power of two of leaders runs Rabenseifner (2 lg 4 alpha_e), one node is a tree
    assert two_level.predict_hierarchical_tree(8, n, 2, (a_i, b_i), (a_e, b_e)) == pytest.approx(
        2 * (a_i + n * b_i) + 4 * a_e + 2 * 3 / 4 * n * b_e)
    assert two_level.predict_hierarchical_tree(8, n, 8, (a_i, b_i), (a_e, b_e)) == pytest.approx(6 * (a_i + n * b_i))


def test_loggp_overhead_gap_and_ports_by_hand():
    # rank 0 sends two 100-byte messages to rank 1 with Isend; o = 1, g = 50, L = 3, G = 0.1
    link = LogGP(L=3.0, o=1.0, g=50.0, G=0.1)
    times = {}

    def program(comm):
        if comm.rank == 0:
            first, second = comm.Isend(np.zeros(25, np.float32), 1, 5), comm.Isend(np.zeros(25, np.float32), 1, 6)
            collectives.sim.engine.Request.Waitall([first, second])
        else:
            buffers = np.empty(25, np.float32), np.empty(25, np.float32)
            comm.Recv(buffers[0], 0, 5)
            times["first"] = comm.engine.clock[1]
            comm.Recv(buffers[1], 0, 6)
        times[comm.rank] = comm.engine.clock[comm.rank]

    Engine(Topology(2, 2, link, link)).run(program, SimComm)
    # first: posted at o = 1, arrives 1 + 3 + 10 = 14, taken in at 15; second: posted at 2, but the
    # port is busy until 1 + max(g, 100 G) = 51: arrives 51 + 13 = 64, taken in at 65
    assert times["first"] == pytest.approx(15.0)
    assert times[1] == pytest.approx(65.0) and times[0] == pytest.approx(64.0)


def test_sizes_only_takes_the_time_and_messages_of_the_run_with_data():
    for name in ("ring", "rabenseifner", "auto") + TWO_LEVEL:
        topology = Topology(12, 5, LogGP(L=INTRA_ALPHA, G=INTRA_BETA), LogGP(L=ALPHA, G=BETA))
        with_data, engine, _ = run(topology, HEARTS[name], 1001)
        sizes_only, sized, _ = run(topology, HEARTS[name], 1001, sizes_only=True)
        assert (sizes_only, sized.messages, sized.bytes) == (with_data, engine.messages, engine.bytes), name


# ---- results: the exact sum --------------------------------------------------------------------

@pytest.mark.parametrize("name, p, c", [(name, p, c) for name in FLAT for p, c in ((7, 7), (16, 16))]
                         + [(name, p, c) for name in TWO_LEVEL for p, c in ((7, 3), (16, 4), (1024, 32))]
                         + [("tree", 1024, 1024)])
def test_results_equal_the_exact_sum(name, p, c):
    count = 37
    _, _, results = run(Topology(p, c), HEARTS[name], count, dtype="float64")
    exact = np.sum([fill(rank, count, "float64") for rank in range(p)], axis=0)
    wrong = [rank for rank in range(p) if not np.array_equal(results[rank], exact)]
    assert not wrong, f"{name}, p = {p}: ranks {wrong[:5]} got {results[wrong[0]][:5]}, expected {exact[:5]}"


# ---- messages: the tracer's, on real MPI ranks ------------------------------------------------

@pytest.mark.parallel(nprocs=[3, 4])
def test_messages_equal_the_tracers_record_of_a_real_run():
    comm = MPI.COMM_WORLD
    count, mismatched = 37, []
    for name in FLAT + TWO_LEVEL:
        traced = trace.TracedComm(comm)
        mine = fill(comm.rank, count, "float64")
        if name in TWO_LEVEL:
            MODULES[name].allreduce(traced, mine, ranks_per_node=2, check=False)
        else:
            collectives.allreduce(traced, mine, algorithm=name, check=False)
        real = trace.gather(traced)
        if comm.rank == 0:                           # an error here goes to every rank's assert, not a hang
            try:
                _, engine, _ = run(Topology(comm.size, 2), HEARTS[name], count, dtype="float64", record=True)
                simulated = Counter(engine.log)
            except Exception as error:                   # noqa: BLE001
                mismatched.append((name, repr(error)))
                continue
            sent = Counter((m.rank, m.peer, m.tag, m.nbytes) for m in real if m.direction == "send")
            if sent != simulated:
                mismatched.append((name, sorted((sent - simulated).items())[:3],
                                   sorted((simulated - sent).items())[:3]))
    mismatched = comm.bcast(mismatched, root=0)
    parallel_assert(not mismatched, f"real run vs simulation (real only, simulated only): {mismatched}")


@pytest.mark.parallel(nprocs=[1, 3, 4])          # c = 1 .. p + 1: nodes that divide p and that do not
def test_both_hierarchies_on_real_ranks_equal_the_exact_reduction_for_every_node_size():
    comm = MPI.COMM_WORLD
    for module in MODULES.values():
        for c in range(1, comm.size + 2):
            for op, reduce in (("sum", np.sum), ("max", np.max)):
                for length in (0, 1, 13):
                    exact = reduce(np.stack([fill(rank, length, "float32") for rank in range(comm.size)]), axis=0)
                    result = module.allreduce(comm, fill(comm.rank, length, "float32"), op=op, ranks_per_node=c)
                    in_place = fill(comm.rank, length, "float32")
                    module.allreduce(comm, MPI.IN_PLACE, in_place, op=op, ranks_per_node=c, across="ring")
                    parallel_assert(bool(np.array_equal(result, exact)) and bool(np.array_equal(in_place, exact)),
                                    f"rank {comm.rank}, {module.__name__}, c = {c}, {op} of {length}: {result[:5]}, "
                                    f"{in_place[:5]}, expected {exact[:5]}")


@pytest.mark.parallel(nprocs=[2, 3, 4])
@settings(max_examples=6)
@given(c=st.integers(1, 5), length=st.integers(0, 40), dtype=strategies.collective_dtypes,
       op=strategies.reduction_ops, mode=st.sampled_from(["separate", "IN_PLACE", "same array"]),
       across=st.sampled_from([None, "ring", "rabenseifner"]), name=st.sampled_from(TWO_LEVEL))
def test_both_hierarchies_on_drawn_node_sizes_dtypes_ops_and_modes(c, length, dtype, op, mode, across, name):
    comm = MPI.COMM_WORLD
    mine = fill(comm.rank, length, dtype)
    if mode == "separate":
        result = MODULES[name].allreduce(comm, mine, np.empty_like(mine), op=op, ranks_per_node=c, across=across)
    else:
        result = mine.copy()
        MODULES[name].allreduce(comm, MPI.IN_PLACE if mode == "IN_PLACE" else result, result, op=op,
                                ranks_per_node=c, across=across)
    expected = expected_allreduce(comm.size, length, dtype, op)
    parallel_assert(bool(np.array_equal(result, expected)) and same_on_every_rank(comm, result)
                    and bool(np.array_equal(mine, fill(comm.rank, length, dtype))),
                    f"rank {comm.rank}, c = {c}, {op} {dtype} {mode}: {result[:5]}, expected {expected[:5]}")


# ---- the engine's own rules ------------------------------------------------------------------

def test_a_receive_nobody_sends_is_reported_as_a_deadlock():
    def program(comm):
        comm.Recv(np.empty(1), source=1 - comm.rank, tag=3)
    with pytest.raises(Deadlock, match="receive from 1 tag 3"):
        Engine(alpha_beta(2, 1.0, 0.0)).run(program, SimComm)


def test_a_message_longer_than_its_receive_buffer_is_refused():
    def program(comm):
        if comm.rank == 0:
            comm.Send(np.zeros(4), 1, 0)
        else:
            comm.Recv(np.empty(3), 0, 0)
    with pytest.raises(ValueError, match="truncated"):
        Engine(alpha_beta(2, 1.0, 0.0)).run(program, SimComm)


def test_split_barrier_and_proc_null_behave_as_in_mpi():
    seen = {}

    def program(comm):
        half = comm.Split(comm.rank % 2, -comm.rank)          # key reverses the order
        buffer = np.array([float(comm.rank)])
        right = (half.rank + 1) % half.size
        half.Sendrecv(buffer.copy(), right, 1, buffer, (half.rank - 1) % half.size, 1)
        comm.Send(buffer, MPI.PROC_NULL, 0)
        comm.Barrier()
        seen[comm.rank] = (half.rank, half.size, float(buffer[0]), comm.engine.clock[comm.rank])

    Engine(alpha_beta(4, 1.0, 0.0)).run(program, SimComm)
    # evens {0, 2}: rank 2 first (key -2 < 0); each receives the other's rank; everyone leaves the barrier at 1
    assert seen == {0: (1, 2, 2.0, 1.0), 1: (1, 2, 3.0, 1.0), 2: (0, 2, 0.0, 1.0), 3: (0, 2, 1.0, 1.0)}


# ---- the command line ---------------------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--ranks", "0", "--bytes", "64"], "--ranks must be an integer >= 1"),
    (["--ranks", "x", "--bytes", "64"], "--ranks must be an integer"),
    (["--ranks", "4", "--bytes", "6"], "--bytes must be >= 0 and a multiple of 4"),
    (["--ranks", "4", "--bytes", "lots"], "--bytes must be a size"),
    (["--ranks", "4", "--bytes", "64", "--ranks-per-node", "0"], "--ranks-per-node must be an integer >= 1"),
    (["--ranks", "4", "--bytes", "64", "--nics-per-node", "0"], "--nics-per-node must be an integer >= 1"),
    (["--ranks", "4", "--bytes", "64", "--nics-per-node", "1.5"], "--nics-per-node must be an integer"),
    (["--ranks", "4", "--bytes", "64", "--algorithms", "ring,hypercube"], "unknown --algorithms hypercube"),
    (["--ranks", "4", "--bytes", "64", "--alpha", "-1"], "--alpha must be a finite number >= 0"),
    (["--ranks", "4", "--bytes", "64", "--beta", "nan"], "--beta must be a finite number"),
    (["--ranks", "4", "--bytes", "64", "--json", "/no/such/folder/out.json"], "--json"),
    (["--bytes", "64"], "the following arguments are required: --ranks"),
    (["--ranks", "4", "--bytes", "64", "--uplinks", "2"], "--uplinks needs --nodes-per-switch"),
    (["--ranks", "4", "--bytes", "64", "--nodes-per-switch", "2", "--uplinks", "0"], "--uplinks must be an integer "
                                                                                     ">= 1"),
])
def test_bad_flags_stop_with_one_error_line_and_status_2(flags, message, capsys):
    with pytest.raises(SystemExit) as stop:
        simulate.main(flags)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_python_m_prints_the_table_and_writes_json(tmp_path):
    path = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, "-m", "collectives.simulate", "--ranks", "8", "--bytes", "2048",
                           "--ranks-per-node", "4", "--intra-alpha", "1e-6", "--intra-beta", "1e-11",
                           "--json", str(path)], capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 0, done.stderr
    rows = json.loads(path.read_text())
    assert [row["algorithm"] for row in rows] == list(collectives.ALGORITHMS)
    for row in rows:
        assert {"algorithm", "ranks", "bytes", "seconds", "closed_form_seconds"} <= set(row)
        assert (row["ranks"], row["bytes"], row["target"], row["met"]) == (8, 2048, "=model", True), row
    assert "hierarchical_tree" in done.stdout and "=model" in done.stdout and " NO" not in done.stdout


def test_allreduce_hierarchical_refuses_a_bad_node_size_from_the_environment_before_training(monkeypatch):
    monkeypatch.setenv("MINIDL_RANKS_PER_NODE", "two")
    for name in TWO_LEVEL:
        with pytest.raises(SettingError, match=f"--allreduce {name}: MINIDL_RANKS_PER_NODE must be an integer >= 1"):
            algorithm_run.allreduce_function(name)
    monkeypatch.setenv("MINIDL_RANKS_PER_NODE", "2")
    assert hierarchical.node_size(None) == 2 and algorithm_run.allreduce_function("hierarchical") is not None


# ---- the two-level fat tree (collectives.sim.FatTree) -----------------------------------------------

def on_fat_tree(topology, name, count, nodes_per_switch, uplinks):
    """(seconds, results by rank) of `name`'s heart on a FatTree, rank r holding fill(r, count)."""
    results = {}

    def program(comm):
        data = fill(comm.Get_rank(), count, "float32")
        HEARTS[name](comm, data, "sum")
        results[comm.Get_rank()] = data
    engine = FatTree(topology, nodes_per_switch=nodes_per_switch, uplinks=uplinks)
    return engine.run(program, SimComm), results


@pytest.mark.parametrize("p, c, switch", [(12, 2, 2), (8, 1, 4), (10, 1, 3)])
def test_a_fat_tree_at_full_bisection_times_every_allreduce_as_the_flat_network(p, c, switch):
    topology = Topology(p, c, LogGP(L=INTRA_ALPHA, G=INTRA_BETA), LogGP(L=ALPHA, G=BETA))
    for name in FLAT + TWO_LEVEL:
        flat, _, _ = run(topology, HEARTS[name], 301)
        seconds, results = on_fat_tree(topology, name, 301, switch, switch * c)     # one uplink per rank under a leaf
        assert seconds == flat, name
        expected = expected_allreduce(p, 301, "float32", "sum")
        assert all(np.array_equal(results[r], expected) for r in range(p)), name


@pytest.mark.parametrize("switch, uplinks", [(4, 1), (4, 2), (3, 2), (4, 4)])
def test_messages_leaving_a_leaf_at_once_take_turns_on_its_uplinks(switch, uplinks):
    """The `switch` ranks of leaf 0 each send m bytes to the rank `switch` places on, under leaf 1, at
    once: with K uplinks they go K at a time, so the last arrives at L + ceil(S / K) m G."""
    m, link = 1000, LogGP(L=5.0, G=0.5)
    done = {}

    def program(comm):
        rank, message = comm.Get_rank(), np.zeros(m // 4, np.float32)
        if rank < switch:
            comm.Send(message, rank + switch, 3)
        else:
            comm.Recv(message, rank - switch, 3)
        done[rank] = comm.engine.clock[rank]
    seconds = FatTree(Topology(2 * switch, 1, link, link), nodes_per_switch=switch, uplinks=uplinks).run(
        program, SimComm)
    turns = -(-switch // uplinks)
    assert seconds == pytest.approx(5.0 + turns * m * 0.5)
    assert sorted(done.values())[0] == pytest.approx(5.0 + m * 0.5)          # the first K go at once


def test_the_ring_in_block_order_keeps_its_closed_form_on_one_uplink_per_leaf():
    """At each step of the ring one message leaves each leaf (the leaf's last rank to the next leaf's
    first): one uplink is enough, so the time stays 2 (p - 1) (alpha + n / p beta)."""
    p, count = 16, 16 * 25
    seconds, _ = on_fat_tree(alpha_beta(p, ALPHA, BETA, ranks_per_node=1), "ring", count, 4, 1)
    assert seconds == pytest.approx(cost.predict("ring", p, 4 * count, ALPHA, BETA), rel=1e-12)
    large = count * 64                           # 100 KiB: the bytes outweigh the latencies
    limited, _ = on_fat_tree(alpha_beta(p, ALPHA, BETA, ranks_per_node=1), "rabenseifner", large, 4, 1)
    # Rabenseifner's first halving steps (distance 8 and 4) send 4 messages out of each leaf at once
    assert limited > 2 * cost.predict("rabenseifner", p, 4 * large, ALPHA, BETA)
