"""The calibrated cost model: rates fitted once on this machine, stored as JSON, read by the tools.

    mpiexec -n 2 python -m collectives.bench --calibrate      # measure, fit, write CALIBRATION_FILE
    model = calibration.load()                                # None where no file was written
    seconds = cost.predict_calibrated("ring", 2, 1 << 20, model)

Why. On one node a message is two memory copies and a reduction a pass over memory, so their
per-byte costs depend on whether the allreduce's footprint (three n-byte vectors per rank:
sendbuf, recvbuf, scratch) stays in cache; and a Python allreduce pays a fixed cost per call and
per step that a bare ping-pong does not. The plain alpha-beta-gamma model (one ping-pong, one
in-cache add) misses all three (collectives.bench prints it beside the calibrated one).

The model (cost.predict_calibrated): with steps, bytes exchanged / sent one way, bytes reduced and
whole-vector copies on the critical path as in cost.traffic, and among the steps the hot ones
(hot_steps: a step that sends bytes its sender's reduction has just written) at their own rates,

    t(n) = o[algorithm] + alpha[k] cold steps + beta_x[k] cold bytes exchanged + beta_1[k] cold one-way
             + hot_alpha_x[k] hot exchanges + hot_beta_x[k] hot bytes exchanged
             + hot_alpha_1[k] hot one-way steps + hot_beta_1[k] hot bytes sent one way
             + gamma_m[k] reduced in place + gamma_3[k] reduced from sendbuf + copy[k] n copies

where k is the level of the footprint 3 n: level 0 up to bounds[0], level 1 up to bounds[1], ...,
the last beyond. The fit decides where; `collectives.bench --calibrate` asks for 4 levels:
messages below 8 KiB, which MPICH copies through shared memory eagerly (its CMA single copy starts
at 8 KiB, MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD), then a core with 2 MiB of L2 and 32 MiB of L3
shared by two ranks suggests about n <= 0.7 MiB, n <= 5 MiB and beyond. (With 3 levels, 4 KiB
shared a level with 8-32 KiB, whose latency and rates overstated it: naive and tree at 4 KiB came
out 1.2-1.3x their measured times on a quiet machine.)

Why hot steps apart. MPICH hands a message of >= 8 KiB to another rank of the node with one copy,
made by the receiver (CMA). Bytes the sender has just written with numpy sit modified in its
core's own cache, and the receiver's copy has to pull them out of there, which costs more than
copying bytes nobody wrote lately; how much more depended on where the virtual machine's two cores
sat on the host, which changed from one launch to the next (calibrate.fit_hot_steps' pair_1
against pair_1_cold measures it; make_10_calibration.py tabulates it in 10_hot_steps.md). With
CMA off (MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD above the message: two copies through shared memory)
the difference went away, every message slower. The ladder's messages are cold. At p = 2 the
second step of the ring, Rabenseifner, tree and naive allreduce sends what the first step's
reduction wrote, the butterfly's one step sends sendbuf: with every step priced cold, the model
gave 0.51-0.82 of those four's measured times (16 KiB to 1 MiB), 0.95-1.20 of the butterfly's
(chapter 10, section 9).

Fitting (`fit`), from measurements none of which is an allreduce of >= 4 KiB:

1. per-byte rates: the micro-benchmarks of collectives.calibrate.fit_rates on a ladder of sizes
   (pairwise exchange, one-way send, add in place, add into a third vector, copy; each cycling
   through three n-byte vectors, every rank at once). For every way of cutting the ladder into
   `levels` runs of at least MIN_RUN consecutive sizes, least squares on relative error fits
   t = a[k] + n r[k] to each micro-benchmark (an intercept per level for the messages, since MPI
   changes protocol with the message size; none for the memory passes); the cut with the least total squared error wins, and a bound lies at the
   geometric mean of the footprints either side of the cut. alpha[k] is the exchange's a[k];
2. a hot step's rates, from calibrate.fit_hot_steps at each ladder size n: two dependent steps
   as an allreduce at p = 2 takes them (exchange n/2, add, exchange the sum; one way n, add, the
   sum one way back), each pair timed interleaved with its first step alone and its add alone;
   hot = pair - first - add, fitted as hot_alpha + m hot_beta per level (step 1's cut, least
   squares on the error relative to the pair's time, both kept >= 0);
3. o, per algorithm: its allreduce of 8 bytes, minus its steps at alpha (and the per-byte terms,
   negligible there): the Python around the messages, one call's worth, which a ping-pong does
   not pay (at p = 2 the ring and Rabenseifner make the same two exchanges; their code is not the
   same length).

The file (JSON, CALIBRATION_FILE unless a tool's --calibration says otherwise) holds p, levels,
footprint, alpha, bounds, one list per rate (one number per level; the four of HOT optional: a
file without them prices hot steps as cold ones), o per algorithm ("overhead"), and the
measurements it was fitted on. `load` refuses a file that is not that (ValueError saying what and where).
"""
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from . import cost
from .fold import largest_power_of_two

CALIBRATION_FILE = Path(__file__).resolve().parent / "calibration.json"
FOOTPRINT = 3                                     # n-byte vectors per rank an allreduce touches
MESSAGES = ("beta_x", "beta_1")                   # fitted with an intercept (a message's latency)
MEMORY = ("gamma_m", "gamma_3", "copy")           # fitted through the origin
RATES = MESSAGES + MEMORY
HOT = ("hot_alpha_x", "hot_beta_x", "hot_alpha_1", "hot_beta_1")   # a hot step's own rates
MIN_RUN = 4                                       # ladder sizes per cache level, at least


@dataclass(frozen=True)
class Calibration:
    p: int                    # ranks the measurements ran on
    overhead: dict            # o: algorithm -> seconds per call, outside its steps
    alpha: tuple              # seconds per step on the critical path, one per level
    bounds: tuple             # footprints (bytes) where one cache level ends, ascending
    rates: dict               # name -> tuple of seconds per byte, one per level
    footprint: int = FOOTPRINT
    hot: dict = None          # name of HOT -> tuple, one per level; None: hot steps as cold ones

    def level(self, nbytes):
        return sum(self.footprint * nbytes > bound for bound in self.bounds)

    def at(self, nbytes):
        """cost.Rates for an allreduce of nbytes: the fitted rates of its footprint's cache level."""
        k = self.level(nbytes)
        r = {name: values[k] for name, values in self.rates.items()}
        return cost.Rates(self.alpha[k], r["beta_x"], r["gamma_m"], r["copy"], 1.0, r["beta_1"], None, None,
                          r["gamma_3"])

    def hot_at(self, nbytes):
        """(alpha_x, beta_x, alpha_1, beta_1) of a hot step (exchange, one way) at nbytes' level,
        or None where the calibration has none (cost.predict_calibrated)."""
        if self.hot is None:
            return None
        k = self.level(nbytes)
        return tuple(self.hot[name][k] for name in HOT)

    def hot_extra(self, algorithm, p, nbytes):
        """Seconds the hot steps (hot_steps) cost at their own rates beyond what cost.predict_refined
        charged them as cold steps (alpha, beta_x, beta_1); 0 without hot rates."""
        if self.hot is None:
            return 0.0
        cold, (alpha_x, beta_x, alpha_1, beta_1) = self.at(nbytes), self.hot_at(nbytes)
        x_steps, x_bytes, one_steps, one_bytes = hot_steps(algorithm, p, nbytes)
        return (x_steps * (alpha_x - cold.alpha) + x_bytes * (beta_x - cold.beta_x)
                + one_steps * (alpha_1 - cold.alpha) + one_bytes * (beta_1 - cold.beta_1))

    def as_json(self):
        data = {"p": self.p, "levels": len(self.bounds) + 1, "footprint": self.footprint,
                "overhead": dict(self.overhead), "alpha": list(self.alpha), "bounds": list(self.bounds),
                **{name: list(self.rates[name]) for name in RATES}}
        return data | ({name: list(self.hot[name]) for name in HOT} if self.hot else {})


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


def _cuts(count, levels):
    """Every way to cut `count` ladder points into `levels` runs of >= MIN_RUN: the runs' first indices."""
    for inner in itertools.combinations(range(MIN_RUN, count - MIN_RUN + 1), levels - 1):
        starts = (0,) + inner
        if all(b - a >= MIN_RUN for a, b in zip(starts, starts[1:])):
            yield starts


def _least_squares(sizes, seconds, starts, intercept):
    """([a per level], [r per level], squared relative error) of t = a[level] + n r[level]
    (a = 0 without intercept): each level on its own."""
    import numpy as np
    a, r, error = [], [], 0.0
    for first, end in zip(starts, starts[1:] + (len(sizes),)):
        n, t = sizes[first:end], seconds[first:end]
        design = np.stack(([np.ones_like(n)] if intercept else []) + [n], axis=1) / t[:, None]
        solution, *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
        error += float(np.sum((design @ solution - 1) ** 2))
        a.append(float(solution[0]) if intercept else 0.0)
        r.append(float(solution[-1]))
    return a, r, error


def _hot(ladder, starts, kind, share):
    """([alpha per level], [beta per level]) of a hot step, t = alpha + m beta with m = share n its
    bytes, from the pairs' rows: least squares on the error relative to the pair's time."""
    import numpy as np
    alpha, beta = [], []
    for first, end in zip(starts, starts[1:] + (len(ladder),)):
        rows = ladder[first:end]
        pair = np.array([row["pair_" + kind] for row in rows], dtype=float)
        m = np.array([share * row["bytes"] for row in rows], dtype=float)
        design = np.stack([np.ones_like(m), m], axis=1) / pair[:, None]
        hot = np.array([row["hot_" + kind] for row in rows], dtype=float)
        (a, b), *_ = np.linalg.lstsq(design, hot / pair, rcond=None)
        alpha.append(max(float(a), 0.0))
        beta.append(max(float(b), 0.0))
    return alpha, beta


def fit(ladder, small, p, levels=3, footprint=FOOTPRINT):
    """Calibration from measurements.

    ladder: [{"bytes": n, "beta_x": seconds, "beta_1": ..., "gamma_m": ..., "gamma_3": ..., "copy": ...}]
    (the seconds of one micro-benchmark at n bytes, ascending n, at least `levels` sizes), and, if
    every row has them, "hot_x", "pair_x", "hot_1", "pair_1" (calibrate.fit_hot_steps: a hot step
    of n/2 bytes exchanged, of n bytes one way, and the pairs they were taken from);
    small: {algorithm: seconds}, one allreduce of 8 bytes on p ranks for each of cost.ALGORITHMS."""
    import numpy as np
    ladder = sorted(ladder, key=lambda row: row["bytes"])
    if levels < 1 or len(ladder) < MIN_RUN * levels:
        raise ValueError(f"{levels} cache levels need at least {MIN_RUN * levels} sizes, got {len(ladder)}")
    sizes = np.array([row["bytes"] for row in ladder], dtype=float)
    best = None
    for starts in _cuts(len(sizes), levels):
        fits = {name: _least_squares(sizes, np.array([row[name] for row in ladder], dtype=float), starts,
                                     name in MESSAGES) for name in RATES}
        error = sum(f[2] for f in fits.values())
        if best is None or error < best[0]:
            best = error, starts, fits
    _, starts, fits = best
    bounds = tuple(footprint * math.sqrt(sizes[k - 1] * sizes[k]) for k in starts[1:])
    rates = {name: tuple(max(r, 0.0) for r in fits[name][1]) for name in RATES}
    hot = None
    if all("pair_x" in row and "pair_1" in row for row in ladder):
        (alpha_x, beta_x), (alpha_1, beta_1) = _hot(ladder, starts, "x", 0.5), _hot(ladder, starts, "1", 1.0)
        hot = dict(zip(HOT, map(tuple, (alpha_x, beta_x, alpha_1, beta_1))))
    model = Calibration(p, {}, tuple(max(a, 0.0) for a in fits["beta_x"][0]), bounds, rates, footprint, hot)
    overhead = {name: max(seconds - cost.predict_calibrated(name, p, 8, model), 0.0) for name, seconds in small.items()}
    return Calibration(p, overhead, model.alpha, bounds, rates, footprint, hot)


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
    footprint = data.get("footprint", FOOTPRINT)
    if isinstance(footprint, bool) or not isinstance(footprint, int) or footprint < 1:
        raise ValueError(f"{where}: 'footprint' must be an integer >= 1, got {footprint!r}")
    bounds = data.get("bounds")
    if not isinstance(bounds, list):
        raise ValueError(f"{where}: 'bounds' must be a list of byte counts, got {bounds!r}")
    bounds = tuple(_number({"bounds": b}, "bounds", where) for b in bounds)
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"{where}: 'bounds' must be ascending, got {list(bounds)}")
    hot = [name for name in HOT if name in data]
    if hot and len(hot) != len(HOT):
        raise ValueError(f"{where}: a hot step's rates need all of {', '.join(HOT)}, got {', '.join(hot)}")
    rates = {}
    for name in ("alpha",) + RATES + tuple(hot):
        values = data.get(name)
        if not isinstance(values, list) or len(values) != len(bounds) + 1:
            raise ValueError(f"{where}: {name!r} must be a list of {len(bounds) + 1} rates "
                             f"(one per cache level), got {values!r}")
        rates[name] = tuple(_number({name: v}, name, where) for v in values)
    overhead = data.get("overhead")
    if not isinstance(overhead, dict) or set(overhead) != set(cost.ALGORITHMS):
        raise ValueError(f"{where}: 'overhead' must map each of {', '.join(cost.ALGORITHMS)} to seconds, "
                         f"got {overhead!r}")
    overhead = {name: _number(overhead, name, where) for name in cost.ALGORITHMS}
    hot = {name: rates.pop(name) for name in hot} or None
    return Calibration(p, overhead, rates.pop("alpha"), bounds, rates, footprint, hot)


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


def save(calibration, path, measurements=None):
    data = calibration.as_json()
    if measurements is not None:
        data["measurements"] = measurements
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
