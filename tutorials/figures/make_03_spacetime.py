"""Chapter 3's space-time diagrams, from real traced runs (make_03_figures.py runs this under mpiexec).

    mpiexec -n 4 python tutorials/figures/make_03_spacetime.py [DIRECTORY]      # default tutorials/figures/out
    mpiexec -n 6 python tutorials/figures/make_03_spacetime.py [DIRECTORY]

Ranks 0-3 trace every algorithm at p = 4 (16 float64 elements, check=False) and draw it with
the logical clock (spacetime.logical_times: one column per step, free of timing noise). At p = 4
the ring is also drawn on the wall clock (1 MiB, after a warm-up call and a barrier), and the
span and start skew of that call, of a cold first call and of the same call at p = 2 go to
03_spacetime_wall.json (only at p = 4: idle extra ranks would poll on the same cores). At a p
that is not a power of two all ranks trace Rabenseifner to show the fold-in.
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
import collectives  # noqa: E402
from collectives import spacetime, trace  # noqa: E402
from collectives.model import cost  # noqa: E402


def draw(comm, algorithm, path, title, clock="steps", length=16, warm=True):
    """Trace one call and draw it (rank 0); returns the gathered messages (rank 0) or None.

    warm=False: no warm-up call and no barrier, as a first call in a program sees it."""
    if warm:
        collectives.allreduce(comm, np.ones(length), algorithm=algorithm, check=False)   # warm-up
    traced = trace.TracedComm(comm)
    if warm:
        comm.Barrier()                                 # start together, so the wall clock is fair
    collectives.allreduce(traced, np.ones(length), algorithm=algorithm, check=False)
    messages = trace.gather(traced)
    if messages is not None and path is not None:
        spacetime.plot_spacetime(messages, path, title, clock=clock, full=8 * length)
    return messages


def wall_summary(messages):
    """Span of the call and skew of the ranks' first sends, in microseconds (rank 0's view)."""
    first = {}
    for m in messages:
        if m.direction == "send":
            first[m.rank] = min(first.get(m.rank, np.inf), m.start)
    return {"span_us": 1e6 * (max(m.end for m in messages) - min(m.start for m in messages)),
            "start_skew_us": 1e6 * (max(first.values()) - min(first.values()))}


def timed_call(comm, length, repeats=20):
    """Untraced ring call after a barrier: median over repeats of the slowest rank's seconds."""
    vector, seconds = np.ones(length), []
    for _ in range(repeats):
        comm.Barrier()
        start = MPI.Wtime()
        collectives.allreduce(comm, vector, algorithm="ring", check=False)
        seconds.append(comm.allreduce(MPI.Wtime() - start, op=MPI.MAX))
    return float(np.median(seconds))


def wall_clock(comm, out, length=1 << 17, repeats=5):
    """The ring at 1 MiB on the wall clock: cold (first call, no barrier) and warm (after a warm-up and a
    barrier, `repeats` times, the last one drawn), at p = 4 and, for comparison, p = 2 (one rank per core);
    summaries to 03_spacetime_wall.json on rank 0 of `comm`."""
    cold = draw(comm, "ring", None, "", clock="wall", length=length, warm=False)
    warm = [draw(comm, "ring", None, "", clock="wall", length=length) for _ in range(repeats - 1)]
    warm.append(draw(comm, "ring", out / "03_spacetime_ring_wall.png",
                     f"ring allreduce, p = {comm.Get_size()}, 1 MiB, wall clock (warm, after a barrier)",
                     clock="wall", length=length))
    untraced = timed_call(comm, length)
    two = comm.Split(0 if comm.Get_rank() < 2 else MPI.UNDEFINED, comm.Get_rank())
    if two != MPI.COMM_NULL:
        warm_two = [draw(two, "ring", None, "", clock="wall", length=length) for _ in range(repeats)]
        untraced_two = timed_call(two, length)
        two.Free()
    if comm.Get_rank() == 0:
        (out / "03_spacetime_wall.json").write_text(json.dumps({
            "bytes": 8 * length, "p": comm.Get_size(),
            "first_call_no_barrier": wall_summary(cold),
            "warm_after_barrier": [wall_summary(m) for m in warm],
            "untraced_median_us": 1e6 * untraced,
            "p2_warm_after_barrier": [wall_summary(m) for m in warm_two],
            "p2_untraced_median_us": 1e6 * untraced_two}, indent=1))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "tutorials/figures/out")
    world = MPI.COMM_WORLD
    four = world.Split(0 if world.Get_rank() < 4 else MPI.UNDEFINED, world.Get_rank())
    if four != MPI.COMM_NULL:
        if world.Get_size() == 4:                      # no idle extra ranks polling on the same cores
            wall_clock(four, out)                      # first: its cold call is the program's first
        for algorithm in cost.ALGORITHMS:
            draw(four, algorithm, out / f"03_spacetime_{algorithm}.png",
                 f"{algorithm} allreduce, p = {four.Get_size()}, 16 elements")
        four.Free()
    if world.Get_size() & (world.Get_size() - 1):      # not a power of two: the fold-in
        draw(world, "rabenseifner", out / f"03_spacetime_rabenseifner_p{world.Get_size()}.png",
             f"rabenseifner allreduce, p = {world.Get_size()} (fold-in), 16 elements")


if __name__ == "__main__":
    main()
