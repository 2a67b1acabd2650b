"""The memory table (``python -m algorithms.memory``): each method's per-rank bytes, predicted by the
formulas of ``accounts`` and measured on one real step (``allocations``, ``measured``); the package's
header (algorithms/memory/__init__.py) writes the formulas out."""
import argparse
import json

from mpi4py import MPI

from algorithms.core import cli, run
from algorithms.core.cli import SettingError
from algorithms.memory import measured, sharded
from algorithms.memory.accounts import EXAMPLE, PARTS, predicted_rows, sent_bytes


def measure_method(comm, method, model, p, batch, micro_batches, recompute, momentum, optimizer="sgd"):
    """(the measured row of ``method``, {"peak": ..., "sent": ...} or None): data parallelism and ZeRO by
    their real steps (``sharded``), the rest by their modules' pieces (``measured``); None where it
    cannot be measured here (spatial needs its p ranks)."""
    if method == "data parallel" or method.startswith("ZeRO"):
        return sharded.measure(comm, method, model, p, batch, recompute, optimizer, momentum)
    if method == "tensor":
        return measured.tensor(comm, model, p, batch, recompute, momentum), None
    if method.startswith("pipeline"):
        return measured.pipeline(model, p, batch, micro_batches, method.split()[1].lower(), recompute, momentum), None
    if method.startswith("hybrid"):
        return measured.hybrid(comm, model, p, batch, micro_batches, recompute, momentum), None
    if method == "spatial local" and comm.Get_size() == p:
        mine = measured.spatial_local(comm, batch, momentum)
        return {part: comm.allreduce(value, op=MPI.MAX) for part, value in mine.items()}, None
    if method == "spatial" and comm.Get_size() == p:
        mine = measured.spatial(comm, model, batch, recompute, momentum)
        return {part: comm.allreduce(value, op=MPI.MAX) for part, value in mine.items()}, None
    return None, None


def table(model, p, batch, micro_batches=8, momentum=0.9, comm=None, measure=True, optimizer="sgd"):
    """Every method's per-rank account, predicted and measured: a list of dicts. Data parallelism and
    ZeRO's also carry ``peak`` (the step's most bytes, measured) and ``sent`` (the bytes rank 0 sends
    per step, predicted and measured)."""
    comm = comm or MPI.COMM_WORLD
    k = 2 if optimizer == "adam" else (1 if momentum else 0)
    records = []
    for recompute in (False, True):
        for method, predicted in predicted_rows(model, p, batch, micro_batches, k, recompute, optimizer):
            record = {"method": method, "recompute": recompute, "predicted": predicted, "measured": None}
            if isinstance(predicted, str):               # the method does not apply: say why
                record.update(predicted=None, note=predicted)
                records.append(record)
                continue
            wire = sent_bytes(method, model, p, recompute)
            if wire is not None:
                record.update(peak=None, sent={"predicted": wire, "measured": None})
            if measure:
                record["measured"], more = measure_method(comm, method, model, p, batch, micro_batches, recompute,
                                                          momentum, optimizer)
                if more:
                    record.update(peak=more["peak"], sent={"predicted": wire, "measured": more["sent"]})
            records.append(record)
    return records


def format_table(records):
    """The records as text, in KiB: a predicted line per row, and its measured line (or why there is none);
    for data parallelism and ZeRO also the step's peak (measured) and the bytes rank 0 sends per step."""
    def kib(value):
        return "-" if value is None else format(value / 1024, ".1f")

    def line(record, kind, values):
        head = f"{record['method']:<16} {'yes' if record['recompute'] else 'no':<9} {kind:<9}"
        if isinstance(values, str):
            return f"{head} {values}"
        cells = [f"{kib(values[part]):>12}" for part in PARTS]
        total = "-" if None in values.values() else kib(sum(values.values()))     # no part left out
        peak = record.get("peak") if kind == "measured" else None
        sent = (record.get("sent") or {}).get(kind)
        return f"{head} {' '.join(cells)} {total:>12} {kib(peak):>10} {kib(sent):>10}"
    lines = [f"{'method':<16} {'recompute':<9} {'kind':<9} " + " ".join(f"{part:>12}" for part in PARTS)
             + f" {'total':>12} {'peak':>10} {'sent':>10}"]
    for record in records:
        if record["predicted"] is None:
            lines.append(line(record, "n/a", record["note"]))
            continue
        lines.append(line(record, "predicted", record["predicted"]))
        lines.append(line(record, "measured", record["measured"] or "not measured"))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m algorithms.memory", description=__doc__.splitlines()[0])
    parser.error = cli.fail                       # a bad flag: one error line, exit 2
    parser.add_argument("--ranks", type=int, required=True, help="p: ranks of the layout (per-rank accounts)")
    parser.add_argument("--model", default="lenet5", choices=sorted(EXAMPLE))
    parser.add_argument("--batch-size", type=int, default=64, help="rows per replica per step")
    parser.add_argument("--micro-batches", type=int, default=8, help="pipeline micro-batches per step")
    parser.add_argument("--momentum", type=float, default=0.9, help="0: SGD keeps no optimizer state")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"), help="adam: Adam's m and v "
                        "(K = 8 bytes a parameter), data parallelism and ZeRO only")
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
        records = table(args.model, args.ranks, args.batch_size, args.micro_batches, args.momentum, comm,
                        optimizer=args.optimizer)
        if comm.Get_rank() == 0:
            print(f"bytes per rank in KiB: --model {args.model}, p = {args.ranks}, batch {args.batch_size}, "
                  f"{args.micro_batches} micro-batches, {args.optimizer}, float32\n" + format_table(records))
            if args.json:
                with open(args.json, "w") as out:
                    json.dump({"model": args.model, "ranks": args.ranks, "batch": args.batch_size,
                               "micro_batches": args.micro_batches, "optimizer": args.optimizer, "rows": records},
                              out, indent=1)
    try:
        run_table()
    except SettingError as error:
        cli.fail(str(error))
