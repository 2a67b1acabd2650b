"""Run several data-parallel algorithms on the same data and seed; draw their curves into one PNG.

    mpiexec -n 4 python -m algorithms.core.compare [--algorithms allreduce_sgd,model_averaging,...] [--out compare.png]

Every algorithm runs in turn on the same communicator, with the same model, data split, seed,
epochs, learning rate, momentum and per-rank batch size (the shared flags), and its own
defaults for the rest (H = 8 for model averaging, K = 8 and rho = 0.1 for ADMM, tau = 4 and
beta = 0.9 for EASGD, ring pairing every step for gossip). Rank 0 prints one summary line per
algorithm (final test accuracy, wall time, bytes sent by all ranks) and draws four panels:
test loss and test accuracy against epochs and against wall-clock seconds. ``--json`` writes
the histories, so a figure or table can be redrawn without training again
(tutorials/figures/make_04_figures.py does that for p = 1, 2, 4).
"""
import json

from algorithms import admm_sgd, allreduce_sgd, easgd, ensemble, gossip_sgd, model_averaging
from algorithms.core import cli, run
from algorithms.core.objective import load_data

ALGORITHMS = {
    "allreduce_sgd": allreduce_sgd.train,
    "model_averaging": model_averaging.train,
    "admm_sgd": admm_sgd.train,
    "easgd": easgd.train,
    "gossip_sgd": gossip_sgd.train,
    "ensemble": ensemble.train,
}


def compare(comm, names, **settings):
    """{name: per-epoch history} for each algorithm in ``names``, trained with the same settings."""
    histories = {}
    for name in names:
        comm.Barrier()                                     # start every algorithm's clock together
        _, history = ALGORITHMS[name](comm, **settings)
        histories[name] = history
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


def check(names, out, json_path):
    unknown = [name for name in names if name not in ALGORITHMS]
    if unknown or not names:
        raise cli.SettingError(f"unknown --algorithms {unknown or names}; choose from {', '.join(ALGORITHMS)}")
    cli.check_output("--out", out)
    cli.check_output("--json", json_path)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], epochs=20, lr=0.05, momentum=0.9, files=False)
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS),
                        help="comma-separated names from: " + ", ".join(ALGORITHMS))
    parser.add_argument("--out", default="compare.png", help="the PNG to draw (rank 0)")
    parser.add_argument("--json", default=None, help="also write the histories here (rank 0)")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.algorithms.split(",") if name.strip()]
    settings = dict(dataset=args.dataset, data_dir=args.data_dir, model=args.model, epochs=args.epochs,
                    lr=args.lr, momentum=args.momentum, batch_size=args.batch_size, seed=args.seed, quiet=True)

    def compare_all(comm, **settings):
        with run.agreed(comm):
            if comm.rank == 0:
                check(names, args.out, args.json)
            settings["data"] = load_data(args.dataset, args.seed, args.data_dir)
        histories = compare(comm, names, **settings)
        if comm.rank == 0:
            print(f"p = {comm.size}, {args.epochs} epochs, model {args.model}, lr {args.lr}, "
                  f"momentum {args.momentum}, batch {args.batch_size} per rank, seed {args.seed}")
            print(summary(histories), flush=True)
            plot(histories, args.out, title=f"{args.model} on {args.dataset}, p = {comm.size}")
            print(f"wrote {args.out}")
            if args.json:
                with open(args.json, "w") as file:
                    json.dump({"size": comm.size, "settings": {k: v for k, v in vars(args).items()},
                               "histories": histories}, file)

    cli.run_main(lambda comm, **_: compare_all(comm, **settings), args)


if __name__ == "__main__":
    main()
