"""collectives.persistent: allreduce_init checks its arguments once, start() repeats the allreduce.

Every start() must give what the one-shot ``collectives.allreduce`` of the same algorithm gives on
the buffers' contents at that moment (exact reductions of small integers, as in test_collectives),
the same on every rank; a bad argument stops every rank at init, before any data message.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from mpi4py import MPI
from pytest_mpi import parallel_assert

import collectives
from collectives import persistent, trace
from collectives.check import MismatchError
from tests import strategies
from tests.helpers import fill, only_check_messages, same_on_every_rank


def expected(size, length, dtype, op, step):
    """The exact reduction of fill(rank + step) over the ranks: numpy on the stacked values."""
    stacked = np.stack([fill(rank + step, length, dtype) for rank in range(size)]) if length else \
        np.zeros((size, 0), dtype=dtype)
    result = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.sum}[op](stacked, axis=0).astype(dtype)
    if op == "mean":                                    # sum, then divide in the buffer's dtype
        result = result // size if result.dtype.kind in "iu" else result / size
    return result


@pytest.mark.parallel(nprocs=[1, 2, 3, 4])
@pytest.mark.parametrize("algorithm", [name for name in collectives.ALGORITHMS if not name.startswith("hierarchical")])
@settings(max_examples=15, deadline=None)       # the hierarchies: started below, and drawn in tests/test_simulate.py
@given(length=st.integers(0, 70), dtype=strategies.collective_dtypes, op=strategies.reduction_ops,
       mode=st.sampled_from(["separate", "IN_PLACE", "same array"]))
def test_every_start_gives_the_exact_reduction_of_the_buffers_current_values(algorithm, length, dtype, op, mode):
    comm = MPI.COMM_WORLD
    sendbuf = np.empty(length, dtype=dtype)
    recvbuf = sendbuf if mode == "same array" else np.empty(length, dtype=dtype)
    bound = persistent.allreduce_init(comm, MPI.IN_PLACE if mode == "IN_PLACE" else sendbuf, recvbuf, op=op,
                                      algorithm=algorithm, check=False)
    for step in range(3):                      # new values each step, as a training loop's gradient
        values = fill(comm.rank + step, length, dtype)
        (recvbuf if mode == "IN_PLACE" else sendbuf)[...] = values
        result = bound.start()
        shifted = expected(comm.size, length, dtype, op, step)
        parallel_assert(result is recvbuf, "start() returns recvbuf")
        parallel_assert(bool(np.array_equal(result, shifted)),
                        f"rank {comm.rank}: {algorithm} {op} step {step} gave {result[:6]}, expected {shifted[:6]}")
        parallel_assert(same_on_every_rank(comm, result), f"{algorithm}: ranks disagree")
        if mode == "separate":
            parallel_assert(bool(np.array_equal(sendbuf, values)), f"{algorithm} modified sendbuf")


@pytest.mark.parallel(nprocs=[2, 4])
def test_start_gives_the_same_bits_as_the_one_shot_allreduce_on_random_floats():
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(comm.rank)
    for algorithm in collectives.ALGORITHMS:
        grad = np.empty(1000, dtype=np.float32)
        bound = persistent.allreduce_init(comm, MPI.IN_PLACE, grad, op="mean", algorithm=algorithm)
        for _ in range(2):
            values = rng.standard_normal(1000).astype(np.float32)
            grad[...] = values
            bound.start()
            once = collectives.allreduce(comm, values, op="mean", algorithm=algorithm)
            parallel_assert(grad.tobytes() == once.tobytes(), f"{algorithm}: start() and allreduce differ")


@pytest.mark.parallel(nprocs=[2, 3])
def test_a_bad_argument_on_one_rank_stops_every_rank_at_init_before_any_data():
    comm = MPI.COMM_WORLD
    traced = trace.TracedComm(comm)
    length = 10 + (comm.rank == comm.size - 1)          # one rank's vector is longer
    with pytest.raises(MismatchError, match="length"):
        persistent.allreduce_init(traced, np.ones(length), np.empty(length))
    parallel_assert(only_check_messages(traced), f"rank {comm.rank}: data sent before the error")


def test_unknown_algorithm_and_missing_buffer_are_refused():
    with pytest.raises(ValueError, match="unknown algorithm"):
        persistent.allreduce_init(MPI.COMM_SELF, np.ones(3), algorithm="hypercube")
    with pytest.raises(MismatchError, match="must be a numpy or cupy array"):
        persistent.allreduce_init(MPI.COMM_SELF, MPI.IN_PLACE, None)


@pytest.mark.parallel(nprocs=[1, 2])
def test_bench_persistent_rows_compare_auto_init_with_mpis_allreduce_init(tmp_path_factory):
    from collectives.bench import measure
    comm = MPI.COMM_WORLD
    path = tmp_path_factory.mktemp("bench") / "bench.json" if comm.rank == 0 else None
    path = comm.bcast(str(path) if path else None)
    records = measure.main(["--quick", "--sizes", "4K", "--algorithms", "auto", "--persistent", "--json", path])
    rows = {record["algorithm"]: record for record in records}
    # mpi_init needs an MPI with persistent collectives (MPI 4.0: MPICH 4, Open MPI 5); without them
    # auto_init is compared with the plain Allreduce
    reference = rows.get("mpi_init", rows["mpi"])
    parallel_assert({"mpi", "auto", "auto_init"} <= set(rows) <= {"mpi", "auto", "mpi_init", "auto_init"},
                    f"rows {sorted(rows)}")
    parallel_assert(rows["auto_init"]["mpi_seconds"] == reference["seconds"]
                    and rows["auto"]["mpi_seconds"] == rows["mpi"]["seconds"], "each auto row against its own MPI")
    # the auto target; beside it the calibrated model's where collectives/model/calibration.json was fitted at this p
    parallel_assert(rows["auto_init"]["target"].split(",")[0] == "<=1.5x", "auto_init has the auto target")
