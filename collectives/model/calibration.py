"""The calibrated cost model: step times measured once on this machine, stored as JSON, read by the tools.

    mpiexec -n 2 python -m collectives.bench --calibrate      # measure, fit, write it into the tuning file
    model, where = calibration.tuned_or_shipped()             # this machine's, else CALIBRATION_FILE's
    seconds = cost.predict_calibrated("ring", 2, 1 << 20, model)

Why. On one node a message is memory copies and a reduction a pass over memory, so a step's
per-byte cost depends on how large the allreduce's vectors are (whether sendbuf, recvbuf and the
scratch vector stay in a cache), on the step's shape (a block of a vector or a whole one, an
exchange or a one-way send) and on whether its bytes were just written (below); and a Python
allreduce pays a fixed cost per call that a bare ping-pong does not. The plain alpha-beta-gamma
model (one ping-pong, one in-cache add) misses all of that (collectives.bench prints it beside).

The model (cost.predict_calibrated) is Hockney's t = alpha + beta m for each kind of step k, with
its own latency alpha_k and a per-byte rate beta_k(n) that depends on the allreduce's size n:

    t(n) = o[algorithm] + sum over kinds k of (c_k alpha_k + b_k beta_k(n))
             + reduce(n)/n x bytes reduced from sendbuf + add(n)/n x bytes reduced in place
             + copy(n) x whole-vector copies

with c_k steps and b_k bytes of kind k on the critical path (cost.traffic, cost.reduced_from_source,
cost.extra_copies, hot_steps). The kinds, each timed by calibrate.fit_steps at every size n of a
ladder (512 B .. 64 MiB) on an allreduce's own three n-byte vectors, as the allreduce at p = 2
takes that step:

    exchange         a block exchanged (the ring, Rabenseifner), measured at m = n/2
    exchange_whole   a whole vector exchanged (the butterfly), m = n
    one_way          a vector sent one way (the tree, the naive root, a fold), m = n
    hot_exchange     an exchanged block its sender's reduction has just written, m = n/2
    hot_one_way      the same sent one way, m = n

alpha_k is kind k's time at the ladder's first size, beta_k(n) = (T_k(n) - alpha_k) / m, and
T_k(n), like reduce(n), add(n) and copy(n), is the measured time at n, linear in n between
ladder sizes (beyond the last: the last segment's slope; below the first: the first size's time).
A butterfly's hot step (p >= 4) is its whole-vector exchange plus what a hot block exchange costs
above a cold one of the same bytes. So at p = 2 the model gives each algorithm the sum of its
measured steps: the ring o + pair_x, the tree o + pair_1, the butterfly o + pair_w (fit_steps;
reduce is a reduction timed right after the message that brought its operand, as in an
allreduce). At other p it prices the same kinds of step at the p = 2 rates; its target is only
at the p it was fitted at.

Why the vector size and not only the message's. The same Sendrecv of m bytes cost clearly
different times as half of a 2m-byte vector and as the whole of an m-byte one in the same run,
and a reduction timed alone less than the same reduction right after the message that brought
its operand (10_steps.md of chapter 10 has both): the rates depend on the vectors an allreduce
works on, not on m alone, so each is measured at the allreduce's own size and shape. An earlier
form of this model, rates per cache level fitted by least squares to micro-benchmarks that
cycled through three vectors, over-priced the butterfly and the tree by a quarter or more.

Why hot steps apart. MPICH hands a message of >= 8 KiB to another rank of the node with one copy,
made by the receiver (CMA). Bytes the sender has just written with numpy sit modified in its
core's own cache, and the receiver's copy has to pull them out of there, which costs more than
copying bytes nobody wrote lately (fit_steps' pair_1 against pair_1_cold measures it; with CMA
off the difference went away, every message slower). How much more changed from one launch of
the same job to the next, as did every memory-bound time here (the virtual machine's cores on
the host): fit and check belong in one job (tutorials/figures/make_10_calibration.py). At p = 2
the second step of the ring, Rabenseifner, tree and naive allreduce sends what the first step's
reduction wrote; the butterfly's one step sends sendbuf.

Fitting (`fit`), from measurements none of which is an allreduce of >= 4 KiB: the ladder's step
times (hot steps kept >= 0), and o per algorithm: its allreduce of 8 bytes minus its steps' alpha
(the per-byte terms are negligible there): the Python around the messages, one call's worth,
which a ping-pong does not pay (at p = 2 the ring and Rabenseifner make the same two exchanges;
their code is not the same length).

Where it lives. `--calibrate` writes it into the user's tuning file (``tuned.py``: the
collectives section, keyed to this machine; ``python -m minidl.tune`` runs it), or to the file a
tool's --calibration names. The tools read this machine's tuned calibration where there is one
(`tuned_or_shipped`), else CALIBRATION_FILE, which ships with the project: fitted on the machine
its chapters ran on, it prices another machine's steps only roughly (on a machine of the same kind,
up to 53% off at p = 2, where a fit of its own was within 25% at every size). The JSON holds p, the
ladder's sizes, one list of seconds per name of TABLES (one number per size), o per algorithm
("overhead"), and the measurements it was fitted on. `load` refuses a file that is not that
(ValueError saying what and where).
"""
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..fold import largest_power_of_two
from . import cost, tuned

CALIBRATION_FILE = Path(__file__).resolve().parent / "calibration.json"
MESSAGES = {"exchange": 0.5, "exchange_whole": 1.0, "one_way": 1.0,     # kind: bytes moved, per n
            "hot_exchange": 0.5, "hot_one_way": 1.0}
MEMORY = ("reduce", "add", "copy")                                      # passes over n bytes
TABLES = tuple(MESSAGES) + MEMORY


def interpolate(sizes, seconds, n):
    """seconds at n: linear between the ladder's sizes, the last segment's slope beyond the last,
    the first size's time below the first; never below 0."""
    if n <= sizes[0]:
        return seconds[0]
    k = next((i for i in range(1, len(sizes)) if n <= sizes[i]), len(sizes) - 1)
    slope = (seconds[k] - seconds[k - 1]) / (sizes[k] - sizes[k - 1])
    return max(seconds[k - 1] + slope * (n - sizes[k - 1]), 0.0)


@dataclass(frozen=True)
class Calibration:
    p: int                    # ranks the measurements ran on
    overhead: dict            # o: algorithm -> seconds per call, outside its steps
    sizes: tuple              # the ladder: vector sizes n in bytes, ascending
    tables: dict              # name of TABLES -> tuple of seconds, one per size

    def seconds(self, name, nbytes):
        """The measured time of step `name` in an allreduce of nbytes (interpolate)."""
        return interpolate(self.sizes, self.tables[name], nbytes)

    def alpha(self, kind):
        """A message kind's latency: its time at the ladder's first size."""
        return self.tables[kind][0]

    def beta(self, kind, nbytes):
        """A message kind's seconds per byte in an allreduce of nbytes (see the header)."""
        return max(self.seconds(kind, nbytes) - self.alpha(kind), 0.0) / (MESSAGES[kind] * max(nbytes, self.sizes[0]))

    def predict(self, algorithm, p, nbytes, in_place=False):
        """Seconds of one allreduce (cost.predict_calibrated; the header's formula)."""
        if p == 1 or nbytes == 0:
            return 0.0
        n = float(nbytes)
        steps, exchanged, busy, solo, reduced = cost.traffic(algorithm, p, nbytes)
        folded = algorithm in ("butterfly", "rabenseifner") and p != largest_power_of_two(p)
        one_way = steps if algorithm in ("naive", "tree") else (2 if folded else 0)
        hot_x, hot_x_bytes, hot_1, hot_1_bytes = hot_steps(algorithm, p, nbytes)
        block = "exchange_whole" if algorithm == "butterfly" else "exchange"

        def messages(kind, count, moved):
            return count * self.alpha(kind) + moved * self.beta(kind, n)
        # a hot step: its shape's cold price plus what heat adds to a block exchange of its bytes
        # (for the ring's and Rabenseifner's blocks that is simply hot_exchange's own price)
        seconds = (self.overhead.get(algorithm, 0.0)                 # none for the lower bound
                   + messages(block, steps - one_way, exchanged)
                   + messages("hot_exchange", hot_x, hot_x_bytes) - messages("exchange", hot_x, hot_x_bytes)
                   + messages("one_way", one_way - hot_1, busy + solo - hot_1_bytes)
                   + messages("hot_one_way", hot_1, hot_1_bytes))
        from_source = cost.reduced_from_source(algorithm, p, nbytes, in_place)
        reducing = self.seconds("reduce", n) * from_source + self.seconds("add", n) * (reduced - from_source)
        return (seconds + reducing / n
                + self.seconds("copy", n) * cost.extra_copies(algorithm, in_place, p))

    def as_json(self):
        return {"p": self.p, "overhead": dict(self.overhead), "sizes": list(self.sizes),
                **{name: list(self.tables[name]) for name in TABLES}}


def hot_steps(algorithm, p, nbytes):
    """(exchange steps, bytes exchanged, one-way steps, bytes one way) on the critical path that send
    what the sender's own reduction has just written ("hot": see the header), lg = lg pof2:

        naive         the root's first send-back                               0, 0, 1, n
        tree          each send up but a leaf's, the root's first send down    0, 0, L, L n (L = ceil lg p)
        ring          reduce-scatter steps 2 .. p-1, the allgather's first     p-1, (p-1) n/p, 0, 0
        butterfly     rounds 2 .. lg                                           lg-1, (lg-1) n, 0, 0
        rabenseifner  halving rounds 2 .. lg, the first doubling round         lg, n/2, 0, 0

    p not a power of two: the fold-in's reduction makes the first round hot too (butterfly lg, lg n;
    Rabenseifner lg + 1, n), and the butterfly's fold-out sends its last round's sum (1, n)."""
    if p == 1 or nbytes == 0 or algorithm == "lower bound":
        return 0, 0.0, 0, 0.0
    pof2 = largest_power_of_two(p)
    n, lg, folded = float(nbytes), pof2.bit_length() - 1, p != pof2
    if algorithm == "naive":
        return 0, 0.0, 1, n
    if algorithm == "tree":
        return 0, 0.0, cost.ceil_lg(p), cost.ceil_lg(p) * n
    if algorithm == "ring":
        return p - 1, (p - 1) / p * n, 0, 0.0
    if algorithm == "butterfly":
        return (lg, lg * n, 1, n) if folded else (lg - 1, (lg - 1) * n, 0, 0.0)
    if algorithm == "rabenseifner":
        return (lg + 1, n, 0, 0.0) if folded else (lg, n / 2, 0, 0.0)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {cost.ALGORITHMS}")


def fit(ladder, small, p):
    """Calibration from measurements.

    ladder: [{"bytes": n, "exchange": seconds, "exchange_whole": ..., ...}], the seconds of every
    name of TABLES at n (calibrate.fit_steps; other keys are kept in the file, not used), at least
    2 sizes; small: {algorithm: seconds}, one allreduce of 8 bytes on p ranks for each of
    cost.ALGORITHMS."""
    ladder = sorted(ladder, key=lambda row: row["bytes"])
    if len(ladder) < 2 or len({row["bytes"] for row in ladder}) != len(ladder):
        raise ValueError(f"the ladder needs at least 2 different sizes, got {[row['bytes'] for row in ladder]}")
    tables = {name: tuple(max(float(row[name]), 0.0) for row in ladder) for name in TABLES}
    model = Calibration(p, {}, tuple(row["bytes"] for row in ladder), tables)
    overhead = {name: max(seconds - model.predict(name, p, 8), 0.0) for name, seconds in small.items()}
    return Calibration(p, overhead, model.sizes, tables)


def _number(data, key, where):
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: {key!r} must be a finite number >= 0, got {value!r}")
    return float(value)


def from_json(data, where="calibration"):
    """Calibration from the object `as_json` wrote; ValueError naming `where` if it is not one."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    p = data.get("p")
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"{where}: 'p' must be an integer >= 1, got {p!r}")
    sizes = data.get("sizes")
    if (not isinstance(sizes, list) or len(sizes) < 2
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes)
            or any(b <= a for a, b in zip(sizes, sizes[1:]))):
        raise ValueError(f"{where}: 'sizes' must be a list of at least 2 ascending byte counts, got {sizes!r}"
                         + (" (a file of the earlier per-cache-level form: run the calibration again)"
                            if "bounds" in data else ""))
    tables = {}
    for name in TABLES:
        values = data.get(name)
        if not isinstance(values, list) or len(values) != len(sizes):
            raise ValueError(f"{where}: {name!r} must be a list of {len(sizes)} times in seconds "
                             f"(one per size), got {values!r}")
        tables[name] = tuple(_number({name: v}, name, where) for v in values)
    overhead = data.get("overhead")
    if not isinstance(overhead, dict) or set(overhead) != set(cost.ALGORITHMS):
        raise ValueError(f"{where}: 'overhead' must map each of {', '.join(cost.ALGORITHMS)} to seconds, "
                         f"got {overhead!r}")
    overhead = {name: _number(overhead, name, where) for name in cost.ALGORITHMS}
    return Calibration(p, overhead, tuple(sizes), tables)


def load(path=None, required=False):
    """The Calibration in `path` (default CALIBRATION_FILE); None if that file does not exist and
    not required. ValueError, saying what and where, for a file that cannot be read or is not one."""
    path = Path(path) if path else CALIBRATION_FILE
    if not path.is_file():
        if required or path.exists():
            raise ValueError(f"--calibration {path}: {'not a file' if path.exists() else 'no such file'}")
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"--calibration {path}: not readable JSON ({error})") from None
    return from_json(data, f"--calibration {path}")


def tuned_or_shipped():
    """(Calibration, where it came from): this machine's, from the tuning file, else the shipped one
    (None where neither exists). ValueError for a tuning file or calibration that is not one."""
    section = tuned.current()
    if section and "calibration" in section:
        where = f"tuning file {tuned.location()}"
        return from_json(section["calibration"], f"{where}, collectives calibration"), f"tuned here ({where})"
    return load(CALIBRATION_FILE), f"shipped ({CALIBRATION_FILE}; fitted on another machine)"


def save(calibration, path, measurements=None):
    """Write the calibration as JSON to ``path``; path "tuned": into the user's tuning file."""
    data = calibration.as_json()
    if measurements is not None:
        data["measurements"] = measurements
    if path == "tuned":
        tuned.store(tuned.location(), "calibration", data)
    else:
        Path(path).write_text(json.dumps(data, indent=1) + "\n")
