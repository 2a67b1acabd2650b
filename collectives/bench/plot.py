"""The bench's plot (``python -m collectives.bench --plot PNG``): time against size, measured and modelled."""


def plot_bench(records, path, size):
    """collectives.bench --plot: time against size, log-log: measured points, model lines, MPI_Allreduce in black."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(7, 4.5))
    names = list(dict.fromkeys(r["algorithm"] for r in records))
    colours = dict(zip([n for n in names if n != "mpi"], plt.get_cmap("tab10").colors))
    for name in names:
        mine = [r for r in records if r["algorithm"] == name]
        x = [r["bytes"] for r in mine]
        colour = "black" if name == "mpi" else colours[name]
        axes.plot(x, [r["seconds"] for r in mine], "o-" if name == "mpi" else "o", color=colour,
                  label="MPI_Allreduce" if name == "mpi" else name, ms=4)
        if name not in ("mpi",):
            axes.plot(x, [r["model_seconds"] for r in mine], "--", color=colour, lw=1)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("bytes per rank")
    axes.set_ylabel("seconds per allreduce")
    axes.set_title(f"allreduce on p = {size}: measured (dots) and alpha-beta-gamma model (dashes)")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
