"""Overlapping the gradient sum with backward: buckets, the autograd hook, the
nonblocking bucketed butterfly, and ``allreduce_sgd --buckets``.

Run: python tests/run.py --max-ranks 4 -- tests/test_overlap.py

The claim tested: ``--buckets MB`` gives bitwise the parameters of ``--allreduce butterfly``
without it, for every bucket size and p (including p = 3, the fold-in), because every element is
summed by the same additions; and the bucketed sum of integer-valued vectors equals the exact sum.
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import allreduce_sgd
from collectives import butterfly
from collectives.nonblocking import BucketedAllreduce, overlap_prediction
from minidl.flat import flatten
from minidl.nn import Linear, ReLU, Sequential
from minidl.tensor import Tensor
from tests.helpers import assert_stopped, expect_error_on_every_rank, float64_mlp, launch, tiny_digits


def test_buckets_cover_the_gradient_in_reverse_layer_order_with_whole_parameters():
    flat = flatten(float64_mlp())                          # 64*16 + 16 + 16*10 + 10 float64 = 1210 values
    for nbytes in (1, 100, 8 * 170, 8 * 1000, 1e9):
        plan = flat.buckets(nbytes)
        assert plan[0][1] == flat.size and plan[-1][0] == 0, plan             # from the end to the start
        assert all(a[0] == b[1] for a, b in zip(plan, plan[1:])), plan        # contiguous, no gap
        members = [index for _, _, bucket in plan for index in bucket]
        assert members == list(reversed(range(len(flat.parameters)))), plan    # reverse order, each once
        for start, stop, bucket in plan:
            assert (start, stop) == (flat.offsets[bucket[-1]][0], flat.offsets[bucket[0]][1])
        assert all((stop - start) * 8 >= nbytes for start, stop, _ in plan[:-1]), plan
    assert len(flat.buckets(1)) == 4 and len(flat.buckets(1e9)) == 1
    with pytest.raises(ValueError, match="nbytes must be > 0"):
        flat.buckets(0)


def test_the_accumulate_hook_sees_each_final_gradient_once_last_layer_first():
    rng = np.random.default_rng(0)
    net = Sequential(Linear(3, 4, rng=rng, dtype="float64"), ReLU(), Linear(4, 2, rng=rng, dtype="float64"))
    parameters = list(net.parameters())
    seen = []
    for index, parameter in enumerate(parameters):
        parameter.register_accumulate_hook(lambda leaf, index=index: seen.append((index, leaf.grad.copy())))
    x = Tensor(rng.standard_normal((5, 3)))
    (net(x) * net(x)).sum().backward()                     # each parameter used twice: two paths to sum
    assert sorted(index for index, _ in seen) == [0, 1, 2, 3]
    assert [index for index, _ in seen][:2] in ([2, 3], [3, 2])     # the last layer's gradients come first
    for index, grad in seen:                               # what the hook saw is the final gradient
        assert np.array_equal(grad, parameters[index].grad)


def test_the_overlap_model_on_hand_worked_cases():
    # p = 4: the butterfly of m bytes costs 2 alpha + 2 m beta (+ 2 m gamma). Buckets ready at
    # forward_backward - after; a bucket starts when it is ready and the previous one is done.
    assert overlap_prediction(4, [100, 100], [10, 0], 20, alpha=1, beta=0) == (22, 22)   # latency: no gain
    assert overlap_prediction(4, [3, 1], [10, 0], 20, alpha=0, beta=1) == (28, 22)      # 3-byte bucket hidden
    assert overlap_prediction(4, [10, 1], [5, 4], 20, alpha=0, beta=1) == (42, 37)      # second waits for the first
    assert overlap_prediction(4, [1, 1], [3, 0], 20, alpha=0, beta=0, gamma=1) == (24, 22)


def test_a_second_backward_in_one_step_is_refused():
    summed = BucketedAllreduce(MPI.COMM_SELF, np.ones(4), [(0, 4, 1)])
    summed.begin(0.5)
    summed.ready(0)                                        # final: scaled and (on one rank) summed
    with pytest.raises(RuntimeError, match="reported ready after it was started"):
        summed.ready(0)
    summed.finish()
    assert summed.vector.tolist() == [0.5] * 4


@pytest.mark.parallel(nprocs=[2, 3, 4])
def test_bucketed_sum_is_exact_and_bitwise_the_butterfly():
    comm = MPI.COMM_WORLD
    rng = np.random.default_rng(comm.rank)
    exact = np.arange(1000, dtype=np.float64)              # integer values: the sum is exact
    values = rng.standard_normal(1000)
    reference = butterfly.allreduce(comm, values.copy())
    for cut in ([(0, 1000, 1)], [(900, 1000, 2), (10, 900, 1), (0, 10, 3)]):
        for data, expected in ((exact * (comm.rank + 1), exact * comm.size * (comm.size + 1) / 2),
                               (values, reference)):
            vector = data.copy()
            summed = BucketedAllreduce(comm, vector, cut)
            summed.begin(1.0)
            for bucket, (_, _, parts) in enumerate(cut):
                if comm.rank != 1:                         # rank 1 starts all in finish(), in plan order;
                    for _ in range(parts - (bucket == 0)):   # the others 1, 2 first, then 0 (a partner of
                                                             # rank 1 waits on another bucket: no deadlock)
                        summed.ready(bucket)
            summed.finish()
            parallel_assert(bool(np.array_equal(vector, expected)), f"p={comm.size}, cut {cut}: wrong sum")


@pytest.mark.parallel(nprocs=[1, 2, 3, 4])
def test_buckets_give_bitwise_the_parameters_of_the_blocking_butterfly():
    comm = MPI.COMM_WORLD
    kw = dict(model=float64_mlp, data=tiny_digits(), epochs=1, lr=0.1, momentum=0.9, batch_size=3, quiet=True)
    blocking, _ = allreduce_sgd.train(comm, allreduce="butterfly", **kw)
    for megabytes in (1e-6, 0.002, 1.0):                   # one parameter per bucket, two buckets, one
        overlapped, _ = allreduce_sgd.train(comm, allreduce="butterfly", buckets=megabytes, **kw)
        parallel_assert(bool(np.array_equal(overlapped, blocking)),
                        f"p={comm.size}, --buckets {megabytes}: not bitwise the blocking butterfly")
    expect_error_on_every_rank(lambda: allreduce_sgd.train(comm, allreduce="ring", buckets=1.0, **kw),
                               "pass that (got --allreduce ring)")


@pytest.mark.parametrize("value, message", [("0", "--buckets must be a finite number > 0, got 0.0"),
                                            ("abc", "argument --buckets: invalid float value: 'abc'")])
def test_a_bad_buckets_value_stops_every_rank(value, message):
    assert_stopped(launch("allreduce_sgd", "--allreduce", "butterfly", "--buckets", value), message)


@pytest.mark.parallel(nprocs=[2, 3])
def test_each_bucket_runs_chapter_3s_butterfly_heart_itself(monkeypatch):
    """No second copy of the butterfly: a bucket's sum is butterfly_allreduce_in_place (tasks 3.6
    and 3.7) run one message at a time, so in a student tree --buckets uses the student's code."""
    from collectives import nonblocking
    calls = []

    def heart(comm, data, op, source=None):
        calls.append(op)
        raise NotImplementedError("Task 3.7: a stub")
    monkeypatch.setattr(nonblocking, "butterfly_allreduce_in_place", heart)
    summed = BucketedAllreduce(MPI.COMM_WORLD, np.ones(6), [(0, 3, 1), (3, 6, 1)])
    summed.begin(1.0)
    with pytest.raises(NotImplementedError, match="Task 3.7"):
        summed.finish()
    parallel_assert(calls[:1] == ["sum"], f"the heart was not called: {calls}")
