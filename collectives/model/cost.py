"""The alpha-beta-gamma cost of every algorithm: per rank exactly, and on the critical path.

Model (Hockney; Thakur, Rabenseifner & Gropp 2005; Ben-Nun & Hoefler 2019): sending one
message of m bytes takes alpha + m beta; reducing m bytes takes m gamma. For an allreduce of
n bytes on p ranks, with lg = log2 and pof2 the largest power of two <= p:

    algorithm     critical path                                                  paper's table
    naive         2 (p-1) alpha + 2 (p-1) n beta + (p-1) n gamma                 (notes' baseline)
    tree          2 ceil(lg p) (alpha + n beta) + ceil(lg p) n gamma             Tree
    butterfly     lg p (alpha + n beta + n gamma)                                Butterfly
    ring          2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma             Pipeline
    rabenseifner  2 lg p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma              RedScat+Gat
    lower bound   lg p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma

butterfly and rabenseifner with p not a power of two run on pof2 ranks (p -> pof2 above) and
add the fold-in's 2 alpha + 2 n beta + n gamma.

On nodes (c ranks each, a faster link inside than between, the node's network ports shared by its
ranks): collectives.model.two_level, which also holds the two hierarchies' costs.

Refined model, beside the plain one. On one node a "message" is two memory copies
(into and out of MPI's shared-memory queue) and a reduction is a read-read-write pass over
memory; when all ranks do this at once they share the memory bus, and with more ranks than
cores they share the cores too. The ping-pong (one pair busy) and one in-cache np.add miss
all of that, which is why the plain model is ~4x optimistic at 64 MiB. `predict_refined`
keeps the same critical-path counts but takes its rates from micro-benchmarks that run the
way the allreduce runs, every rank at once, on the allreduce's footprint (collectives.bench
measures them; none of them is an allreduce):

    alpha     ping-pong latency, times `share` = max(1, p / cores): a rank waits for its
              partner to be scheduled
    beta_x    seconds per byte sent in a pairwise Sendrecv exchange of n bytes (r <-> r xor 1,
              every pair at once): the step of butterfly, ring and Rabenseifner, where each rank
              sends and receives at the same time
    beta_1    seconds per byte of a one-way Send of n bytes (even rank -> odd rank, every pair
              at once): a step of the binomial tree, or a fold-in, where a message's receiver
              sends nothing back meanwhile and several pairs move data at once
    beta_solo the same with one pair alone (rank 0 -> rank 1, the others waiting in MPI, as in
              an allreduce): the tree's top level, a fold-in of one pair
    beta_gather seconds per byte arriving at rank 0 when every other rank sends it n bytes at
              once and it receives them in rank order: the naive root's gather. Measured at
              p = 4 on 2 cores, per message it was below beta_solo at 1 MiB and about equal
              from 4 MiB, so p - 1 solo messages overestimate the gather
    beta_scatter the same for rank 0 sending n bytes to every other rank in turn: the naive
              root's send-back (measured at p = 4: about half of beta_solo per message from
              1 to 4 MiB, as if the receivers' copies ran at once)
    beta_ring seconds per byte of a ring shift of n/p-byte blocks (send to r + 1, receive from
              r - 1, every rank at once): the ring's step. Unlike a pairwise exchange, each rank
              waits on two others, so with more ranks than cores it waits longer
    gamma_m   seconds per byte of np.add(a, b, out=a) on n-byte vectors, all ranks at once
    gamma_3   the same for np.add(a, b, out=c), three distinct vectors: out of place, a heart's
              reduction that reads this rank's input from sendbuf writes it into recvbuf
              (`reduced_from_source`), and numpy's add into a third vector measured 1.6-2.1x
              the in-place one per byte at every size from 16 KiB to 64 MiB (p = 2), in cache
              or not
    copy      seconds per byte of np.copyto on n-byte vectors, all ranks at once: the
              extra whole-vector copies the code makes (sendbuf -> recvbuf on entry only where
              a fold-in reads recvbuf first: Rabenseifner and the butterfly, p not a power of two;
              the butterfly's result back out of its scratch vector), `extra_copies`

    t = share alpha steps + beta_x exchanged + beta_1 busy + beta_solo solo
        + gamma_m (reduced - from_source) + gamma_3 from_source + copy n extra_copies
            (the ring: beta_ring for beta_x; the naive root: beta_gather and beta_scatter,
             (p - 1) n bytes each, for beta_solo)

Footprint: an allreduce of n bytes works on three n-byte vectors (sendbuf, recvbuf and the
scratch vector it receives into), so each micro-benchmark cycles through three n-byte vectors:
at 1 MiB that is 3 MiB, more than a core's L2 cache, as in the allreduce; timed on one vector
they ran from cache and the model came out 1.5-2x optimistic there. Cycling, they miss the cache
more often than the allreduce, which reuses its buffers call after call: at 1 MiB (p = 2) the
model is now up to 1.35x pessimistic (chapter 3, section 5); from 4 MiB up neither fits.

Calibrated model (`predict_calibrated`): traffic's counts, each kind of step at the latency and
per-byte rate measured once on this machine at the allreduce's own vector size and step shape,
plus each algorithm's per-call overhead, with the steps that send what a reduction just wrote
apart (collectives.model.calibration, its `hot_steps`).

`per_rank(algorithm, p, n, itemsize, rank)` gives what one rank does, exactly, counting the
uneven blocks (block_counts: n elements in `parts` blocks, the first n % parts one longer):
the messages it sends, the bytes it sends, and the bytes it receives and reduces into its own
data. The tests run every algorithm through collectives.trace and assert that each rank's
traced messages equal these numbers: that is what ties the code to the table above.
Here n is in elements (so uneven blocks are exact); `predict` takes bytes.
"""
import math
from dataclasses import dataclass

from ..buffers import block_counts
from ..fold import largest_power_of_two

ALGORITHMS = ("naive", "tree", "butterfly", "ring", "rabenseifner")


@dataclass(frozen=True)
class RankCost:
    messages: int        # point-to-point messages this rank sends
    bytes_sent: int      # total bytes in them
    bytes_reduced: int   # bytes this rank receives and combines into its own data (the gamma work)


def ceil_lg(p):
    """ceil(log2 p), with ceil_lg(1) = 0."""
    return (p - 1).bit_length()


def _children(relative, p):
    """Children of `relative` in the binomial tree on p ranks: relative + mask, mask < lowbit."""
    lowbit = relative & -relative if relative else 1 << ceil_lg(p)
    return sum(1 for k in range(ceil_lg(p) + 1) if (1 << k) < lowbit and relative + (1 << k) < p)


def _aligned_group(counts, q, k):
    """Elements in the aligned group of 2^k blocks that holds block q."""
    start = (q >> k) << k
    return sum(counts[start:start + (1 << k)])


def per_rank(algorithm, p, n, itemsize, rank):
    """RankCost of `rank` in an allreduce of n elements of `itemsize` bytes on p ranks."""
    if n == 0 or p == 1:
        return RankCost(0, 0, 0)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    # BEGIN SOLUTION
    if algorithm == "naive":                          # root 0 gathers, reduces, sends back
        if rank == 0:
            return RankCost(p - 1, (p - 1) * n * itemsize, (p - 1) * n * itemsize)
        return RankCost(1, n * itemsize, 0)
    if algorithm == "tree":                           # root 0: reduce up, broadcast down
        children = _children(rank, p)
        messages = (1 if rank else 0) + children      # one send to the parent, one per child
        return RankCost(messages, messages * n * itemsize, children * n * itemsize)
    if algorithm == "ring":
        counts = block_counts(n, p)
        sent = (n - counts[rank]) + (n - counts[(rank + 1) % p])
        return RankCost(2 * (p - 1), sent * itemsize, (n - counts[(rank - 1) % p]) * itemsize)
    if algorithm in ("butterfly", "rabenseifner"):
        pof2 = largest_power_of_two(p)
        rem, rounds = p - pof2, pof2.bit_length() - 1
        if rank < 2 * rem and rank % 2 == 0:          # folds in and sits out
            return RankCost(1, n * itemsize, 0)
        folded = rank < 2 * rem                       # odd partner: reduces one more, sends back
        newrank = rank // 2 if folded else rank - rem
        if algorithm == "butterfly":
            messages, sent, reduced = rounds, rounds * n, rounds * n
        else:
            counts = block_counts(n, pof2)
            doubling = sum(_aligned_group(counts, newrank, k) for k in range(rounds))
            messages, sent, reduced = 2 * rounds, (n - counts[newrank]) + doubling, doubling
        if folded:
            messages, sent, reduced = messages + 1, sent + n, reduced + n
        return RankCost(messages, sent * itemsize, reduced * itemsize)
    # END SOLUTION


def critical_path(algorithm, p, nbytes):
    """(alpha steps, beta bytes, gamma bytes) on the critical path: the paper's formula."""
    if p == 1 or nbytes == 0:
        return 0, 0.0, 0.0
    n = float(nbytes)
    if algorithm == "naive":
        return 2 * (p - 1), 2 * (p - 1) * n, (p - 1) * n
    if algorithm == "tree":
        lg = ceil_lg(p)
        return 2 * lg, 2 * lg * n, lg * n
    if algorithm == "ring":
        return 2 * (p - 1), 2 * (p - 1) / p * n, (p - 1) / p * n
    if algorithm == "lower bound":
        return ceil_lg(p), 2 * (p - 1) / p * n, (p - 1) / p * n
    if algorithm in ("butterfly", "rabenseifner"):
        pof2 = largest_power_of_two(p)
        lg = pof2.bit_length() - 1
        if algorithm == "butterfly":
            steps, sent, reduced = lg, lg * n, lg * n
        else:
            steps, sent, reduced = 2 * lg, 2 * (pof2 - 1) / pof2 * n, (pof2 - 1) / pof2 * n
        if pof2 != p:                                 # fold-in and fold-out
            steps, sent, reduced = steps + 2, sent + 2 * n, reduced + n
        return steps, sent, reduced
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")


def predict(algorithm, p, nbytes, alpha, beta, gamma=0.0):
    """Predicted seconds: alpha * steps + beta * bytes + gamma * reduced bytes on the critical path."""
    steps, sent, reduced = critical_path(algorithm, p, nbytes)
    return alpha * steps + beta * sent + gamma * reduced


def traffic(algorithm, p, nbytes):
    """(alpha steps, bytes exchanged, one-way bytes with several pairs busy, one-way bytes with one
    pair busy, bytes reduced) on the critical path.

    The same totals as critical_path, with the bytes split by how they move: in an exchange step
    (butterfly, ring, Rabenseifner) every rank sends and receives at once; in a one-way step the
    receiver sends nothing meanwhile, and either several pairs move data at once (the first level
    of a binomial tree on 4 ranks: 1 -> 0 and 3 -> 2) or one pair alone (every message to or from
    the naive root, the tree's top level, a fold-in of one pair).
    """
    steps, sent, reduced = critical_path(algorithm, p, nbytes)
    n = float(nbytes)
    if p == 1 or nbytes == 0:
        return steps, 0.0, 0.0, 0.0, reduced
    if algorithm == "naive":
        return steps, 0.0, 0.0, sent, reduced
    if algorithm == "tree":
        busy = solo = 0.0
        distance = 1
        while distance < p:                       # one level of the reduce, and one of the broadcast
            pairs = len(range(distance, p, 2 * distance))
            if pairs > 1:
                busy += 2 * n
            else:
                solo += 2 * n
            distance *= 2
        return steps, 0.0, busy, solo, reduced
    rem = p - largest_power_of_two(p)
    folded = 2 * n if algorithm in ("butterfly", "rabenseifner") and rem else 0.0
    busy, solo = (folded, 0.0) if rem > 1 else (0.0, folded)
    return steps, sent - folded, busy, solo, reduced


@dataclass(frozen=True)
class Rates:
    """The refined model's rates (see the header), all seconds or seconds per byte."""
    alpha: float
    beta_x: float
    gamma_m: float
    copy: float
    share: float = 1.0
    beta_1: float = None          # one-way sends, every pair at once; None: as an exchange (beta_x)
    beta_solo: float = None       # one-way sends, one pair alone; None: as beta_1
    beta_ring: float = None       # the ring's shift of blocks; None: as an exchange (beta_x)
    gamma_3: float = None         # np.add(a, b, out=c); None: as the in-place add (gamma_m)
    beta_gather: float = None     # the naive root's gather; None: as one pair alone (beta_solo)
    beta_scatter: float = None    # the naive root's send-back; None: as one pair alone (beta_solo)


def extra_copies(algorithm, in_place=False, p=2):
    """Whole-vector copies outside the messages and reductions, on the critical path."""
    reads_sendbuf = algorithm not in ("rabenseifner", "butterfly") or p == largest_power_of_two(p)
    copies = 0 if in_place or reads_sendbuf else 1    # run_allreduce: recvbuf[...] = sendbuf
    if algorithm == "butterfly" and (in_place or copies or p > 2):
        copies += 1                            # some rank's result ends in the scratch vector (out of
                                               # place at p = 2, the one round writes into recvbuf)
    return copies


def reduced_from_source(algorithm, p, nbytes, in_place=False):
    """Bytes of the critical path's reduction that read this rank's input from sendbuf and write
    the result into recvbuf (out of place; 0 in place): every heart's first reduction reads
    `source`, and the ring's every reduction does (block i of data <- block i of source (op) the
    arrived block). Where a fold-in copies sendbuf into recvbuf first, none does."""
    if in_place or p == 1 or nbytes == 0:
        return 0.0
    n = float(nbytes)
    if algorithm in ("naive", "tree"):
        return n                                  # the root's first reduction
    if algorithm == "ring":
        return critical_path(algorithm, p, nbytes)[2]
    if p != largest_power_of_two(p):
        return 0.0                                # butterfly, Rabenseifner: copied in for the fold-in
    return n if algorithm == "butterfly" else n / 2   # the first exchange round / halving round


def predict_refined(algorithm, p, nbytes, rates, in_place=False):
    """Predicted seconds with the memory-traffic terms (see the header)."""
    if p == 1 or nbytes == 0:
        return 0.0
    steps, exchanged, busy, solo, reduced = traffic(algorithm, p, nbytes)
    beta_1 = rates.beta_x if rates.beta_1 is None else rates.beta_1
    beta_solo = beta_1 if rates.beta_solo is None else rates.beta_solo
    beta_x = rates.beta_ring if algorithm == "ring" and rates.beta_ring is not None else rates.beta_x
    solo_seconds = beta_solo * solo
    if algorithm == "naive":                  # solo: (p - 1) n bytes in to the root, then as many out
        gather = beta_solo if rates.beta_gather is None else rates.beta_gather
        scatter = beta_solo if rates.beta_scatter is None else rates.beta_scatter
        solo_seconds = gather * solo / 2 + scatter * solo / 2
    gamma_3 = rates.gamma_m if rates.gamma_3 is None else rates.gamma_3
    from_source = reduced_from_source(algorithm, p, nbytes, in_place)
    return (rates.share * rates.alpha * steps + beta_x * exchanged + beta_1 * busy + solo_seconds
            + rates.gamma_m * (reduced - from_source) + gamma_3 * from_source
            + rates.copy * nbytes * extra_copies(algorithm, in_place, p))


def predict_calibrated(algorithm, p, nbytes, calibration, in_place=False):
    """Predicted seconds with step times measured once on this machine (collectives.model.calibration:
    the algorithm's overhead o per call, and each kind of step at its own latency and at per-byte
    rates measured at this vector size, the steps that send what a reduction just wrote apart)."""
    return calibration.predict(algorithm, p, nbytes, in_place)


def table(p, nbytes, alpha, beta, gamma=0.0):
    """Text table of every algorithm's critical path and predicted time at p, nbytes."""
    lines = [f"p = {p}, n = {nbytes} bytes, alpha = {alpha:.3g} s, beta = {beta:.3g} s/B, "
             f"gamma = {gamma:.3g} s/B",
             f"{'algorithm':<13} {'messages':>8} {'bytes sent':>12} {'bytes reduced':>14} {'predicted':>11}"]
    for algorithm in ALGORITHMS + ("lower bound",):
        steps, sent, reduced = critical_path(algorithm, p, nbytes)
        seconds = predict(algorithm, p, nbytes, alpha, beta, gamma)
        lines.append(f"{algorithm:<13} {steps:>8} {sent:>12.0f} {reduced:>14.0f} {seconds * 1e6:>9.1f} us")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(4, 1 << 20, 5e-6, 1e-10, 1e-10))
    print(f"\n(lg 4 = {math.log2(4):.0f}; run `mpiexec -n 2 python -m collectives.bench` to fit alpha, beta, gamma)")
