"""SparCML's sparse allreduce (collectives/compression/sparse.py), against the dense sum and the message formula.

Run: python tests/run.py -- tests/test_sparse_allreduce.py

Every rank's sparse vector is drawn from a generator seeded with (case, rank), so every rank can
rebuild every other rank's vector and sum them densely: that is the oracle. Values are small
positive integers, so every sum is exact (any order of additions gives the same bits) and no two
values cancel (the merged support is the union of the supports). The expected message sizes are
written out here from the schedule (fold-in, recursive doubling on aligned groups, fold-out) and
the break-even rule: a vector whose support has k entries travels as min(k (4 + 8), 8 n) bytes.
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from collectives.compression import sparse
from collectives.compression.compress import Sparse
from collectives.tags import CHECK
from collectives.trace import TracedComm

N = 97                                                        # odd, so no block is even
CASES = [("disjoint-ish", 0.0), ("1%", 0.01), ("5%", 0.05), ("20%", 0.2), ("50%", 0.5), ("all", 1.0),
         ("shared 30%", 0.3)]                                 # shared: every rank the same support


def support(case, rank):
    name, density = CASES[case]
    rng = np.random.default_rng([case, 0 if name.startswith("shared") else rank])
    return np.sort(rng.choice(N, size=round(density * N), replace=False))


def values(case, rank):
    return np.random.default_rng([case, rank, 1]).integers(1, 9, size=len(support(case, rank))).astype(np.float64)


def message(count):
    """The break-even rule: pairs while 12 k < 8 n, the dense vector from there on."""
    return 8 * N if 12 * count >= 8 * N else 12 * count


def expected_sends(case, rank, size):
    """The bytes of each message ``rank`` sends, in order, from the schedule."""
    pof2 = 1 << (size.bit_length() - 1)
    rem = size - pof2

    def held(newrank):                                        # the ranks whose vectors a survivor holds
        return [2 * newrank, 2 * newrank + 1] if newrank < rem else [newrank + rem]

    def union(ranks):
        return len(set().union(*(set(support(case, r).tolist()) for r in ranks)))
    if rank < 2 * rem and rank % 2 == 0:
        return [message(union([rank]))]                       # fold-in, then it only receives
    newrank = rank // 2 if rank < 2 * rem else rank - rem
    sends, distance = [], 1
    while distance < pof2:
        group = [r for q in range(newrank // distance * distance, newrank // distance * distance + distance)
                 for r in held(q)]
        sends.append(message(union(group)))
        distance *= 2
    if rank < 2 * rem:
        sends.append(message(union(range(size))))           # fold-out: the result
    return sends


@pytest.mark.task("8.3")
@pytest.mark.parallel(nprocs=[2, 3, 4, 5, 7, 8])
def test_sparse_allreduce_is_the_dense_sum_and_sends_what_the_break_even_rule_says():
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    traced = TracedComm(comm)
    for case, (name, _) in enumerate(CASES):
        traced.reset()
        total = sparse.sparse_allreduce(traced, support(case, rank), values(case, rank), N)
        dense = np.zeros(N)
        for other in range(size):
            dense[support(case, other)] += values(case, other)
        parallel_assert(bool(np.array_equal(total, dense)), f"{name}, p={size}: not the dense sum")
        sent = [m.nbytes for m in traced.messages if m.direction == "send" and m.tag != CHECK]
        expected = expected_sends(case, rank, size)
        parallel_assert(sent == expected, f"{name}, p={size}, rank {rank}: sent {sent}, formula {expected}")
        # the result is dense exactly when the union of all supports is past the break-even point
        own = Sparse(support(case, rank).astype(np.int32), values(case, rank), N)
        result = sparse.sparse_allreduce_recursive_doubling(comm, own)
        union = len(set().union(*(set(support(case, r).tolist()) for r in range(size))))
        parallel_assert(isinstance(result, np.ndarray) == (12 * union >= 8 * N),
                        f"{name}, p={size}: {type(result).__name__} result for {union} nonzeros of {N}")


@pytest.mark.parallel(nprocs=[1])
def test_sparse_allreduce_on_one_rank_densifies_and_the_direct_allgather_returns_the_block():
    total = sparse.sparse_allreduce(MPI.COMM_WORLD, [5, 2], [1.0, 2.0], 7)
    parallel_assert(bool(np.array_equal(total, [0, 0, 2, 0, 0, 1, 0])), f"got {total}")
    block = np.arange(5, dtype=np.uint8)
    parallel_assert(sparse.allgather(MPI.COMM_WORLD, block)[0] is block, "allgather on one rank")


@pytest.mark.parallel(nprocs=[3, 4])
def test_direct_allgather_gives_every_block_in_rank_order_for_p_minus_one_messages():
    comm = MPI.COMM_WORLD
    traced = TracedComm(comm)
    blocks = sparse.allgather(traced, np.full(6, comm.rank, dtype=np.uint8))
    parallel_assert(all(np.array_equal(block, np.full(6, r)) for r, block in enumerate(blocks)), "wrong blocks")
    sends = [m.nbytes for m in traced.messages if m.direction == "send" and m.tag != CHECK]
    parallel_assert(sends == [6] * (comm.size - 1), f"sent {sends}")
