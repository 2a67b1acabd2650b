"""Model parallelism (DistBelief): a partitioned MLP equals the unpartitioned one, on P = 1..4 ranks.

Run: python tests/run.py --max-ranks 4 -- tests/test_model_parallel.py

The MLP 64 -> 7 -> 5 -> 10 (float64) splits unevenly for P = 2, 3, 4 (7 = 2+2+2+1, 5 = 2+1+1+1
at P = 4), by output neurons and by input features; a small CNN (5 and 6 channels) by output
channels. Forward (the loss), backward (every piece's
gradient against the same block of the unpartitioned gradient) and 10 SGD steps are compared
with minidl's autograd on the whole model; the bytes sent are traced and compared with the
formula, written in tests/helpers.py from the layer widths.
"""
import numpy as np
import pytest
from mpi4py import MPI

from algorithms import model_parallel
from algorithms.core import partition
from algorithms.core.cli import SettingError
from minidl.nn import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
from tests.helpers import assert_stopped, check_partitioned_equals_whole, launch, tiny_digits, uneven_mlp

WIDTHS = [64, 7, 5, 10]


def small_cnn():
    """(N, 1, 8, 8) -conv 5-> pool -> (N, 5, 4, 4) -conv 6-> pool -> (N, 6, 2, 2) -> 24 -> 10; 5 and 6 channels
    split unevenly over 2, 3 and 4 ranks."""
    rng = np.random.default_rng(6)
    return Sequential(Conv2d(1, 5, 3, padding=1, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      Conv2d(5, 6, 3, padding=1, rng=rng, dtype="float64"), ReLU(), MaxPool2d(2),
                      Flatten(), Linear(24, 10, rng=rng, init="glorot", dtype="float64"))


CNN_FEATURES = [64, 5 * 4 * 4, 6 * 2 * 2, 10]      # per row: the input, and each block's output (after pooling)


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
    done = launch("model_parallel", "--model", "cnn", "--split", "input", ranks=2)
    assert_stopped(done, "--model cnn: --split input partitions an MLP", ranks=2)
