"""``python -m collectives.sim``: the same command as ``python -m collectives.simulate``
(collectives/sim/simulate.py)."""
from collectives.sim.simulate import main

if __name__ == "__main__":
    main()
