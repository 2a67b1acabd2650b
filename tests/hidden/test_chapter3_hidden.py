"""Hidden: the collectives of chapter 3 (tasks 3.1-3.9) on awkward rank counts, lengths and dtypes.

The visible tests (tests/test_collectives.py) draw lengths and dtypes at random, mostly on 2 to 5
ranks. Here the MPI checks run on p = 3, 5, 6 and 7 (not a power of two: the fold-in's pairs, the
ring's uneven blocks, the binomial tree's missing children; the butterfly's and Rabenseifner's
hearts also on p = 4, where they read `source` in their first round), on lengths below p (empty blocks),
around multiples of p and of the largest power of two, on every dtype collectives.check.DTYPES
promises, every op, in place and out of place, and with the heart called directly with a
`source` and a `data` full of garbage.

Expected values never come from collectives: every rank's fill depends only on (rank, index), so
each rank stacks all of them and reduces with numpy. The fills are small integers (exact in
float16 and in every sum), and each index has its maximum and its minimum on different ranks.
The cost formulas (task 3.9) are checked against a schedule simulator written here, message by
message, from the headers' pictures, and against traced runs with other item sizes.
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

import collectives
from collectives import butterfly, naive, rabenseifner, ring, trace, tree
from collectives.buffers import block_counts, block_offsets
from collectives.check import DTYPES, MismatchError
from collectives.fold import fold_in, fold_out, largest_power_of_two
from collectives.model import cost
from collectives.tags import CHECK
from tests.helpers import results_of, same_on_every_rank, traced_costs

AWKWARD_P = [3, 5, 6, 7]
REAL = [name for name in DTYPES if not name.startswith("complex")]
BASE_OPS = ["sum", "max", "min"]
OPS = BASE_OPS + ["mean"]


def lengths_for(size):
    """Lengths that stress the block arithmetic at p = size: 1, below p, around p and 2p, odd."""
    pof2 = largest_power_of_two(size)
    return sorted({1, 2, size - 1, size + 1, pof2 + 1, 2 * size + 3, 3 * pof2 - 1, 29})


def fill(rank, length, dtype):
    """Small rank-dependent integers: exact in every dtype; non-negative for unsigned ones."""
    index = np.arange(length)
    values = (index * 5 + rank * 3) % 13 + (index % 3) * rank          # 0 .. 12 + 2 (p - 1)
    dtype = np.dtype(dtype)
    if dtype.kind in "fc" or dtype.kind == "i":
        values = values - 7
    if dtype.kind == "c":
        return (values + 1j * ((index + 2 * rank) % 5)).astype(dtype)
    return values.astype(dtype)


def stacked(size, length, dtype):
    return np.stack([fill(rank, length, dtype) for rank in range(size)]) if length else \
        np.zeros((size, 0), dtype=dtype)


def expected(size, length, dtype, op):
    """op over ranks, computed by numpy from every rank's fill; mean divides in the buffer's dtype."""
    rows = stacked(size, length, dtype)
    result = {"sum": np.sum, "mean": np.sum, "max": np.max, "min": np.min}[op](rows, axis=0).astype(dtype)
    if op == "mean":
        if result.dtype.kind in "iu":
            result //= size
        else:
            result /= size
    return result


def ops_for(dtype):
    return ["sum", "mean"] if np.dtype(dtype).kind == "c" else OPS


def garbage(length, dtype):
    """What a fresh recvbuf or scratch may hold: values no reduction gives (NaN where it can)."""
    if np.dtype(dtype).kind in "fc":
        return np.full(length, np.nan, dtype=dtype)
    return np.full(length, 99, dtype=dtype)


def report(comm, what, got, want):
    return f"rank {comm.rank} of {comm.size}, {what}: got {got[:10]}, expected {want[:10]}"


def check_allreduce_every_dtype_and_op(algorithm):
    """Every promised dtype and op, lengths around p, out of place into a recvbuf of garbage."""
    comm = MPI.COMM_WORLD
    choices = lengths_for(comm.size)
    cases = [(dtype, op, choices[(i + j) % len(choices)]) for i, dtype in enumerate(DTYPES)
             for j, op in enumerate(ops_for(dtype))]
    cases += [("int64", op, length) for op in OPS for length in choices[1::2]]
    for dtype, op, length in cases:
        mine = fill(comm.rank, length, dtype)
        recvbuf = garbage(length, dtype)
        collectives.allreduce(comm, mine, recvbuf, op=op, algorithm=algorithm, check=False)
        want = expected(comm.size, length, dtype, op)
        parallel_assert(np.array_equal(recvbuf, want) and np.array_equal(mine, fill(comm.rank, length, dtype)),
                        report(comm, f"{algorithm} {op} of {length} {dtype}", recvbuf, want))


def check_allreduce_in_place_modes(algorithm):
    """MPI.IN_PLACE, sendbuf is recvbuf, and recvbuf=None, on every awkward length."""
    comm = MPI.COMM_WORLD
    for i, length in enumerate(lengths_for(comm.size)):
        for op in BASE_OPS[i % 3:i % 3 + 1]:
            want = expected(comm.size, length, "int64", op)
            in_place = fill(comm.rank, length, "int64")
            collectives.allreduce(comm, MPI.IN_PLACE, in_place, op=op, algorithm=algorithm, check=False)
            same = fill(comm.rank, length, "int64")
            collectives.allreduce(comm, same, same, op=op, algorithm=algorithm, check=False)
            fresh = collectives.allreduce(comm, fill(comm.rank, length, "int64"), op=op, algorithm=algorithm,
                                          check=False)
            parallel_assert(all(np.array_equal(result, want) for result in (in_place, same, fresh)),
                            f"rank {comm.rank} of {comm.size}, {algorithm} {op} of {length}: IN_PLACE {in_place[:8]}, "
                            f"same array {same[:8]}, recvbuf=None {fresh[:8]}, expected {want[:8]}")


def check_heart_with_source(heart, length, op):
    """The heart itself, out of place: `data` starts as garbage, `source` holds the input and stays."""
    comm = MPI.COMM_WORLD
    source = fill(comm.rank, length, "float64")
    data = garbage(length, "float64")
    heart(comm, data, op, source=source)
    want = expected(comm.size, length, "float64", op)
    parallel_assert(np.array_equal(data, want) and np.array_equal(source, fill(comm.rank, length, "float64")),
                    report(comm, f"{heart.__name__}({op}, source=...) of {length}", data, want))
    in_place = fill(comm.rank, length, "float64")
    heart(comm, in_place, op)
    parallel_assert(np.array_equal(in_place, want), report(comm, f"{heart.__name__}({op}) in place, {length}",
                                                           in_place, want))


def check_random_floats_identical_bits(algorithm, length):
    """Random float64 values: every rank ends with the same bytes, and the sum to rounding."""
    comm = MPI.COMM_WORLD
    every = [np.random.default_rng([11, length, rank]).standard_normal(length) for rank in range(comm.size)]
    result = collectives.allreduce(comm, every[comm.rank], algorithm=algorithm, check=False)
    parallel_assert(same_on_every_rank(comm, result), f"{algorithm}: ranks hold different bytes at p = {comm.size}")
    parallel_assert(bool(np.allclose(result, np.sum(every, axis=0), rtol=1e-12, atol=1e-12)),
                    f"rank {comm.rank}: {algorithm} sum {result[:6]}")


# ---- every allreduce of a task, on rank counts that are not powers of two ---------------------

def of_task(*names_and_tasks):
    return [pytest.param(name, marks=pytest.mark.task(task)) for name, task in names_and_tasks]


@pytest.mark.parallel(nprocs=AWKWARD_P)
@pytest.mark.parametrize("algorithm", of_task(("naive", "3.1"), ("tree", "3.2"), ("ring", "3.4"),
                                              ("butterfly", "3.7"), ("rabenseifner", "3.8")))
def test_allreduce_every_dtype_and_op(algorithm):
    check_allreduce_every_dtype_and_op(algorithm)


@pytest.mark.parallel(nprocs=AWKWARD_P)
@pytest.mark.parametrize("algorithm", of_task(("naive", "3.1"), ("ring", "3.4"), ("butterfly", "3.7"),
                                              ("rabenseifner", "3.8")))
def test_allreduce_in_place_same_array_and_allocated(algorithm):
    check_allreduce_in_place_modes(algorithm)


# ---- 3.1 naive ------------------------------------------------------------------------------

@pytest.mark.task("3.1")
@pytest.mark.parallel(nprocs=AWKWARD_P)
@pytest.mark.parametrize("op", BASE_OPS)
def test_naive_heart_reads_source_and_writes_data(op):
    check_heart_with_source(naive.naive_allreduce_in_place, 2 * MPI.COMM_WORLD.size + 1, op)


# ---- 3.2 tree reduce, 3.3 tree broadcast ----------------------------------------------------

@pytest.mark.task("3.2")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_reduce_to_every_root_every_dtype_and_op():
    comm = MPI.COMM_WORLD
    for root in range(comm.size):
        for dtype in DTYPES[root % 4::4]:
            for op in ops_for(dtype)[root % 2::2]:
                choices = lengths_for(comm.size)
                length = choices[(root + len(op)) % len(choices)]
                mine = fill(comm.rank, length, dtype)
                recvbuf = garbage(length, dtype) if comm.rank == root else None
                result = collectives.reduce(comm, mine, recvbuf, op=op, root=root, check=False)
                want = expected(comm.size, length, dtype, op)
                ok = np.array_equal(result, want) if comm.rank == root else result is None
                parallel_assert(bool(ok) and np.array_equal(mine, fill(comm.rank, length, dtype)),
                                f"rank {comm.rank} of {comm.size}, reduce {op} of {length} {dtype} to root {root}: "
                                f"{result if result is None else result[:8]}, expected {want[:8]}")


@pytest.mark.task("3.2")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_reduce_in_place_on_a_root_that_is_not_rank_0():
    comm = MPI.COMM_WORLD
    for root in range(1, comm.size):
        for op in BASE_OPS:
            length = comm.size + root
            mine = fill(comm.rank, length, "int32")
            if comm.rank == root:
                result = collectives.reduce(comm, MPI.IN_PLACE, mine, op=op, root=root, check=False)
                ok = result is mine and np.array_equal(mine, expected(comm.size, length, "int32", op))
            else:
                ok = collectives.reduce(comm, mine, None, op=op, root=root, check=False) is None
            parallel_assert(bool(ok), f"rank {comm.rank}: in-place reduce {op} to root {root}: {mine}")


# the root as a function of p: the tree is drawn around it (relative ranks), so each is another tree
ROOTS = {"rank_1": lambda size: 1, "middle": lambda size: size // 2, "last": lambda size: size - 1}


@pytest.mark.task("3.2")
@pytest.mark.parallel(nprocs=AWKWARD_P)
@pytest.mark.parametrize("root_name", ROOTS)
@pytest.mark.parametrize("op", BASE_OPS)
def test_tree_reduce_heart_with_source_leaves_the_input_and_fills_the_roots_data(op, root_name):
    comm = MPI.COMM_WORLD
    length = comm.size + 2
    for root in (ROOTS[root_name](comm.size), 0):
        source = fill(comm.rank, length, "float64")
        data = garbage(length, "float64")
        tree.tree_reduce_in_place(comm, data, op, root=root, source=source)
        want = expected(comm.size, length, "float64", op)
        ok = np.array_equal(source, fill(comm.rank, length, "float64"))
        if comm.rank == root:
            ok = ok and np.array_equal(data, want)
        parallel_assert(bool(ok), report(comm, f"tree_reduce_in_place({op}, root={root}, source=...)", data, want))


@pytest.mark.task("3.3")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_broadcast_from_every_root_every_dtype():
    comm = MPI.COMM_WORLD
    for root in range(comm.size):
        for dtype in DTYPES[root % 3::3]:
            for length in (1, comm.size + root):
                buf, want = fill(comm.rank, length, dtype), fill(root, length, dtype)
                collectives.broadcast(comm, buf, root=root, check=False)
                parallel_assert(np.array_equal(buf, want),
                                report(comm, f"broadcast of {length} {dtype} from {root}", buf, want))


@pytest.mark.task("3.3")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_broadcast_heart_overwrites_garbage_on_every_other_rank():
    comm = MPI.COMM_WORLD
    length = 2 * comm.size - 1
    for root in range(comm.size):
        data = fill(root, length, "float32") if comm.rank == root else garbage(length, "float32")
        tree.tree_broadcast_in_place(comm, data, root=root)
        parallel_assert(np.array_equal(data, fill(root, length, "float32")),
                        report(comm, f"tree_broadcast_in_place from {root}", data, fill(root, length, "float32")))


@pytest.mark.task("3.3")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_broadcast_sends_each_rank_its_vector_once_down_the_binomial_tree():
    # every rank but the root receives exactly once, and p - 1 messages are sent in all
    comm = MPI.COMM_WORLD
    traced = trace.TracedComm(comm)
    for root in (1, comm.size - 1):
        traced.reset()
        data = np.full(5, float(comm.rank))
        tree.tree_broadcast_in_place(traced, data, root=root)
        received = [m for m in traced.messages if m.direction == "recv"]
        sent = comm.allreduce(sum(m.direction == "send" for m in traced.messages))
        ok = len(received) == (0 if comm.rank == root else 1) and sent == comm.size - 1 and np.all(data == root)
        parallel_assert(bool(ok), f"rank {comm.rank}, root {root}: received {len(received)} times, {sent} sends "
                                  f"in all, data {data}")


# ---- 3.4 ring reduce-scatter, 3.5 ring allgather --------------------------------------------

@pytest.mark.task("3.4")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_reduce_scatter_every_dtype_op_and_uneven_length():
    comm = MPI.COMM_WORLD
    choices = lengths_for(comm.size)
    for i, dtype in enumerate(DTYPES):
        for j, op in enumerate(ops_for(dtype)):
            for length in choices[(i + j) % 3::3]:
                counts = block_counts(length, comm.size)
                start = block_offsets(counts)[comm.rank]
                mine = fill(comm.rank, length, dtype)
                result = collectives.reduce_scatter(comm, mine, op=op, check=False)
                want = expected(comm.size, length, dtype, op)[start:start + counts[comm.rank]]
                parallel_assert(result.shape == want.shape and np.array_equal(result, want)
                                and np.array_equal(mine, fill(comm.rank, length, dtype)),
                                report(comm, f"reduce_scatter {op} of {length} {dtype}", result, want))


@pytest.mark.task("3.4")
@pytest.mark.parallel(nprocs=AWKWARD_P)
@pytest.mark.parametrize("op", BASE_OPS)
def test_reduce_scatter_heart_with_source_and_in_place_gives_block_rank(op):
    comm = MPI.COMM_WORLD
    for length in lengths_for(comm.size):
        counts = block_counts(length, comm.size)
        start = block_offsets(counts)[comm.rank]
        mine = slice(start, start + counts[comm.rank])
        want = expected(comm.size, length, "float64", op)[mine]
        source = fill(comm.rank, length, "float64")
        data = garbage(length, "float64")
        ring.ring_reduce_scatter_in_place(comm, data, op, source=source)
        in_place = fill(comm.rank, length, "float64")
        ring.ring_reduce_scatter_in_place(comm, in_place, op)
        parallel_assert(np.array_equal(data[mine], want) and np.array_equal(in_place[mine], want)
                        and np.array_equal(source, fill(comm.rank, length, "float64")),
                        f"rank {comm.rank} of {comm.size}, {op} of {length}: block {counts[comm.rank]} at {start}: "
                        f"out of place {data[mine]}, in place {in_place[mine]}, expected {want}")


def ring_pattern(messages, rank, size, counts, itemsize, first):
    """None if ``messages`` are a ring's, step by step, in either direction: every send to one neighbour
    and every receive from the other, step s sending block first(rank, s, d) and receiving the block the
    neighbour sent (d = +1: blocks go right; d = -1: left); else what was seen and what a ring sends."""
    seen = [(m.direction, m.peer, m.nbytes) for m in messages]
    rings = []
    for d in (1, -1):
        want = {"send": [((rank + d) % size, counts[first(rank, s, d) % size] * itemsize) for s in range(size - 1)],
                "recv": [((rank - d) % size, counts[first(rank - d, s, d) % size] * itemsize)
                         for s in range(size - 1)]}
        if all([(peer, nbytes) for way, peer, nbytes in seen if way == direction] == want[direction]
               for direction in ("send", "recv")):
            return None
        rings.append(want)
    return f"rank {rank}: (direction, peer, bytes) in order {seen}; a ring's, one way or the other: {rings}"


def test_the_ring_pattern_takes_a_ring_either_way_and_refuses_a_direct_exchange_of_the_same_sizes():
    # (a check of the check: the grader trusts it to tell a ring from anything else that sends the same sizes)
    counts, p = block_counts(3 * 5 + 2, 5), 5
    first = lambda r, s, d: r - d * (s + 1)                                   # noqa: E731
    for d in (1, -1):
        ring_messages = [trace.Message(0, way_peer, way, counts[block % p] * 8, 0, 0, 0, 0)
                         for s in range(p - 1)
                         for way, way_peer, block in (("send", d % p, first(0, s, d)),
                                                      ("recv", -d % p, first(-d, s, d)))]
        assert ring_pattern(ring_messages, 0, p, counts, 8, first) is None
    direct = [trace.Message(0, j, "send", counts[j] * 8, 0, 0, 0, 0) for j in range(1, p)] + \
             [trace.Message(0, j, "recv", counts[0] * 8, 0, 0, 0, 0) for j in range(1, p)]
    assert ring_pattern(direct, 0, p, counts, 8, first) is not None


@pytest.mark.task("3.4")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_ring_reduce_scatter_sends_p_minus_1_blocks_of_the_uneven_sizes():
    # rank r sends blocks r - 1, r - 2, ..., r - p + 1 (all but its own), each once, to its right neighbour
    # and receives from its left (or all the other way round): peers, sizes and their order, step by step
    comm = MPI.COMM_WORLD
    traced = trace.TracedComm(comm)
    length = 3 * comm.size + 2
    counts = block_counts(length, comm.size)
    data = fill(comm.rank, length, "int64")
    ring.ring_reduce_scatter_in_place(traced, data, "sum")
    wrong = ring_pattern(traced.messages, comm.rank, comm.size, counts, 8, lambda r, s, d: r - d * (s + 1))
    parallel_assert(wrong is None, str(wrong))


@pytest.mark.task("3.5")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_allgather_every_dtype_length_and_in_place():
    comm = MPI.COMM_WORLD
    for dtype in DTYPES:
        for length in lengths_for(comm.size)[:: 1 if dtype in ("float64", "int8") else 2]:
            counts = block_counts(length, comm.size)
            offsets = block_offsets(counts)
            want = np.concatenate([fill(r, length, dtype)[offsets[r]:offsets[r] + counts[r]] for r in range(comm.size)])
            mine = fill(comm.rank, length, dtype)[offsets[comm.rank]:offsets[comm.rank] + counts[comm.rank]]
            recvbuf = garbage(length, dtype)
            collectives.allgather(comm, mine, recvbuf, check=False)
            in_place = garbage(length, dtype)
            in_place[offsets[comm.rank]:offsets[comm.rank] + counts[comm.rank]] = mine
            collectives.allgather(comm, MPI.IN_PLACE, in_place, check=False)
            parallel_assert(np.array_equal(recvbuf, want) and np.array_equal(in_place, want),
                            report(comm, f"allgather of {length} {dtype}", recvbuf, want))


@pytest.mark.task("3.5")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_allgather_heart_fills_every_block_from_its_owner():
    comm = MPI.COMM_WORLD
    for length in lengths_for(comm.size):
        counts = block_counts(length, comm.size)
        offsets = block_offsets(counts)
        data = garbage(length, "float32")
        mine = slice(offsets[comm.rank], offsets[comm.rank] + counts[comm.rank])
        data[mine] = fill(comm.rank, length, "float32")[mine]
        ring.ring_allgather_in_place(comm, data)
        want = np.concatenate([fill(r, length, "float32")[offsets[r]:offsets[r] + counts[r]] for r in range(comm.size)])
        parallel_assert(np.array_equal(data, want), report(comm, f"ring_allgather_in_place of {length}", data, want))


@pytest.mark.task("3.5")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_ring_allgather_passes_each_block_on_around_the_ring():
    # step s: rank r sends block r - s (its own first, then the one it received last) to its right
    # neighbour and receives block r - s - 1 from its left (or all the other way round)
    comm = MPI.COMM_WORLD
    traced = trace.TracedComm(comm)
    length = 3 * comm.size + 2
    counts = block_counts(length, comm.size)
    offsets = block_offsets(counts)
    data = garbage(length, "float64")
    mine = slice(offsets[comm.rank], offsets[comm.rank] + counts[comm.rank])
    data[mine] = fill(comm.rank, length, "float64")[mine]
    ring.ring_allgather_in_place(traced, data)
    wrong = ring_pattern(traced.messages, comm.rank, comm.size, counts, 8, lambda r, s, d: r - d * s)
    parallel_assert(wrong is None, str(wrong))


@pytest.mark.task("3.5")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_ring_allreduce_needs_the_allgather_on_uneven_lengths():
    comm = MPI.COMM_WORLD
    for length in lengths_for(comm.size):
        for op in BASE_OPS:
            result = collectives.allreduce(comm, fill(comm.rank, length, "int16"), op=op, algorithm="ring", check=False)
            want = expected(comm.size, length, "int16", op)
            parallel_assert(np.array_equal(result, want), report(comm, f"ring {op} of {length}", result, want))


# ---- 3.6 fold-in ----------------------------------------------------------------------------

@pytest.mark.task("3.6")
@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_fold_in_every_dtype_and_op_reduces_each_pair_and_renumbers():
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    rem = size - largest_power_of_two(size)
    for dtype in DTYPES:
        for op in (["sum"] if np.dtype(dtype).kind == "c" else BASE_OPS):
            length = 7
            data = fill(rank, length, dtype)
            newrank = fold_in(comm, data, op)
            if rank < 2 * rem and rank % 2 == 0:
                ok = newrank is None and np.array_equal(data, fill(rank, length, dtype))   # sat out, untouched
                want = fill(rank, length, dtype)
            else:
                pair = stacked(size, length, dtype)[[rank - 1, rank] if rank < 2 * rem else [rank]]
                want = {"sum": np.sum, "max": np.max, "min": np.min}[op](pair, axis=0).astype(dtype)
                ok = newrank == (rank // 2 if rank < 2 * rem else rank - rem) and np.array_equal(data, want)
            parallel_assert(bool(ok), f"rank {rank} of {size}, fold_in {op} {dtype}: new rank {newrank}, data "
                                      f"{data}, expected {want}")
            fold_out(comm, data)


@pytest.mark.task("3.6")
@pytest.mark.parallel(nprocs=AWKWARD_P)
@pytest.mark.parametrize("length", [0, 1, 2, 37])
def test_fold_in_sends_one_whole_vector_per_pair_with_the_tag_it_is_given(length):
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    rem = size - largest_power_of_two(size)
    traced = trace.TracedComm(comm)
    data = fill(rank, length, "float64")
    fold_in(traced, data, "sum", tag=CHECK)
    mine = [(m.direction, m.peer, m.nbytes, m.tag) for m in traced.messages]
    if rank >= 2 * rem:
        want = []
    elif rank % 2 == 0:
        want = [("send", rank + 1, 8 * length, CHECK)]
    else:
        want = [("recv", rank - 1, 8 * length, CHECK)]
    parallel_assert(mine == want, f"rank {rank} of {size}: fold_in's messages {mine}, expected {want}")
    fold_out(comm, data, tag=CHECK)


@pytest.mark.parallel(nprocs=AWKWARD_P)
def test_the_agreement_check_catches_a_mismatch_at_awkward_rank_counts():
    # no task's test: collectives.check agrees through MPI's own Allreduce, never a student's fold-in
    comm = MPI.COMM_WORLD
    for odd_one in (0, comm.size - 1):
        length = 6 if comm.rank == odd_one else 5
        try:
            collectives.allreduce(comm, np.ones(length), algorithm="ring", check=True)
            raised = False
        except MismatchError:
            raised = True
        parallel_assert(raised, f"rank {comm.rank} of {comm.size}: rank {odd_one}'s other length went unnoticed")
    result = collectives.allreduce(comm, fill(comm.rank, 9, "int64"), op="max", algorithm="ring", check=True)
    parallel_assert(np.array_equal(result, expected(comm.size, 9, "int64", "max")), f"rank {comm.rank}: {result}")


@pytest.mark.task("3.6")
@pytest.mark.parallel(nprocs=AWKWARD_P)
@pytest.mark.parametrize("algorithm", ["butterfly", "rabenseifner"])
def test_butterfly_and_rabenseifner_need_the_fold_in(algorithm):
    comm = MPI.COMM_WORLD
    for op in OPS:
        for length in (1, comm.size, 2 * comm.size + 1):
            result = collectives.allreduce(comm, fill(comm.rank, length, "int64"), op=op, algorithm=algorithm,
                                           check=False)
            want = expected(comm.size, length, "int64", op)
            parallel_assert(np.array_equal(result, want), report(comm, f"{algorithm} {op} of {length}", result, want))


# ---- 3.7 butterfly, 3.8 Rabenseifner --------------------------------------------------------

HEARTS = {"butterfly": butterfly.butterfly_allreduce_in_place,
          "rabenseifner": rabenseifner.rabenseifner_allreduce_in_place}
BUTTERFLY_AND_RABENSEIFNER = of_task(("butterfly", "3.7"), ("rabenseifner", "3.8"))


@pytest.mark.parallel(nprocs=[3, 4, 5, 6, 7])
@pytest.mark.parametrize("algorithm", BUTTERFLY_AND_RABENSEIFNER)
def test_heart_with_source_and_garbage_data(algorithm):
    # p = 4: the heart reads `source` in its first round (no fold-in copies it into data first)
    for op in BASE_OPS:
        for length in (1, 3, MPI.COMM_WORLD.size + 4):
            check_heart_with_source(HEARTS[algorithm], length, op)


@pytest.mark.parallel(nprocs=AWKWARD_P)
@pytest.mark.parametrize("algorithm", BUTTERFLY_AND_RABENSEIFNER)
def test_random_floats_give_the_same_bytes_on_every_rank(algorithm):
    for length in (1, 6, 31):
        check_random_floats_identical_bits(algorithm, length)


@pytest.mark.parallel(nprocs=AWKWARD_P)
@pytest.mark.parametrize("algorithm", BUTTERFLY_AND_RABENSEIFNER)
def test_messages_bytes_and_reductions_equal_the_cost_formulas_with_other_item_sizes(algorithm):
    check_traced_against_per_rank(algorithm)


# ---- 3.9 per_rank costs ---------------------------------------------------------------------

def simulate(algorithm, p, n):
    """Every message of an allreduce of n elements on p ranks, from the header's schedule:
    [(sender, receiver, elements, reduced)], reduced: the receiver combines it into its data."""
    messages = []
    if algorithm == "naive":
        messages += [(r, 0, n, True) for r in range(1, p)] + [(0, r, n, False) for r in range(1, p)]
    elif algorithm == "tree":
        for r in range(1, p):                                  # parent: clear r's lowest set bit
            parent = r - (r & -r)
            messages += [(r, parent, n, True), (parent, r, n, False)]
    elif algorithm == "ring":
        counts = block_counts(n, p)
        for step in range(p - 1):
            for r in range(p):
                messages.append((r, (r + 1) % p, counts[(r - step - 1) % p], True))
        for step in range(p - 1):
            for r in range(p):
                messages.append((r, (r + 1) % p, counts[(r - step) % p], False))
    else:
        pof2 = largest_power_of_two(p)
        rem = p - pof2
        world = [2 * q + 1 if q < rem else q + rem for q in range(pof2)]
        messages += [(2 * i, 2 * i + 1, n, True) for i in range(rem)]           # fold-in
        if algorithm == "butterfly":
            distance = 1
            while distance < pof2:
                messages += [(world[q], world[q ^ distance], n, True) for q in range(pof2)]
                distance *= 2
        else:
            counts = block_counts(n, pof2)
            windows = {q: (0, pof2) for q in range(pof2)}
            distance = pof2 // 2
            while distance >= 1:                               # halving: send the half given up
                for q in range(pof2):
                    lo, hi = windows[q]
                    mid = (lo + hi) // 2
                    give = (lo, mid) if q & distance else (mid, hi)
                    messages.append((world[q], world[q ^ distance], sum(counts[give[0]:give[1]]), True))
                windows = {q: ((lo + hi) // 2, hi) if q & distance else (lo, (lo + hi) // 2)
                           for q, (lo, hi) in windows.items()}
                distance //= 2
            distance = 1
            while distance < pof2:                             # doubling: send the window kept
                for q in range(pof2):
                    lo, hi = windows[q]
                    messages.append((world[q], world[q ^ distance], sum(counts[lo:hi]), False))
                windows = {q: (min(lo, windows[q ^ distance][0]), max(hi, windows[q ^ distance][1]))
                           for q, (lo, hi) in windows.items()}
                distance *= 2
        messages += [(2 * i + 1, 2 * i, n, False) for i in range(rem)]          # fold-out
    return messages


def simulated_costs(algorithm, p, n, itemsize):
    """Every rank's RankCost, counted from the simulated messages."""
    counted = [[0, 0, 0] for _ in range(p)]
    for sender, receiver, elements, combined in simulate(algorithm, p, n):
        counted[sender][0] += 1
        counted[sender][1] += elements * itemsize
        if combined:
            counted[receiver][2] += elements * itemsize
    return [cost.RankCost(*numbers) for numbers in counted]


@pytest.mark.task("3.9")
@pytest.mark.parametrize("algorithm", cost.ALGORITHMS)
def test_per_rank_equals_the_simulated_schedule_for_every_rank(algorithm):
    cases, expected = [], []
    for p in list(range(2, 18)) + [24, 31, 33]:
        for n in sorted({1, 2, p - 1, p, p + 1, 2 * p + 3, 3 * largest_power_of_two(p) - 1, 100}):
            for itemsize in (1, 8):
                for rank, want in enumerate(simulated_costs(algorithm, p, n, itemsize)):
                    cases.append((p, n, itemsize, rank))
                    expected.append(want)
    got = results_of(cost.per_rank, [(algorithm, *case) for case in cases], cost.RankCost)   # in one call
    wrong = [(*case, mine, want) for case, mine, want in zip(cases, got, expected) if mine != want]
    assert not wrong, f"{algorithm}: {len(wrong)} wrong, first (p, n, itemsize, rank, got, expected): {wrong[:3]}"


@pytest.mark.task("3.9")
@pytest.mark.parametrize("p", [3, 5, 6, 7, 12])
def test_per_rank_totals_balance_sends_and_receives(p):
    # over all ranks, bytes sent = bytes received, and the bytes reduced add up to the simulation's
    cases = [(algorithm, p, n, 2, rank) for algorithm in cost.ALGORITHMS for n in (1, p - 1, 2 * p + 1)
             for rank in range(p)]
    every = dict(zip(cases, results_of(cost.per_rank, cases, cost.RankCost)))            # in one call
    for algorithm in cost.ALGORITHMS:
        for n in (1, p - 1, 2 * p + 1):
            costs = [every[algorithm, p, n, 2, rank] for rank in range(p)]
            messages = simulate(algorithm, p, n)
            assert sum(c.messages for c in costs) == len(messages), (algorithm, p, n)
            assert sum(c.bytes_sent for c in costs) == 2 * sum(m[2] for m in messages), (algorithm, p, n)
            assert sum(c.bytes_reduced for c in costs) == 2 * sum(m[2] for m in messages if m[3]), (algorithm, p, n)


def check_traced_against_per_rank(algorithm, dtypes=("int8", "float16", "complex128")):
    comm = MPI.COMM_WORLD
    runs = [(algorithm, length, dtype) for dtype in dtypes for length in (1, 2, comm.size + 1, 3 * comm.size - 1)]
    for (_, length, dtype), _, measured, formula in traced_costs(comm, runs, values=fill):
        parallel_assert(measured == (formula.messages, formula.bytes_sent, formula.bytes_reduced),
                        f"{algorithm} p={comm.size} n={length} {dtype} rank {comm.rank}: traced {measured}, "
                        f"cost.per_rank {formula}")


@pytest.mark.task("3.9")
@pytest.mark.parallel(nprocs=AWKWARD_P)
@pytest.mark.parametrize("algorithm", ["naive", "tree", "ring"])
def test_per_rank_equals_traced_runs_with_one_and_sixteen_byte_items(algorithm):
    check_traced_against_per_rank(algorithm)
