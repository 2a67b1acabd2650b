"""``python -m collectives.cluster``: a job on emulated hosts (collectives/cluster/launch.py)."""
import sys

from collectives.cluster import launch

if __name__ == "__main__":
    sys.exit(launch.main())
