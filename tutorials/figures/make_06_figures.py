"""The figures and tables of chapter 6 (model, pipeline and hybrid parallelism); about 20 s on 2 cores.

    mpiexec -n 4 python tutorials/figures/make_06_figures.py [--quick] [--out DIR] [--part replicas]

06_schedule_gpipe.png, 06_schedule_1f1b.png   space-time diagrams of one global batch (P = 4, m = 8):
                       each stage's forwards and backwards as measured boxes
06_bubble.png          measured bubble fraction against m, both schedules, beside (P-1)/(m+P-1)
06_memory.png          activation memory per stage, GPipe against 1F1B (tracemalloc peaks)
06_measurements.json   every number of the chapter; 06_table.md the tables as markdown
06_replicas.json       section 5 (``--part replicas`` measures only this)
``--part predicted``   only the alpha-beta table of section 4, from chapter 3's fit (03_bench_p2.json),
                       into the 06_measurements.json and 06_table.md already there (no timing)

Downpour with model-parallel replicas (section 5, ``measure_replicas``): one server and one replica
of k = 1 .. P-1 ranks (a communicator of k + 1 ranks), the default CNN and Adagrad, 3 seeds: the
test accuracy reached, and per step what each replica rank moves to and from the server and sends
inside its replica.

The stages' work in the schedule and bubble measurements is simulated: a ``Work`` layer sleeps
10 ms per forward and 20 ms per backward of a micro-batch, so that 4 ranks on 2 shared cores do not
compete for the cores and the timing shows the schedule rather than the contention; the messages
between the stages are the module's real ones. Memory and bytes are measured on the real MLP.
--quick (for a check that it runs): fewer micro-batch counts, one repeat, no figures; replicas of
k = 1, 2 for one epoch and one seed.
"""
import argparse
import contextlib
import json
import os
import time
import tracemalloc

import numpy as np
from mpi4py import MPI

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from algorithms import downpour_sgd, model_parallel, pipeline_parallel  # noqa: E402
from algorithms.core import partition  # noqa: E402
from algorithms.core.objective import Data, NetworkObjective, load_data  # noqa: E402
from collectives import allreduce  # noqa: E402
from collectives.trace import CountingComm, WatchedComm  # noqa: E402
from minidl.data import Batch  # noqa: E402
from minidl.nn import Linear, Module, ReLU, Sequential  # noqa: E402
from minidl.tensor import result  # noqa: E402

comm = MPI.COMM_WORLD
P = comm.size
FORWARD_SECONDS, BACKWARD_SECONDS = 0.010, 0.020
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "out")      # what the figure scripts write (chapter 3's bench JSON among it)


def chapter3_fit(path=os.path.join(OUT, "03_bench_p2.json")):
    """(alpha, beta): chapter 3's ping-pong fit on this machine (p = 2, the first bench launch that
    make_03_figures.py kept), so that both chapters use one measurement."""
    with open(path) as handle:
        runs = json.load(handle)
    first = runs[0][0] if isinstance(runs[0], list) else runs[0]
    return first["alpha"], first["beta"]


ALPHA, BETA = chapter3_fit()


class Work(Module):
    """Identity that sleeps (forward and backward) and logs when: a stage's simulated compute."""

    def __init__(self, log):
        super().__init__()
        object.__setattr__(self, "log", log)

    def forward(self, x):
        start = time.perf_counter()
        time.sleep(FORWARD_SECONDS)
        self.log.append(("forward", start, time.perf_counter()))

        def backward(grad):
            begin = time.perf_counter()
            time.sleep(BACKWARD_SECONDS)
            self.log.append(("backward", begin, time.perf_counter()))
            return (grad,)
        return result(x.data, (x,), backward, "work")


class PoliteComm(WatchedComm):
    """Receives that sleep between polls: a waiting stage leaves the cores to the working ones (MPI's
    own Recv spins), as it would on a machine with a core per rank."""

    def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        request = self.comm.Irecv(buf, source, tag)
        while not request.Test():
            time.sleep(0.0002)


def flat_digits(rows=256):
    data = load_data("digits", seed=0)
    x = data.x_train[:rows].reshape(rows, -1).astype(np.float64)
    return Data(x, data.y_train[:rows], x[:1], data.y_train[:1])


def timed_pipeline(kind, m, rows, log):
    """One global batch through a P-stage pipeline of (Linear, Work) blocks; returns this rank's log."""
    rng = np.random.default_rng(0)
    layers = []
    for block in range(P):
        layers += [Linear(64, 10 if block == P - 1 else 64, rng=rng, dtype="float64"), Work(log)]
    net = Sequential(*layers)
    objective = NetworkObjective(net, flat_digits(rows))
    stage = pipeline_parallel.Stage(net, comm.rank, P, objective.data.x_train[:1])
    log.clear()
    comm.Barrier()
    pipeline_parallel.pipeline_gradient(PoliteComm(comm), stage, objective, Batch(np.arange(rows), rows), m, kind)
    return list(log)


def bubble(logs):
    """1 - (busy time of all stages) / (P x the span from the first start to the last end)."""
    starts = [start for log in logs for _, start, _ in log]
    ends = [end for log in logs for _, _, end in log]
    busy = sum(end - start for log in logs for _, start, end in log)
    return 1 - busy / (len(logs) * (max(ends) - min(starts)))


def measure_bubbles(micro_batch_counts, repeats):
    log, out = [], {}
    for kind in pipeline_parallel.SCHEDULES:
        for m in micro_batch_counts:
            fractions = []
            for _ in range(repeats):
                logs = comm.gather(timed_pipeline(kind, m, max(m, 8), log), root=0)
                if comm.rank == 0:
                    fractions.append(bubble(logs))
                    if m == 2 * P:
                        out.setdefault("diagrams", {})[kind] = logs
            if comm.rank == 0:
                out.setdefault("bubble", {}).setdefault(kind, {})[m] = float(np.median(fractions))
    return out


def real_mlp(width=256):
    rng = np.random.default_rng(1)
    return Sequential(Linear(64, width, rng=rng, dtype="float64"), ReLU(),
                      Linear(width, width, rng=rng, dtype="float64"), ReLU(),
                      Linear(width, width, rng=rng, dtype="float64"), ReLU(),
                      Linear(width, 10, rng=rng, dtype="float64"))


def measure_memory(m, rows):
    """Peak bytes allocated (tracemalloc) during one global batch, per stage, for each schedule."""
    out = {}
    for kind in pipeline_parallel.SCHEDULES:
        net = real_mlp()
        objective = NetworkObjective(net, flat_digits(rows))
        stage = pipeline_parallel.Stage(net, comm.rank, P, objective.data.x_train[:1])
        comm.Barrier()
        tracemalloc.start()
        pipeline_parallel.pipeline_gradient(comm, stage, objective, Batch(np.arange(rows), rows), m, kind)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[kind] = {"peak_bytes": comm.gather(peak, root=0), "held": comm.gather(stage.peak_held, root=0)}
    return out


def default_mlp():
    """minidl.models.mlp's shape, 64 -> 128 -> 64 -> 10, float32."""
    rng = np.random.default_rng(0)
    return Sequential(Linear(64, 128, rng=rng), ReLU(), Linear(128, 64, rng=rng), ReLU(),
                      Linear(64, 10, rng=rng, init="glorot"))


def measure_bytes(batch_sizes, m=4):
    """Bytes all ranks send in one step of each kind of parallelism, on the same network and batch."""
    data = load_data("digits", seed=0)
    flat = Data(data.x_train.reshape(len(data.x_train), -1), data.y_train, data.x_test[:1], data.y_test[:1])
    rows_out = {}
    for rows in batch_sizes:
        record = {}
        # data parallel: a ring allreduce of the whole gradient (every rank holds the whole model)
        objective = NetworkObjective(default_mlp(), flat)
        counting = CountingComm(comm)
        allreduce(counting, MPI.IN_PLACE, objective.grad, op="sum", algorithm="ring", check=False)
        record["data"] = {"bytes": counting.total_bytes(), "parameters": int(objective.params.size)}
        # pipeline parallel: P stages of the same layers
        counting = CountingComm(comm)
        stage = pipeline_parallel.Stage(objective.net, comm.rank, P, flat.x_train[:1])
        pipeline_parallel.pipeline_gradient(counting, stage, objective, Batch(np.arange(rows), rows), m, "1f1b")
        widths = [int(np.prod(stage.shapes[stop])) for _, stop in stage.bounds[:-1]]
        record["pipeline"] = {"bytes": counting.total_bytes(),
                              "formula": pipeline_parallel.bytes_per_step(rows, widths, 4)}
        # model parallel, each split
        for split in partition.SPLITS:
            pieces = [partition.Piece(block, comm.rank, P, split) for block in partition.blocks_of(objective.net)]
            for piece in pieces:
                for parameter in piece.parameters():
                    parameter.grad = np.zeros_like(parameter.data)
            counting = CountingComm(comm)
            model_parallel.model_parallel_gradient(counting, pieces, flat.x_train[:rows], flat.y_train[:rows], split)
            widths = [64, 128, 64, 10]
            record[f"model ({split})"] = {"bytes": counting.total_bytes(),
                                          "formula": model_parallel.bytes_per_step(rows, widths, P, 4, split)}
        rows_out[rows] = record
    return rows_out


def measure_replicas(sizes, seeds, epochs):
    """Downpour, 1 server + one replica of k ranks, for k in ``sizes``: accuracy and traffic per step."""
    records = {}
    for k in sizes:
        sub = comm.Split(color=0 if comm.rank <= k else MPI.UNDEFINED, key=comm.rank)
        if sub == MPI.COMM_NULL:
            continue
        for seed in seeds:
            report = {}
            started = time.perf_counter()
            _, history = downpour_sgd.train(sub, replica_size=k, epochs=epochs, seed=seed, timeout=None, quiet=True,
                                            report=report)
            seconds = time.perf_counter() - started
            steps = sum(1 for event in report["logs"][0] if event[0] == "push")     # n_push = 1: one push a step
            ranks = sorted(report["values"])
            record = records.setdefault(k, {"accuracy": [], "seconds": []})
            record["accuracy"].append(history[-1]["test_accuracy"])
            record["seconds"].append(round(seconds, 2))
            # float32: 4 bytes a value; per rank of the replica, per step
            record["server_bytes_per_step"] = [sum(report["values"][r]) * 4 // steps for r in ranks]
            record["replica_bytes_per_step"] = [report["replica_bytes"][r] // steps for r in ranks]
        sub.Free()
    return records


def predicted_seconds(p, rows, n=17226, itemsize=4, m=4, widths=(64, 128, 64, 10)):
    """alpha-beta time of one step's messages on the busiest rank (no overlap, no compute)."""
    inner, outputs = sum(widths[1:-1]), sum(widths[1:])
    data = 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * n * itemsize * BETA                 # ring allreduce
    model = (2 * len(widths) - 3) * (p - 1) * ALPHA + (p - 1) / p * rows * (outputs + inner) * itemsize * BETA
    pipeline = 2 * m * ALPHA + 2 * rows * max(widths[1:-1]) * itemsize * BETA      # a middle stage, both ways
    return {"data": data, "model (output)": model, "pipeline": pipeline}


@contextlib.contextmanager
def drawing(path, size):
    """The axes of a new figure of ``size`` inches; on leaving, the figure is laid out, saved to
    ``path`` and closed (matplotlib drawing to files: no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=size)
    yield axes
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def plot_diagram(logs, kind, m, path):
    origin = min(start for log in logs for _, start, _ in log)
    with drawing(path, (9, 0.55 * len(logs) + 1.2)) as axes:
        for stage, log in enumerate(logs):
            order = pipeline_parallel.schedule(kind, stage, len(logs), m)
            for (step, start, end), (expected, index) in zip(log, order):
                assert step == expected, "the measured order differs from the schedule"
                colour = "tab:blue" if step == "forward" else "tab:orange"
                axes.barh(stage, (end - start) * 1e3, left=(start - origin) * 1e3, color=colour, edgecolor="white")
                axes.text((start + end - 2 * origin) / 2 * 1e3, stage, str(index), ha="center", va="center",
                          fontsize=7, color="white")
        axes.set_yticks(range(len(logs)), [f"stage {s}" for s in range(len(logs))])
        axes.invert_yaxis()
        axes.set_xlabel("time (ms); blue: forward, orange: backward, number: micro-batch")
        axes.set_title(f"{kind}: P = {len(logs)} stages, m = {m} micro-batches (measured)")


def plot_bubble(bubbles, path):
    counts = sorted(bubbles["gpipe"])
    grid = np.linspace(1, max(counts), 100)
    with drawing(path, (5.5, 3.6)) as axes:
        axes.plot(grid, (P - 1) / (grid + P - 1), "k--", label="(P-1)/(m+P-1)")
        for kind, marker in (("gpipe", "o"), ("1f1b", "x")):
            axes.plot(counts, [bubbles[kind][m] for m in counts], marker, label=f"{kind}, measured")
        axes.set_xscale("log", base=2)
        axes.set_xlabel("micro-batches m")
        axes.set_ylabel("bubble fraction")
        axes.set_title(f"P = {P} stages")
        axes.legend(frameon=False)


def plot_memory(memory, path):
    stages = np.arange(P)
    with drawing(path, (5.5, 3.4)) as axes:
        for offset, kind in ((-0.2, "gpipe"), (0.2, "1f1b")):
            axes.bar(stages + offset, np.array(memory[kind]["peak_bytes"]) / 1e3, width=0.4, label=kind)
        axes.set_xticks(stages, [f"stage {s}" for s in stages])
        axes.set_ylabel("peak allocated (kB)")
        axes.set_title(f"one global batch, P = {P}, m = {memory['m']}")
        axes.legend(frameon=False)


def table(results):
    lines = ["| m | bubble GPipe | bubble 1F1B | (P-1)/(m+P-1) |", "| --- | --- | --- | --- |"]
    for m in sorted(results["bubble"]["gpipe"]):
        lines.append(f"| {m} | {results['bubble']['gpipe'][m]:.3f} | {results['bubble']['1f1b'][m]:.3f} | "
                     f"{(P - 1) / (m + P - 1):.3f} |")
    memory = results["memory"]
    lines += ["", "| stage | held GPipe | held 1F1B | peak kB GPipe | peak kB 1F1B |", "| --- | --- | --- | --- | "
                                                                                       "--- |"]
    for s in range(P):
        lines.append(f"| {s} | {memory['gpipe']['held'][s]} | {memory['1f1b']['held'][s]} | "
                     f"{memory['gpipe']['peak_bytes'][s] / 1e3:.0f} | {memory['1f1b']['peak_bytes'][s] / 1e3:.0f} |")
    lines += ["", "| batch | data (ring) | pipeline | model (output) | model (input) |", "| --- | --- | --- | --- | "
                                                                                         "--- |"]
    for rows, record in results["bytes"].items():
        lines.append(f"| {rows} | {record['data']['bytes']} | {record['pipeline']['bytes']} | "
                     f"{record['model (output)']['bytes']} | {record['model (input)']['bytes']} |")
    lines += [""] + predicted_table(results["predicted"])
    return "\n".join(lines) + "\n"


PREDICTED_HEADER = "| P | batch | data (ring) us | model (output) us | pipeline us |"


def predicted_table(predicted):
    lines = [PREDICTED_HEADER, "| --- | --- | --- | --- | --- |"]
    for key, value in predicted.items():
        lines.append(f"| {key.split(',')[0]} | {key.split(',')[1]} | {value['data'] * 1e6:.1f} | "
                     f"{value['model (output)'] * 1e6:.1f} | {value['pipeline'] * 1e6:.1f} |")
    return lines


def replicas_table(replicas):
    lines = ["| k | test accuracy (one per seed) | bytes to and from the server, per replica rank and step | "
             "bytes sent inside the replica, per replica rank and step | seconds |", "| --- | --- | --- | --- | --- |"]
    for k, record in replicas.items():
        cells = [str(k), ", ".join(f"{a:.4f}" for a in record["accuracy"])]
        cells += [", ".join(map(str, record[key]))
                  for key in ("server_bytes_per_step", "replica_bytes_per_step", "seconds")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer points, one repeat, no figures")
    parser.add_argument("--out", default=OUT, help="output folder (default: tutorials/figures/out)")
    parser.add_argument("--part", choices=["replicas", "predicted"], default=None,
                        help="only section 5's Downpour replicas (06_replicas.json), or only the predicted "
                             "seconds from chapter 3's alpha and beta (no timing)")
    args = parser.parse_args(argv)
    prefix = "06_quick_" if args.quick else "06_"
    if args.part == "predicted":
        if comm.rank == 0:
            path = os.path.join(args.out, prefix + "measurements.json")
            with open(path) as handle:
                results = json.load(handle)
            results["predicted"] = {f"{p},{rows}": predicted_seconds(p, rows) for p in (4, 16, 64)
                                    for rows in (32, 256)}
            results["alpha_beta"] = [ALPHA, BETA]
            with open(path, "w") as handle:
                json.dump(results, handle, indent=1, default=str)
            path = os.path.join(args.out, prefix + "table.md")
            with open(path) as handle:                   # the measured tables stay as they were
                kept = handle.read().split(PREDICTED_HEADER)[0]
            with open(path, "w") as handle:
                handle.write(kept + "\n".join(predicted_table(results["predicted"])) + "\n")
            print(f"alpha = {ALPHA * 1e6:.2f} us, beta = {BETA * 1e9:.4f} ns/B (chapter 3's fit)")
            print("\n".join(predicted_table(results["predicted"])))
        return
    replicas = measure_replicas([1, 2] if args.quick else list(range(1, P)), [0] if args.quick else [0, 1, 2],
                                1 if args.quick else 5)
    if comm.rank == 0:
        with open(os.path.join(args.out, prefix + "replicas.json"), "w") as handle:
            json.dump({"P": P, "epochs": 1 if args.quick else 5, "replicas": replicas}, handle, indent=1)
        print(replicas_table(replicas))
    if args.part == "replicas":
        return
    counts = [1, 2 * P] if args.quick else [1, 2, 4, 8, 16]
    results = measure_bubbles(counts, 1 if args.quick else 3)
    memory = measure_memory(m=2 * P, rows=256)
    measured_bytes = measure_bytes([8, 32] if args.quick else [8, 32, 128])
    if comm.rank != 0:
        return
    results["memory"] = {**memory, "m": 2 * P, "rows": 256}
    results["load_average"] = os.getloadavg()          # other jobs on the cores lengthen every hand-over
    results["bytes"] = measured_bytes
    results["predicted"] = {f"{p},{rows}": predicted_seconds(p, rows) for p in (4, 16, 64) for rows in (32, 256)}
    results["alpha_beta"] = [ALPHA, BETA]
    for rows, record in measured_bytes.items():
        for name in ("pipeline", "model (output)", "model (input)"):
            assert record[name]["bytes"] == record[name]["formula"], (rows, name, record[name])
    diagrams = results.pop("diagrams", {})
    with open(os.path.join(args.out, prefix + "measurements.json"), "w") as handle:
        json.dump({"P": P, **results}, handle, indent=1, default=str)
    with open(os.path.join(args.out, prefix + "table.md"), "w") as handle:
        handle.write(table(results))
    print(table(results))
    if not args.quick:
        for kind, logs in diagrams.items():
            plot_diagram(logs, kind, 2 * P, os.path.join(args.out, f"06_schedule_{kind}.png"))
        plot_bubble(results["bubble"], os.path.join(args.out, "06_bubble.png"))
        plot_memory(results["memory"], os.path.join(args.out, "06_memory.png"))


if __name__ == "__main__":
    main()
