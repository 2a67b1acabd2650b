"""``python -m collectives.sim``: every allreduce on a simulated network (collectives/sim/simulate.py)."""
from collectives.sim import simulate

if __name__ == "__main__":
    simulate.main()
