"""auto: recursive doubling for small vectors, Rabenseifner's algorithm for large ones, by size alone.

Like MPICH's MPI_Allreduce (Thakur, Rabenseifner & Gropp, IJHPCA 2005): butterfly while the
latency term dominates (lg p alpha, against Rabenseifner's 2 lg p alpha), Rabenseifner once the
vector is long enough that its smaller bandwidth and reduction terms pay the extra lg p alpha
back (2 (p-1)/p n beta + (p-1)/p n gamma, against butterfly's lg p n (beta + gamma)). Even at
p = 2, where both send n bytes, Rabenseifner reduces only n/2 per rank, so it wins for large n.

The threshold was measured on this machine (2 cores, MPICH 5.0.2 shared memory) with

    mpiexec -n P python -m collectives.bench --algorithms butterfly,rabenseifner,ring \
        --sizes 4K,16K,64K,256K,1M,4M --rounds 15 --min-time 0.005

best of 15 batches, microseconds per allreduce (float32 vectors, check=False):

    p = 2     4 KiB  16 KiB  64 KiB  256 KiB  1 MiB  4 MiB
    butterfly   7.8    42.5    38.7    133.5  477.7   1360
    rabenseif. 17.6    76.8    60.6    183.4  329.1   1127
    p = 4
    butterfly  59.1   152.0   201.2    606.5   1428   6046
    rabenseif. 113.1  250.4   384.8    377.0   1126   4611

A second full run (`mpiexec -n 2 python -m collectives.bench`, best of 7) disagreed at p = 2,
256 KiB: butterfly 118.6 us, Rabenseifner 73.1 us (and at 64 KiB 37.4 against 32.0). The
model, with that run's fitted alpha = 1.9 us and gamma = 0.025 ns/B, puts the p = 2 crossover where
Rabenseifner's saved n/2 gamma pays for its extra alpha: n = 2 alpha / gamma ~ 150 KB. So one
threshold, 128 KiB, for every p: between the measured 64 KiB and 256 KiB at p = 4 (p = 3
looked alike) and at the model's crossover for p = 2. The machine was shared with other jobs
(load average 4-8 on 2 cores) while these ran, so single numbers are noisy and the crossover is
known only to within a factor of 4. That was the single THRESHOLD_BYTES below.

Per p (issue 15). The threshold is now looked up per p in collectives/thresholds.json, which
the bench writes from its own measurement (the smallest size from which Rabenseifner is at
least as fast as the butterfly at every larger size measured):

    mpiexec -n 2 python -m collectives.bench --algorithms butterfly,rabenseifner,auto --write-thresholds
    mpiexec -n 4 python -m collectives.bench --algorithms butterfly,rabenseifner,auto --write-thresholds

A p missing from the file (or no file) gets THRESHOLD_BYTES. The file is plain JSON
({"2": bytes, "4": bytes, ...}), read once at import.

    mpiexec -n 4 python -m collectives.auto
"""
import json
import os

from mpi4py import MPI

from . import butterfly, rabenseifner
from .buffers import run_allreduce

# vectors of at least this many bytes go to Rabenseifner, shorter ones to the butterfly
THRESHOLD_BYTES = 128 * 1024       # the default, for a p that thresholds.json does not list
THRESHOLDS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "thresholds.json")


def load_thresholds(path=THRESHOLDS_FILE):
    """{p: bytes} from the bench's JSON file; {} when it is absent or unreadable."""
    try:
        with open(path) as file:
            table = json.load(file)
        return {int(p): int(nbytes) for p, nbytes in table.items() if p.isdigit()}
    except (OSError, ValueError, AttributeError):
        return {}


THRESHOLDS = load_thresholds()


def threshold(p):
    """The size in bytes from which auto uses Rabenseifner on p ranks."""
    return THRESHOLDS.get(p, THRESHOLD_BYTES)


def choose(nbytes, p=None):
    """The algorithm module auto uses for a vector of `nbytes` bytes on p ranks (p=None: default)."""
    return butterfly if nbytes < (THRESHOLD_BYTES if p is None else threshold(p)) else rabenseifner


def auto_allreduce_in_place(comm, data, op):
    """The heart: pick by the vector's size in bytes and by p (see the header), run that heart."""
    chosen = choose(data.nbytes, comm.Get_size())
    if chosen is butterfly:
        butterfly.butterfly_allreduce_in_place(comm, data, op)
    else:
        rabenseifner.rabenseifner_allreduce_in_place(comm, data, op)


def allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True):
    """recvbuf <- op over ranks of sendbuf, by the algorithm `choose` picks. See the module docstring."""
    return run_allreduce(auto_allreduce_in_place, comm, sendbuf, recvbuf, op, check, "auto allreduce")


if __name__ == "__main__":
    from .demo import demo
    demo(allreduce, MPI.COMM_WORLD, "auto")
