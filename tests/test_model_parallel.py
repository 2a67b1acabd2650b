"""Model parallelism (DistBelief): a partitioned MLP equals the unpartitioned one, on P = 1..4 ranks.

Run: python tests/run.py --max-ranks 4 -- tests/test_model_parallel.py

The MLP 64 -> 7 -> 5 -> 10 (float64) splits unevenly for P = 2, 3, 4 (7 = 2+2+2+1, 5 = 2+1+1+1
at P = 4), by output neurons and by input features; a small CNN (5 and 6 channels) by output
channels. Forward (the loss), backward (every piece's
gradient against the same block of the unpartitioned gradient) and 10 SGD steps are compared
with minidl's autograd on the whole model; the bytes sent are traced and compared with the
formula, written here from the layer widths.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import model_parallel
from algorithms.core import partition
from algorithms.core.cli import SettingError
from algorithms.core.objective import Data, NetworkObjective, load_data
from collectives.trace import TracedComm
from minidl.data import epoch_order
from minidl.nn import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidl.optim import SGD

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = [64, 7, 5, 10]
EQUAL_UP_TO_ROUNDING = 1e-10          # the reductions regroup sums of <= 64 terms: a few ulps (measured ~2e-16)


def uneven_mlp():
    rng = np.random.default_rng(5)
    return Sequential(Flatten(), Linear(64, 7, rng=rng, dtype="float64"), ReLU(),
                      Linear(7, 5, rng=rng, dtype="float64"), ReLU(),
                      Linear(5, 10, rng=rng, init="glorot", dtype="float64"))


def tiny_digits(n_train=50, n_test=20):
    data = load_data("digits", seed=0)
    return Data(data.x_train[:n_train].astype(np.float64), data.y_train[:n_train],
                data.x_test[:n_test].astype(np.float64), data.y_test[:n_test])


def relative_error(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def expected_bytes(rows, size, split, features):
    """Every Sendrecv carries a block that crosses between partitions; summed over the ranks:
    output: each layer's output allgathered ((P-1) copies of every neuron), each inner da reduce-
    scattered ((P-1) partial sums of every feature); input: each layer's output reduce-scattered
    and allgathered, each inner da allgathered. ``features``: per row, the input and each layer's output."""
    outputs, inner = sum(features[1:]), sum(features[1:-1])
    forward = outputs * (1 if split == "output" else 2)
    return (size - 1) * rows * (forward + inner) * 8


def small_cnn():
    """(N, 1, 8, 8) -conv 5-> pool -> (N, 5, 4, 4) -conv 6-> pool -> (N, 6, 2, 2) -> 24 -> 10; 5 and 6 channels
    split unevenly over 2, 3 and 4 ranks."""
    rng = np.random.default_rng(6)
    return Sequential(Conv2d(1, 5, 3, padding=1, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      Conv2d(5, 6, 3, padding=1, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      Flatten(), Linear(24, 10, rng=rng, init="glorot", dtype="float64"))


CNN_FEATURES = [64, 5 * 4 * 4, 6 * 2 * 2, 10]      # per row: the input, and each block's output (after pooling)


def own_block(layer, gradient, rows_or_cols, split):
    """The block of the whole layer's ``gradient`` that a rank's piece holds."""
    if isinstance(layer, Conv2d):                    # weight (out channels, in channels, k, k)
        return gradient[rows_or_cols]
    return gradient[:, rows_or_cols] if split == "output" else gradient[rows_or_cols, :]


def check_partitioned_equals_whole(model, features, splits):
    comm, data = MPI.COMM_WORLD, tiny_digits()
    rows = np.arange(12)
    whole = NetworkObjective(model(), data)
    loss = whole.loss_and_grad(rows)
    layers = [layer for layer in whole.net if isinstance(layer, (Linear, Conv2d))]
    # ten serial SGD steps at batch 5 (one epoch of 50 rows), from the same weights
    serial = NetworkObjective(model(), data)
    optimizer = SGD([serial.flat.as_parameter()], lr=0.1, momentum=0.9)
    order = epoch_order(serial.n, 0, 0)
    for start in range(0, 50, 5):
        serial.loss_and_grad(order[start:start + 5])
        optimizer.step()
    for split in splits:
        pieces = [partition.Piece(block, comm.rank, comm.size, split)
                  for block in partition.blocks_of(model())]
        for piece in pieces:
            for parameter in piece.parameters():
                parameter.grad = np.zeros_like(parameter.data)
        traced = TracedComm(comm)
        mine = model_parallel.model_parallel_gradient(traced, pieces, data.x_train[rows], data.y_train[rows], split)
        parallel_assert(abs(mine - loss) < 1e-12 * abs(loss), f"{split}, P={comm.size}: loss {mine} != {loss}")
        for k, (piece, layer) in enumerate(zip(pieces, layers)):
            own = piece.cols if split == "output" else piece.rows
            error = relative_error(piece.weight.grad, own_block(layer, layer.weight.grad, own, split))
            parallel_assert(error < EQUAL_UP_TO_ROUNDING, f"{split}, P={comm.size}, layer {k}: weight grad {error:.1e}")
            error = 0.0                           # parallel_assert is collective: every rank calls it
            if piece.bias is not None:
                bias = layer.bias.grad[own] if split == "output" else layer.bias.grad
                error = relative_error(piece.bias.grad, bias)
            parallel_assert(error < EQUAL_UP_TO_ROUNDING, f"{split}, layer {k}: bias grad {error:.1e}")
        owners = comm.allreduce(sum(piece.bias is not None for piece in pieces))
        parallel_assert(owners == len(layers) * (comm.size if split == "output" else 1),
                        f"{split}: each bias (block) must have exactly one owner, got {owners} owners")
        sent = comm.allreduce(sum(record.nbytes for record in traced.messages if record.direction == "send"))
        expected = expected_bytes(len(rows), comm.size, split, features)
        parallel_assert(sent == expected, f"{split}, P={comm.size}: {sent} bytes, formula {expected}")
        parallel_assert(sent == model_parallel.bytes_per_step(len(rows), features, comm.size, 8, split),
                        f"{split}: bytes_per_step disagrees")
        params, _ = model_parallel.train(comm, split=split, model=model, data=data, epochs=1, lr=0.1,
                                         momentum=0.9, batch_size=5, quiet=True)
        error = relative_error(params, serial.params)
        parallel_assert(error < EQUAL_UP_TO_ROUNDING, f"{split}, P={comm.size}: 10 steps, relative error {error:.1e}")


@pytest.mark.task("6.2")
@pytest.mark.parallel(nprocs=[1, 2, 3, 4])
def test_partitioned_mlp_forward_backward_and_ten_steps_equal_the_unpartitioned_model():
    check_partitioned_equals_whole(uneven_mlp, WIDTHS, partition.SPLITS)


@pytest.mark.task("6.2")
@pytest.mark.parallel(nprocs=[1, 2, 3, 4])
def test_cnn_split_by_output_channels_equals_the_unpartitioned_model():
    check_partitioned_equals_whole(small_cnn, CNN_FEATURES, ["output"])


@pytest.mark.parallel(nprocs=[4])
def test_a_layer_narrower_than_the_ranks_is_refused_on_every_rank():
    def narrow():
        rng = np.random.default_rng(0)
        return Sequential(Flatten(), Linear(64, 3, rng=rng, dtype="float64"), ReLU(),
                          Linear(3, 10, rng=rng, dtype="float64"))
    with pytest.raises(SettingError, match=r"4 ranks cannot split layer 0 \(64 -> 3\) by output"):
        model_parallel.train(MPI.COMM_WORLD, split="output", model=narrow, data=tiny_digits(), quiet=True)
    with pytest.raises(SettingError, match=r"4 ranks cannot split layer 1 \(3 -> 10\) by input"):
        model_parallel.train(MPI.COMM_WORLD, split="input", model=narrow, data=tiny_digits(), quiet=True)


def test_a_cnn_split_by_input_features_stops_every_rank_with_an_error():
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([str(Path(sys.executable).parent / "mpiexec"), "-n", "2", sys.executable, "-m",
                           "algorithms.model_parallel", "--model", "cnn", "--split", "input"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 2, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr and "epoch" not in done.stdout, done.stderr
    assert done.stderr.count("error: --model cnn: --split input partitions an MLP") == 2, done.stderr
