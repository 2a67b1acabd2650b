"""Activation recomputation (minidl.recompute): the plain backward's gradients, bit for bit, with fewer
activations kept, by the amount the segment sizes predict.

Run: python tests/run.py --max-ranks 2 -- tests/test_recompute.py

Memory is measured with tracemalloc (NumPy reports its array allocations to it): the peak of one
forward + backward above what was allocated before it. The test network is L = 8 pairs of
Linear(W, W) -> ReLU in float64 on a batch of N rows, so every kept activation is one array of
A = N W 8 bytes: the plain backward starts with all 2 L of them alive; checkpointed in S equal
segments, only the S segment outputs are kept, and during the backward one segment of 2 L / S
arrays is alive again, with the gradient that flows into it (one A, held by the engine while the
segment's own backward runs). So the peak is lower by (2 L - S - 2 L / S - 1) A, the rest of the
peak (the gradients in flight) being the same both ways.
"""
import tracemalloc

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import allreduce_sgd, serial_sgd
from algorithms.core import cli, run
from algorithms.core.checkpoint import Writer
from minidl import functional as F, models
from minidl.flat import flatten
from minidl.nn import Dropout, Linear, ReLU, Sequential
from minidl.recompute import Checkpoint, checkpoint, checkpointed
from minidl.tensor import Tensor
from tests.helpers import small_data

PAIRS, ROWS, WIDTH = 8, 64, 256
A = ROWS * WIDTH * 8


def gradients(net, x, labels):
    """(the flat parameter gradient, the input's gradient) of the mean cross-entropy, as copies."""
    flat = flatten(net)
    flat.zero_grad()
    inputs = Tensor(x, requires_grad=True)
    F.softmax_cross_entropy(net(inputs), labels).backward()
    return flat.grad.copy(), inputs.grad.copy()


@pytest.mark.parametrize("name, shape", [("mlp", (8, 1, 8, 8)), ("cnn", (8, 1, 8, 8)), ("lenet5", (4, 1, 28, 28))])
def test_checkpointed_segments_give_the_plain_backwards_gradients_bit_for_bit(name, shape):
    rng = np.random.default_rng(1)
    x, labels = rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])
    plain = gradients(models.build(name, np.random.default_rng(0)), x, labels)
    layers = len(models.build(name, np.random.default_rng(0)))
    for segments in sorted({1, 2, layers}):
        recomputed = gradients(checkpointed(models.build(name, np.random.default_rng(0)), segments), x, labels)
        assert np.array_equal(recomputed[0], plain[0]), f"{name}, {segments} segments: parameter gradients differ"
        assert np.array_equal(recomputed[1], plain[1]), f"{name}, {segments} segments: input gradients differ"


def deep_mlp():
    rng = np.random.default_rng(0)
    return Sequential(*[layer for _ in range(PAIRS) for layer in (Linear(WIDTH, WIDTH, rng=rng, dtype="float64"),
                                                                 ReLU())])


def peak_bytes(net, x):
    """Peak bytes allocated during forward + backward of sum(net(x)^2), above the bytes alive before."""
    flat = flatten(net)
    net(Tensor(x)).sum().backward()            # once first: the workspaces and gradient arrays exist
    flat.zero_grad()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = net(Tensor(x))
        (out * out).sum().backward()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_peak_activation_memory_drops_by_what_the_segment_sizes_predict():
    x = np.random.default_rng(1).standard_normal((ROWS, WIDTH))
    plain = peak_bytes(deep_mlp(), x)
    assert plain > 2 * PAIRS * A, f"plain peak {plain / A:.2f} A: not every activation was counted"
    for segments in (2, 4, 8):
        saved = (plain - peak_bytes(checkpointed(deep_mlp(), segments), x)) / A
        predicted = 2 * PAIRS - segments - 2 * PAIRS / segments - 1
        assert abs(saved - predicted) < 0.25, f"{segments} segments: saved {saved:.2f} A, predicted {predicted} A"


def test_a_segment_with_dropout_is_refused_and_no_grad_runs_it_plainly():
    segment = Sequential(Linear(4, 4, rng=np.random.default_rng(0)), Dropout(0.5, rng=np.random.default_rng(0)))
    with pytest.raises(ValueError, match="Dropout"):
        Checkpoint(segment)(Tensor(np.ones((2, 4), dtype=np.float32)))
    out = checkpoint(Linear(4, 4, rng=np.random.default_rng(0)), Tensor(np.ones((2, 4), dtype=np.float32)))
    assert out.requires_grad and out.op == "checkpoint"


def test_the_recompute_flag_reaches_the_network_and_serial_sgd_trains_bit_for_bit_as_without():
    args = cli.parser("serial", recompute=True).parse_args(["--recompute", "--model", "mlp"])
    settings = run.Settings.of(cli.shared_settings(args), data=small_data(), quiet=True)
    job = run.Run.start(MPI.COMM_SELF, settings, writer=Writer("serial_sgd"))
    assert [type(layer) for layer in job.objective.net] == [Checkpoint, Checkpoint]    # round(sqrt(6)) segments
    runs = [serial_sgd.train(data=small_data(), epochs=1, quiet=True, recompute=flag)[0] for flag in (False, True)]
    assert np.array_equal(*runs)


@pytest.mark.parallel(nprocs=[2])
def test_allreduce_sgd_with_recompute_trains_bit_for_bit_as_without():
    runs = [allreduce_sgd.train(MPI.COMM_WORLD, data=small_data(), epochs=1, quiet=True, recompute=flag)[0]
            for flag in (False, True)]
    parallel_assert(np.array_equal(*runs), "--recompute changed allreduce SGD's parameters")
