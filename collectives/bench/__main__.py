"""``python -m collectives.bench``: the bench of collectives/bench/measure.py (its header says what it measures)."""
from collectives.bench import measure

if __name__ == "__main__":
    measure.main()
