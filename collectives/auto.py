"""auto: for each vector size and rank count, the allreduce that was measured fastest here.

Like MPICH's MPI_Allreduce (Thakur, Rabenseifner & Gropp, IJHPCA 2005), which picks its algorithm by
message size and communicator size, first from fixed thresholds (recursive doubling below
MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE, Rabenseifner's algorithm above) and, in MPICH 4, from a JSON
tuning file per machine. The textbook rule is the default here too:

    butterfly     below 128 KiB: the latency term dominates, and recursive doubling has the fewest
                  rounds (lg p alpha, against Rabenseifner's 2 lg p alpha)
    rabenseifner  from 128 KiB: its bandwidth and reduction terms (2 (p-1)/p n beta + (p-1)/p n
                  gamma, against the butterfly's lg p n (beta + gamma)) pay for the extra lg p alpha;
                  even at p = 2, where both send n bytes, Rabenseifner reduces only n/2 per rank

The crossover moves with the machine, with p, and with what the model leaves out (on one node a
message is two memory copies, and with more ranks than cores a waiting rank takes a core from
the rank it waits for), so the choice is measured. A table holds, per p, a list of [from_bytes,
algorithm]: at each size the bench timed, the point-to-point algorithm it measured fastest there
(every algorithm timed in turn, in rounds), used from that size up to the next measured one; the
smallest size's choice also covers anything shorter. Two files hold such tables:

    the user's tuning file (model/tuned.py), measured on this machine by python -m minidl.tune or
        mpiexec -n 2 python -m collectives.bench --write-selection
    collectives/selection.json, shipped, measured on the machine the chapters ran on
        (python tutorials/figures/make_03_figures.py --only select)

The tuned table wins for every p it lists; a p neither lists gets the textbook rule. Both are plain
JSON, read once at import, and the same on every rank, so every rank picks the same algorithm.

    mpiexec -n 4 python -m collectives.auto
"""
import json
import os

from mpi4py import MPI

from . import butterfly, naive, rabenseifner, ring, tree
from .buffers import run_allreduce
from .model import tuned

HEARTS = {"naive": naive.naive_allreduce_in_place, "tree": tree.tree_allreduce_in_place,
          "butterfly": butterfly.butterfly_allreduce_in_place, "ring": ring.ring_allreduce_in_place,
          "rabenseifner": rabenseifner.rabenseifner_allreduce_in_place}
THRESHOLD_BYTES = 128 * 1024       # the textbook rule's crossover, for a p that selection.json does not list
DEFAULT = ((0, "butterfly"), (THRESHOLD_BYTES, "rabenseifner"))
SELECTION_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "selection.json")


def load_selection(path=SELECTION_FILE):
    """{p: ((from_bytes, algorithm), ...)} from the bench's JSON file, sorted by size; {} when the
    file is absent or unreadable, and a p whose list names an unknown algorithm is left out."""
    try:
        with open(path) as file:
            table = json.load(file)
        selection = {}
        for p, rows in table.items():
            rows = tuple(sorted((int(nbytes), str(name)) for nbytes, name in rows))
            if p.isdigit() and rows and all(name in HEARTS for _, name in rows):
                selection[int(p)] = rows
        return selection
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


SHIPPED = load_selection()
SELECTION = {**SHIPPED, **tuned.selection()}      # this machine's tuned table wins for every p it lists


def source(p):
    """Where auto's table for p comes from, in words."""
    if p in tuned.selection():
        return f"tuned here: {tuned.location()}"
    return "shipped: collectives/selection.json" if p in SHIPPED else "the textbook default: no table for this p"


def fastest_table(records):
    """[[from_bytes, algorithm], ...] from collectives.bench's records: at each measured size the
    fastest point-to-point algorithm (auto and MPI's own left out), runs of the same choice merged.
    [] if nothing was measured."""
    fastest = {}
    for record in records:
        name = record["algorithm"]
        if name in ("mpi", "auto", "mpi_init", "auto_init"):
            continue
        best = fastest.get(record["bytes"])
        if best is None or record["seconds"] < best[1]:
            fastest[record["bytes"]] = (name, record["seconds"])
    rows = []
    for nbytes in sorted(fastest):
        if not rows or rows[-1][1] != fastest[nbytes][0]:
            rows.append([nbytes, fastest[nbytes][0]])
    return rows


def write_selection(p, rows, path=SELECTION_FILE):
    """Store auto's table for p (fastest_table's rows) in the shipped JSON file (other p's entries kept);
    the user's tuning file is written by ``tuned.store``."""
    entries = {str(k): [list(row) for row in v] for k, v in load_selection(path).items()}
    entries[str(p)] = rows
    with open(path, "w") as file:
        json.dump(dict(sorted(entries.items(), key=lambda item: int(item[0]))), file)
        file.write("\n")


def table(p):
    """The (from_bytes, algorithm) list auto follows on p ranks."""
    return SELECTION.get(p, DEFAULT)


def choose_name(nbytes, p=None):
    """The algorithm auto runs for a vector of `nbytes` bytes on p ranks (p=None: the textbook rule)."""
    rows = DEFAULT if p is None else table(p)
    name = rows[0][1]                  # below the smallest size measured: that size's choice
    for start, algorithm in rows:
        if nbytes >= start:
            name = algorithm
    return name


def choose(nbytes, p=None):
    """The algorithm module auto runs for a vector of `nbytes` bytes on p ranks."""
    return {"naive": naive, "tree": tree, "butterfly": butterfly, "ring": ring,
            "rabenseifner": rabenseifner}[choose_name(nbytes, p)]


_CHOSEN = {}           # (p, nbytes) -> the heart choose_name picks: a small allreduce is mostly Python


def auto_allreduce_in_place(comm, data, op, source=None):
    """The heart: pick by the vector's size in bytes and by p (see the header), run that heart.

    source: the input, when it is not in `data` yet; handed on (every heart reads it there).
    """
    key = (comm.Get_size(), data.nbytes)
    heart = _CHOSEN.get(key)
    if heart is None:
        heart = _CHOSEN[key] = HEARTS[choose_name(data.nbytes, key[0])]
    heart(comm, data, op, source)


def allreduce(comm, sendbuf, recvbuf=None, op="sum", check=True):
    """recvbuf <- op over ranks of sendbuf, by the algorithm `choose` picks (arguments: buffers.run_allreduce)."""
    return run_allreduce(auto_allreduce_in_place, comm, sendbuf, recvbuf, op, check, "auto allreduce")


if __name__ == "__main__":
    from .demo import demo
    demo(allreduce, MPI.COMM_WORLD, "auto")
