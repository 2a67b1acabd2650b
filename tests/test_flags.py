"""No flag is silently ignored, and none is refused late: a walk over every algorithm's --help.

Run: python tests/run.py --max-ranks 4 -- tests/test_flags.py

Each algorithm's parser is taken from its own ``main`` (``parse_args`` is intercepted, so the walk
sees exactly the flags ``--help`` lists). Every flag that takes a value is then given one that the
parser accepts but no run can use (an integer -1, a float nan, a path in a folder that does not
exist, an unknown name), on 4 ranks in this process, through the same ``main`` and
``cli.run_main`` the command line runs. Each must stop every rank with ``error: ...`` naming the
flag and exit status 2, before any training. Flags that only mean something beside another flag
(``--data-dir`` with the embedded digits, ``--split`` with a pipeline replica) are given alone
from a table, with the same expectation.
"""
import argparse
import contextlib
import importlib
import io
import os
import pkgutil
import tempfile

import pytest
from pytest_mpi import parallel_assert

import algorithms

NOWHERE = "/nonexistent-folder/x"


class Parsed(Exception):
    """Raised in place of parsing: carries the parser ``main`` built."""


def parser_of(module):
    original = argparse.ArgumentParser.parse_args

    def intercept(self, *args, **kwargs):
        raise Parsed(self)
    argparse.ArgumentParser.parse_args = intercept
    try:
        module.main([])
    except Parsed as parsed:
        return parsed.args[0]
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"{module.__name__}.main() parsed no arguments")


# every runnable module, named from algorithms. ("allreduce_sgd", "compare"), sub-packages included
MODULES = sorted(info.name.removeprefix("algorithms.")
                 for info in pkgutil.walk_packages(algorithms.__path__, prefix="algorithms.")
                 if hasattr(importlib.import_module(info.name), "main") and info.name != "algorithms.core.evaluate")
# a short run of each, so that a flag the walk fails to have refused costs seconds, not minutes
SHORT = {"pbt": ["--rounds", "1", "--ready", "2"], "bench": ["--quick", "--no-torch"],
         "sandblaster_lbfgs": ["--epochs", "1", "--max-iter", "2"],
         "memory.table": ["--ranks", "2", "--model", "mlp"],
         "compare": ["--epochs", "1", "--algorithms", "allreduce_sgd", "--out",
                     # one name per run (its ranks share their parent, mpiexec's proxy), so that two runs of
                     # the suite on one machine never write the same file
                     os.path.join(tempfile.gettempdir(), f"minidl-flags-compare-{os.getppid()}.png")]}


def meaningless(action):
    """A value the parser accepts for ``action`` that no run can use (None: nothing to try)."""
    flag = action.option_strings[-1]
    if action.nargs == 0 or action.choices is not None:
        return None
    if flag in ("--log", "--save", "--lineage", "--out", "--json", "--markdown", "--resume", "--data-dir"):
        return NOWHERE
    if flag == "--algorithms":
        return "no_such_algorithm"
    if flag == "--cases":                         # algorithms.bench: model:batch pairs
        return "no_such_model:0"
    name = getattr(action.type, "__name__", "")
    if action.type is int or name in ("parse_period", "parse_staleness"):
        return "-1"
    if name == "parse_epochs":
        return "0"
    if action.type is float:
        return "nan"
    raise AssertionError(f"the walk has no meaningless value for {flag} (type {action.type!r}): add one")


def attempts():
    for name in MODULES:
        parser = parser_of(importlib.import_module(f"algorithms.{name}"))
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                value = meaningless(action)
                if value is not None:
                    yield name, [action.option_strings[-1], value], action.option_strings[-1]


# flags that mean something only beside another one, given alone: (module, flags, the flag named)
WITHOUT_THEIR_PARTNER = [
    ("allreduce_sgd", ["--data-dir", "/tmp"], "--data-dir"),
    ("downpour_sgd", ["--data-dir", "/tmp"], "--data-dir"),
    ("hogwild", ["--problem", "dense", "--data-dir", "/tmp"], "--data-dir"),
    ("allreduce_sgd", ["--reference-batch", "64"], "--reference-batch"),
    ("allreduce_sgd", ["--warmup-epochs", "1"], "--warmup-epochs"),
    ("model_averaging", ["--batch-schedule"], "--batch-schedule"),
    ("allreduce_sgd", ["--decay-factor", "2"], "--decay-factor"),
    ("hybrid_parallel", ["--split", "input"], "--split"),
    ("hybrid_parallel", ["--group", "model", "--schedule", "gpipe"], "--schedule"),
    ("hybrid_parallel", ["--group", "model", "--micro-batches", "2"], "--micro-batches"),
    ("hogwild", ["--problem", "dense", "--nnz", "3"], "--nnz"),
    ("hogwild", ["--model", "mlp"], "--model"),
    ("sandblaster_lbfgs", ["--slow-factor", "2"], "--slow-factor"),
    ("sandblaster_lbfgs", ["--slow-worker", "1"], "--slow-worker"),
    ("compressed_sgd", ["--compressor", "topk", "--k", "5", "--density", "0.1"], "--k"),
    ("downpour_sgd", ["--deterministic", "--timeout", "5"], "--timeout"),
    ("ssp_sgd", ["--deterministic", "--timeout", "5"], "--timeout"),
]


def outcome(name, flags):
    """(exit status or None if main returned, stderr, stdout) of ``algorithms.<name>.main`` on this rank."""
    module = importlib.import_module(f"algorithms.{name}")
    argv = SHORT.get(name, ["--epochs", "1"]) + flags
    err, out = io.StringIO(), io.StringIO()
    status = None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            module.main(argv)
        except SystemExit as stop:
            status = stop.code
    return status, err.getvalue(), out.getvalue()


def check_refused(name, flags, named):
    status, err, out = outcome(name, flags)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    refused = status == 2 and len(errors) == 1 and named in errors[0] and "Traceback" not in err
    parallel_assert(refused and "epoch 1" not in out,
                    f"{name} {' '.join(flags)}: exit {status}, stderr {err[-400:]!r}, stdout {out[-200:]!r}")


@pytest.mark.parallel(nprocs=[4])
@pytest.mark.parametrize("name", MODULES)
def test_every_value_flag_given_a_value_no_run_can_use_stops_every_rank_naming_it(name):
    for module, flags, named in attempts():
        if module == name:
            check_refused(name, flags, named)


@pytest.mark.parallel(nprocs=[4])
@pytest.mark.parametrize("name, flags, named", WITHOUT_THEIR_PARTNER,
                         ids=[f"{name} {' '.join(flags)}" for name, flags, _ in WITHOUT_THEIR_PARTNER])
def test_a_flag_without_the_flag_it_acts_through_is_refused_on_every_rank(name, flags, named):
    check_refused(name, flags, named)


def test_the_walk_reaches_every_algorithm_and_its_own_flags():
    tried = {}
    for name, flags, _ in attempts():
        tried.setdefault(name, set()).add(flags[0])
    assert set(tried) == set(MODULES) and len(MODULES) >= 19, sorted(tried)
    assert {"--bucket", "--k", "--density", "--bits"} <= tried["compressed_sgd"]
    assert {"--slow-factor", "--portions", "--backup-threshold"} <= tried["sandblaster_lbfgs"]
    assert {"--micro-batches", "--stages"} <= tried["hybrid_parallel"]
    assert all({"--epochs", "--lr", "--seed", "--log"} & flags for name, flags in tried.items()
               if name not in ("bench", "memory.table"))   # these two train nothing: their flags are their own
    assert {"--ranks", "--steps", "--runs", "--json", "--markdown"} <= tried["bench"]


@pytest.mark.parallel(nprocs=[4])
@pytest.mark.parametrize("module", ["easgd", "async_easgd"])
def test_an_lr_too_small_for_the_elastic_spring_is_blamed_on_lr_not_rho(module):
    # the default rho = 0.9 / (p lr) overflows at lr 1e-310; alpha = lr rho underflows at 1e-300 * 1e-300
    check_refused(module, ["--lr", "1e-310"], "--lr 1e-310 is too small")
    check_refused(module, ["--lr", "1e-300", "--rho", "1e-300"], "--lr 1e-300 is too small for --rho 1e-300")
