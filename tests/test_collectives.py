"""collectives: every allreduce and building block on real MPI ranks, tied to closed forms and to cost.py.

Expected values come from outside the code under test: every rank can compute every other
rank's fill values (they depend only on rank and index), so the exact reduction is one numpy
call on a stacked array. Fill values are small integers, so sums are exact in float32 too and
any reduction order must give the same bits. Message counts come from cost.py's formulas.

Course tasks (``@pytest.mark.task``): a test of one allreduce or building block is marked with the
tasks whose code it runs (BY_ALGORITHM), on p >= 2 only (on one rank nothing is sent, so no heart
runs: test_on_one_rank_every_collective_returns_its_input covers p = 1), and with check=False.
The agreement check is MPI's own Allreduce on 9 int64 and runs through no task
(test_the_agreement_check_runs_through_no_task); it has tests of its own in
tests/test_collectives_errors.py. Every algorithm's result with check=True is checked there and by
test_lengths_around_p_and_below_p, which carries no task.
"""
import json
import runpy
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st
from mpi4py import MPI
from pytest_mpi import parallel_assert

import collectives
from collectives import spacetime, trace
from collectives.bench import measure
from collectives.buffers import block_counts, block_offsets
from collectives.fold import fold_in, fold_out, largest_power_of_two, world_rank
from collectives.model import cost
from tests import strategies
from tests.helpers import fill, results_of, same_on_every_rank, traced_costs

ALGORITHMS = collectives.ALGORITHMS        # naive, tree, butterfly, ring, rabenseifner, auto, the two hierarchies
TRACED = cost.ALGORITHMS                               # the five with a cost formula
NUMPY_OPS = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.sum}
SMALL_P = [2, 3, 4]
LARGE_P = [5, 6, 7, 8]
# naive 3.1; tree: reduce (3.2), then broadcast (3.3); ring: reduce-scatter (3.4), then allgather
# (3.5); butterfly 3.7 and Rabenseifner 3.8 (each folds in with 3.6 when p is not a power of two);
# auto runs one of the last two and belongs to no task. Each two-part allreduce counts for its first
# part only (which so requires the second: tasks.toml), so that no two tasks need each other.
BY_ALGORITHM = [
    pytest.param("naive", marks=pytest.mark.task("3.1")),
    pytest.param("tree", marks=pytest.mark.task("3.2")),
    pytest.param("butterfly", marks=pytest.mark.task("3.7")),
    pytest.param("ring", marks=pytest.mark.task("3.4")),
    pytest.param("rabenseifner", marks=pytest.mark.task("3.8")),
    "auto",
    "hierarchical",
    "hierarchical_tree",
]
assert [getattr(param, "values", (param,))[0] for param in BY_ALGORITHM] == list(ALGORITHMS)


def expected_allreduce(size, length, dtype, op):
    """The exact result, from every rank's fill values stacked: numpy, not collectives."""
    stacked = np.stack([fill(rank, length, dtype) for rank in range(size)]) if length else \
        np.zeros((size, 0), dtype=dtype)
    result = NUMPY_OPS[op](stacked, axis=0).astype(dtype)
    if op == "mean":                                    # sum, then divide in the buffer's dtype
        if result.dtype.kind in "iu":
            result //= size
        else:
            result /= size
    return result


def run_allreduce(comm, algorithm, length, dtype, op, in_place, check=True):
    mine = fill(comm.rank, length, dtype)
    if in_place == "IN_PLACE":
        result = mine.copy()
        collectives.allreduce(comm, MPI.IN_PLACE, result, op=op, algorithm=algorithm, check=check)
    elif in_place == "same array":
        result = mine.copy()
        collectives.allreduce(comm, result, result, op=op, algorithm=algorithm, check=check)
    else:
        result = collectives.allreduce(comm, mine, np.empty_like(mine), op=op, algorithm=algorithm, check=check)
        parallel_assert(bool(np.array_equal(mine, fill(comm.rank, length, dtype))),
                        f"{algorithm} modified sendbuf")
    return result


def check_algorithm(algorithm, length, dtype, op, in_place, check=True):
    comm = MPI.COMM_WORLD
    expected = expected_allreduce(comm.size, length, dtype, op)
    result = run_allreduce(comm, algorithm, length, dtype, op, in_place, check)
    parallel_assert(result.dtype == np.dtype(dtype) and result.shape == (length,),
                    f"{algorithm}: got {result.dtype} {result.shape}")
    parallel_assert(bool(np.array_equal(result, expected)),
                    f"rank {comm.rank}: {algorithm} {op} of {length} {dtype} ({in_place}) gave "
                    f"{result[:8]}..., expected {expected[:8]}...")
    parallel_assert(same_on_every_rank(comm, result), f"{algorithm}: ranks disagree")


def check_every_algorithm(length, dtype, op, in_place):
    for algorithm in ALGORITHMS:
        check_algorithm(algorithm, length, dtype, op, in_place)


in_place_modes = st.sampled_from(["separate", "IN_PLACE", "same array"])


# ---------------------------------------------------------------------------------------------
# every algorithm computes the exact reduction, identical on every rank

@pytest.mark.parallel(nprocs=SMALL_P + LARGE_P)
@pytest.mark.parametrize("algorithm", BY_ALGORITHM)
def test_every_allreduce_equals_the_exact_reduction_of_rank_fill_values(algorithm):
    """30 examples of up to 70 values on 2..4 ranks; 6 of up to 40 on 5..8 (oversubscribed: each
    example costs every rank's time on 2 cores)."""
    small = MPI.COMM_WORLD.size <= max(SMALL_P)
    if small and algorithm in ("hierarchical", "hierarchical_tree"):
        pytest.skip("on 2..4 ranks the hierarchies' own tests draw the node size as well (tests/test_simulate.py); "
                    "this one would run it at MPI's node size only")

    @settings(max_examples=30 if small else 6)
    @given(length=st.integers(0, 70 if small else 40), dtype=strategies.collective_dtypes,
           op=strategies.reduction_ops, in_place=in_place_modes)
    def every(length, dtype, op, in_place):
        check_algorithm(algorithm, length, dtype, op, in_place, check=False)

    every()


@pytest.mark.parallel(nprocs=[1])
@settings(max_examples=30)
@given(length=st.integers(0, 70), dtype=strategies.collective_dtypes, op=strategies.reduction_ops,
       in_place=in_place_modes, root_seed=st.integers(0, 100), gather_in_place=st.booleans())
def test_on_one_rank_every_collective_returns_its_input(length, dtype, op, in_place, root_seed, gather_in_place):
    # what the tests above and below check on p >= 2, here on p = 1 (with the agreement check)
    check_every_algorithm(length, dtype, op, in_place)
    check_broadcast(length, dtype, root_seed, check=True)
    check_reduce(length, dtype, op, root_seed, check=True)
    check_reduce_scatter(length, dtype, op, check=True)
    check_allgather(length, dtype, gather_in_place, check=True)


@pytest.mark.parallel(nprocs=[1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("length", [0, 1, 2, 3, 5, 7, 8, 9])
def test_lengths_around_p_and_below_p(length):
    # n < p leaves some blocks empty; n not divisible by p makes them uneven
    check_every_algorithm(length, "float64", "sum", "separate")


@pytest.mark.parallel(nprocs=[2, 3, 4])
@pytest.mark.parametrize("algorithm", BY_ALGORITHM)
@settings(max_examples=5)
@given(seed=strategies.seeds, length=st.integers(1, 200))
def test_random_floats_give_identical_bits_on_every_rank_and_the_sum_to_rounding(algorithm, seed, length):
    comm = MPI.COMM_WORLD
    every = [np.random.default_rng([seed, rank]).standard_normal(length) for rank in range(comm.size)]
    exact = np.sum(every, axis=0)
    result = collectives.allreduce(comm, every[comm.rank], algorithm=algorithm, check=False)
    parallel_assert(same_on_every_rank(comm, result), f"{algorithm}: ranks disagree bitwise")
    parallel_assert(bool(np.allclose(result, exact, rtol=1e-12, atol=1e-12)), f"{algorithm}: {result}")


@pytest.mark.parallel(nprocs=[2, 3, 4])
@pytest.mark.parametrize("algorithm", BY_ALGORITHM)
def test_large_vectors_above_the_eager_limit_do_not_deadlock(algorithm):
    # 1 MiB and more per message: MPI switches to rendezvous, where a send waits for its receive
    comm = MPI.COMM_WORLD
    length = 300_001
    expected = expected_allreduce(comm.size, length, "float32", "sum")
    result = collectives.allreduce(comm, fill(comm.rank, length, "float32"), algorithm=algorithm, check=False)
    parallel_assert(bool(np.array_equal(result, expected)), f"{algorithm} wrong at {length}")


@pytest.mark.parallel(nprocs=[2, 3])
def test_integer_mean_is_floor_division_of_the_sum():
    comm = MPI.COMM_WORLD
    mine = np.array([comm.rank + 1, -(comm.rank + 1)], dtype=np.int64)
    for algorithm in ALGORITHMS:
        result = collectives.allreduce(comm, mine, op="mean", algorithm=algorithm)
        total = comm.size * (comm.size + 1) // 2
        parallel_assert(result.tolist() == [total // comm.size, -total // comm.size], f"{algorithm}: {result}")


# ---------------------------------------------------------------------------------------------
# identical bytes on every rank, for every op, even where the operand order could show:
# numpy.maximum(+0.0, -0.0) is -0.0 but numpy.maximum(-0.0, +0.0) is +0.0, and of two NaNs the
# result keeps one payload. Every algorithm, every op, p = 1..8.

def special_values(dtype):
    """+0.0, -0.0, small numbers, infinities and NaNs with three different payloads."""
    unsigned = {"float32": np.uint32, "float64": np.uint64}[dtype]
    quiet = {"float32": 0x7FC00000, "float64": 0x7FF8000000000000}[dtype]
    nans = np.array([quiet | 1, quiet | 2, quiet | 3], dtype=unsigned).view(dtype)
    return np.concatenate([np.array([0.0, -0.0, 1.0, -1.0, 2.0, np.inf, -np.inf], dtype=dtype), nans])


SPECIAL_COUNT = 10
MAX_LENGTH = 6
# rank r, element j: +0.0 if r + j is even, -0.0 if odd; rank r, every element: NaN payload r % 3 + 1
ZEROS_BY_PARITY = [(index // MAX_LENGTH + index % MAX_LENGTH) % 2 for index in range(8 * MAX_LENGTH)]
NANS_BY_RANK = [7 + (index // MAX_LENGTH) % 3 for index in range(8 * MAX_LENGTH)]


special_codes = st.lists(st.integers(0, SPECIAL_COUNT - 1), min_size=8 * MAX_LENGTH, max_size=8 * MAX_LENGTH)


def check_identical_bytes(algorithms, length, dtype, op, codes):
    comm = MPI.COMM_WORLD
    values = special_values(dtype)[np.array(codes)].reshape(8, MAX_LENGTH)[:comm.size, :length]
    with np.errstate(invalid="ignore"):                    # inf - inf is NaN, as intended
        expected = expected_from_rows(values, op)
        results = {algorithm: collectives.allreduce(comm, values[comm.rank].copy(), op=op,
                                                    algorithm=algorithm, check=False)
                   for algorithm in algorithms}
    mine = {algorithm: result.tobytes() for algorithm, result in results.items()}
    rank_0 = comm.bcast(mine, root=0)
    other_bits = [algorithm for algorithm in algorithms if mine[algorithm] != rank_0[algorithm]]
    wrong = [algorithm for algorithm in algorithms
             if not np.array_equal(results[algorithm], expected, equal_nan=True)]
    bits = {algorithm: results[algorithm].tobytes().hex() for algorithm in other_bits + wrong}
    parallel_assert(not other_bits and not wrong,
                    f"rank {comm.rank}, {op} of {values.tolist()}: other bits than rank 0 from "
                    f"{other_bits}, wrong values from {wrong}: {bits}")


@pytest.mark.parallel(nprocs=[2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("algorithm", BY_ALGORITHM)
@settings(max_examples=3)
@given(length=st.integers(1, MAX_LENGTH), dtype=strategies.float_dtypes, op=strategies.reduction_ops,
       codes=special_codes)
@example(length=4, dtype="float64", op="max", codes=ZEROS_BY_PARITY)   # butterfly max: bits differed
@example(length=3, dtype="float32", op="min", codes=ZEROS_BY_PARITY)
@example(length=1, dtype="float64", op="sum", codes=NANS_BY_RANK)      # which NaN payload survives
def test_every_rank_holds_identical_bytes_with_signed_zeros_and_nans(algorithm, length, dtype, op, codes):
    check_identical_bytes([algorithm], length, dtype, op, codes)


@pytest.mark.parallel(nprocs=[2, 3, 4, 5])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(max_examples=4)
@given(length=st.integers(1, 200), dtype=strategies.float_dtypes, op=strategies.reduction_ops,
       seed=st.integers(0, 2**16), codes=special_codes)
@example(length=4, dtype="float64", op="max", seed=0, codes=ZEROS_BY_PARITY)
@example(length=3, dtype="float32", op="min", seed=1, codes=ZEROS_BY_PARITY)
def test_out_of_place_reads_sendbuf_and_gives_the_in_place_bytes(algorithm, length, dtype, op, seed, codes):
    """Every heart reads an out-of-place input in sendbuf itself, instead of copying it into
    recvbuf first (buffers.run_allreduce's source). Random floats round differently in
    every order, signed zeros and NaNs fill the first elements: the result must be the same bytes
    as in place, sendbuf untouched, and recvbuf's old contents (NaN) must not leak in."""
    comm = MPI.COMM_WORLD
    values = np.random.default_rng([seed, comm.rank]).standard_normal(length).astype(dtype)
    special = special_values(dtype)[np.array(codes)].reshape(8, MAX_LENGTH)[comm.rank % 8]
    values[:min(length, MAX_LENGTH)] = special[:min(length, MAX_LENGTH)]
    sendbuf = values.copy()
    recvbuf = np.full_like(values, np.nan)
    in_place = values.copy()
    with np.errstate(invalid="ignore"):
        collectives.allreduce(comm, sendbuf, recvbuf, op=op, algorithm=algorithm, check=False)
        collectives.allreduce(comm, MPI.IN_PLACE, in_place, op=op, algorithm=algorithm, check=False)
        reduce = collectives.allreduce_init(comm, sendbuf, np.full_like(values, np.nan), op=op,
                                            algorithm=algorithm, check=False)
        persistent = reduce.start().copy()
    parallel_assert(recvbuf.tobytes() == in_place.tobytes() and persistent.tobytes() == in_place.tobytes()
                    and sendbuf.tobytes() == values.tobytes(),
                    f"rank {comm.rank}: {algorithm} {op} out of place {recvbuf[:6]}, persistent "
                    f"{persistent[:6]}, in place {in_place[:6]}; sendbuf kept: "
                    f"{sendbuf.tobytes() == values.tobytes()}")


def test_out_of_place_hearts_make_no_copy_in_the_model_unless_a_fold_in_reads_recvbuf():
    """cost.extra_copies follows the code: no copy-in where the heart reads sendbuf (all of them,
    except Rabenseifner and the butterfly with a fold-in), none in place; the butterfly's result
    may end in its scratch vector, one copy more (not out of place at p = 2: its one round writes
    the result into recvbuf)."""
    assert [cost.extra_copies(name, in_place=False, p=4) for name in TRACED] == [0, 0, 1, 0, 0]
    assert [cost.extra_copies(name, in_place=False, p=6) for name in TRACED] == [0, 0, 2, 0, 1]
    assert [cost.extra_copies(name, in_place=True, p=4) for name in TRACED] == [0, 0, 1, 0, 0]
    assert [cost.extra_copies("butterfly", in_place, p=2) for in_place in (False, True)] == [0, 1]


def test_out_of_place_reductions_that_read_sendbuf_follow_the_code():
    """cost.reduced_from_source: the bytes of the critical path's reduction that read sendbuf and
    write recvbuf (a 3-operand add, gamma_3). From the hearts: the naive and tree root's first
    reduction (n), the butterfly's first round (n) and Rabenseifner's first halving (n / 2) for p a
    power of two, every one of the ring's (p - 1) / p n; none in place or after a fold-in's copy."""
    n = 1 << 20
    for p, expected in ((2, [n, n, n, n / 2, n / 2]), (4, [n, n, n, 3 * n / 4, n / 2]),
                        (6, [n, n, 0, 5 * n / 6, 0])):
        assert [cost.reduced_from_source(name, p, n) for name in TRACED] == expected, p
        assert [cost.reduced_from_source(name, p, n, in_place=True) for name in TRACED] == [0] * 5


def test_refined_model_adds_gamma_3_and_times_the_naive_root_by_gather_and_send_back():
    """predict_refined by hand at p = 4, n = 1000 bytes with round rates: the butterfly is
    lg p (alpha share + n beta_x) + n gamma_3 + n gamma_m + n copy (its result ends in the scratch
    vector on some rank); the naive root is 2 (p - 1) share alpha + (p - 1) n (beta_gather +
    beta_scatter) + n gamma_3 + (p - 2) n gamma_m. Without gamma_3 and the gather rates the
    model falls back to gamma_m and beta_solo."""
    rates = cost.Rates(alpha=1.0, beta_x=10.0, gamma_m=100.0, copy=1000.0, share=2.0, beta_1=20.0,
                       beta_solo=30.0, beta_ring=40.0, gamma_3=300.0, beta_gather=50.0, beta_scatter=60.0)
    n = 1000
    assert cost.predict_refined("butterfly", 4, n, rates) == pytest.approx(
        2 * (2 * 1.0 + n * 10.0) + n * 300.0 + n * 100.0 + n * 1000.0)
    assert cost.predict_refined("naive", 4, n, rates) == pytest.approx(
        6 * 2 * 1.0 + 3 * n * (50.0 + 60.0) + n * 300.0 + 2 * n * 100.0)
    assert cost.predict_refined("naive", 4, n, rates, in_place=True) == pytest.approx(
        6 * 2 * 1.0 + 3 * n * (50.0 + 60.0) + 3 * n * 100.0)
    plain = cost.Rates(alpha=1.0, beta_x=10.0, gamma_m=100.0, copy=1000.0, share=2.0, beta_1=20.0, beta_solo=30.0)
    assert cost.predict_refined("naive", 4, n, plain) == pytest.approx(6 * 2 * 1.0 + 6 * n * 30.0 + 3 * n * 100.0)


@pytest.mark.parallel(nprocs=[1])
@settings(max_examples=3)
@given(length=st.integers(1, MAX_LENGTH), dtype=strategies.float_dtypes, op=strategies.reduction_ops,
       codes=special_codes)
def test_on_one_rank_signed_zeros_and_nans_come_back_as_they_went_in(length, dtype, op, codes):
    check_identical_bytes(ALGORITHMS, length, dtype, op, codes)


def expected_from_rows(rows, op):
    """op over the rows (ranks), by numpy: values only (+0.0 == -0.0, NaN == NaN in the test)."""
    result = NUMPY_OPS[op](rows, axis=0).astype(rows.dtype)
    return result / rows.shape[0] if op == "mean" else result


# ---------------------------------------------------------------------------------------------
# the building blocks

def check_broadcast(length, dtype, root_seed, check):
    comm = MPI.COMM_WORLD
    root = root_seed % comm.size
    buf = fill(comm.rank, length, dtype)
    collectives.broadcast(comm, buf, root=root, check=check)
    parallel_assert(bool(np.array_equal(buf, fill(root, length, dtype))), f"rank {comm.rank}: {buf}")


def check_reduce(length, dtype, op, root_seed, check):
    comm = MPI.COMM_WORLD
    root = root_seed % comm.size
    mine = fill(comm.rank, length, dtype)
    result = collectives.reduce(comm, mine, np.empty_like(mine) if comm.rank == root else None, op=op, root=root,
                                check=check)
    if comm.rank == root:
        ok = np.array_equal(result, expected_allreduce(comm.size, length, dtype, op))
    else:
        ok = result is None
    parallel_assert(bool(ok), f"rank {comm.rank} (root {root}): {result}")
    parallel_assert(bool(np.array_equal(mine, fill(comm.rank, length, dtype))), "reduce modified sendbuf")


def check_reduce_scatter(length, dtype, op, check):
    comm = MPI.COMM_WORLD
    counts = block_counts(length, comm.size)
    start = block_offsets(counts)[comm.rank]
    result = collectives.reduce_scatter(comm, fill(comm.rank, length, dtype), op=op, check=check)
    expected = expected_allreduce(comm.size, length, dtype, op)[start:start + counts[comm.rank]]
    parallel_assert(bool(np.array_equal(result, expected)), f"rank {comm.rank}: {result} != {expected}")


def check_allgather(length, dtype, in_place, check):
    comm = MPI.COMM_WORLD
    counts = block_counts(length, comm.size)
    offsets = block_offsets(counts)
    # block r of the expected vector comes from rank r
    expected = np.concatenate([fill(r, length, dtype)[offsets[r]:offsets[r] + counts[r]]
                               for r in range(comm.size)]) if length else np.zeros(0, dtype)
    mine = fill(comm.rank, length, dtype)[offsets[comm.rank]:offsets[comm.rank] + counts[comm.rank]]
    recvbuf = np.zeros(length, dtype=dtype)
    if in_place:
        recvbuf[offsets[comm.rank]:offsets[comm.rank] + counts[comm.rank]] = mine
        collectives.allgather(comm, MPI.IN_PLACE, recvbuf, check=check)
    else:
        collectives.allgather(comm, mine, recvbuf, check=check)
    parallel_assert(bool(np.array_equal(recvbuf, expected)), f"rank {comm.rank}: {recvbuf}")


@pytest.mark.task("3.3")
@pytest.mark.parallel(nprocs=[2, 3, 4, 5])
@settings(max_examples=10)
@given(length=st.integers(0, 40), dtype=strategies.collective_dtypes, root_seed=st.integers(0, 100))
def test_broadcast_gives_every_rank_the_roots_buffer(length, dtype, root_seed):
    check_broadcast(length, dtype, root_seed, check=False)


@pytest.mark.task("3.2")
@pytest.mark.parallel(nprocs=[2, 3, 4, 5])
@settings(max_examples=10)
@given(length=st.integers(0, 40), dtype=strategies.collective_dtypes, op=strategies.reduction_ops,
       root_seed=st.integers(0, 100))
def test_reduce_gives_the_root_the_exact_reduction(length, dtype, op, root_seed):
    check_reduce(length, dtype, op, root_seed, check=False)


@pytest.mark.task("3.4")
@pytest.mark.parallel(nprocs=[2, 3, 4, 5])
@settings(max_examples=10)
@given(length=st.integers(0, 40), dtype=strategies.collective_dtypes, op=strategies.reduction_ops)
def test_reduce_scatter_gives_rank_r_block_r_of_the_reduction(length, dtype, op):
    check_reduce_scatter(length, dtype, op, check=False)


@pytest.mark.task("3.5")
@pytest.mark.parallel(nprocs=[2, 3, 4, 5])
@settings(max_examples=10)
@given(length=st.integers(0, 40), dtype=strategies.collective_dtypes, in_place=st.booleans())
def test_allgather_puts_every_ranks_block_in_rank_order(length, dtype, in_place):
    check_allgather(length, dtype, in_place, check=False)


@pytest.mark.parallel(nprocs=[2, 3, 4])
@pytest.mark.parametrize("block", [pytest.param("reduce", marks=pytest.mark.task("3.2")),
                                   pytest.param("broadcast", marks=pytest.mark.task("3.3")),
                                   pytest.param("reduce_scatter", marks=pytest.mark.task("3.4")),
                                   pytest.param("allgather", marks=pytest.mark.task("3.5"))])
def test_building_blocks_on_large_vectors_above_the_eager_limit(block):
    # as test_large_vectors_above_the_eager_limit_do_not_deadlock: rendezvous messages, root 1
    length = 300_001
    {"reduce": lambda: check_reduce(length, "float32", "sum", 1, check=False),
     "broadcast": lambda: check_broadcast(length, "float32", 1, check=False),
     "reduce_scatter": lambda: check_reduce_scatter(length, "float32", "sum", check=False),
     "allgather": lambda: check_allgather(length, "float32", False, check=False)}[block]()


@pytest.mark.task("3.6")
@pytest.mark.parallel(nprocs=[2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("length", [0, 1, 9])
def test_fold_in_leaves_a_power_of_two_of_ranks_holding_every_ranks_values(op, length):
    # fold.py's header: of p = pof2 + rem ranks, the even ones below 2 rem hand their vector to
    # rank + 1 and sit out (None); the odd ones below 2 rem reduce it into theirs; the survivors are
    # renumbered 0 .. pof2 - 1 (world_rank, not a task, is the inverse mapping)
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    pof2 = largest_power_of_two(size)
    rem = size - pof2
    data = fill(rank, length, "int64")
    newrank = fold_in(comm, data, op)
    folded = rank < 2 * rem
    if folded and rank % 2 == 0:
        ok = newrank is None
    else:
        partners = [rank - 1, rank] if folded else [rank]
        ok = newrank is not None and 0 <= newrank < pof2 and world_rank(newrank, rem) == rank and \
            np.array_equal(data, NUMPY_OPS[op](np.stack([fill(r, length, "int64") for r in partners]), axis=0))
    parallel_assert(bool(ok), f"rank {rank} of {size}: new rank {newrank}, data {data}")
    everyone = comm.allgather(newrank)
    survivors = sorted(number for number in everyone if number is not None)
    parallel_assert(survivors == list(range(pof2)), f"the survivors are {survivors}, not 0 .. {pof2 - 1}")
    # fold_out hands each survivor's finished vector back to the rank that sat out beside it
    if newrank is not None:
        data[...] = 100 + newrank
    fold_out(comm, data)
    mine = newrank if newrank is not None else everyone[rank + 1]
    parallel_assert(bool(np.all(data == 100 + mine)), f"rank {rank}: {data} after the fold-out")


def test_block_counts_cover_n_and_differ_by_at_most_one():
    for n in range(0, 40):
        for parts in range(1, 10):
            counts = block_counts(n, parts)
            assert sum(counts) == n and max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)


# ---------------------------------------------------------------------------------------------
# traced messages equal cost.py's formulas

def check_traced_costs(length, dtype):
    comm = MPI.COMM_WORLD
    for (algorithm, _, _), traced, measured, formula in traced_costs(comm, [(a, length, dtype) for a in TRACED]):
        parallel_assert(measured == (formula.messages, formula.bytes_sent, formula.bytes_reduced),
                        f"{algorithm} p={comm.size} n={length} rank {comm.rank}: traced {measured}, "
                        f"cost.py {formula}")
        everything = trace.gather(traced)
        if comm.rank == 0:
            sent = sum(m.nbytes for m in everything if m.direction == "send")
            received = sum(m.nbytes for m in everything if m.direction == "recv")
            pairs = trace.match(everything)
            consistent = sent == received and 2 * len(pairs) == len(everything)
        else:
            consistent = True
        parallel_assert(consistent, f"{algorithm}: sends and receives do not pair up")


# cost.per_rank (task 3.9) answers n = 0 and p = 1 before its heart: those items are no test of it
@pytest.mark.parallel(nprocs=[2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("length", [0] + [pytest.param(n, marks=pytest.mark.task("3.9")) for n in (1, 3, 8, 37)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_traced_messages_bytes_and_reductions_equal_the_cost_formulas(length, dtype):
    check_traced_costs(length, dtype)


@pytest.mark.parallel(nprocs=[1])
@pytest.mark.parametrize("length", [0, 1, 3, 8, 37])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_on_one_rank_nothing_is_sent_as_the_cost_formulas_say(length, dtype):
    check_traced_costs(length, dtype)


@pytest.mark.parallel(nprocs=[1, 2, 3, 4, 5, 8])
def test_the_agreement_check_sends_no_point_to_point_message():
    # the docstring of collectives.check: one MPI Allreduce of 9 int64, which a tracer does not record
    comm = MPI.COMM_WORLD
    traced = trace.TracedComm(comm)
    collectives.allreduce(traced, np.ones(5), algorithm="ring", check=True)
    with_check = list(traced.messages)
    traced.reset()
    collectives.allreduce(traced, np.ones(5), algorithm="ring", check=False)
    parallel_assert(len(with_check) == len(traced.messages) and not any(m.phase == "check" for m in with_check),
                    f"rank {comm.rank}: the check sent {len(with_check) - len(traced.messages)} messages")


@pytest.mark.parallel(nprocs=[2, 3, 5])
def test_the_agreement_check_runs_through_no_task(monkeypatch):
    """In a student tree every heart may be a stub: the check must still work, so that a task's
    tests (which call collectives with check=True) depend only on the tasks they list."""
    from collectives import ring

    def stub(*args, **kwargs):
        raise NotImplementedError("a stubbed task")
    # every name a collectives module holds for the fold-in, fold-out or the butterfly (imported or its own)
    for module in [module for name, module in sys.modules.items() if name.startswith("collectives.")]:
        for name in ("fold_in", "fold_out", "butterfly_allreduce_in_place"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, stub)
    comm = MPI.COMM_WORLD
    result = ring.allreduce(comm, np.full(7, comm.rank + 1.0), check=True)
    parallel_assert(result.tolist() == [comm.size * (comm.size + 1) / 2] * 7, f"rank {comm.rank}: {result}")
    try:
        ring.allreduce(comm, np.ones(7 + (comm.rank == comm.size - 1)), check=True)
        caught = None
    except collectives.check.MismatchError as error:
        caught = str(error)
    parallel_assert(caught is not None and "the length differs" in caught, f"rank {comm.rank}: {caught}")


@pytest.mark.parallel(nprocs=[4])
def test_trace_prints_as_text_and_draws_a_spacetime_png(tmp_path_factory):
    comm = MPI.COMM_WORLD
    traced = trace.TracedComm(comm)
    collectives.allreduce(traced, np.ones(12), algorithm="ring", check=False)
    messages = trace.gather(traced)
    ok = True
    if comm.rank == 0:
        text = trace.format_text(messages)
        ok = "0 -> 1" in text and "reduce-scatter 2" in text and "allgather 0" in text
        for clock in ("wall", "steps"):
            path = tmp_path_factory.mktemp("trace") / f"ring_{clock}.png"
            spacetime.plot_spacetime(messages, path, "ring", clock=clock)
            ok = ok and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        slots = spacetime.logical_times(messages)
        ok = ok and max(slots.values()) == 2 * (comm.size - 1) - 1   # 6 steps, one after another
    parallel_assert(bool(ok), "trace text or picture wrong")


PHASE_OF = {"naive": "gather", "tree": "reduce", "butterfly": "exchange", "ring": "reduce-scatter",
            "rabenseifner": "reduce-scatter"}


@pytest.mark.parallel(nprocs=[2, 4])
def test_auto_runs_the_algorithm_its_table_names_at_every_size_boundary():
    """At each boundary of auto's table for this p (selection.json, or the textbook default), the
    vector just below runs the previous row's algorithm and the one at the boundary the row's own,
    as the traced phases show (ring and Rabenseifner share phase names: their message counts differ)."""
    comm = MPI.COMM_WORLD
    traced = trace.TracedComm(comm)
    rows = collectives.auto.table(comm.size)
    cases = [(rows[0][0] + 8, rows[0][1])] + [(start, name) for start, name in rows[1:]]
    cases += [(start - 8, before) for (start, name), (_, before) in zip(rows[1:], rows) if start >= 16]
    for nbytes, name in cases:
        traced.reset()
        collectives.allreduce(traced, np.ones(max(nbytes // 8, 1)), algorithm="auto", check=False)
        phases = {m.phase for m in traced.messages}
        expected = cost.per_rank(name, comm.size, max(nbytes // 8, 1), 8, comm.rank).messages
        mine = trace.counts(traced.messages, comm.rank)[0]
        parallel_assert(PHASE_OF[name] in phases and mine == expected,
                        f"auto at {nbytes} bytes: phases {phases}, {mine} messages; table says {name}")


def test_auto_reads_its_table_and_falls_back_to_the_textbook_rule(tmp_path):
    auto = collectives.auto
    path = tmp_path / "selection.json"
    path.write_text('{"2": [[0, "tree"], [65536, "ring"]], "3": [[0, "nope"]], "x": [[0, "ring"]]}')
    table = auto.load_selection(path)
    assert table == {2: ((0, "tree"), (65536, "ring"))}          # unknown algorithm, bad p: left out
    assert auto.load_selection(tmp_path / "missing.json") == {}
    assert auto.choose_name(1024) == "butterfly" and auto.choose_name(auto.THRESHOLD_BYTES) == "rabenseifner"
    assert auto.choose_name(auto.THRESHOLD_BYTES - 1) == "butterfly"


# ---------------------------------------------------------------------------------------------
# CountingComm: bytes sent, as cost.py predicts them

@pytest.mark.parallel(nprocs=[1, 2, 3, 4, 5])
def test_counting_comm_counts_the_bytes_cost_py_predicts_for_every_algorithm():
    comm = MPI.COMM_WORLD
    counting = trace.CountingComm(comm)
    length = 37
    check = counting._allreduce_estimate(9 * 8)          # the check: one MPI Allreduce of nine int64
    for algorithm in TRACED:
        for with_check in (False, True):
            counting.bytes_sent = 0
            buffer = fill(comm.rank, length, "float32")
            collectives.allreduce(counting, MPI.IN_PLACE, buffer, algorithm=algorithm, check=with_check)
            formula = cost.per_rank(algorithm, comm.size, length, 4, comm.rank).bytes_sent
            expected = formula + (check if with_check else 0)
            parallel_assert(counting.bytes_sent == expected, f"{algorithm} check={with_check} "
                            f"rank {comm.rank}: {counting.bytes_sent} != {expected}")
            every = sum(cost.per_rank(algorithm, comm.size, length, 4, r).bytes_sent for r in range(comm.size))
            every += check * comm.size if with_check else 0
            parallel_assert(counting.total_bytes() == every, f"{algorithm}: total")
            parallel_assert(counting.bytes_sent == expected, "total_bytes() must not count itself")


@pytest.mark.parallel(nprocs=[2, 3])
def test_counting_comm_counts_sends_pickles_and_estimates_mpi_allreduce():
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    right, left = (rank + 1) % size, (rank - 1) % size
    counting = trace.CountingComm(comm)
    parallel_assert(counting.Get_size() == size and counting.rank == rank, "forwards attributes")
    counting.Sendrecv(np.ones(10), right, 1, np.empty(10), left, 1)              # 80 bytes
    request = counting.Isend(np.ones(3, dtype=np.int32), right, 2)              # 12 bytes
    counting.Recv(np.empty(3, dtype=np.int32), left, 2)
    request.Wait()
    payload = {"rank": rank, "step": 7}
    request = counting.isend(payload, right, 3)                                 # its pickle
    received = counting.recv(source=left, tag=3)
    request.Wait()
    point_to_point = 80 + 12 + len(MPI.pickle.dumps(payload))
    parallel_assert(counting.bytes_sent == point_to_point and received["rank"] == left,
                    f"rank {rank}: {counting.bytes_sent} != {point_to_point}")
    # MPI's own allreduce: estimated as a bandwidth-optimal one, 2 (p - 1) / p n bytes
    total = np.full(5, rank, dtype=np.float64)
    counting.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
    largest = counting.allreduce(rank, op=MPI.MAX)                              # a Python int: 8 bytes
    estimate = 2 * (size - 1) * 40 // size + 2 * (size - 1) * 8 // size
    parallel_assert(bool(np.all(total == size * (size - 1) / 2)) and largest == size - 1, "results")
    parallel_assert(counting.bytes_sent == point_to_point + estimate, f"rank {rank}: {counting.bytes_sent}")
    parallel_assert(counting.total_bytes() == size * (point_to_point + estimate), "total")


# ---------------------------------------------------------------------------------------------
# `python -m collectives.<name>`: one allreduce, traced, checked against MPI's Allreduce

@pytest.mark.parallel(nprocs=[3])
@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")
def test_python_m_runs_one_allreduce_traced_and_checked_against_mpi(monkeypatch, capsys):
    comm = MPI.COMM_WORLD
    for algorithm in ALGORITHMS:
        monkeypatch.setattr(sys, "argv", [algorithm, "--length", "5", "--op", "mean"])
        runpy.run_module(f"collectives.{algorithm}", run_name="__main__")      # what python -m runs
        out = capsys.readouterr().out
        ok = comm.rank != 0 or ("same bits as MPI_Allreduce on every rank" in out and "check" not in out
                                and f"{algorithm} allreduce (mean)" in out)
        parallel_assert(ok, f"{algorithm}: {out}")


# ---------------------------------------------------------------------------------------------
# cost.py against the paper's table

@pytest.mark.task("3.9")
@given(p=st.integers(1, 64), elements=st.integers(0, 500))
def test_per_rank_costs_reduce_to_the_papers_formulas(p, elements):
    n = elements * p                                   # divisible, so blocks are equal
    lg = (p - 1).bit_length()
    if n == 0 or p == 1:
        assert all(cost.per_rank(a, p, n, 4, 0) == cost.RankCost(0, 0, 0) for a in TRACED)
        return
    # every rank's cost under every algorithm, in one call (under the grader: one trip to the sandbox)
    every = dict(zip([(a, r) for a in TRACED for r in range(p)],
                     results_of(cost.per_rank, [(a, p, n, 1, r) for a in TRACED for r in range(p)], cost.RankCost)))
    ring = [every["ring", r] for r in range(p)]
    assert all(c == cost.RankCost(2 * (p - 1), 2 * (p - 1) * n // p, (p - 1) * n // p) for c in ring)
    root = every["naive", 0]
    assert root == cost.RankCost(p - 1, (p - 1) * n, (p - 1) * n)
    assert every["tree", 0].messages == lg                            # + lg received = 2 ceil(lg p) steps
    assert sum(every["tree", r].messages for r in range(p)) == 2 * (p - 1)
    if p & (p - 1) == 0:                                              # power of two
        for r in range(p):
            assert every["butterfly", r] == cost.RankCost(lg, lg * n, lg * n)
            assert every["rabenseifner", r] == cost.RankCost(2 * lg, 2 * (p - 1) * n // p, (p - 1) * n // p)


def test_predicted_times_order_like_the_paper():
    alpha, beta, gamma = 2e-6, 1e-10, 3e-11
    small, large = 4096, 64 << 20
    for p in (4, 8, 16):
        at = {a: cost.predict(a, p, large, alpha, beta, gamma) for a in TRACED + ("lower bound",)}
        assert at["lower bound"] <= at["rabenseifner"] <= at["ring"] < at["butterfly"] < at["tree"] < at["naive"]
        assert cost.predict("butterfly", p, small, alpha, beta, gamma) < cost.predict("ring", p, small, alpha, beta,
                                                                                      gamma)


# ---------------------------------------------------------------------------------------------
# CuPy buffers (staged through the host unless MPI is CUDA-aware)

def _cupy_or_skip():
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        return cupy
    except Exception:                                   # no module, no driver, no device
        pytest.skip("no GPU/CuPy")


@pytest.mark.parallel(nprocs=[1, 2, 3])
def test_cupy_buffers_give_the_same_result_as_numpy():
    cupy = _cupy_or_skip()
    comm = MPI.COMM_WORLD
    expected = expected_allreduce(comm.size, 37, "float32", "sum")
    for algorithm in ALGORITHMS:
        result = collectives.allreduce(comm, cupy.asarray(fill(comm.rank, 37, "float32")), algorithm=algorithm)
        parallel_assert(isinstance(result, cupy.ndarray) and bool(np.array_equal(cupy.asnumpy(result), expected)),
                        f"{algorithm} on CuPy")


# ---------------------------------------------------------------------------------------------
# the benchmark runs (a smoke test; the numbers themselves are not tested)

@pytest.mark.parallel(nprocs=[1, 2])
def test_bench_quick_writes_json_with_the_documented_fields(tmp_path_factory):
    comm = MPI.COMM_WORLD
    path = tmp_path_factory.mktemp("bench") / "bench.json" if comm.rank == 0 else None
    path = comm.bcast(str(path) if path else None)
    records = measure.main(["--quick", "--sizes", "4K", "--algorithms", "ring,auto", "--json", path])
    ok = True
    if comm.rank == 0:
        with open(path) as file:
            written = json.load(file)
        fields = {"algorithm", "p", "bytes", "seconds", "mpi_seconds", "ratio", "model_seconds", "alpha", "beta"}
        ok = (written == records and {r["algorithm"] for r in written} == {"mpi", "ring", "auto"}
              and all(fields <= set(r) and r["bytes"] == 4096 and r["seconds"] > 0 for r in written))
    parallel_assert(bool(ok), "bench JSON")
