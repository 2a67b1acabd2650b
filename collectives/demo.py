"""What `python -m collectives.<algorithm>` runs: one allreduce, traced and checked against MPI's own.

    mpiexec -n 4 python -m collectives.ring [--length 10] [--op sum|max|min|mean] [--png ring.png]

Rank r holds r, r + 1, ..., r + length - 1 (float64 integers, so every summation order is
exact). The algorithm runs on a TracedComm with the agreement check on (one MPI Allreduce of
a few integers, which the tracer does not record); rank 0 prints every message of the algorithm,
each rank's message and byte counts beside collectives.model.cost's formula, and the result.
Every rank then compares its result, bit for bit, with MPI's own Allreduce of the same vector;
if any rank differs, every rank exits with status 1.
"""

import numpy as np
from mpi4py import MPI

from . import cli, spacetime, trace
from .model import cost
from .ops import OPS

MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "mean": MPI.SUM}


def demo(allreduce, comm, name, argv=None):
    """Run `allreduce` (algorithm `name`) once on comm, traced; check it against comm.Allreduce."""
    parser = cli.Parser(prog=f"python -m collectives.{name}", description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=10, help="elements per rank (default 10)")
    parser.add_argument("--op", choices=OPS, default="sum")
    parser.add_argument("--png", help="also draw the space-time diagram here (needs matplotlib)")
    args = parser.parse_args(argv)
    rank, size = comm.Get_rank(), comm.Get_size()

    grad = np.arange(args.length, dtype=np.float64) + rank
    traced = trace.TracedComm(comm)
    result = allreduce(traced, grad, np.empty_like(grad), op=args.op)

    # the reference: MPI's own Allreduce (mean = sum, then / p, as collectives.ops does)
    expected = np.empty_like(grad)
    comm.Allreduce(grad, expected, op=MPI_OPS[args.op])
    if args.op == "mean":
        expected /= size
    same = comm.allgather(result.tobytes() == expected.tobytes())

    messages = trace.gather(traced)
    every_count = comm.gather(trace.counts(traced.messages, rank))
    if rank == 0:
        print(f"{name} allreduce ({args.op}) of {args.length} float64 on {size} ranks, traced:")
        print(trace.format_text(messages, directions=("send",)))
        for other, (sent, nbytes, reduced) in enumerate(every_count):
            line = f"rank {other}: {sent} messages, {nbytes} bytes sent, {reduced} reduced"
            if name in cost.ALGORITHMS:
                formula = cost.per_rank(name, size, args.length, 8, other)
                line += (f"; cost.py: {formula.messages}, {formula.bytes_sent}, {formula.bytes_reduced}")
            print(line)
        print("result  ", result)
        print("MPI_Allreduce", expected)
        print("same bits as MPI_Allreduce on every rank" if all(same) else
              f"DIFFERENT from MPI_Allreduce on ranks {[r for r, ok in enumerate(same) if not ok]}")
        if args.png:
            print("space-time diagram:", spacetime.plot_spacetime(messages, args.png, f"{name} allreduce"))
    if not all(same):
        raise SystemExit(1)
    return result
