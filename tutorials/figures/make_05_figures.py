"""The figures of chapter 5 (parameter servers and consistency); about a minute on 2 cores.

    mpiexec -n 4 python tutorials/figures/make_05_figures.py

05_downpour.png    test accuracy against time: Downpour + Adagrad, fixed-rate Downpour, one replica
05_staleness.png   staleness histograms of SSP with s = 0, 2, 8 and fully asynchronous
05_hogwild.png     Hogwild on the sparse problem and on the CNN, one process against four
"""
import os
import time

import matplotlib
import numpy as np
from mpi4py import MPI

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from algorithms import downpour_sgd, hogwild, objective, serial_sgd, ssp_sgd  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
comm = MPI.COMM_WORLD
data = objective.load_data("digits", 0)
EPOCHS = 10


def wait():
    """A barrier that sleeps, so idle ranks leave the cores to the timed ones."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.005)


# Dean et al.'s figure 4, small: accuracy against wall-clock time
curves = {}
for label, kwargs in [("Downpour, Adagrad (lr 0.05)", dict(server_optimizer="adagrad", lr=0.05)),
                      ("Downpour, fixed rate (lr 0.05)", dict(server_optimizer="sgd", lr=0.05))]:
    params, history = downpour_sgd.train(comm, epochs=EPOCHS, quiet=True, data=data, **kwargs)
    curves[label] = [(h["seconds"], h["test_accuracy"]) for h in history]
if comm.rank == 0:
    _, history = serial_sgd.train(epochs=EPOCHS, lr=0.05, momentum=0.0, quiet=True, data=data)
    curves["one replica (serial SGD, lr 0.05)"] = [(h["seconds"], h["test_accuracy"]) for h in history]
wait()

# staleness under SSP
staleness = {}
for s in (0, 2, 8, None):
    report = {}
    ssp_sgd.train(comm, staleness=s, epochs=EPOCHS, lr=0.05, quiet=True, data=data, report=report)
    updates = [event[1] for event in report["logs"][0] if event[0] == "push"]
    staleness["inf" if s is None else s] = ([u.clock_staleness for u in updates], [u.staleness for u in updates])

# Hogwild: one process against all of them, sparse and dense
hog = {}
for problem in ("sparse", "dense"):
    _, history = hogwild.train(comm, problem=problem, quiet=True, data=data if problem == "dense" else None)
    hog[problem, comm.size] = history
    solo = comm.Split(0 if comm.rank == 0 else MPI.UNDEFINED)
    if comm.rank == 0:
        _, history = hogwild.train(solo, problem=problem, quiet=True, data=data if problem == "dense" else None)
        hog[problem, 1] = history
        solo.Free()
    wait()

if comm.rank == 0:
    figure, axis = plt.subplots(figsize=(6, 4))
    for label, points in curves.items():
        axis.plot(*zip(*points), marker="o", label=label)
    axis.set_xlabel("seconds (2 shared cores; 1 server + 3 workers for Downpour)")
    axis.set_ylabel("test accuracy")
    axis.set_ylim(0.5, 1.0)
    axis.legend()
    axis.set_title("Downpour on the digits CNN, 10 epochs")
    figure.tight_layout()
    figure.savefig(os.path.join(HERE, "05_downpour.png"), dpi=100)

    figure, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for s, (clock, version) in staleness.items():
        for axis, values in zip(axes, (clock, version)):
            bins = np.arange(0, max(max(values), 1) + 2) - 0.5
            axis.hist(values, bins=bins, histtype="step", linewidth=1.5, label=f"s = {s}")
    axes[0].set_xlabel("clock staleness: c - min(clocks) at the read")
    axes[1].set_xlabel("version staleness: pushes between read and update")
    for axis in axes:
        axis.set_ylabel("updates")
        axis.set_yscale("log")
        axis.legend()
    figure.suptitle("SSP on 1 server + 3 workers, 450 updates each")
    figure.tight_layout()
    figure.savefig(os.path.join(HERE, "05_staleness.png"), dpi=100)

    figure, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for p in (1, comm.size):
        axes[0].semilogy([h["epoch"] for h in hog["sparse", p]], [h["loss_gap"] for h in hog["sparse", p]],
                         marker="o", label=f"{p} process{'es' if p > 1 else ''}")
        axes[1].plot([h["epoch"] for h in hog["dense", p]], [h["test_accuracy"] for h in hog["dense", p]],
                     marker="o", label=f"{p} process{'es' if p > 1 else ''}")
    axes[0].set_title("sparse logistic regression (10 of 500 features)")
    axes[0].set_ylabel("F(w) - F(w*)")
    axes[1].set_title("small CNN on the digits (dense gradients)")
    axes[1].set_ylabel("test accuracy")
    for axis in axes:
        axis.set_xlabel("epoch")
        axis.legend()
    figure.tight_layout()
    figure.savefig(os.path.join(HERE, "05_hogwild.png"), dpi=100)
    print("final accuracy:", {label: points[-1][1] for label, points in curves.items()})
    print("max clock staleness:", {s: max(c) for s, (c, v) in staleness.items()},
          "mean version staleness:", {s: round(float(np.mean(v)), 2) for s, (c, v) in staleness.items()})
    print("hogwild:", {key: history[-1] for key, history in hog.items()})
