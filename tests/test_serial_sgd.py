"""Serial SGD: the baseline reaches its stated accuracy and behaves like a command-line tool."""
import json
import subprocess
import sys

import numpy as np
import pytest

from algorithms import serial_sgd
from tests.helpers import assert_stopped, float64_mlp, serial_reference, tiny_digits


@pytest.mark.task("1.5")
def test_serial_sgd_reaches_95_percent_on_the_embedded_digits_with_the_default_seed(tmp_path):
    params, history = serial_sgd.train(quiet=True, log=str(tmp_path / "run.jsonl"))
    assert history[-1]["test_accuracy"] >= 0.95
    assert len(history) == 10
    lines = [json.loads(line) for line in open(tmp_path / "run.jsonl")]
    assert [line["epoch"] for line in lines] == list(range(1, 11))


@pytest.mark.task("1.5")
def test_same_seed_gives_identical_parameters_and_save_resume_continues_the_run(tmp_path):
    full, _ = serial_sgd.train(epochs=3, quiet=True)
    again, _ = serial_sgd.train(epochs=3, quiet=True)
    np.testing.assert_array_equal(full, again)
    serial_sgd.train(epochs=2, quiet=True, save=str(tmp_path / "two.npz"))
    resumed, history = serial_sgd.train(epochs=3, quiet=True, resume=str(tmp_path / "two.npz"))
    np.testing.assert_array_equal(resumed, full)      # epochs 1-2 saved, epoch 3 run again identically
    assert [h["epoch"] for h in history] == [3]


@pytest.mark.task("1.5")
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_serial_sgd_is_the_update_of_its_header_bit_for_bit(momentum):
    # the float64 MLP on 50 digits, against the loop that the chapter-4 tests compare with
    data = tiny_digits()
    params, history = serial_sgd.train(model=float64_mlp, data=data, epochs=2, lr=0.1, momentum=momentum,
                                       batch_size=4, quiet=True)
    np.testing.assert_array_equal(params, serial_reference(data, epochs=2, lr=0.1, momentum=momentum, batch_size=4))
    assert [h["epoch"] for h in history] == [1, 2] and all(np.isfinite(h["train_loss"]) for h in history)


def test_bad_settings_are_refused_before_training():
    with pytest.raises(ValueError, match="--lr"):
        serial_sgd.train(lr=-1, quiet=True)
    with pytest.raises(ValueError, match="--batch-size"):
        serial_sgd.train(batch_size=0, quiet=True)
    with pytest.raises(ValueError, match="lenet5 expects 28x28"):
        serial_sgd.train(model="lenet5", quiet=True)


@pytest.mark.task("1.5")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the overflow itself warns; the run must then stop
def test_a_diverging_run_stops_and_names_the_step():
    with pytest.raises(FloatingPointError, match="at step"):
        serial_sgd.train(lr=1e30, momentum=0.0, epochs=1, quiet=True)


def test_command_line_prints_one_line_per_epoch():
    out = subprocess.run([sys.executable, "-m", "algorithms.serial_sgd", "--epochs", "2", "--model", "mlp"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.count("test_accuracy") == 2
    bad = subprocess.run([sys.executable, "-m", "algorithms.serial_sgd", "--epochs", "0"],
                         capture_output=True, text=True, timeout=120)
    assert_stopped(bad, "--epochs must be", ranks=1)
