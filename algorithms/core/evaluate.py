"""Evaluate any checkpoint on the test set, serially, whatever algorithm and layout wrote it.

    python -m algorithms.core.evaluate params.npz [--data-dir D] [--json OUT]

A ``--save`` file holds the serial model's flat parameters and records what wrote it
(``algorithms.core.checkpoint``: the algorithm, the model, the dataset and the seed of its train/test
split), so this builds that model on that test set, puts the parameters in and prints the test
loss and accuracy: the same numbers the run's own last log line printed, bit for bit, since the
run evaluated the same parameters with the same serial code (``objective.evaluate``). A file it
cannot evaluate (missing, not a checkpoint, a convex problem's) is ``error: ...``, exit status 2.
"""
import argparse
import json

from algorithms.core import checkpoint, cli
from algorithms.core.cli import SettingError
from algorithms.core.objective import build as build_objective
from minidl import backend
from minidl.nn import read_npz


def evaluate(path, data_dir=None):
    """{"algorithm", "epoch", "test_loss", "test_accuracy"} of the checkpoint at ``path``."""
    cli.check_input("checkpoint", path)
    try:
        arrays = read_npz(path)
    except ValueError as error:
        raise SettingError(str(error)) from None
    meta = checkpoint.read_meta(path, arrays)
    if meta["model"] == "custom" or meta["model"].startswith("problem:"):
        raise SettingError(f"{path}: written for {meta['model']}, not a named --model; evaluate it where its "
                           f"model is defined")
    try:
        objective = build_objective(meta["model"], meta["dataset"], meta["seed"], data_dir=data_dir)
    except ValueError as error:
        raise SettingError(f"{path}: {error}") from None
    params = arrays.get("params")
    if params is None or params.shape != (objective.params.size,):
        raise SettingError(f"{path}: 'params' does not fit --model {meta['model']} "
                           f"({objective.params.size} parameters)")
    objective.params[...] = backend.asarray(params, dtype=objective.params.dtype)
    return {"algorithm": meta["algorithm"], "epoch": int(arrays["epoch"]), **objective.evaluate()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.error = cli.fail                       # a bad flag: one error line, exit 2
    parser.add_argument("checkpoint", help="a file written by --save")
    parser.add_argument("--data-dir", default=None, help="the MNIST IDX files, for a checkpoint trained on mnist")
    parser.add_argument("--json", default=None, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    try:
        cli.check_output("--json", args.json)
        result = evaluate(args.checkpoint, args.data_dir)
    except SettingError as error:
        cli.fail(str(error))
    print("  ".join(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}"
                    for key, value in result.items()))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file)
    return result


if __name__ == "__main__":
    main()
