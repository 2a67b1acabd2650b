"""collectives: bad input stops every rank at once with a clear error, before any data message.

The contract: a rank that passes arguments it cannot use (a read-only buffer the call writes
into, an unsupported dtype, the wrong shape) or that disagrees with the others (length, dtype,
op) makes EVERY rank raise MismatchError, naming the rank and the kind of problem, within the
agreement check (collectives.check), so no rank hangs and none returns a wrong answer. With
check=False the caller is trusted; a rank still refuses its own bad buffer before it sends
anything. A hang fails these tests through pytest-timeout (setup.cfg).
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

import collectives
from collectives import trace
from collectives.check import MismatchError
from tests.helpers import only_check_messages

ALGORITHMS = collectives.ALGORITHMS


def read_only(array):
    array.flags.writeable = False
    return array


# ---------------------------------------------------------------------------------------------
# ranks that disagree

@pytest.mark.parallel(nprocs=[2, 3, 4, 5])
@pytest.mark.parametrize("what", ["length", "dtype", "op", "shape"])
def test_mismatched_arguments_raise_on_every_rank(what):
    comm = MPI.COMM_WORLD
    odd_one = comm.size - 1
    for algorithm in ALGORITHMS:
        length, dtype, op = 10, np.float64, "sum"
        if comm.rank == odd_one:
            length, dtype, op = {"length": (11, dtype, op), "dtype": (length, np.float32, op),
                                 "op": (length, dtype, "max"), "shape": (length, dtype, op)}[what]
        mine = np.ones(length, dtype=dtype)
        if what == "shape" and comm.rank == odd_one:
            mine = np.ones((2, 5), dtype=dtype)
        try:
            collectives.allreduce(comm, mine, op=op, algorithm=algorithm)
            message = None
        except MismatchError as error:
            message = str(error)
        word = {"length": "length", "dtype": "dtype", "op": "op", "shape": "1-D"}[what]
        parallel_assert(message is not None, f"rank {comm.rank}: {algorithm} raised nothing")
        parallel_assert(word in message, f"rank {comm.rank}: {message}")


@pytest.mark.parallel(nprocs=[2, 3])
def test_mismatched_building_block_arguments_raise_on_every_rank():
    comm = MPI.COMM_WORLD
    length = 10 + (comm.rank == 1)
    for call in (lambda: collectives.broadcast(comm, np.ones(length)),
                 lambda: collectives.reduce(comm, np.ones(length)),
                 lambda: collectives.reduce_scatter(comm, np.ones(length)),
                 lambda: collectives.allgather(comm, np.ones(1), np.ones(length))):
        with pytest.raises(MismatchError):
            call()


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="unknown algorithm"):
        collectives.allreduce(MPI.COMM_SELF, np.ones(3), algorithm="hypercube")


# ---------------------------------------------------------------------------------------------
# a read-only buffer that the call would write into, on one rank

@pytest.mark.parallel(nprocs=[2, 3, 4])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("mode", ["IN_PLACE", "same array", "separate"])
def test_a_read_only_result_buffer_on_one_rank_stops_every_rank_before_any_data(algorithm, mode):
    # before the fix: ring and auto hung, butterfly and Rabenseifner aborted on one rank, and
    # naive and tree returned "OK" on every rank but the read-only one
    comm = MPI.COMM_WORLD
    traced = trace.TracedComm(comm)
    odd_one = comm.size - 1
    recvbuf = np.ones(7)
    if comm.rank == odd_one:
        read_only(recvbuf)
    sendbuf = {"IN_PLACE": MPI.IN_PLACE, "same array": recvbuf, "separate": np.ones(7)}[mode]
    with pytest.raises(MismatchError, match="read-only") as raised:
        collectives.allreduce(traced, sendbuf, recvbuf, algorithm=algorithm)
    expected = f"rank {odd_one}" if comm.rank != odd_one else f"on rank {odd_one}: recvbuf is read-only"
    parallel_assert(expected in str(raised.value), f"rank {comm.rank}: {raised.value}")
    parallel_assert(only_check_messages(traced), f"rank {comm.rank}: data sent before the error")


@pytest.mark.parallel(nprocs=[2, 3])
def test_a_read_only_sendbuf_is_fine_when_the_result_goes_elsewhere():
    comm = MPI.COMM_WORLD
    sendbuf = read_only(np.full(5, comm.rank + 1.0))
    for algorithm in ALGORITHMS:
        result = collectives.allreduce(comm, sendbuf, np.empty(5), algorithm=algorithm)
        parallel_assert(bool(np.all(result == comm.size * (comm.size + 1) / 2)), f"{algorithm}: {result}")


@pytest.mark.parallel(nprocs=[2, 3])
def test_a_read_only_result_buffer_in_a_building_block_stops_every_rank():
    comm = MPI.COMM_WORLD
    last = comm.size - 1
    counts = collectives.block_counts(6, comm.size)

    def buffer(length):           # read-only on the last rank only
        array = np.ones(length)
        return read_only(array) if comm.rank == last else array

    calls = {"broadcast": lambda: collectives.broadcast(comm, buffer(6), root=0),     # last rank receives
             "reduce": lambda: collectives.reduce(comm, np.ones(6), buffer(6), root=last),
             "reduce_scatter": lambda: collectives.reduce_scatter(comm, np.ones(6), buffer(counts[comm.rank])),
             "allgather": lambda: collectives.allgather(comm, np.ones(counts[comm.rank]), buffer(6))}
    for name, call in calls.items():
        try:
            call()
            message = ""
        except MismatchError as error:
            message = str(error)
        parallel_assert("read-only" in message, f"rank {comm.rank}: {name} gave {message!r}")


@pytest.mark.parallel(nprocs=[2, 3])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_with_check_false_a_read_only_buffer_is_refused_before_the_first_message(algorithm):
    # check=False trusts the caller, so only the rank that has the problem can raise; here every
    # rank has it, so every rank must raise, and before sending (before the fix: BufferError or
    # numpy's "output array is read-only" after messages had gone out, or a hang)
    comm = MPI.COMM_WORLD
    traced = trace.TracedComm(comm)
    buffer = read_only(np.ones(6))
    with pytest.raises(ValueError, match="recvbuf is read-only"):
        collectives.allreduce(traced, MPI.IN_PLACE, buffer, algorithm=algorithm, check=False)
    parallel_assert(traced.messages == [], f"rank {comm.rank} sent {len(traced.messages)} messages first")


# ---------------------------------------------------------------------------------------------
# dtypes: longdouble and clongdouble are refused on every rank, whatever the others pass

@pytest.mark.parallel(nprocs=[2, 3])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("layout", ["longdouble everywhere", "longdouble here, clongdouble there"])
def test_longdouble_and_clongdouble_are_refused_on_every_rank(algorithm, layout):
    # before the fix both passed the agreement check as one "unsupported" code, then hung or
    # aborted inside MPICH (mixed), or returned an unchecked result (longdouble everywhere)
    if np.dtype(np.longdouble).name == "float64":
        pytest.skip("longdouble is plain float64 on this platform")
    comm = MPI.COMM_WORLD
    traced = trace.TracedComm(comm)
    dtype = np.clongdouble if layout != "longdouble everywhere" and comm.rank % 2 else np.longdouble
    with pytest.raises(MismatchError, match="longdouble") as raised:
        collectives.allreduce(traced, np.ones(4, dtype=dtype), algorithm=algorithm)
    parallel_assert("not supported" in str(raised.value), f"rank {comm.rank}: {raised.value}")
    parallel_assert(only_check_messages(traced), f"rank {comm.rank}: data sent before the error")


@pytest.mark.parallel(nprocs=[2, 3])
@pytest.mark.parametrize("odd_dtype", ["longdouble", ">f8", "bool"])
def test_an_unsupported_dtype_on_one_rank_stops_every_rank_and_names_it(odd_dtype):
    if odd_dtype == "longdouble" and np.dtype(np.longdouble).name == "float64":
        pytest.skip("longdouble is plain float64 on this platform")
    comm = MPI.COMM_WORLD
    odd_one = comm.size - 1
    dtype = odd_dtype if comm.rank == odd_one else "float64"
    for algorithm in ALGORITHMS:
        with pytest.raises(MismatchError) as raised:
            collectives.allreduce(comm, np.ones(4, dtype=dtype), algorithm=algorithm)
        words = "unsupported dtype" if comm.rank != odd_one else "dtype"
        parallel_assert(words in str(raised.value) and f"rank {odd_one}" in str(raised.value),
                        f"rank {comm.rank}: {raised.value}")
