"""``python -m algorithms.memory``: the memory table (algorithms/memory/table.py; the formulas: __init__.py)."""
from algorithms.memory import table

if __name__ == "__main__":
    table.main()
