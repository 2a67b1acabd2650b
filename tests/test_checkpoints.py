"""Checkpoints: every algorithm's --save writes exactly the path given, records what wrote it, and
resumes; a file another algorithm cannot continue is refused on every rank; the file is the serial
model, so any layout's checkpoint resumes in another layout and evaluates serially to the same numbers.

Run: python tests/run.py --max-ranks 4 -- tests/test_checkpoints.py

The sweep runs each algorithm in process on 3 ranks (the MLP on the digits: a few hundred steps),
through the same ``train`` the command line calls; the command-line cases run under mpiexec with a
timeout and expect ``error:`` from every rank and exit status 2.
"""
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms.core import checkpoint, evaluate
from algorithms.core.cli import SettingError
from tests.helpers import (
    ENV,
    EQUAL_UP_TO_ROUNDING,
    ROOT,
    assert_stopped,
    float64_mlp,
    launch,
    relative_error,
    tiny_digits,
)

SMALL = dict(model="mlp", batch_size=64, quiet=True)
# The sweep runs every algorithm module (a module of algorithms/ with a top-level ``train``): a new one
# is swept as it comes, resumed bit for bit and its file evaluated to its last log line. The table
# holds what differs: algorithm: (its own arguments for a small run on 3 ranks, how a resumed run
# compares with an unbroken one: "exact" bit for bit, "runs" only, None: --resume not offered;
# whether its last log line evaluates the saved params).
ALGORITHMS = sorted(path.stem for path in (ROOT / "algorithms").glob("*.py")
                    if re.search(r"^def train\(", path.read_text(), re.M))
NOT_SWEPT = {"spatial_parallel": "the small CNN's first map has 2 rows: too few for 3 ranks' tiles"}
EXCEPTIONS = {
    "model_averaging": ({"period": 4}, "exact", True),
    "admm_sgd": ({"local_steps": 2}, "exact", True),
    "ensemble": ({}, "exact", False),             # the log scores the ensemble, the file holds member 0
    "compressed_sgd": ({"compressor": "topk", "density": 0.1}, "exact", True),
    "pipeline_parallel": ({"micro_batches": 2}, "exact", True),
    "hybrid_parallel": ({"stages": 3, "group": "model"}, "exact", True),
    "pbt": ({"population": 3, "ready": 3}, "exact", True),
    "downpour_sgd": ({"deterministic": True}, "exact", True),
    "ssp_sgd": ({"deterministic": True}, "exact", True),
    "async_easgd": ({"deterministic": True}, "runs", True),        # the file is the centre: workers restart there
    "hogwild": ({"n_samples": 300, "features": 30, "nnz": 3}, "runs", False),   # lock-free: races between ranks
    "sandblaster_lbfgs": ({"deterministic": True, "max_iter": 3}, None, True),   # the history is not saved
}
SWEEP = {name: EXCEPTIONS.get(name, ({}, "exact", True)) for name in ALGORITHMS if name not in NOT_SWEPT}


def shared_folder(comm):
    """One temporary folder every rank sees (rank 0 makes it)."""
    folder = tempfile.mkdtemp(prefix="minidl-ck-") if comm.Get_rank() == 0 else None
    return Path(comm.bcast(folder, root=0))


def run_of(name, comm, epochs, **flags):
    """``train`` of algorithm ``name`` for ``epochs`` (pbt: rounds) with the sweep's arguments."""
    module = importlib.import_module(f"algorithms.{name}")
    own, _, _ = SWEEP[name]
    length = {"rounds": epochs} if name == "pbt" else {"epochs": epochs}
    small = {"pbt": {"quiet": True, "model": "mlp"}, "hogwild": {"quiet": True, "batch_size": 8},
             "sandblaster_lbfgs": {"quiet": True, "model": "mlp"}}.get(name, SMALL)
    if name == "serial_sgd":                      # one process: each rank runs its own serial SGD
        comm = MPI.COMM_SELF
    return module.train(comm, **own, **small, **length, **flags)


@pytest.mark.parallel(nprocs=[3])
@pytest.mark.parametrize("name", sorted(SWEEP))
def test_save_writes_the_path_given_and_resume_continues_where_the_run_would_have(name):
    comm = MPI.COMM_WORLD
    folder = shared_folder(comm)
    ck = str(folder / ("ck" if name != "serial_sgd" else f"ck{comm.Get_rank()}"))   # no .npz suffix
    straight, _ = run_of(name, comm, 2)
    _, history = run_of(name, comm, 1, save=ck)
    comm.Barrier()
    wrote = sorted(os.listdir(folder))
    parallel_assert(os.path.isfile(ck) and not os.path.exists(ck + ".npz") and
                    not any(entry.endswith(".partial") for entry in wrote), f"{name}: wrote {wrote}")
    meta = json.loads(str(np.load(ck)["meta"]))
    parallel_assert(meta["algorithm"] == name and meta["model"] in ("mlp", "sparse-logistic"), f"{name}: {meta}")
    resumes, evaluates = SWEEP[name][1:]
    if resumes == "exact":
        resumed, _ = run_of(name, comm, 2, resume=ck)
        parallel_assert(np.array_equal(resumed, straight), f"{name}: 1 + 1 epochs differ from 2 by "
                                                           f"{np.max(np.abs(resumed - straight)):.3g}")
    elif resumes == "runs":
        resumed, _ = run_of(name, comm, 2, resume=ck)
        parallel_assert(resumed.shape == straight.shape and np.all(np.isfinite(resumed)), name)
    if evaluates:                                 # a serial evaluation of the file: the run's own numbers
        found = evaluate.evaluate(ck)
        parallel_assert(found["test_accuracy"] == history[-1]["test_accuracy"] and
                        found["test_loss"] == history[-1]["test_loss"], f"{name}: {found} vs {history[-1]}")
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(folder)


@pytest.mark.parallel(nprocs=[3])
@pytest.mark.parametrize("name", sorted(SWEEP))
def test_a_save_path_that_is_a_folder_is_refused_on_every_rank_before_training(name):
    comm = MPI.COMM_WORLD
    folder = shared_folder(comm)
    if comm.Get_rank() == 0:
        (folder / "existing.npz").mkdir()
    comm.Barrier()
    for path in (folder / "existing.npz", str(folder / "missing.npz") + "/"):
        try:
            run_of(name, comm, 1, save=str(path))
            message = None
        except SettingError as error:
            message = str(error) if error.every_rank or name == "serial_sgd" else "raised on one rank only"
        parallel_assert(message is not None and f"--save {path}" in message, f"{name} --save {path}: {message}")
    comm.Barrier()
    left = comm.bcast(sorted(os.listdir(folder)) if comm.Get_rank() == 0 else None, root=0)
    parallel_assert(left == ["existing.npz"], f"{name} left {left}")
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(folder)


@pytest.mark.parallel(nprocs=[3])
def test_a_file_another_algorithm_cannot_continue_is_refused_naming_both():
    comm = MPI.COMM_WORLD
    folder = shared_folder(comm)
    easgd, topk = str(folder / "easgd.npz"), str(folder / "topk.npz")
    run_of("easgd", comm, 1, save=easgd)
    run_of("compressed_sgd", comm, 1, save=topk)
    cases = [("compressed_sgd", easgd, {}, ["written by easgd", "compressed_sgd"]),
             ("allreduce_sgd", easgd, {}, ["written by easgd", "allreduce_sgd"]),
             ("easgd", topk, {}, ["written by compressed_sgd", "easgd"]),
             ("compressed_sgd", topk, {"compressor": "qsgd", "density": None},
              ["--compressor 'topk' in the file, 'qsgd' here"]),
             ("admm_sgd", easgd, {}, ["written by easgd", "admm_sgd"])]
    for name, path, change, expected in cases:
        own = {**SWEEP[name][0], **change}
        module = importlib.import_module(f"algorithms.{name}")
        try:
            module.train(comm, **{key: value for key, value in own.items() if value is not None}, **SMALL,
                         epochs=2, resume=path)
            message = None
        except SettingError as error:
            message = str(error) if error.every_rank else "raised on one rank only"
        parallel_assert(message is not None and all(part in message for part in expected),
                        f"{name} --resume {path}: {message}")
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(folder)


@pytest.mark.parallel(nprocs=[3])
@pytest.mark.parametrize("writer, options", [("model_parallel", {}), ("pipeline_parallel", {"micro_batches": 2}),
                                             ("tensor_parallel", {}),
                                             ("hybrid_parallel", {"stages": 3, "group": "model", "split": "input"})])
def test_a_split_models_file_continues_in_other_layouts_as_the_unbroken_run(writer, options):
    """1 epoch on 3 ranks of a split model, saved; epoch 2 resumed serially, by allreduce SGD on 2
    ranks and by model_parallel on 2 ranks equals the unbroken 2 epochs on 3 ranks, in float64, up to
    the order of the additions (the file holds the serial model and its momentum in serial order)."""
    from algorithms import allreduce_sgd, model_parallel, serial_sgd
    comm = MPI.COMM_WORLD
    folder = shared_folder(comm)
    ck = str(folder / "split.npz")
    data = tiny_digits()
    common = dict(model=float64_mlp, data=data, lr=0.1, momentum=0.9, quiet=True)
    module = importlib.import_module(f"algorithms.{writer}")
    unbroken, _ = module.train(comm, **options, **common, batch_size=4, epochs=2)
    module.train(comm, **options, **common, batch_size=4, epochs=1, save=ck)
    continued = {"serial_sgd": serial_sgd.train(MPI.COMM_SELF, **common, batch_size=4, epochs=2, resume=ck)[0]}
    pair = comm.Split(0 if comm.Get_rank() < 2 else MPI.UNDEFINED, comm.Get_rank())
    if pair != MPI.COMM_NULL:
        continued["allreduce_sgd"] = allreduce_sgd.train(pair, **common, batch_size=2, epochs=2, resume=ck)[0]
        continued["model_parallel"] = model_parallel.train(pair, **common, batch_size=4, epochs=2, resume=ck)[0]
        pair.Free()
    errors = {name: relative_error(params, unbroken) for name, params in continued.items()}
    parallel_assert(all(error < EQUAL_UP_TO_ROUNDING for error in errors.values()), f"{writer}: {errors}")
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(folder)


def test_a_pipeline_checkpoint_continues_in_allreduce_sgd_and_evaluates_serially_to_its_own_numbers(tmp_path):
    ck = tmp_path / "pipeline"
    log = tmp_path / "pipeline.jsonl"
    done = launch("pipeline_parallel", "--epochs", "2", "--save", str(ck), "--log", str(log), "--quiet", ranks=4,
                  timeout=90)
    assert done.returncode == 0, done.stderr
    assert ck.is_file() and not (tmp_path / "pipeline.npz").exists()
    last = json.loads(log.read_text().splitlines()[-1])
    done = subprocess.run([sys.executable, "-m", "algorithms.core.evaluate", str(ck), "--json",
                           str(tmp_path / "e.json")],
                          capture_output=True, text=True, timeout=60, env=ENV, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    found = json.loads((tmp_path / "e.json").read_text())
    assert (found["test_accuracy"], found["test_loss"]) == (last["test_accuracy"], last["test_loss"])
    assert found["algorithm"] == "pipeline_parallel" and found["epoch"] == 2
    done = launch("allreduce_sgd", "--epochs", "3", "--resume", str(ck), "--log", str(tmp_path / "more.jsonl"),
                  "--quiet", ranks=2, timeout=90)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["epoch"] for line in (tmp_path / "more.jsonl").read_text().splitlines()] == [3]


def test_a_cross_algorithm_resume_stops_every_rank_with_exit_2(tmp_path):
    ck = tmp_path / "easgd.npz"
    assert launch("easgd", "--epochs", "1", "--save", str(ck), "--quiet", ranks=2, timeout=90).returncode == 0
    done = launch("compressed_sgd", "--epochs", "2", "--resume", str(ck), ranks=3, timeout=90)
    assert_stopped(done, re.compile("written by easgd.*compressed_sgd|compressed_sgd.*written by easgd"), ranks=3)


def test_evaluate_refuses_what_is_not_a_checkpoint(tmp_path):
    junk = tmp_path / "junk.npz"
    np.savez(junk, params=np.zeros(3))
    for path, expected in ((junk, "records no 'meta'"), (tmp_path / "none.npz", "no such file")):
        done = subprocess.run([sys.executable, "-m", "algorithms.core.evaluate", str(path)], capture_output=True,
                              text=True, timeout=60, env=ENV, cwd=ROOT)
        assert done.returncode == 2 and done.stderr.startswith("error: ") and expected in done.stderr, done.stderr


def test_check_match_names_what_differs():
    mine = {"algorithm": "compressed_sgd", "family": "compressed_sgd", "model": "mlp", "dataset": "digits",
            "state": {"--compressor": "qsgd", "--error-feedback": False}}
    with pytest.raises(SettingError, match="--compressor 'topk' in the file, 'qsgd' here; --error-feedback"):
        checkpoint.check_match("f", {**mine, "state": {"--compressor": "topk", "--error-feedback": True}}, mine)
    with pytest.raises(SettingError, match="--model cnn by compressed_sgd, this run has --model mlp"):
        checkpoint.check_match("f", {**mine, "model": "cnn"}, mine)
    with pytest.raises(SettingError, match="written by easgd .family easgd."):
        checkpoint.check_match("f", {**mine, "algorithm": "easgd", "family": "easgd"}, mine)
    checkpoint.check_match("f", dict(mine), mine)      # the same: no error
