"""Memory accounts: the bytes each rank holds, by method, predicted by formula and measured on a real step.

    python -m algorithms.memory --ranks 4 --model lenet5 [--batch-size 64] [--micro-batches 4] [--json out.json]
    mpiexec -n 4 python -m algorithms.memory --ranks 4 --model lenet5      # measures the allreduce's buffer too

Papers: Rajbhandari et al. 2020 (ZeRO), section 5 and Figure 1: model states of Psi parameters per
device, K bytes of optimizer state per parameter, N_d data-parallel ranks: baseline (2 + 2 + K) Psi
in mixed precision, stage 1 (P_os) 4 Psi + K Psi / N_d, stage 2 (P_os+g) 2 Psi + (2 + K) Psi / N_d,
stage 3 (P_os+g+p) (2 + 2 + K) Psi / N_d. Written here for float32 (b = 4 bytes a value, no fp16
copies) and SGD with momentum (one state value per parameter, k = 1; k = 0 without momentum).
Chen et al. 2016 for recomputation; Huang et al. 2019 (GPipe) and Narayanan et al. 2021
(PipeDream-Flush's 1F1B) for the activations in flight; Shoeybi et al. 2019 (Megatron-LM) for the
tensor split; Dean et al. 2012 for the spatial split. Full references: tutorials/references.md.

Per rank, for n parameters, p ranks, a batch of B rows per replica (``--batch-size``) and A(layers, rows)
the activations the forward keeps (``algorithms.core.footprint``, which counts minidl's own kernels):

    method         params       grads       optimizer   activations               comm buffers
    data parallel  n b          n b         k n b       A(all, B)                 n/p b          (1)
    ZeRO-1         n b          n b         k n b / p   A(all, B)                 n/p b          (2)
    ZeRO-2         n b          n b / p     k n b / p   A(all, B)                 n b            (3)
    ZeRO-3         n b / p      n b / p     k n b / p   A(all, B)                 2 n_layer b    (4)
    tensor         n_c + n_f/p  as params   k params    A(convs, B) + A(fc, B)/p  B w b          (5)
    GPipe          n_s b        n_s b       k n_s b     m A(stage, B/m)           (m + 1) B/m out_s b
    1F1B           n_s b        n_s b       k n_s b     min(p, m) A(stage, B/m)   (m + 1) B/m out_s b
    spatial        n b          n b         k n b       A_tiles(r, B) + A(fc, B)  B C H W b + n_c/p b  (6)
    hybrid         2-stage 1F1B with p/2 replicas of each stage, plus n_s/(p/2) b of the stage's ring

(1) the ring's receive block; (2) the reduce-scatter's block; (3) the backward's whole gradient before
it is reduce-scattered (a bucketed backward: one bucket); (4) one layer's gathered weights and its
gradient, freed after use; (5) a row-parallel output, allreduced; (6) the gathered last map (C, H, W)
and the ring's block of the conv weights' gradient.

n/p means the largest shard, ceil(n/p). tensor: the Linear layers in pairs (column-parallel, then
row-parallel: Megatron's MLP block), each pair's weights and the column layer's activations split
p ways, an unpaired last Linear whole; n_c the other layers' parameters, w the widest row-parallel
output. Pipeline: stage s holds n_s parameters of its contiguous layers (``pipeline_parallel``'s cut),
m micro-batches, out_s its output bytes per row (the sends of all m micro-batches stay alive until
the step's Waitall in ``pipeline_gradient``, and one gradient is received at a time); the table shows
stage 0, which holds the most micro-batches in flight (GPipe all m, 1F1B at most p). Spatial: A_tiles
the bytes rank r's tiles keep, halo and padding included (``Tiling.activation_bytes``), for the rank
with the most; spatial_parallel runs no recomputation.
With ``--recompute`` (the table's second half), A keeps only about sqrt(L) segment outputs and
recomputes the largest segment in the backward (``footprint.activations``).

Measured: the data-parallel rows (with and without --recompute) run one real step of allreduce SGD
phase by phase under tracemalloc (``algorithms.core.allocations``), its comm buffer only under
``mpiexec -n P`` (one process has no peers to allreduce with); the spatial row runs
``spatial_parallel``'s pieces phase by phase on the P ranks of ``mpiexec -n P`` (or P = 1), the
largest figure over the ranks. The other rows print "not measured": their formulas were written
before their steps were instrumented (ZeRO and tensor parallelism were not yet in the tree; the
pipeline and hybrid steps interleave micro-batches' forwards, backwards and messages in one call).
What the numbers say for LeNet-5: the conv workspaces (im2col columns) are most of its activations,
and minidl's workspace pool keeps them whatever runs, so recomputation saves little there; on deep
MLPs it saves what ``minidl.recompute`` predicts (tests/test_recompute.py).
tests/test_memory.py: predicted and measured within 10% for LeNet-5 and the MLP.
"""
import argparse
import dataclasses
import json
import math

from mpi4py import MPI

from algorithms import spatial_parallel
from algorithms.core import allocations, cli, footprint, run
from algorithms.core.cli import SettingError
from algorithms.core.objective import build_model
from algorithms.core.tiling import Tiling
from collectives.buffers import release_scratch
from minidl import functional as F
from minidl.conv.scratch import release
from minidl.data import shard_sizes
from minidl.nn import Sequential
from minidl.tensor import Tensor

PARTS = ("params", "grads", "optimizer", "activations", "comm")
EXAMPLE = {"mlp": (1, 8, 8), "cnn": (1, 8, 8), "lenet5": (1, 28, 28)}


def share(n, p):
    return math.ceil(n / p)


def scaled(layer, fraction):
    """``layer``'s per-example activation bytes times ``fraction`` (a rank's share of them)."""
    return dataclasses.replace(layer, fresh=math.ceil(layer.fresh * fraction),
                               scratch=math.ceil(layer.scratch * fraction), out=math.ceil(layer.out * fraction))


def row(params, grads, optimizer, activations, comm):
    return dict(zip(PARTS, (params, grads, optimizer, activations, comm)))


def data_parallel(layers, p, batch, b, k, recompute):
    n = footprint.parameters(layers)
    comm = share(n, p) * b if p > 1 else 0
    return row(n * b, n * b, k * n * b, footprint.activations(layers, batch, recompute), comm)


def zero(stage, layers, p, batch, b, k, recompute):
    """ZeRO stage 1, 2 or 3 (the formulas of the header)."""
    n = footprint.parameters(layers)
    largest = max(layer.params for layer in layers)
    comm = {1: share(n, p) * b, 2: n * b, 3: 2 * largest * b}[stage] if p > 1 else 0
    return row((share(n, p) if stage >= 3 else n) * b, (share(n, p) if stage >= 2 else n) * b, k * share(n, p) * b,
               footprint.activations(layers, batch, recompute), comm)


def tensor(layers, p, batch, b, k, recompute):
    """Megatron's split of the Linear layers in (column, row) pairs; the rest replicated."""
    linear = [index for index, layer in enumerate(layers) if layer.name == "Linear"]
    pairs = [(linear[i], linear[i + 1]) for i in range(0, len(linear) - 1, 2)]
    split = {index for pair in pairs for index in pair}
    params = sum(share(layer.params, p) if index in split else layer.params for index, layer in enumerate(layers))
    # the column layer's output and the ReLU behind it are split p ways; the row layer's output is whole
    column = {first + offset for first, _ in pairs for offset in (0, 1)}
    activations = footprint.activations([scaled(layer, 1 / p) if index in column else layer
                                         for index, layer in enumerate(layers)], batch, recompute)
    width = max((layers[second].out for _, second in pairs), default=0)
    return row(params * b, params * b, k * params * b, activations, batch * width if p > 1 else 0)


def stage_layers(layers, p):
    """Stage 0's layers and the layer after them (``pipeline_parallel``'s cut: L/p each, the first stages one more)."""
    return layers[:int(shard_sizes(len(layers), p)[0])]


def pipeline(layers, p, batch, b, k, recompute, micro_batches, kind):
    """GPipe or 1F1B, stage 0 (the most micro-batches in flight); its comm buffers: every micro-batch's
    output, which ``pipeline_gradient``'s Isend holds until the step's Waitall, and one gradient received."""
    stage = stage_layers(layers, p)
    rows = share(batch, micro_batches)
    in_flight = micro_batches if kind == "gpipe" else min(p, micro_batches)
    n = footprint.parameters(stage)
    last = len(stage) == len(layers)
    activations = footprint.activations(stage, rows, recompute, copies=in_flight, loss=last)
    comm = 0 if p == 1 else (micro_batches + 1) * rows * stage[-1].out
    return row(n * b, n * b, k * n * b, activations, comm)


def spatial(net, layers, example, p, batch, b, k):
    """Spatial tiles of the conv stages (the rank with the most), the head whole on the gathered map."""
    tiling = Tiling.of(net, example[1], example[2], p)       # SettingError where it cannot tile
    convs = len(layers) - len(tiling.head)                   # the conv stages' layers come first
    n, n_conv = footprint.parameters(layers), tiling.conv_parameters()
    activations = max(tiling.activation_bytes(rank, batch, b) for rank in range(p))
    activations += footprint.activations(layers[convs:], batch)
    comm = batch * layers[convs - 1].out + (share(n_conv, p) * b if p > 1 else 0)
    return row(n * b, n * b, k * n * b, activations, comm)


def predicted_rows(model, p, batch, micro_batches, k, recompute):
    """[(method, row or the reason it does not apply)] for every method, predicted."""
    example = EXAMPLE[model]
    net = build_model(model, 0, "mnist" if model == "lenet5" else "digits")
    layers = footprint.of(net, example)
    b = next(iter(net.parameters())).dtype.itemsize
    rows = [("data parallel", data_parallel(layers, p, batch, b, k, recompute))]
    rows += [(f"ZeRO-{stage}", zero(stage, layers, p, batch, b, k, recompute)) for stage in (1, 2, 3)]
    rows.append(("tensor", tensor(layers, p, batch, b, k, recompute)))
    for kind, name in (("gpipe", "pipeline GPipe"), ("1f1b", "pipeline 1F1B")):
        rows.append((name, pipeline(layers, p, batch, b, k, recompute, micro_batches, kind)
                     if p <= len(layers) else f"{p} stages for {len(layers)} layers"))
    try:
        rows.append(("spatial", "spatial_parallel has no --recompute" if recompute else
                     spatial(net, layers, example, p, batch, b, k)))
    except SettingError as error:
        rows.append(("spatial", str(error)))
    if p % 2 == 0 and p > 2:                                  # 2 pipeline stages x p/2 data replicas
        hybrid = pipeline(layers, 2, batch, b, k, recompute, micro_batches, "1f1b")
        hybrid["comm"] += share(hybrid["params"] // b, p // 2) * b
        rows.append(("hybrid 2 x p/2", hybrid))
    else:
        rows.append(("hybrid 2 x p/2", f"{p} ranks do not form a grid of 2 pipeline stages"))
    return rows


def measure_spatial(comm, model, batch, momentum, seed=0):
    """This rank's bytes per part of one step of ``spatial_parallel``, phase by phase as its heart runs:
    the tiles' forward (activations), the gather (comm), the head's forward (activations), the conv
    gradient's ring (comm), the update (optimizer)."""
    x, labels = allocations.example_batch(EXAMPLE[model], batch, seed)
    rank, meter = comm.Get_rank(), allocations.Meter()
    try:
        net, flat, optimizer, measured = allocations.set_up(meter, model, EXAMPLE[model], momentum=momentum, seed=seed)
        tiling = Tiling.of(net, x.shape[2], x.shape[3], comm.Get_size())
        release()
        meter.take()
        kept, tile = [], None
        for s, stage in enumerate(tiling.stages):
            lo, hi = stage.needed[rank]
            window = x[:, :, lo:hi] if s == 0 else spatial_parallel.halo_exchange(comm, tile.data, stage)
            leaf, tile = spatial_parallel.run_stage(stage, window, rank, need_grad=s > 0)
            kept.append((leaf, tile))
            del window
        measured["activations"] = meter.take()
        whole = Tensor(spatial_parallel.gather_rows(comm, tile.data, tiling.final[0]), requires_grad=True)
        measured["comm"] = meter.take()
        loss = F.softmax_cross_entropy(Sequential(*tiling.head)(whole), labels)
        measured["activations"] += meter.take()
        del loss, whole, kept, tile
        release_scratch()
        meter.take()
        if comm.Get_size() > 1:
            run.allreduce_function("ring")(comm, flat.grad[:tiling.conv_parameters()])
        measured["comm"] += meter.take()
        flat.grad[...] = 0
        optimizer.step()
        measured["optimizer"] = meter.take()
    finally:
        meter.stop()
    return measured


def measured_row(comm, model, p, batch, recompute, momentum):
    """The data-parallel row measured on this process (the comm buffer only when comm has p ranks)."""
    real = comm.Get_size() == p and p > 1
    summed = run.allreduce_function("ring") if real else None
    measured = allocations.data_parallel(comm if real else MPI.COMM_SELF, model, EXAMPLE[model], batch, recompute,
                                         momentum, allreduce=summed)
    if not real and p > 1:
        measured["comm"] = None                               # not measured: no peers in this process
    return measured


def table(model, p, batch, micro_batches=8, momentum=0.9, comm=None, measure=True):
    """Every method's per-rank account, predicted (and measured where it is): a list of dicts."""
    k = 1 if momentum else 0
    records = []
    for recompute in (False, True):
        for method, predicted in predicted_rows(model, p, batch, micro_batches, k, recompute):
            record = {"method": method, "recompute": recompute, "predicted": predicted, "measured": None}
            if isinstance(predicted, str):
                record.update(predicted=None, note=predicted)
            elif method == "data parallel" and measure:
                record["measured"] = measured_row(comm or MPI.COMM_WORLD, model, p, batch, recompute, momentum)
            elif method == "spatial" and measure and (comm or MPI.COMM_WORLD).Get_size() == p:
                mine = measure_spatial(comm or MPI.COMM_WORLD, model, batch, momentum)
                record["measured"] = {part: (comm or MPI.COMM_WORLD).allreduce(value, op=MPI.MAX)   # the fullest rank
                                      for part, value in mine.items()}
            records.append(record)
    return records


def format_table(records):
    """The records as text, in KiB: a predicted line per row, and its measured line (or why there is none)."""
    def line(record, kind, values):
        head = f"{record['method']:<16} {'yes' if record['recompute'] else 'no':<9} {kind:<9}"
        if isinstance(values, str):
            return f"{head} {values}"
        cells = [f"{'-' if values[part] is None else format(values[part] / 1024, '.1f'):>12}" for part in PARTS]
        total = sum(value for value in values.values() if value is not None)
        return f"{head} {' '.join(cells)} {total / 1024:>12.1f}"
    lines = [f"{'method':<16} {'recompute':<9} {'kind':<9} " + " ".join(f"{part:>12}" for part in PARTS)
             + f" {'total':>12}"]
    for record in records:
        if record["predicted"] is None:
            lines.append(line(record, "n/a", record["note"]))
            continue
        lines.append(line(record, "predicted", record["predicted"]))
        lines.append(line(record, "measured", record["measured"] or "not measured"))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, required=True, help="p: ranks of the layout (per-rank accounts)")
    parser.add_argument("--model", default="lenet5", choices=sorted(EXAMPLE))
    parser.add_argument("--batch-size", type=int, default=64, help="rows per replica per step")
    parser.add_argument("--micro-batches", type=int, default=8, help="pipeline micro-batches per step")
    parser.add_argument("--momentum", type=float, default=0.9, help="0: SGD keeps no optimizer state")
    parser.add_argument("--json", default=None, help="write the table as JSON to this file")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD

    def run_table():
        with run.agreed(comm):                        # every rank refuses a bad flag together
            cli.require("--ranks", args.ranks, integer=True, low=1)
            cli.require("--batch-size", args.batch_size, integer=True, low=1)
            cli.require("--micro-batches", args.micro_batches, integer=True, low=1, high=args.batch_size)
            cli.require("--momentum", args.momentum, low=0, high=1, high_open=True)
            if comm.Get_rank() == 0:
                cli.check_output("--json", args.json)
        records = table(args.model, args.ranks, args.batch_size, args.micro_batches, args.momentum, comm)
        if comm.Get_rank() == 0:
            print(f"bytes per rank in KiB: --model {args.model}, p = {args.ranks}, batch {args.batch_size}, "
                  f"{args.micro_batches} micro-batches, float32\n" + format_table(records))
            if args.json:
                with open(args.json, "w") as out:
                    json.dump({"model": args.model, "ranks": args.ranks, "batch": args.batch_size,
                               "micro_batches": args.micro_batches, "rows": records}, out, indent=1)
    try:
        run_table()
    except SettingError as error:
        cli.fail(str(error))


if __name__ == "__main__":
    main()
