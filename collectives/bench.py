"""Benchmark: every allreduce here against MPI's own Allreduce, and against the cost model.

    OMP_NUM_THREADS=1 mpiexec -n 4 python -m collectives.bench [--json out.json] [--plot out.png]
    mpiexec -n 2 python -m collectives.bench --quick             # a few seconds, for a smoke test
    mpiexec -n 4 python -m collectives.bench --sizes 4K,1M,64M --algorithms ring,auto
    mpiexec -n 4 python -m collectives.bench --sizes 4K,16K,64K --persistent   # + allreduce_init rows

1. alpha and beta from a ping-pong between ranks 0 and 1 (half the round trip, 8 B .. 64 MiB),
   fitted as t = alpha + beta m by least squares on relative error, so the small messages fix
   alpha and the large ones beta;
2. gamma: the time per byte of numpy's element-wise add into a float32 vector (out=), timed on
   every rank at once, as in an allreduce;
3. for each size (float32 vectors, 4 KiB .. 64 MiB by default) and each algorithm, the time
   of one call, check=False (no agreement check), compared with comm.Allreduce on the same
   buffers, and with cost.predict(...) at the fitted alpha, beta, gamma.

4. the refined model (cost.predict_refined), its rates measured at each size n (per-byte rates
   change as the footprint leaves the cache), each micro-benchmark cycling through three n-byte
   vectors (an allreduce's sendbuf, recvbuf and scratch): a pairwise Sendrecv of n bytes
   (r <-> r xor 1, every rank at once) for beta_x, a one-way Send (r even -> r + 1, every pair at
   once) for beta_1 and from rank 0 to rank 1 alone for beta_solo, every other rank sending to
   rank 0 (received in rank order) for beta_gather and rank 0 sending to each in turn for
   beta_scatter (the naive root's two phases), a ring shift of n/p-byte blocks (r -> r + 1,
   every rank at once) for beta_ring, np.add in place, np.add into a third vector and np.copyto
   on n-byte vectors (every rank at once) for gamma_m, gamma_3 and copy, and
   share = max(1, p / cores); none of these is an allreduce;
5. the performance targets, a column per row with "met" or "NO": auto <= 1.5x MPI at every size;
   ring and Rabenseifner <= 1.0x MPI from 1 MiB; refined model / measured within 25% for every
   algorithm from 1 MiB. And auto's table: at each size, the point-to-point algorithm measured
   fastest; --write-selection stores it for this p in collectives/selection.json, which
   collectives.auto reads (so auto's row is only as good as the last such run on this machine).
6. with --persistent, two more rows: MPI's persistent Allreduce_init (Start + Wait per call, "mpi_init")
   and collectives.persistent's auto (allreduce_init once, start() per call, "auto_init"), whose
   ratio and <= 1.5x target are against mpi_init: both sides check their arguments once.

A time is the slowest rank's mean over a batch of calls between barriers (batches of >= 0.02 s),
and the best of seven batches, taken in turn with the other algorithms so that noise from
other processes on the machine hits all of them alike.

Each rank's BLAS thread variables are set to 1 below, for what loads after this module (the
package, ``collectives/__init__.py``, has loaded numpy already; the collectives themselves use no
BLAS, only element-wise ufuncs).
"""
import os

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = "1"

import argparse          # noqa: E402  (after the thread pinning on purpose)
import json              # noqa: E402
import time              # noqa: E402

import numpy as np       # noqa: E402
from mpi4py import MPI   # noqa: E402

from . import auto, butterfly, cost, naive, persistent, rabenseifner, ring, tree   # noqa: E402
from .tags import PING_PONG  # noqa: E402

ALGORITHMS = {"naive": naive.allreduce, "tree": tree.allreduce, "butterfly": butterfly.allreduce,
              "ring": ring.allreduce, "rabenseifner": rabenseifner.allreduce, "auto": auto.allreduce}
DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4 << 10, 256 << 10]


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("IB")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def human(nbytes):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def timed(comm, call, min_seconds, rounds_done=None):
    """Seconds per call: slowest rank's mean over a batch lasting >= min_seconds."""
    comm.Barrier()
    start = time.perf_counter()
    call()
    first = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
    repeats = max(1, min(10000, int(min_seconds / max(first, 1e-7))))
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    mine = (time.perf_counter() - start) / repeats
    return comm.allreduce(mine, op=MPI.MAX)


def fit_alpha_beta(comm, min_seconds):
    """Ping-pong between ranks 0 and 1; returns (alpha, beta, [(bytes, seconds)])."""
    rank = comm.Get_rank()
    points = []
    for nbytes in [8 << (2 * k) for k in range(12)] + [64 << 20]:
        message = np.zeros(nbytes, dtype=np.uint8)

        def ping_pong():
            if rank == 0:
                comm.Send(message, dest=1, tag=PING_PONG)
                comm.Recv(message, source=1, tag=PING_PONG)
            elif rank == 1:
                comm.Recv(message, source=0, tag=PING_PONG)
                comm.Send(message, dest=0, tag=PING_PONG)
        best = min(timed(comm, ping_pong, min_seconds) for _ in range(3))
        points.append((nbytes, best / 2))
    sizes = np.array([p[0] for p in points], dtype=float)
    seconds = np.array([p[1] for p in points])
    # least squares on relative error: minimise sum ((alpha + beta m - t) / t)^2
    design = np.stack([1 / seconds, sizes / seconds], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    return float(alpha), float(beta), points


def fit_gamma(comm, min_seconds, nbytes=4 << 20):
    """Seconds per byte of an element-wise float32 add, all ranks at once."""
    into = np.ones(nbytes // 4, dtype=np.float32)
    incoming = np.ones_like(into)
    return min(timed(comm, lambda: np.add(into, incoming, out=into), min_seconds) for _ in range(3)) / nbytes


FOOTPRINT = 3       # an allreduce of n bytes touches sendbuf, recvbuf and a scratch vector: 3 n bytes


def rotating_pairs(nbytes, dtype):
    """A function that hands out (this, next) pairs of FOOTPRINT n-byte vectors in turn, so that a
    micro-benchmark touches the allreduce's footprint rather than one vector that stays in cache."""
    vectors = [np.zeros(max(nbytes // np.dtype(dtype).itemsize, 1), dtype=dtype) for _ in range(FOOTPRINT)]
    turn = [0]

    def next_pair():
        k = turn[0] = (turn[0] + 1) % FOOTPRINT
        return vectors[k], vectors[(k + 1) % FOOTPRINT]
    return next_pair


def fit_memory(comm, min_seconds, nbytes, rounds=3):
    """(gamma_m, gamma_3, copy): seconds per byte of np.add(a, b, out=a), np.add(a, b, out=c)
    and np.copyto(a, b) on n-byte float32 vectors, all ranks at once, cycling through FOOTPRINT
    vectors (the out-of-place add uses all three at every call, each in every role in turn)."""
    next_pair = rotating_pairs(nbytes, np.float32)

    def add():
        into, incoming = next_pair()
        np.add(into, incoming, out=into)

    def add3():
        first, second = next_pair()
        into = next_pair()[1]                  # the third vector: (k, k + 1) then (k + 1, k + 2)
        np.add(first, second, out=into)

    def copy():
        into, source = next_pair()
        np.copyto(into, source)
    add_seconds = min(timed(comm, add, min_seconds) for _ in range(rounds))
    add3_seconds = min(timed(comm, add3, min_seconds) for _ in range(rounds))
    copy_seconds = min(timed(comm, copy, min_seconds) for _ in range(rounds))
    return add_seconds / nbytes, add3_seconds / nbytes, copy_seconds / nbytes


def fit_rates(comm, min_seconds, nbytes, alpha, rounds=3):
    """cost.Rates for vectors of `nbytes` bytes, from micro-benchmarks at that size (none an
    allreduce), each cycling through FOOTPRINT vectors of n bytes as the allreduce does: per-byte
    rates depend on whether the footprint fits in cache, so each size gets its own.
    beta_x: a pairwise Sendrecv of n bytes (r <-> r xor 1), every rank at once, over n;
    beta_1: a one-way Send of n bytes (r even -> r + 1), every pair at once, over n;
    beta_ring: a ring shift of n/p-byte blocks (send to r + 1, receive from r - 1), every rank at
    once, over the block's bytes: the ring's step;
    gamma_m, gamma_3, copy: np.add in place / into a third vector and np.copyto on n-byte float32
    vectors, every rank at once."""
    rank, size = comm.Get_rank(), comm.Get_size()
    partner = rank ^ 1
    next_pair = rotating_pairs(nbytes, np.uint8)

    def exchange():
        out, into = next_pair()
        if partner < size:
            comm.Sendrecv(out, partner, 3, into, partner, 3)

    def one_way():
        out, into = next_pair()
        if partner < size:
            if rank % 2 == 0:
                comm.Send(out, partner, 4)
            else:
                comm.Recv(into, partner, 4)

    block = max(nbytes // size, 1)
    shifts = [0]

    def ring_shift():                    # block k of the vectors at the k-th call: the whole footprint
        out, into = next_pair()
        start = block * (shifts[0] % size)
        shifts[0] += 1
        comm.Sendrecv(out[start:start + block], (rank + 1) % size, 6,
                      into[start:start + block], (rank - 1) % size, 6)

    def solo():
        out, into = next_pair()
        if rank == 0:
            comm.Send(out, 1, 5)
        elif rank == 1:
            comm.Recv(into, 0, 5)

    def root_phase(to_root, tag):
        """The naive root's gather (every other rank -> rank 0, received in rank order) or its
        send-back (rank 0 -> every other rank, in turn)."""
        def phase():
            out, into = next_pair()
            if rank == 0:
                for other in range(1, size):
                    if to_root:
                        comm.Recv(into, other, tag)
                    else:
                        comm.Send(out, other, tag)
            elif to_root:
                comm.Send(out, 0, tag)
            else:
                comm.Recv(into, 0, tag)
        return phase
    gather, scatter = root_phase(True, 7), root_phase(False, 8)
    beta_x = beta_1 = beta_solo = beta_ring = beta_gather = beta_scatter = 0.0
    if size > 1:
        beta_ring = min(timed(comm, ring_shift, min_seconds) for _ in range(rounds)) / block
        beta_x = min(timed(comm, exchange, min_seconds) for _ in range(rounds)) / nbytes
        beta_1 = min(timed(comm, one_way, min_seconds) for _ in range(rounds)) / nbytes
        beta_solo = min(timed(comm, solo, min_seconds) for _ in range(rounds)) / nbytes
        beta_gather = min(timed(comm, gather, min_seconds) for _ in range(rounds)) / ((size - 1) * nbytes)
        beta_scatter = min(timed(comm, scatter, min_seconds) for _ in range(rounds)) / ((size - 1) * nbytes)
    gamma_m, gamma_3, copy = fit_memory(comm, min_seconds, nbytes, rounds)
    return cost.Rates(alpha, beta_x, gamma_m, copy, max(1.0, size / cores()), beta_1, beta_solo, beta_ring,
                      gamma_3, beta_gather, beta_scatter)


def cores():
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def target(name, nbytes, ratio, refined_ratio):
    """(text, met) for the performance targets on this row: met is True, False or None (no target)."""
    checks = []
    if name in ("auto", "auto_init"):               # auto_init: against MPI's persistent Allreduce_init
        checks.append(("<=1.5x", ratio <= 1.5))
    if name in ("ring", "rabenseifner") and nbytes >= 1 << 20:
        checks.append(("<=1.0x", ratio <= 1.0))
    if refined_ratio is not None and nbytes >= 1 << 20:
        checks.append(("model+-25%", 0.75 <= refined_ratio <= 1.25))
    if not checks:
        return "-", None
    return ",".join(text for text, _ in checks), all(ok for _, ok in checks)


def selection(records):
    """[[from_bytes, algorithm], ...]: at each measured size the fastest point-to-point algorithm
    (auto and MPI's own left out), runs of the same choice merged. [] if nothing was measured."""
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


def write_selection(p, rows, path=auto.SELECTION_FILE):
    """Store auto's table for p in the JSON file auto reads (other p's entries kept)."""
    table = {str(k): [list(row) for row in v] for k, v in auto.load_selection(path).items()}
    table[str(p)] = rows
    with open(path, "w") as file:
        json.dump(dict(sorted(table.items(), key=lambda item: int(item[0]))), file)
        file.write("\n")


def describe(rows):
    return ", ".join(f"{name} from {human(nbytes)}" for nbytes, name in rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", help="comma-separated message sizes, e.g. 4K,1M,64M")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--quick", action="store_true", help="two small sizes, short batches")
    parser.add_argument("--min-time", type=float, default=0.02, help="seconds per timed batch")
    parser.add_argument("--rounds", type=int, default=7, help="batches per measurement (best kept)")
    parser.add_argument("--json", help="write one JSON object per measurement to this file")
    parser.add_argument("--plot", help="write a PNG of time against size")
    parser.add_argument("--persistent", action="store_true",
                        help="also time collectives.persistent's auto (allreduce_init once, start() per call, "
                             "row auto_init) against MPI's persistent Allreduce_init (row mpi_init)")
    parser.add_argument("--write-selection", action="store_true",
                        help="store, for this p, the algorithm measured fastest at each size in "
                             "collectives/selection.json, which collectives.auto reads")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else (
        QUICK_SIZES if args.quick else DEFAULT_SIZES)
    min_time = 0.002 if args.quick else args.min_time
    rounds = 1 if args.quick else args.rounds
    names = [name.strip() for name in args.algorithms.split(",")]

    if size > 1:
        alpha, beta, points = fit_alpha_beta(comm, min_time)
    else:
        alpha, beta, points = 0.0, 0.0, []
    gamma = fit_gamma(comm, min_time)
    if rank == 0:
        print(f"# p = {size}; {MPI.Get_library_version().splitlines()[0].strip()}")
        print(f"# ping-pong fit: alpha = {alpha * 1e6:.2f} us, beta = {beta * 1e9:.4f} ns/B "
              f"({1 / beta / 1e9 if beta > 0 else float('inf'):.2f} GB/s); gamma = {gamma * 1e9:.4f} ns/B")
        for nbytes, seconds in points:
            print(f"#   ping-pong {human(nbytes):>9}: {seconds * 1e6:10.2f} us  "
                  f"(fit {(alpha + beta * nbytes) * 1e6:10.2f} us)")
        print(f"# refined model: rates per size from exchange/add/add3/copy micro-benchmarks at that size, "
              f"every rank at once; share = max(1, p / {cores()} cores) = {max(1.0, size / cores()):g}")
        print(f"{'bytes':>9} {'algorithm':<18} {'measured us':>12} {'x MPI':>7} {'model us':>10} {'model/meas':>10}"
              f" {'refined us':>10} {'ref/meas':>8}  {'target':<18} met")

    records = []
    for nbytes in sizes:
        count = max(nbytes // 4, 1)
        sendbuf = np.full(count, rank + 1, dtype=np.float32)
        recvbuf = np.empty_like(sendbuf)
        expected = np.float32(size * (size + 1) / 2)

        rates = fit_rates(comm, min_time, count * 4, alpha, rounds)     # best of as many batches as below
        if rank == 0:
            print(f"# {human(count * 4)}: exchange beta_x = {rates.beta_x * 1e9:.4f} ns/B, one-way beta_1 = "
                  f"{rates.beta_1 * 1e9:.4f} ns/B, alone beta_solo = {rates.beta_solo * 1e9:.4f} ns/B, gather "
                  f"beta_gather = {rates.beta_gather * 1e9:.4f} ns/B, send-back beta_scatter = "
                  f"{rates.beta_scatter * 1e9:.4f} ns/B, ring shift "
                  f"beta_ring = {rates.beta_ring * 1e9:.4f} ns/B, add gamma_m = "
                  f"{rates.gamma_m * 1e9:.4f} ns/B, add into a third gamma_3 = "
                  f"{rates.gamma_3 * 1e9:.4f} ns/B, copy = {rates.copy * 1e9:.4f} ns/B", flush=True)
        calls = {"mpi": lambda: comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM)}
        for name in names:
            calls[name] = (lambda f: lambda: f(comm, sendbuf, recvbuf, op="sum", check=False))(ALGORITHMS[name])
        requests = []
        if args.persistent:                        # both sides' arguments bound once (MPI 4.0 persistent collectives)
            try:
                requests.append(comm.Allreduce_init(sendbuf, recvbuf, op=MPI.SUM))
                calls["mpi_init"] = lambda: requests[0].Start() or requests[0].Wait()
            except (NotImplementedError, MPI.Exception):
                pass                               # an MPI without them: auto_init is compared with Allreduce
            calls["auto_init"] = persistent.allreduce_init(comm, sendbuf, recvbuf, check=False).start
        best = {}
        for _ in range(rounds):                    # interleaved, best batch kept
            for name, call in calls.items():
                seconds = timed(comm, call, min_time)
                best[name] = min(best.get(name, np.inf), seconds)
                if not np.all(recvbuf == expected):
                    raise SystemExit(f"rank {rank}: {name} gave a wrong sum at {nbytes} bytes")
        for request in requests:
            request.Free()
        for name in calls:
            if name in ("mpi", "mpi_init"):
                model_name = "lower bound"
            elif name in ("auto", "auto_init"):
                model_name = auto.choose_name(count * 4, size)
            else:
                model_name = name
            model = cost.predict(model_name, size, count * 4, alpha, beta, gamma)
            refined = (cost.predict_refined(model_name, size, count * 4, rates)
                       if model_name != "lower bound" else None)     # MPI's own: no refined model
            refined_ratio = None if refined is None else refined / best[name]
            reference = best.get("mpi_init", best["mpi"]) if name == "auto_init" else best["mpi"]   # persistent vs persistent
            goal, met = target(name, count * 4, best[name] / reference, refined_ratio)
            record = {"algorithm": name, "p": size, "bytes": count * 4, "seconds": best[name],
                      "mpi_seconds": reference, "ratio": best[name] / reference,
                      "model_seconds": model, "model": model_name,
                      "alpha": alpha, "beta": beta, "gamma": gamma,
                      "refined_seconds": refined, "refined_ratio": refined_ratio,
                      "rates": {"alpha": alpha, "beta_x": rates.beta_x, "beta_1": rates.beta_1,
                                "beta_solo": rates.beta_solo, "beta_ring": rates.beta_ring,
                                "beta_gather": rates.beta_gather, "beta_scatter": rates.beta_scatter,
                                "gamma_m": rates.gamma_m, "gamma_3": rates.gamma_3,
                                "copy": rates.copy, "share": rates.share},
                      "target": goal, "met": met}
            records.append(record)
            if rank == 0:
                label = f"{name}({model_name})" if name in ("auto", "auto_init") else name
                print(f"{human(count * 4):>9} {label:<18} {best[name] * 1e6:12.1f} {record['ratio']:7.2f} "
                      f"{model * 1e6:10.1f} {model / best[name]:10.2f} "
                      f"{'-' if refined is None else f'{refined * 1e6:.1f}':>10} "
                      f"{'-' if refined is None else f'{refined_ratio:.2f}':>8}  {goal:<18} "
                      f"{'-' if met is None else 'met' if met else 'NO'}", flush=True)

    measured = selection(records)
    if rank == 0 and measured:
        print(f"# fastest measured at p = {size}: {describe(measured)}")
        print(f"# auto uses at p = {size}: {describe(auto.table(size))}"
              f"{'' if size in auto.SELECTION else ' (the textbook default: no entry in selection.json)'}")
    if rank == 0 and args.write_selection:
        if not measured:
            print("# --write-selection: nothing measured")
        else:
            write_selection(size, measured)
            print(f"# wrote p = {size} to {auto.SELECTION_FILE} (auto reads it at its next import)")
    if rank == 0:
        rows = [r for r in records if r["met"] is not None]
        print(f"# targets met: {sum(r['met'] for r in rows)} of {len(rows)} rows")

    if rank == 0 and args.json:
        with open(args.json, "w") as file:
            json.dump(records, file, indent=1)
    if rank == 0 and args.plot:
        plot(records, args.plot, size)
    return records


def plot(records, path, size):
    """Time against size, log-log: measured points, model lines, MPI_Allreduce in black."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(7, 4.5))
    names = list(dict.fromkeys(r["algorithm"] for r in records))
    colours = dict(zip([n for n in names if n != "mpi"], plt.get_cmap("tab10").colors))
    for name in names:
        mine = [r for r in records if r["algorithm"] == name]
        x = [r["bytes"] for r in mine]
        colour = "black" if name == "mpi" else colours[name]
        axes.plot(x, [r["seconds"] for r in mine], "o-" if name == "mpi" else "o", color=colour,
                  label="MPI_Allreduce" if name == "mpi" else name, ms=4)
        if name not in ("mpi",):
            axes.plot(x, [r["model_seconds"] for r in mine], "--", color=colour, lw=1)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("bytes per rank")
    axes.set_ylabel("seconds per allreduce")
    axes.set_title(f"allreduce on p = {size}: measured (dots) and alpha-beta-gamma model (dashes)")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


if __name__ == "__main__":
    main()
