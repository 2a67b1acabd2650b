"""``python -m collectives.simulate``: every allreduce on p simulated ranks, beside its closed form.

The command lives with the engine it drives (collectives/sim/simulate.py, where its flags, targets
and JSON are described); this is its name on the command line.

    python -m collectives.simulate --ranks 16384 --bytes 1M --sizes-only --ranks-per-node 8 --nics-per-node 1 \\
        --algorithms rabenseifner,butterfly,tree,hierarchical
"""
from collectives.sim.simulate import main

if __name__ == "__main__":
    main()
