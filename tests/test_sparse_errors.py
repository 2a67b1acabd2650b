"""collectives/compression/sparse.py refuses bad (index, value) pairs on every rank, before any pair moves.

Run: python tests/run.py --max-ranks 5 -- tests/test_sparse_errors.py

The contract of the dense collectives (tests/test_collectives_errors.py), for the sparse ones: a
rank whose indices repeat, fall outside 0..n-1, are not integers, or whose n or values do not fit,
or ranks that pass different n, dtypes or allgather block lengths, make EVERY rank raise
MismatchError within one agreement check (check.agree), naming the rank and the problem; the trace
shows nothing but the check's messages. Indices of different integer dtypes on different ranks are
fine (each rank's are range-checked, then sent as int32). A hang fails through pytest-timeout
(60 s here: each case runs in well under a second).
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from collectives.check import MismatchError
from collectives.compression import sparse
from collectives.compression.compress import Sparse
from collectives.trace import TracedComm

pytestmark = pytest.mark.timeout(60)

N = 10
GOOD = ([7, 1, 4], [1.0, 2.0, 3.0], N)                  # every rank's arguments but the odd one's

# the odd rank's (index, values, n) -> (the kind every other rank names, the odd rank's own words)
BAD = {
    "a repeated index": (([3, 1, 3], [1.0, 2.0, 3.0], N), "duplicate indices", "index 3 appears more than once"),
    "a negative index": (([-1, 2], [1.0, 2.0], N), "an index out of range", "index -1 is outside 0..9"),
    "an index equal to n": (([2, N], [1.0, 2.0], N), "an index out of range", "index 10 is outside 0..9"),
    "an int64 index that int32 would wrap": ((np.array([2 ** 32 + 3], dtype=np.int64), [1.0], N),
                                             "an index out of range", "index 4294967299 is outside 0..9"),
    "float indices": ((np.array([1.0, 2.0]), [1.0, 2.0], N), "indices that are not integers",
                      "index has dtype float64"),
    "bool indices": ((np.array([True, False]), [1.0, 2.0], N), "indices that are not integers",
                     "index has dtype bool"),
    "fewer values than indices": (([1, 2], [1.0], N), "a buffer of the wrong length",
                                  "index has 2 entries but values has 1"),
    "a 2-D index": ((np.array([[1, 2]]), [1.0, 2.0], N), "a buffer that is not 1-D", "must be 1-D"),
    "bool values": (([1, 2], [True, False], N), "an unsupported dtype", "values has dtype bool"),
    "a negative n": (([], [], -1), "an invalid vector length n", "n must be an integer in 0..2^31, got -1"),
    "n past int32's indices": (([1], [1.0], 2 ** 31 + 1), "an invalid vector length n", "got 2147483649"),
    "a float n": (([1], [1.0], 10.0), "an invalid vector length n", "got 10.0"),
}


def only_check_messages(traced):
    return all(message.phase == "check" for message in traced.messages)


def raised(call):
    """The MismatchError's text, or None if ``call`` returned."""
    try:
        call()
    except MismatchError as error:
        return str(error)
    return None


@pytest.mark.parallel(nprocs=[1, 2, 3, 4, 5])
@pytest.mark.parametrize("case", list(BAD))
def test_bad_pairs_on_one_rank_stop_every_rank_before_any_pair(case):
    comm = MPI.COMM_WORLD
    traced = TracedComm(comm)
    odd_one = comm.size - 1
    (index, values, n), kind, words = BAD[case]
    arguments = (index, values, n) if comm.rank == odd_one else GOOD
    message = raised(lambda: sparse.sparse_allreduce(traced, *arguments))
    expected = f"on rank {odd_one}: " if comm.rank == odd_one else f"rank {odd_one} passed {kind}"
    words = words if comm.rank == odd_one else expected
    parallel_assert(message is not None and expected in message and words in message,
                    f"{case}, rank {comm.rank}: {message!r}")
    parallel_assert(only_check_messages(traced), f"{case}, rank {comm.rank}: pairs sent before the error")


@pytest.mark.parallel(nprocs=[2, 3, 4, 5])
@pytest.mark.parametrize("what", ["n", "dtype"])
def test_ranks_that_pass_different_n_or_dtypes_all_raise(what):
    comm = MPI.COMM_WORLD
    traced = TracedComm(comm)
    index, values, n = GOOD
    values = np.array(values)
    if comm.rank == comm.size - 1:
        n, values = (n + 2, values) if what == "n" else (n, values.astype(np.float32))
    message = raised(lambda: sparse.sparse_allreduce(traced, index, values, n))
    parallel_assert(message is not None and f"the {what} differs across ranks" in message,
                    f"rank {comm.rank}: {message!r}")
    parallel_assert(only_check_messages(traced), f"rank {comm.rank}: pairs sent before the error")


@pytest.mark.parallel(nprocs=[2, 3, 4, 5])
def test_indices_of_any_integer_dtype_in_any_order_give_the_dense_sum():
    comm = MPI.COMM_WORLD
    dtypes = [np.int32, np.int64, np.uint16, np.int8]

    def pairs(rank):                              # unsorted, distinct, each rank its own dtype
        index = np.random.default_rng([5, rank]).permutation(N)[:4 + rank % 3]
        return index.astype(dtypes[rank % 4]), np.arange(1.0, len(index) + 1) * (rank + 1)
    total = sparse.sparse_allreduce(comm, *pairs(comm.rank), N)
    expected = np.zeros(N)
    for rank in range(comm.size):
        index, values = pairs(rank)
        expected[index.astype(np.int64)] += values        # small integers: exact in any order
    parallel_assert(bool(np.array_equal(total, expected)), f"rank {comm.rank}: {total} against {expected}")
    # the heart itself sends int32 indices when handed int64 ones
    index, values = pairs(comm.rank)
    order = np.argsort(index)
    result = sparse.sparse_allreduce_recursive_doubling(
        comm, Sparse(index[order].astype(np.int64), values[order], N))
    result = result.dense() if isinstance(result, Sparse) else result
    parallel_assert(bool(np.array_equal(result, expected)), f"heart, rank {comm.rank}: {result}")


@pytest.mark.parallel(nprocs=[2, 3, 4])
@pytest.mark.parametrize("odd_block", ["longer", "shorter", "float64", "2-D"])
def test_allgather_of_unequal_or_unusable_blocks_stops_every_rank(odd_block):
    comm = MPI.COMM_WORLD
    traced = TracedComm(comm)
    odd_one = comm.size - 1
    block = np.full(6, comm.rank, dtype=np.uint8)
    if comm.rank == odd_one:
        block = {"longer": np.zeros(7, dtype=np.uint8), "shorter": np.zeros(5, dtype=np.uint8),
                 "float64": np.zeros(6), "2-D": np.zeros((2, 3), dtype=np.uint8)}[odd_block]
    message = raised(lambda: sparse.allgather(traced, block))
    words = {"longer": "the length differs across ranks", "shorter": "the length differs across ranks",
             "float64": "dtype", "2-D": "1-D"}[odd_block]
    parallel_assert(message is not None and words in message, f"rank {comm.rank}: {message!r}")
    parallel_assert(only_check_messages(traced), f"rank {comm.rank}: blocks sent before the error")


@pytest.mark.parallel(nprocs=[2, 3])
def test_with_check_false_a_ranks_own_bad_pairs_raise_before_it_sends():
    # check=False trusts the caller on n and dtype; a rank's own problem is still refused before
    # its first message (here every rank has it, so every rank raises)
    comm = MPI.COMM_WORLD
    traced = TracedComm(comm)
    with pytest.raises(ValueError, match="index 3 appears more than once"):
        sparse.sparse_allreduce(traced, [3, 3], [1.0, 1.0], N, check=False)
    with pytest.raises(ValueError, match="allgather moves bytes"):
        sparse.allgather(traced, np.zeros(4), check=False)
    parallel_assert(traced.messages == [], f"rank {comm.rank} sent {len(traced.messages)} messages first")


class CountedAllreduce(TracedComm):
    """TracedComm that also keeps the length and dtype of each MPI Allreduce it is asked for."""

    def __init__(self, comm):
        super().__init__(comm)
        self.allreduces = []

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        self.allreduces.append((len(recvbuf), np.asarray(recvbuf).dtype))
        return self.comm.Allreduce(sendbuf, recvbuf, op=op)


@pytest.mark.parallel(nprocs=[1, 2, 3, 4, 5])
def test_the_check_is_one_allreduce_of_five_int64_and_the_allgathers_of_three():
    # the header of collectives/compression/sparse.py: (n, dtype, their negatives, a problem code); allgather:
    # (length, its negative, a problem code), maxed by MPI's own Allreduce: no point-to-point message
    comm = MPI.COMM_WORLD
    for call, numbers in ((lambda c: sparse.sparse_allreduce(c, *GOOD), 5),
                          (lambda c: sparse.allgather(c, np.zeros(3, dtype=np.uint8)), 3)):
        spied = CountedAllreduce(comm)
        call(spied)
        parallel_assert(spied.allreduces == [(numbers, np.dtype(np.int64))] and
                        not any(m.phase == "check" for m in spied.messages),
                        f"rank {comm.rank}: allreduces {spied.allreduces}, "
                        f"{sum(m.phase == 'check' for m in spied.messages)} check messages")
