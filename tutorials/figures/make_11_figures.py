"""The tables and figures of chapter 11 (memory as the limit); 10 s to 4 min on 2 cores, as loaded.

    mpiexec -n 2 python tutorials/figures/make_11_figures.py [--quick] [--out DIR]

11_memory_<model>.json  ``python -m algorithms.memory --ranks 2 --model <model> --json``, run in this
                        process on the 2 ranks (LeNet-5 at batch 64 in 8 micro-batches, the MLP at
                        512 in 4): every method's per-rank bytes, predicted and measured (every row
                        that applies); 11_memory_<model>_p1.json the same at p = 1
11_memory_vs_p.json     every method's predicted per-rank total for p = 1 .. 64 (the plot's lines)
11_memory_vs_p.png      the plot: per-rank bytes against p, LeNet-5 and the MLP, measured points marked
11_runs.json            the training runs: per method, model and seed, the final test accuracy, the
                        bytes the run's log counted and the point-to-point messages this script's
                        counting communicator saw, per step (all ranks together), and the prediction
11_tables.md            the chapter's tables, as generated

The training runs (all at P = 2, digits, a global batch of 32 examples per step: allreduce SGD and
ZeRO 16 per rank, the one-replica methods 32), 10 epochs, 3 seeds each: on the MLP allreduce SGD
(ring), ZeRO 1/2/3, tensor parallelism and the pipeline (1F1B and GPipe, 4 micro-batches); on the
small CNN allreduce SGD and the spatial split (spatial_parallel needs convolutions, tensor_parallel
a Linear, ReLU, Linear block); allreduce SGD, tensor, 1F1B and spatial also with --recompute.
ZeRO and allreduce SGD's --recompute give allreduce SGD's bits (same seed, same bits), the others'
--recompute their plain runs' bits, which the script checks seed by seed; the rest sum in another
order (the ring over the blocks' columns, the tiles' conv gradients), so their accuracy is compared
seed by seed with allreduce SGD's (the difference per seed, and its mean ± the 95% t interval:
inside the noise where the interval holds 0).
--quick: one epoch, one seed, p up to 8: a check that the script runs, not numbers for the chapter.
"""
import argparse
import json
import os
import time

import numpy as np
from mpi4py import MPI

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from algorithms import allreduce_sgd, pipeline_parallel, spatial_parallel, tensor_parallel, zero  # noqa: E402
from algorithms.core.objective import build_model, load_data  # noqa: E402
from algorithms.memory import table as memory_table  # noqa: E402
from algorithms.shards.tiling import Tiling  # noqa: E402
from algorithms.shards.units import units_of  # noqa: E402
from collectives.trace import WatchedComm  # noqa: E402

comm = MPI.COMM_WORLD
P = comm.Get_size()
HERE = os.path.dirname(os.path.abspath(__file__))
GLOBAL_BATCH = 32
ITEMSIZE = 4               # float32


class MessageCounter(WatchedComm):
    """Counts the point-to-point messages this rank sends (MPI's own collectives, which the
    algorithms use only for agreement and the log's evaluation, pass through uncounted)."""

    def __init__(self, comm):
        super().__init__(comm)
        self.sent, self.bytes = 0, 0

    def watch(self, start, end, sent=None, received=None):
        if sent is not None:
            self.sent += 1
            self.bytes += sent[1]


# ---- memory tables ---------------------------------------------------------------------------------

# (batch per replica, micro-batches) of each model's tables: the MLP's arrays are small, so it runs 128
# rows a micro-batch, where the Python objects of the graph (no formula counts them) stay under 5%
SHAPE = {"lenet5": (64, 8), "mlp": (512, 4)}


def memory_tables(out, quick):
    """algorithms.memory's own command at p = P (and at p = 1 on rank 0), both models; the plot's lines."""
    tables = {}
    for model in ("lenet5", "mlp"):
        path = os.path.join(out, f"11_memory_{model}.json")
        batch, micro_batches = SHAPE[model]
        memory_table.main(["--ranks", str(P), "--model", model, "--batch-size", str(batch), "--micro-batches",
                     str(micro_batches), "--json", path])
        if comm.Get_rank() == 0:
            records = memory_table.table(model, 1, batch, micro_batches, comm=MPI.COMM_SELF)
            with open(os.path.join(out, f"11_memory_{model}_p1.json"), "w") as handle:
                json.dump({"model": model, "ranks": 1, "batch": batch, "micro_batches": micro_batches,
                           "rows": records}, handle, indent=1)
        comm.Barrier()
        tables[model] = path
    return predicted_sweep(out, quick) if comm.Get_rank() == 0 else None


def predicted_sweep(out, quick):
    """{model: {method: {p: {"total": bytes, "states": params + grads + optimizer}}}}, predicted, p = 1..64."""
    sweep = {}
    for model in ("lenet5", "mlp"):
        for p in range(1, (8 if quick else 64) + 1):
            for record in memory_table.table(model, p, *SHAPE[model], measure=False):
                if record["predicted"] is None:
                    continue
                key = record["method"] + (" + recompute" if record["recompute"] else "")
                parts = record["predicted"]
                sweep.setdefault(model, {}).setdefault(key, {})[p] = {
                    "total": sum(parts.values()), "states": parts["params"] + parts["grads"] + parts["optimizer"]}
    with open(os.path.join(out, "11_memory_vs_p.json"), "w") as handle:
        json.dump(sweep, handle, indent=1)
    return sweep


def measured_points(out):
    """{model: {method: {p: measured total}}} from the JSON written above (rows with every part measured)."""
    points = {}
    for model in ("lenet5", "mlp"):
        for suffix in ("_p1", ""):
            with open(os.path.join(out, f"11_memory_{model}{suffix}.json")) as handle:
                table = json.load(handle)
            for record in table["rows"]:
                measured = record["measured"]
                if measured and all(value is not None for value in measured.values()):
                    key = record["method"] + (" + recompute" if record["recompute"] else "")
                    points.setdefault(model, {}).setdefault(key, {})[table["ranks"]] = sum(measured.values())
    return points


COLOURS = {"data parallel": "C0", "ZeRO-1": "C1", "ZeRO-2": "C2", "ZeRO-3": "C3", "tensor": "C4",
           "pipeline GPipe": "C5", "pipeline 1F1B": "C6", "spatial": "C7", "hybrid 2 x p/2": "C8",
           "data parallel + recompute": "C9", "pipeline 1F1B + recompute": "C6"}


def plot_memory(sweep, points, path):
    """Per-rank bytes against p: the model states (left) and everything (right), one row per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, panels = plt.subplots(2, 2, figsize=(11, 8))
    for row, (model, title) in enumerate((("lenet5", "LeNet-5, 28 x 28, batch 64"),
                                          ("mlp", "the MLP 64-128-64-10, batch 512"))):
        for column, part in enumerate(("states", "total")):
            axes = panels[row][column]
            for method, colour in COLOURS.items():
                line = sweep[model].get(method)
                if not line:
                    continue
                ps = [p for p in sorted(line, key=int) if line[p][part] > 0]      # a log axis: no empty stage
                axes.plot([int(p) for p in ps], [line[p][part] / 1024 for p in ps], marker="." if len(ps) > 1 else "o",
                          color=colour, markersize=3, label=method, linestyle="--" if "recompute" in method else "-")
                for p, value in points.get(model, {}).get(method, {}).items():
                    if part == "total":
                        axes.plot(int(p), value / 1024, "o", color=colour, markersize=8, markerfacecolor="none")
            axes.set_xscale("log", base=2)
            axes.set_yscale("log")
            axes.set_xlabel("ranks p")
            axes.set_ylabel("KiB per rank" + (", the batch per replica" if part == "total" else ""))
            axes.set_title(f"{title}: " + ("parameters + gradients + optimizer state" if part == "states"
                                          else "everything (predicted; circles measured)"), fontsize=9)
    panels[0][1].legend(frameon=False, fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


# ---- training runs -----------------------------------------------------------------------------------

def methods():
    """(name, model, train function, keyword arguments): every run of the comparison."""
    per_rank = GLOBAL_BATCH // P
    data = dict(batch_size=per_rank)
    whole = dict(batch_size=GLOBAL_BATCH)
    return [
        ("allreduce SGD", "mlp", allreduce_sgd.train, dict(data, allreduce="ring")),
        ("allreduce SGD --recompute", "mlp", allreduce_sgd.train, dict(data, allreduce="ring", recompute=True)),
        ("ZeRO-1", "mlp", zero.train, dict(data, stage=1)),
        ("ZeRO-2", "mlp", zero.train, dict(data, stage=2)),
        ("ZeRO-3", "mlp", zero.train, dict(data, stage=3)),
        ("ZeRO-3 --prefetch", "mlp", zero.train, dict(data, stage=3, prefetch=True)),
        ("tensor", "mlp", tensor_parallel.train, dict(whole)),
        ("tensor --recompute", "mlp", tensor_parallel.train, dict(whole, recompute=True)),
        ("pipeline 1F1B", "mlp", pipeline_parallel.train, dict(whole, schedule="1f1b", micro_batches=4)),
        ("pipeline 1F1B --recompute", "mlp", pipeline_parallel.train,
         dict(whole, schedule="1f1b", micro_batches=4, recompute=True)),
        ("pipeline GPipe", "mlp", pipeline_parallel.train, dict(whole, schedule="gpipe", micro_batches=4)),
        ("allreduce SGD", "cnn", allreduce_sgd.train, dict(data, allreduce="ring")),
        ("allreduce SGD --recompute", "cnn", allreduce_sgd.train, dict(data, allreduce="ring", recompute=True)),
        ("spatial", "cnn", spatial_parallel.train, dict(whole)),
        ("spatial --recompute", "cnn", spatial_parallel.train, dict(whole, recompute=True)),
    ]


# the run whose bits each of these gives (same seed, same bits), checked seed by seed
BITWISE = {"allreduce SGD --recompute": "allreduce SGD", "ZeRO-1": "allreduce SGD", "ZeRO-2": "allreduce SGD",
           "ZeRO-3": "allreduce SGD", "ZeRO-3 --prefetch": "allreduce SGD",
           "pipeline 1F1B --recompute": "pipeline 1F1B", "tensor --recompute": "tensor",
           "spatial --recompute": "spatial"}


def batch_rows():
    """The global batches of one epoch: 44 of 32 examples and a last one of 30 (the digits' 1438 rows)."""
    full, last = divmod(len(load_data("digits", seed=0).x_train), GLOBAL_BATCH)
    return [GLOBAL_BATCH] * full + ([last] if last else [])


def predicted_traffic(name, model):
    """(bytes, messages) all ranks send per step, by the modules' formulas, averaged over an epoch's
    batches (the activation traffic follows the batch; the ring sends 2 (p-1) messages a rank)."""
    net = build_model(model, 0, "digits")
    n = sum(parameter.size for parameter in net.parameters())
    rows = batch_rows()
    ring_bytes, ring_messages = 2 * (P - 1) * n * ITEMSIZE, 2 * (P - 1) * P     # P ranks, (p-1)/p n each way
    if name.startswith("allreduce"):
        return ring_bytes, ring_messages
    if name.startswith("ZeRO"):                  # per layer (3 units): a reduce-scatter and 1 or 2 allgathers
        halves = 3 if name.startswith("ZeRO-3") else 2
        return halves * (P - 1) * n * ITEMSIZE, halves * (P - 1) * P * len(units_of(net, "layer"))
    if name.startswith("tensor"):                # one block (64 -> 128 -> 64) that reads the data: g only
        return float(np.mean([2 * (P - 1) * r * 64 * ITEMSIZE for r in rows])), 2 * (P - 1) * P
    if name.startswith("pipeline"):              # the MLP's 5 layers cut 3 | 2: 128 features cross
        return float(np.mean([pipeline_parallel.bytes_per_step(r, [128], ITEMSIZE) for r in rows])), 2 * 4 * (P - 1)
    if name.startswith("spatial"):
        tiling, again = Tiling.of(net, 8, 8, P), "recompute" in name        # recompute: the forward halo twice
        halo_messages = (3 if again else 2) * 2 * (P - 1) * (len(tiling.stages) - 1)   # each inner boundary, both ways
        return float(np.mean([spatial_parallel.bytes_per_step(tiling, r, ITEMSIZE, again) for r in rows])), \
            halo_messages + (P - 1) * P + 2 * (P - 1) * P            # + the gather + the ring of the conv grads
    raise KeyError(name)


def training_runs(out, quick):
    epochs, seeds = (1, [0]) if quick else (10, [0, 1, 2])
    steps = epochs * len(batch_rows())
    runs = []
    reference = {}
    for name, model, train, kwargs in methods():
        for seed in seeds:
            counter = MessageCounter(comm)
            started = time.perf_counter()
            params, history = train(counter, model=model, epochs=epochs, seed=seed, quiet=True, **kwargs)
            seconds = time.perf_counter() - started
            messages = comm.allreduce(counter.sent)
            sent = comm.allreduce(counter.bytes)
            record = {"method": name, "model": model, "seed": seed, "epochs": epochs, "steps": steps,
                      "test_accuracy": history[-1]["test_accuracy"], "seconds": round(seconds, 1),
                      "log_bytes_per_step": history[-1]["bytes"] / steps,
                      "bytes_per_step": sent / steps, "messages_per_step": messages / steps}
            reference[(name, model, seed)] = params
            if name in BITWISE:
                record["same_bits_as"] = BITWISE[name]
                record["same_bits"] = bool(np.array_equal(params, reference[(BITWISE[name], model, seed)]))
            predicted_bytes, predicted_messages = predicted_traffic(name, model)
            record.update(predicted_bytes_per_step=predicted_bytes, predicted_messages_per_step=predicted_messages)
            runs.append(record)
            if comm.Get_rank() == 0:
                print(f"{name:<28} {model:<4} seed {seed}: {record['test_accuracy']:.4f} "
                      f"{record['bytes_per_step']:.0f} B {record['messages_per_step']:.1f} msgs/step {seconds:.0f} s",
                      flush=True)
    return runs


# ---- tables -----------------------------------------------------------------------------------------

def kib(value):
    return "-" if value is None else f"{value / 1024:.1f}"


def memory_markdown(path):
    with open(path) as handle:
        table = json.load(handle)
    lines = ["| method | recompute | | params | grads | optimizer | activations | extra | total | peak | sent |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for record in table["rows"]:
        head = f"| {record['method']} | {'yes' if record['recompute'] else 'no'} |"
        if record["predicted"] is None:
            lines.append(f"{head} n/a | {record['note']} | | | | | | | |")
            continue
        for kind in ("predicted", "measured"):
            values = record[kind]
            if values is None:
                continue
            cells = [kib(values[part]) for part in memory_table.PARTS]
            total = kib(sum(values.values())) if None not in values.values() else "-"
            peak = kib(record.get("peak")) if kind == "measured" else "-"
            lines.append(f"{head} {kind} | " + " | ".join(cells) + f" | {total} | {peak} | "
                         f"{kib((record.get('sent') or {}).get(kind))} |")
    return lines


T_975 = {2: 4.303}          # t's 97.5% point for 2 degrees of freedom (3 seeds)


def mean_pm(values, sign=""):
    """mean ± the half-width of the 95% t interval, in percent (one value: the value alone)."""
    digits = 2 if sign else 1
    if len(values) == 1:
        return f"{values[0] * 100:{sign}.{digits}f}% (1 seed)"
    mean, sd = np.mean(values), np.std(values, ddof=1)
    return f"{mean * 100:{sign}.{digits}f} ± {T_975[len(values) - 1] * sd / np.sqrt(len(values)) * 100:.{digits}f}%"


def runs_markdown(runs):
    lines = ["| method | model | test accuracy | minus allreduce SGD's, same seed | bytes per step, predicted | "
             "measured | messages per step, predicted | measured |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    seen = []
    for record in runs:
        key = (record["method"], record["model"])
        if key in seen:
            continue
        seen.append(key)
        same = [r for r in runs if (r["method"], r["model"]) == key]
        accuracy = mean_pm([r["test_accuracy"] for r in same])
        base = {r["seed"]: r["test_accuracy"] for r in runs if (r["method"], r["model"]) == ("allreduce SGD", key[1])}
        if key[0] == "allreduce SGD":
            difference = "-"
        elif all(r.get("same_bits") and r["same_bits_as"] == "allreduce SGD" for r in same):
            difference = "0 (the same bits, every seed)"
        else:
            difference = mean_pm([r["test_accuracy"] - base[r["seed"]] for r in same], sign="+")
            if all(r.get("same_bits") for r in same):
                difference += f" ({same[0]['same_bits_as']}'s bits, every seed)"
        lines.append(f"| {key[0]} | {key[1]} | {accuracy} | {difference} | {record['predicted_bytes_per_step']:.0f} | "
                     f"{record['bytes_per_step']:.0f} | {record['predicted_messages_per_step']:.0f} | "
                     f"{record['messages_per_step']:.1f} |")
    return lines


def write_outputs(out, sweep, runs, plot):
    """The plot (unless ``plot`` is False) and 11_tables.md; 11_runs.json when there are runs."""
    if plot:
        plot_memory(sweep, measured_points(out), os.path.join(out, "11_memory_vs_p.png"))
    lines = []
    for model in ("lenet5", "mlp"):
        lines += [f"<!-- memory {model}, p = {P} -->"] + memory_markdown(os.path.join(out, f"11_memory_{model}.json"))
        lines.append("")
    if runs is not None:
        with open(os.path.join(out, "11_runs.json"), "w") as handle:
            json.dump({"ranks": P, "global_batch": GLOBAL_BATCH, "runs": runs}, handle, indent=1)
        lines += ["<!-- runs -->"] + runs_markdown(runs)
    with open(os.path.join(out, "11_tables.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one epoch, one seed, p <= 8: a check that it runs")
    parser.add_argument("--out", default=os.path.join(HERE, "out"))
    args = parser.parse_args(argv)
    if comm.Get_rank() == 0:
        os.makedirs(args.out, exist_ok=True)
    comm.Barrier()
    sweep = memory_tables(args.out, args.quick)
    runs = training_runs(args.out, args.quick)
    if comm.Get_rank() == 0:
        write_outputs(args.out, sweep, runs, plot=not args.quick)


if __name__ == "__main__":
    main()
