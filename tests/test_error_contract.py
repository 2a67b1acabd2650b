"""The error contract of the synchronous and decentralized algorithms, from the command line.

Any bad input or failure stops every rank within seconds with ``error: <what, where>`` and exit
status 2: no traceback for anything a user can cause, no hang. Each case runs ``mpiexec -n 3`` with
a timeout (a hang fails the test) and says, above it, the rule it checks. Settings are checked on
every rank before the first message, so no training output may appear before the error.
"""
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import admm_sgd, easgd, ensemble, gossip_sgd, model_averaging
from algorithms.core import checkpoint, run
from algorithms.core.cli import SettingError
from algorithms.core.objective import load_data
from collectives.model.cost import per_rank
from tests.helpers import ROOT, assert_stopped, launch, mpiexec

RANKS = 3


# output paths are checked on every rank before any training
@pytest.mark.parametrize("flag", ["--log", "--save"])
def test_an_unwritable_output_path_stops_every_rank_before_training(flag):
    assert_stopped(launch("allreduce_sgd", "--epochs", "1", flag, "/nonexistent-folder/out"),
                   f"{flag} /nonexistent-folder/out: the folder /nonexistent-folder does not exist")


def test_an_output_path_that_is_a_folder_is_refused(tmp_path):
    assert_stopped(launch("model_averaging", "--epochs", "1", "--log", str(tmp_path)), "is a folder")


def test_compare_checks_its_png_path_before_training():
    done = subprocess.run([sys.executable, "-m", "algorithms.compare", "--epochs", "1", "--out",
                           "/nonexistent-folder/c.png"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert_stopped(done, "--out /nonexistent-folder/c.png", ranks=1)


# data and checkpoint files: a message naming the file, no traceback
def test_a_missing_mnist_folder_is_named():
    assert_stopped(launch("allreduce_sgd", "--dataset", "mnist", "--model", "lenet5", "--data-dir", "/nonexistent"),
                   "--data-dir /nonexistent: does not exist")


def bad_checkpoints(folder):
    good = folder / "good.npz"
    assert launch("allreduce_sgd", "--epochs", "1", "--model", "mlp", "--save", str(good), "--quiet").returncode == 0
    arrays = dict(np.load(good))
    files = {}
    files["random bytes"] = folder / "random.npz"
    files["random bytes"].write_bytes(np.random.default_rng(0).bytes(4000))
    files["truncated"] = folder / "truncated.npz"
    files["truncated"].write_bytes(good.read_bytes()[:1000])
    files["extra optimizer key"] = folder / "extra.npz"
    np.savez(files["extra optimizer key"], **arrays, **{"optimizer.velocity.7": np.zeros(3)})
    files["vector epoch"] = folder / "vector.npz"
    np.savez(files["vector epoch"], **{**arrays, "epoch": np.array([1, 2])})
    files["no optimizer state"] = folder / "nostate.npz"
    np.savez(files["no optimizer state"], params=arrays["params"], epoch=arrays["epoch"])
    files["missing"] = folder / "missing.npz"
    return files


def test_bad_resume_files_are_refused_naming_the_file(tmp_path):
    for what, path in bad_checkpoints(tmp_path).items():
        done = launch("allreduce_sgd", "--epochs", "2", "--model", "mlp", "--resume", str(path))
        assert_stopped(done, f"--resume {path}")
        assert zipfile.is_zipfile(path) or what in ("random bytes", "truncated", "missing"), what


# a checkpoint that has trained more epochs than asked for
def test_resuming_a_longer_run_with_fewer_epochs_is_refused(tmp_path):
    four = tmp_path / "four.npz"
    assert launch("allreduce_sgd", "--epochs", "4", "--model", "mlp", "--save", str(four), "--quiet").returncode == 0
    assert_stopped(launch("allreduce_sgd", "--epochs", "2", "--model", "mlp", "--resume", str(four),
                          "--save", str(tmp_path / "two.npz")), "has already trained 4 epochs")
    assert not (tmp_path / "two.npz").exists()


# a flag an algorithm cannot honour is refused, not ignored
def test_gossip_refuses_an_allreduce_flag():
    done = launch("gossip_sgd", "--allreduce", "ring")
    assert done.returncode == 2 and "unrecognized arguments: --allreduce" in done.stderr


# the synchronous family: a diverged run is an error, not a result
def test_a_nan_loss_stops_every_rank_with_exit_2():
    assert_stopped(launch("model_averaging", "--epochs", "2", "--lr", "1e30"), "loss became nan",
                   before_training=False)


# the backstop: an unexpected failure on one rank aborts the whole job instead of hanging it
def test_an_exception_on_one_rank_only_aborts_every_rank(tmp_path):
    script = tmp_path / "one_rank_fails.py"
    script.write_text(
        "from algorithms.core import cli\n"
        "def train(comm, **settings):\n"
        "    if comm.Get_rank() == 1:\n"
        "        raise KeyError('only on rank 1')\n"
        "    comm.Barrier()                     # the others wait for rank 1 here\n"
        "cli.run_main(train, cli.parser('test').parse_args([]))\n")
    done = mpiexec(RANKS, str(script), timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "error: 'only on rank 1' (KeyError on rank 1, at" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parallel(nprocs=[2, 3])
def test_a_set_up_failure_on_one_rank_stops_every_rank_with_its_message():
    comm = MPI.COMM_WORLD

    def fails_on_rank_one(settings):
        if comm.Get_rank() == 1:
            raise SettingError("--data-dir /x: unreadable here")

    try:
        run.Run.start(comm, run.Settings(model="mlp", epochs=1, quiet=True), check=fails_on_rank_one,
                  writer=checkpoint.Writer("test"))
        message = None
    except SettingError as error:
        message = (str(error), error.every_rank)
    parallel_assert(message == ("--data-dir /x: unreadable here (on rank 1)", True), f"got {message}")


# the standard "--resume continues bit for bit", for every decentralized algorithm
RESUMABLE = {
    "model_averaging": lambda comm, **kw: model_averaging.train(comm, period=5, **kw),   # 5 does not divide an epoch
    "admm_sgd": lambda comm, **kw: admm_sgd.train(comm, local_steps=3, **kw),
    "easgd": lambda comm, **kw: easgd.train(comm, tau=3, **kw),
    "gossip_sgd": lambda comm, **kw: gossip_sgd.train(comm, period=2, pairing="random", **kw),
    "ensemble": lambda comm, **kw: ensemble.train(comm, **kw),
}


@pytest.mark.parallel(nprocs=[3])
@pytest.mark.parametrize("name", sorted(RESUMABLE))
def test_save_and_resume_continue_a_decentralized_run_bit_for_bit(name, tmp_path_factory):
    comm = MPI.COMM_WORLD
    folder = comm.bcast(str(tmp_path_factory.mktemp(name)) if comm.rank == 0 else None, root=0)
    kwargs = dict(model="mlp", lr=0.05, batch_size=64, seed=1, quiet=True)
    straight, _ = RESUMABLE[name](comm, epochs=3, **kwargs)
    RESUMABLE[name](comm, epochs=2, save=f"{folder}/two.npz", **kwargs)
    resumed, history = RESUMABLE[name](comm, epochs=3, resume=f"{folder}/two.npz", **kwargs)
    parallel_assert(bool(np.array_equal(straight, resumed)), f"{name}: the resumed run differs")
    parallel_assert([record["epoch"] for record in history] == [3], f"{name}: resumed epochs {history}")


class CallCounter:
    """An mpi4py communicator that counts the calls that move data (a test double)."""
    MOVING = {"Send", "Isend", "Sendrecv", "Recv", "Irecv", "Allreduce", "allreduce", "Bcast", "bcast",
              "Barrier", "Ibarrier", "gather", "allgather", "Allgather", "Reduce", "send", "recv", "isend"}

    def __init__(self, comm):
        self.comm, self.calls = comm, 0

    def __getattr__(self, name):
        attribute = getattr(self.comm, name)
        if name in self.MOVING:
            self.calls += 1
        return attribute


# the ensemble trains without communication; every message it sends is counted
@pytest.mark.parallel(nprocs=[2, 3])
def test_the_ensemble_sends_nothing_between_epoch_ends():
    comm = MPI.COMM_WORLD
    counts, bytes_sent = [], []
    for batch_size in (200, 20):                             # 8 and 72 steps in the epoch
        counter = CallCounter(comm)
        _, history = ensemble.train(counter, model="mlp", epochs=1, batch_size=batch_size, quiet=True)
        counts.append(counter.calls)
        bytes_sent.append(history[-1]["bytes"])
    parallel_assert(counts[0] == counts[1], f"messages grow with the step count: {counts}")
    # what is left, per epoch and rank: the 8-byte agreement (2 (p-1)/p 8 bytes counted) and the
    # ring allreduce of the (test images x 10 classes) float32 predictions (collectives.model.cost)
    p, tests = comm.size, len(load_data("digits", 0).y_test)
    expected = sum(2 * (p - 1) * 8 // p + per_rank("ring", p, tests * 10, 4, rank).bytes_sent for rank in range(p))
    parallel_assert(bytes_sent == [expected, expected], f"bytes {bytes_sent}, expected {expected}")


# gossip saves what its log evaluated, the mean of the ranks' parameters
@pytest.mark.parallel(nprocs=[3])
def test_gossip_saves_the_mean_model_it_evaluated(tmp_path_factory):
    comm = MPI.COMM_WORLD
    folder = comm.bcast(str(tmp_path_factory.mktemp("gossip")) if comm.rank == 0 else None, root=0)
    returned, history = gossip_sgd.train(comm, model="mlp", epochs=1, batch_size=64, save=f"{folder}/g.npz",
                                         quiet=True)
    saved = np.load(f"{folder}/g.npz")
    mean = saved["rank.params"].astype(np.float64).mean(axis=0).astype(np.float32)
    parallel_assert(bool(np.array_equal(saved["params"], returned)), "the file holds another vector than train()")
    parallel_assert(bool(np.allclose(saved["params"], mean, rtol=0, atol=1e-6)), "params is not the ranks' mean")
    parallel_assert(not np.array_equal(saved["rank.params"][0], saved["params"]), "rank 0's own params were saved")


# a flag argparse does not know is one error line too, not argparse's usage text above it
@pytest.mark.parametrize("module", ["algorithms.serial_sgd", "algorithms.bench", "algorithms.memory",
                                    "collectives.bench", "collectives.ring", "minidl.bench",
                                    "tutorials.assignments", "tutorials.block", "tutorials.notebook",
                                    "tutorials.book"])
def test_an_unknown_flag_is_one_error_line_and_exit_2(module):
    done = subprocess.run([sys.executable, "-m", module, "--no-such-flag"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr


# MINIDL_CONV_COLUMN_BYTES is read at a run's first convolution; a bad one stops every rank in the set-up
def test_a_bad_column_budget_stops_every_rank_before_training(monkeypatch):
    from tests import helpers
    monkeypatch.setitem(helpers.ENV, "MINIDL_CONV_COLUMN_BYTES", "64MiB")
    done = launch("allreduce_sgd", "--epochs", "1", "--model", "cnn", ranks=2)
    assert_stopped(done, "MINIDL_CONV_COLUMN_BYTES must be a whole number of bytes", ranks=2)
    assert "MPI_Abort" not in done.stderr, done.stderr     # refused in the agreed set-up, not aborted mid-run
    done = subprocess.run([sys.executable, "-m", "minidl.bench", "sweep", "--quick", "--no-torch"], cwd=helpers.ROOT,
                          env=helpers.ENV, capture_output=True, text=True, timeout=60)
    assert_stopped(done, "MINIDL_CONV_COLUMN_BYTES must be a whole number of bytes", ranks=1)
