"""Calibrating the cost model: alpha, beta, gamma and the refined rates, from micro-benchmarks.

    alpha, beta, points = fit_alpha_beta(comm, 0.02)    # ping-pong between ranks 0 and 1
    gamma = fit_gamma(comm, 0.02)                       # np.add into a float32 vector, every rank
    rates = fit_rates(comm, 0.02, nbytes, alpha)        # cost.Rates for vectors of nbytes

collectives.bench runs these before it times the allreduces, and compares each measured time
with collectives.model.cost's prediction at the rates found here; none of them is an allreduce.

1. alpha and beta from a ping-pong between ranks 0 and 1 (half the round trip, 8 B .. 64 MiB),
   fitted as t = alpha + beta m by least squares on relative error, so the small messages fix
   alpha and the large ones beta;
2. gamma: the time per byte of numpy's element-wise add into a float32 vector (out=), timed on
   every rank at once, as in an allreduce;
3. the refined model's rates (cost.predict_refined), measured at each size n (per-byte rates
   change as the footprint leaves the cache), each micro-benchmark cycling through three n-byte
   vectors (an allreduce's sendbuf, recvbuf and scratch): a pairwise Sendrecv of n bytes
   (r <-> r xor 1, every rank at once) for beta_x, a one-way Send (r even -> r + 1, every pair at
   once) for beta_1 and from rank 0 to rank 1 alone for beta_solo, every other rank sending to
   rank 0 (received in rank order) for beta_gather and rank 0 sending to each in turn for
   beta_scatter (the naive root's two phases), a ring shift of n/p-byte blocks (r -> r + 1,
   every rank at once) for beta_ring, np.add in place, np.add into a third vector and np.copyto
   on n-byte vectors (every rank at once) for gamma_m, gamma_3 and copy, and
   share = max(1, p / cores);
4. the calibrated model's step times (collectives.model.calibration): fit_steps times each kind of step
   an allreduce takes at p = 2 on an allreduce's own vectors, and two dependent steps whose second
   sends what the first's reduction wrote (a hot step).

Every time is `timed`'s: the slowest rank's mean over a batch of calls between barriers; the
fits keep the best of a few batches.
"""
import os
import time

import numpy as np
from mpi4py import MPI

from ..model import cost
from ..tags import PING_PONG


def timed(comm, call, min_seconds, median=False):
    """Seconds per call: slowest rank's mean over a batch lasting >= min_seconds; median=True: the
    slowest rank's median of single calls, each after a barrier, for >= min_seconds (at least 5),
    which a process that takes the core for a moment moves less (a loaded machine)."""
    comm.Barrier()
    start = time.perf_counter()
    call()
    first = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)      # every rank: the same count below
    repeats = max(1, min(10000, int(min_seconds / max(first, 1e-7))))
    if median:
        times = []
        for _ in range(max(repeats, 5)):
            comm.Barrier()
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return comm.allreduce(float(np.median(times)), op=MPI.MAX)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    mine = (time.perf_counter() - start) / repeats
    return comm.allreduce(mine, op=MPI.MAX)


def fit_alpha_beta(comm, min_seconds, median=False):
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
        best = min(timed(comm, ping_pong, min_seconds, median) for _ in range(3))
        points.append((nbytes, best / 2))
    sizes = np.array([p[0] for p in points], dtype=float)
    seconds = np.array([p[1] for p in points])
    # least squares on relative error: minimise sum ((alpha + beta m - t) / t)^2
    design = np.stack([1 / seconds, sizes / seconds], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    return float(alpha), float(beta), points


def fit_gamma(comm, min_seconds, nbytes=4 << 20, median=False):
    """Seconds per byte of an element-wise float32 add, all ranks at once."""
    into = np.ones(nbytes // 4, dtype=np.float32)
    incoming = np.ones_like(into)
    return min(timed(comm, lambda: np.add(into, incoming, out=into), min_seconds, median) for _ in range(3)) / nbytes


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


def fit_memory(comm, min_seconds, nbytes, rounds=3, median=False):
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
    add_seconds = min(timed(comm, add, min_seconds, median) for _ in range(rounds))
    add3_seconds = min(timed(comm, add3, min_seconds, median) for _ in range(rounds))
    copy_seconds = min(timed(comm, copy, min_seconds, median) for _ in range(rounds))
    return add_seconds / nbytes, add3_seconds / nbytes, copy_seconds / nbytes


def fit_rates(comm, min_seconds, nbytes, alpha, rounds=3, median=False):
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
        beta_ring = min(timed(comm, ring_shift, min_seconds, median) for _ in range(rounds)) / block
        beta_x = min(timed(comm, exchange, min_seconds, median) for _ in range(rounds)) / nbytes
        beta_1 = min(timed(comm, one_way, min_seconds, median) for _ in range(rounds)) / nbytes
        beta_solo = min(timed(comm, solo, min_seconds, median) for _ in range(rounds)) / nbytes
        beta_gather = min(timed(comm, gather, min_seconds, median) for _ in range(rounds)) / ((size - 1) * nbytes)
        beta_scatter = min(timed(comm, scatter, min_seconds, median) for _ in range(rounds)) / ((size - 1) * nbytes)
    gamma_m, gamma_3, copy = fit_memory(comm, min_seconds, nbytes, rounds, median)
    return cost.Rates(alpha, beta_x, gamma_m, copy, max(1.0, size / cores()), beta_1, beta_solo, beta_ring,
                      gamma_3, beta_gather, beta_scatter)


def fit_steps(comm, min_seconds, nbytes, rounds=3, median=False):
    """Seconds of each kind of step an allreduce of n bytes takes at p = 2, on an allreduce's own
    three n-byte float32 vectors (sendbuf, recvbuf, scratch; not cycled: an allreduce reuses them),
    every micro-benchmark timed interleaved with the others, best of `rounds` kept, partners r and
    r xor 1 (the last rank of an odd p idles):

    exchange        Sendrecv of half of sendbuf into scratch: the ring's and Rabenseifner's step;
    exchange_whole  Sendrecv of all of sendbuf into scratch: the butterfly's;
    one_way         the odd rank Sends sendbuf, the even one receives it into scratch: the tree's
                    and the naive root's;
    add_into        np.add(sendbuf, scratch, out=recvbuf), every rank, alone;
    add             np.add(recvbuf, scratch, out=recvbuf), every rank: a reduction in place;
    copy            np.copyto(recvbuf, sendbuf), every rank;
    pair_w          the butterfly at p = 2 written out: exchange_whole, then add_into;
    pair_x          the ring at p = 2 written out: exchange half into scratch, add the other half of
                    sendbuf to it into recvbuf, exchange that result into recvbuf's other half;
    pair_1          the tree at p = 2 written out: one_way, the even rank adds sendbuf to scratch into
                    recvbuf and sends recvbuf back;
    pair_1_cold     pair_1 sending sendbuf back instead of the sum: the same steps, a cold second message.

    From the pairs (derived): reduce = pair_w - exchange_whole, a reduction as an allreduce makes
    it, right after the message that brought its operand (the parts timed alone each keep their
    own vectors in cache: at 4 MiB add_into alone took 104-157 us, the butterfly 130-230 us more
    than its parts); a hot step (collectives.model.calibration: one that sends what its sender's
    reduction has just written) is a pair's second step: hot_exchange = pair_x - exchange -
    reduce / 2 (n/2 bytes exchanged) and hot_one_way = pair_1 - one_way - reduce (n bytes one way).
    Each a difference, so noise may take it below zero (the fit keeps it >= 0). pair_1 - pair_1_cold
    is what the heat cost. Returns {name: seconds} for every micro-benchmark named above and the
    three derived."""
    calls = step_calls(comm, nbytes)
    best = {}
    for _ in range(rounds):                          # interleaved, best kept: parts and pairs alike
        for name, call in calls.items():
            best[name] = min(best.get(name, np.inf), timed(comm, call, min_seconds, median))
    return best | derived(best)


def step_calls(comm, nbytes):
    """{name: call} of fit_steps' micro-benchmarks on one set of three n-byte vectors, allocated here
    once (as an allreduce's are by its caller and its scratch cache)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    partner = rank ^ 1
    count = max(nbytes // 4, 2) // 2 * 2
    half = count // 2
    sendbuf, recvbuf = np.ones(count, dtype=np.float32), np.zeros(count, dtype=np.float32)
    incoming = np.zeros(count, dtype=np.float32)
    mine, other = (slice(0, half), slice(half, count)) if rank % 2 == 0 else (slice(half, count), slice(0, half))
    active = partner < size

    def exchange():
        if active:
            comm.Sendrecv(sendbuf[other], partner, 9, incoming[:half], partner, 9)

    def exchange_whole():
        if active:
            comm.Sendrecv(sendbuf, partner, 13, incoming, partner, 13)

    def add_into():
        np.add(sendbuf, incoming, out=recvbuf)

    def one_way():
        if active and rank % 2:
            comm.Send(sendbuf, partner, 11)
        elif active:
            comm.Recv(incoming, partner, 11)

    def pair_x():
        exchange()
        np.add(sendbuf[mine], incoming[:half], out=recvbuf[mine])
        if active:
            comm.Sendrecv(recvbuf[mine], partner, 10, recvbuf[other], partner, 10)

    def one_way_pair(back):
        def pair():
            one_way()
            if active and rank % 2:
                comm.Recv(recvbuf, partner, 12)
            elif active:
                add_into()
                comm.Send(back, partner, 12)
        return pair
    return {"exchange": exchange, "exchange_whole": exchange_whole, "one_way": one_way, "add_into": add_into,
            "add": lambda: np.add(recvbuf, incoming, out=recvbuf), "copy": lambda: np.copyto(recvbuf, sendbuf),
            "pair_w": lambda: exchange_whole() or add_into(), "pair_x": pair_x,
            "pair_1": one_way_pair(recvbuf), "pair_1_cold": one_way_pair(sendbuf)}


def derived(seconds):
    """reduce and the hot steps (fit_steps' header) from the pairs' times and their parts'."""
    reduce = seconds["pair_w"] - seconds["exchange_whole"]
    return {"reduce": reduce, "hot_exchange": seconds["pair_x"] - seconds["exchange"] - reduce / 2,
            "hot_one_way": seconds["pair_1"] - seconds["one_way"] - reduce}


def cores():
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


LADDER = [1 << k for k in range(9, 27)]           # 512 B, 1 KiB, ..., 64 MiB


def measure_calibration(comm, min_seconds, rounds=3, sizes=LADDER, median=False, between=None):
    """What collectives.model.calibration.fit takes: (ladder, small). ladder: per size n, the seconds of
    each fit_steps micro-benchmark, {"bytes": n, "exchange": ..., ...}; small: per algorithm of
    cost.ALGORITHMS, the best time of an 8-byte allreduce (check=False) on comm.

    Rounds over the whole ladder, best kept, so that a state of the machine that lasts seconds
    (collectives.model.calibration's header) reaches fewer of one size's rounds. between(n), if given,
    runs after each size n of each round, and between(None) at each round's end (collectives.bench:
    the allreduces of n bytes it checks the model against, then those of sizes off the ladder), so
    that a size's steps and its allreduces are measured moments apart, through the same states."""
    from ..table import MODULES
    ladder = [{"bytes": nbytes} for nbytes in sizes]
    seen = [{} for _ in sizes]                       # per size: name -> the rounds' seconds
    sendbuf, recvbuf = np.ones(2, dtype=np.float32), np.empty(2, dtype=np.float32)
    small = {}
    calls = [step_calls(comm, nbytes) for nbytes in sizes]     # each size's vectors kept through the rounds
    for _ in range(rounds):
        for times, size_calls, nbytes in zip(seen, calls, sizes):
            for name, call in size_calls.items():
                times.setdefault(name, []).append(timed(comm, call, min_seconds, median))
            if between is not None:
                between(nbytes)
        for name in cost.ALGORITHMS:
            allreduce = MODULES[name].allreduce
            seconds = timed(comm, lambda: allreduce(comm, sendbuf, recvbuf, check=False), min_seconds, median)
            small[name] = min(small.get(name, np.inf), seconds)
        if between is not None:
            between(None)
    for row, times in zip(ladder, seen):     # the rounds' best, and what fit_steps derives from them
        row.update({name: min(values) for name, values in times.items()})
        row.update(derived(row))
    return ladder, small
