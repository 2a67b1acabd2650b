"""Run several data-parallel algorithms on the same data and seed; draw their curves into one PNG.

    python -m algorithms.compare --ranks 4 [--algorithms allreduce_sgd,model_averaging,...] [--out compare.png]

The algorithms are the modules of algorithms/ that declare ``COMPARE = True`` (``compared()`` reads
the declaration from their source; a new data-parallel algorithm takes part by declaring it too).
Each runs in turn as its own command, ``mpiexec -n P python -m algorithms.<name>``, with the same
model, data split, seed, epochs, learning rate, momentum and per-rank batch size (the shared flags,
checked here before the first launch), and its own defaults for the rest; its per-epoch log
(``--log``) is its history. Rank 0 of each run logs; this command prints one summary line per
algorithm (final test accuracy, wall time, bytes sent by all ranks) and draws four panels: test
loss and test accuracy against epochs and against wall-clock seconds. ``--json`` writes the
histories, so a figure or table can be redrawn without training again
(tutorials/figures/make_04_figures.py does that for p = 1, 2, 4).
"""
import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from algorithms.core import cli, run
from algorithms.core.objective import load_data

HERE = Path(__file__).resolve().parent
SHARED = ("dataset", "model", "epochs", "lr", "momentum", "batch_size", "seed")


def compared(folder=HERE):
    """The names of the modules in ``folder`` that declare ``COMPARE = True`` at their top level, sorted."""
    names = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) and target.id == "COMPARE"
                                                    for target in node.targets):
                if isinstance(node.value, ast.Constant) and node.value.value is True:
                    names.append(path.stem)
    return names


def command(name, ranks, settings, log):
    """The command line that runs algorithm ``name`` on ``ranks`` ranks with the shared ``settings``."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    line = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(ranks), sys.executable, "-m",
            f"algorithms.{name}", "--log", str(log), "--quiet"]
    for key in SHARED:
        line += [f"--{key.replace('_', '-')}", str(settings[key])]
    if settings.get("data_dir"):
        line += ["--data-dir", settings["data_dir"]]
    return line


def compare(names, ranks, settings):
    """{name: per-epoch history} for each algorithm in ``names``, each run on ``ranks`` ranks with the same
    shared ``settings``; a run that fails stops the comparison with a SettingError naming it."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    histories = {}
    with tempfile.TemporaryDirectory(prefix="minidl-compare-") as folder:
        for name in names:
            log = Path(folder) / f"{name}.jsonl"
            done = subprocess.run(command(name, ranks, settings, log), env=environment, capture_output=True,
                                  text=True)
            if done.returncode != 0:
                said = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
                reason = said[0].removeprefix("error: ") if said else done.stderr.strip()[-500:]
                raise cli.SettingError(f"{name} on {ranks} ranks stopped with exit status {done.returncode}: "
                                       f"{reason}")
            histories[name] = [json.loads(line) for line in log.read_text().splitlines()]
    return histories


def plot(histories, path, title=""):
    """Test loss and accuracy against epochs and against seconds, one line per algorithm."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for name, history in histories.items():
        epochs = [record["epoch"] for record in history]
        seconds = [record["seconds"] for record in history]
        for row, key in enumerate(("test_loss", "test_accuracy")):
            values = [record[key] for record in history]
            axes[row][0].plot(epochs, values, marker=".", label=name)
            axes[row][1].plot(seconds, values, marker=".", label=name)
    for row, key in enumerate(("test loss", "test accuracy")):
        axes[row][0].set_ylabel(key)
        for column, xlabel in enumerate(("epoch", "wall time (s)")):
            axes[row][column].set_xlabel(xlabel)
            axes[row][column].grid(alpha=0.3)
    axes[0][0].set_yscale("log")
    axes[0][1].set_yscale("log")
    for column in (0, 1):
        axes[1][column].set_ylim(0.85, 1.0)
    axes[0][1].legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def summary(histories):
    lines = [f"{'algorithm':<16} {'test acc':>8} {'seconds':>8} {'bytes':>12}"]
    for name, history in histories.items():
        last = history[-1]
        lines.append(f"{name:<16} {last['test_accuracy']:>8.4f} {last['seconds']:>8.2f} {last['bytes']:>12d}")
    return "\n".join(lines)


def check(args, names, known):
    """A SettingError naming the flag unless every launch can use it: before the first launch."""
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise cli.SettingError(f"unknown --algorithms {unknown or names}; choose from {', '.join(known)}")
    cli.require("--ranks", args.ranks, integer=True, low=1)
    run.Settings(**{key: getattr(args, key) for key in SHARED}).check()
    try:
        load_data(args.dataset, args.seed, args.data_dir)
    except ValueError as error:                      # a SettingError is one too
        raise cli.SettingError(str(error)) from None
    cli.check_output("--out", args.out)
    cli.check_output("--json", args.json)


def main(argv=None):
    known = compared()
    parser = cli.parser(__doc__.splitlines()[0], files=False)   # the family's defaults
    parser.add_argument("--ranks", type=int, default=4, help="ranks of each run (mpiexec -n)")
    parser.add_argument("--algorithms", default=",".join(known), help="comma-separated names from: " + ", ".join(known))
    parser.add_argument("--out", default="compare.png", help="the PNG to draw")
    parser.add_argument("--json", default=None, help="also write the histories here")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.algorithms.split(",") if name.strip()]
    settings = {key: getattr(args, key) for key in (*SHARED, "data_dir")}
    try:
        check(args, names, known)
        histories = compare(names, args.ranks, settings)
    except cli.SettingError as error:
        cli.fail(str(error))
    print(f"p = {args.ranks}, {args.epochs} epochs, model {args.model}, lr {args.lr}, momentum {args.momentum}, "
          f"batch {args.batch_size} per rank, seed {args.seed}")
    print(summary(histories), flush=True)
    plot(histories, args.out, title=f"{args.model} on {args.dataset}, p = {args.ranks}")
    print(f"wrote {args.out}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"size": args.ranks, "settings": vars(args), "histories": histories}, file)


if __name__ == "__main__":
    main()
