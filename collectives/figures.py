"""Regenerate the space-time diagrams of tutorials/03_collectives.md from real traced runs.

    mpiexec -n 6 python -m collectives.figures [DIRECTORY]      # default tutorials/figures

Ranks 0-3 trace every algorithm at p = 4 (16 float64 elements, check=False) and draw it with
the logical clock (trace.logical_times: one column per step, free of timing noise); then all
6 ranks trace Rabenseifner to show the fold-in for a p that is not a power of two, and the
ring at p = 4 is drawn once more on the wall clock.
"""
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import collectives
from collectives import cost, trace


def draw(comm, algorithm, path, title, clock="steps", length=16):
    collectives.allreduce(comm, np.ones(length), algorithm=algorithm, check=False)   # warm-up
    traced = trace.TracedComm(comm)
    comm.Barrier()                                     # start together, so the wall clock is fair
    collectives.allreduce(traced, np.ones(length), algorithm=algorithm, check=False)
    messages = trace.gather(traced)
    if messages is not None:
        trace.plot_spacetime(messages, path, title, clock=clock)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "tutorials/figures")
    world = MPI.COMM_WORLD
    four = world.Split(0 if world.Get_rank() < 4 else MPI.UNDEFINED, world.Get_rank())
    if four != MPI.COMM_NULL:
        for algorithm in cost.ALGORITHMS:
            draw(four, algorithm, out / f"03_spacetime_{algorithm}.png",
                 f"{algorithm} allreduce, p = {four.Get_size()}, 16 elements")
        draw(four, "ring", out / "03_spacetime_ring_wall.png",
             "ring allreduce, p = 4, 1 MiB, wall clock", clock="wall", length=1 << 17)
        four.Free()
    draw(world, "rabenseifner", out / f"03_spacetime_rabenseifner_p{world.Get_size()}.png",
         f"rabenseifner allreduce, p = {world.Get_size()} (fold-in), 16 elements")


if __name__ == "__main__":
    main()
