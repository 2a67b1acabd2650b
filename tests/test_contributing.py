"""CONTRIBUTING.md's three-file path, walked: a toy algorithm added to a copy of the tree as three files
(its module, its test, its README row) passes the suite's checks there, and each of the three left out
or half written fails the check that is about it.

The copy is the tracked tree (git ls-files) without the figures' outputs; the checks run in it with its
own packages first on the path: the serial checks (README, shape, fences, rooms, imports, lint, the
toy's own test), then the checkpoint sweep and the flag walk on the toy alone, on the ranks they ask for.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")

MODULE = '''"""Toy SGD: synchronous SGD whose gradient is MPI's own Allreduce of the ranks' gradients, over p.

    mpiexec -n 2 python -m algorithms.toy_sgd [--epochs N] [--lr X] [--batch-size B]

Paper: Hegde & Usmani 2016, section 6.1 (synchronous SGD). Full references: tutorials/references.md.

The update, in the code's names (``toy_step``), at each step on rank r of p: grad_r, the mean gradient
of this rank's piece of the global batch; grad = (1/p) sum_r grad_r by one Allreduce; w <- w - lr grad.
Where every global batch splits evenly it is allreduce SGD's step (tests/test_toy_sgd.py). Cost per
step: one allreduce of the n-element gradient. Memory: the model, its gradient and momentum per rank.
The example of CONTRIBUTING.md: no course asks for its heart.
"""
from mpi4py import MPI

from algorithms.core import checkpoint, cli
from algorithms.core.run import Run, Settings

DEFAULTS = dict(epochs=2, momentum=0.9, partition="global")
HEARTS_WITHOUT_A_TASK = ("toy_step",)


def toy_step(comm, objective, optimizer, batch):
    """One step: this rank's mean gradient, summed over the ranks by MPI's Allreduce, divided by p."""
    # BEGIN SOLUTION
    if len(batch.index):
        loss = objective.loss_and_grad(batch.index)
    else:                                                  # a rank with no rows adds zeros
        loss, objective.grad[...] = 0.0, 0
    comm.Allreduce(MPI.IN_PLACE, objective.grad, op=MPI.SUM)
    objective.grad /= comm.Get_size()
    optimizer.step()
    # END SOLUTION
    return loss


def train(comm=None, **settings):
    """Toy SGD on ``comm``; returns (final flat parameters as NumPy, history)."""
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)
    run = Run.start(comm, settings, writer=checkpoint.Writer("toy_sgd"))
    return run.loop(lambda batch: toy_step(run.counting, run.objective, run.optimizer, batch))


def main(argv=None):
    cli.run_main(train, cli.parser(__doc__.splitlines()[0], **DEFAULTS).parse_args(argv))


if __name__ == "__main__":
    main()
'''

TEST = '''"""Toy SGD is allreduce SGD (with MPI's Allreduce) wherever every global batch splits evenly."""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import allreduce_sgd, toy_sgd
from tests.helpers import float64_mlp, tiny_digits


@pytest.mark.parallel(nprocs=[1, 2])
def test_toy_sgd_is_allreduce_sgd_when_every_global_batch_splits_evenly():
    comm = MPI.COMM_WORLD
    common = dict(model=float64_mlp, data=tiny_digits(n_train=48), epochs=2, lr=0.1, momentum=0.9, batch_size=4,
                  quiet=True)
    toy, _ = toy_sgd.train(comm, **common)
    plain, _ = allreduce_sgd.train(comm, allreduce="mpi", **common)
    parallel_assert(bool(np.array_equal(toy, plain)), "toy SGD and allreduce SGD differ")
'''

ROW = "| `algorithms.toy_sgd` | toy SGD: the ranks' gradients summed by MPI's Allreduce, over p | Hegde & Usmani |\n"


def tracked_copy(destination):
    """The tracked files of this checkout (figure outputs left out) under ``destination``."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in listed.splitlines():
        if name.startswith("tutorials/figures/out/") or not (ROOT / name).is_file():
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    (destination / "tutorials" / "figures" / "out").mkdir(parents=True, exist_ok=True)


def add_toy(tree, module=MODULE, test=TEST, row=ROW):
    (tree / "algorithms" / "toy_sgd.py").write_text(module)
    (tree / "tests" / "test_toy_sgd.py").write_text(test)
    readme = (tree / "README.md").read_text()
    last = readme.index("| `algorithms.pbt` |")
    end = readme.index("\n", last) + 1
    (tree / "README.md").write_text(readme[:end] + row + readme[end:])


def pytest_in(tree, *arguments, ranks=None, timeout=600):
    """pytest in ``tree`` (its packages first on the path): the completed process."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MINIDL_HYPOTHESIS_EXAMPLES="3")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *arguments]
    if ranks:
        command = [MPIEXEC, "-n", str(ranks), *command]
    return subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)


SERIAL_CHECKS = ["tests/test_readme.py", "tests/test_shape.py", "tests/test_fences.py", "tests/test_rooms.py",
                 "tests/test_imports.py", "tests/test_lint.py", "tests/test_defaults.py", "tests/test_toy_sgd.py"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the copy lists its files with git ls-files")
    tree = tmp_path_factory.mktemp("house")
    tracked_copy(tree)
    add_toy(tree)
    return tree


def test_a_toy_algorithm_in_three_files_passes_the_suites_checks(tree):
    serial = pytest_in(tree, "-m", "parallel[1]", *SERIAL_CHECKS, "-k", "not pinned_bits and not answers_help")
    assert serial.returncode == 0, serial.stdout[-4000:] + serial.stderr[-2000:]
    assert "toy_sgd" in pytest_in(tree, "--collect-only", "tests/test_checkpoints.py").stdout
    sweep = pytest_in(tree, "-m", "parallel[3]", "tests/test_checkpoints.py", "-k", "toy_sgd", ranks=3)
    assert sweep.returncode == 0 and " passed" in sweep.stdout, sweep.stdout[-4000:] + sweep.stderr[-2000:]
    flags = pytest_in(tree, "-m", "parallel[4]", "tests/test_flags.py", "-k", "toy_sgd", ranks=4)
    assert flags.returncode == 0 and " passed" in flags.stdout, flags.stdout[-4000:] + flags.stderr[-2000:]


README_TABLE = ("tests/test_readme.py::test_the_readmes_algorithm_table_and_the_runnable_modules_are_the_same_and_"
                "each_shows_its_run_line")


# each fault runs the one check about it (its test function, not its whole file: the whole files ran above)
@pytest.mark.parametrize("fault, check, complaint", [
    ("no README row", README_TABLE, "README's table and algorithms/ disagree"),
    ("an undeclared fence", "tests/test_fences.py::test_every_fence_is_a_task_or_declared_so_in_its_module",
     "toy_step is fenced but is no task"),
    ("no fence", "tests/test_shape.py::test_every_algorithm_module_fences_its_heart",
     "toy_sgd.py has no # BEGIN SOLUTION"),
    ("no run line", README_TABLE, "should open with its run line"),
], ids=["no README row", "an undeclared fence", "no fence", "no run line"])
def test_each_of_the_three_files_half_written_fails_the_check_about_it(tmp_path, fault, check, complaint):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the copy lists its files with git ls-files")
    tracked_copy(tmp_path)
    module = MODULE
    if fault == "an undeclared fence":
        module = module.replace('HEARTS_WITHOUT_A_TASK = ("toy_step",)\n', "")
    elif fault == "no fence":
        module = module.replace("    # BEGIN SOLUTION\n", "").replace("    # END SOLUTION\n", "")
        module = module.replace('HEARTS_WITHOUT_A_TASK = ("toy_step",)\n', "")
    elif fault == "no run line":
        module = module.replace("    mpiexec -n 2 python -m algorithms.toy_sgd", "    in mpiexec: algorithms.toy_sgd")
    add_toy(tmp_path, module=module, row="" if fault == "no README row" else ROW)
    file, _, function = check.partition("::")
    done = pytest_in(tmp_path, "-m", "parallel[1]", file, "-k", function)
    assert done.returncode != 0 and complaint in done.stdout, done.stdout[-3000:]
