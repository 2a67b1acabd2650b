"""Nonblocking, bucketed allreduce: sum a vector over ranks piece by piece, each piece started as
soon as it is ready, so communication runs while the caller still computes (the rest of backward).

Papers: Li et al. (VLDB 2020), PyTorch Distributed: gradient bucketing, autograd hooks that
start each bucket's allreduce as soon as its gradients are final, and a wait before the optimizer
step; Sergeev & Del Balso (2018), Horovod: the same idea as tensor fusion. The per-bucket
algorithm is the butterfly of collectives/butterfly.py (Thakur, Rabenseifner & Gropp 2005), with
the same fold-in for non-powers of two, as a sequence of Isend/Irecv steps.

    summed = BucketedAllreduce(comm, grad, [(start, stop, parts), ...])
    summed.begin(weight)        # each step: arm the buckets, scale by weight when started
    summed.ready(b)             # one more of bucket b's `parts` is final (an autograd hook);
                                # the last one scales and starts bucket b; every call advances
                                # all started buckets as far as their messages allow (progress)
    summed.finish()             # start what is not started yet, wait for all: grad summed

Why the bits do not depend on the cut: the butterfly reduces every element by the same tree of
additions (fold-in pairs, then partners at distance 1, 2, 4, ...) and both partners compute
lower <- lower + higher with the lower rank's vector first. Cutting the vector into buckets
changes which message an element travels in, never the additions it goes through, so
``--buckets`` gives bitwise the parameters of ``--allreduce butterfly``. (Not so for the ring or
Rabenseifner: there the chunk an element falls in decides at which rank its sum starts.)

Progress: without an MPI progress thread, a message moves only inside MPI calls. Eager sends
(small buckets) are copied out at Isend; a receive is matched and the next butterfly round
posted only when this rank calls ``ready`` (Testall) or ``finish`` (Waitall). So the first round
of each bucket overlaps backward; later rounds overlap only up to the next hook.

Cost: the butterfly's lg p alpha + lg p n_b beta + lg p n_b gamma per bucket of n_b elements,
p a power of two (plus the fold-in's 2 alpha + 2 n_b beta + n_b gamma otherwise): B buckets pay
B times the latency, and all of it except the last bucket's can hide behind backward.
``overlap_prediction`` gives that model's step time with one core per rank.

Tags: bucket b, step s sends with tag BASE + STRIDE b + s (s = 0 fold-in, 1 fold-out, 2 + k
round k), so messages of different buckets and rounds never match each other, whatever order
the ranks advance them in.
"""
from mpi4py import MPI

from .cost import predict
from .fold import largest_power_of_two, world_rank
from .ops import array_module, combine

BASE = 7200                    # above tags.py's range
STRIDE = 64                    # tags per bucket: fold-in, fold-out, up to 62 rounds
MAX_BUCKETS = (32767 - BASE) // STRIDE     # MPI guarantees tags up to 32767


def butterfly_steps(comm, data, tag):
    """collectives/butterfly.py's allreduce (sum, in place) as a generator of steps: each ``yield``
    hands back the requests this rank must see completed before the next step can run."""
    rank, size = comm.Get_rank(), comm.Get_size()
    pof2 = largest_power_of_two(size)
    rem = size - pof2
    xp = array_module(data)
    # fold-in: an even rank below 2 rem hands its vector over and waits for the result
    if rank < 2 * rem and rank % 2 == 0:
        yield [comm.Isend(data, rank + 1, tag)]
        yield [comm.Irecv(data, rank + 1, tag + 1)]
        return
    if rank < 2 * rem:                            # an odd one adds it to its own
        incoming = xp.empty_like(data)
        yield [comm.Irecv(incoming, rank - 1, tag)]
        combine(data, incoming, "sum")
    newrank = rank // 2 if rank < 2 * rem else rank - rem
    # recursive doubling: swap with partner newrank XOR distance, lower <- lower + higher
    mine, theirs = data, xp.empty_like(data)
    distance, round_ = 1, 0
    while distance < pof2:
        partner = world_rank(newrank ^ distance, rem)
        yield [comm.Isend(mine, partner, tag + 2 + round_), comm.Irecv(theirs, partner, tag + 2 + round_)]
        lower, higher = (theirs, mine) if newrank & distance else (mine, theirs)
        combine(lower, higher, "sum")
        mine, theirs = lower, higher
        distance, round_ = distance * 2, round_ + 1
    if mine is not data:
        data[...] = mine
    # fold-out: the result back to the rank that sat out
    if rank < 2 * rem:
        yield [comm.Isend(data, rank - 1, tag + 1)]


class BucketedAllreduce:
    """In-place sum over ranks of ``vector``, cut into ``buckets`` = [(start, stop, parts), ...].

    A bucket starts when ``ready`` has been called ``parts`` times for it since ``begin`` (or at
    ``finish``). Every rank must use the same buckets; the order in which ranks start them does
    not matter (each bucket and round has its own tag).
    """

    def __init__(self, comm, vector, buckets):
        if len(buckets) > MAX_BUCKETS:
            raise ValueError(f"BucketedAllreduce: {len(buckets)} buckets, at most {MAX_BUCKETS} "
                             "(one tag range each); use larger buckets")
        if largest_power_of_two(comm.Get_size()).bit_length() > STRIDE - 2:
            raise ValueError("BucketedAllreduce: too many ranks for the tag range")
        self.comm, self.vector = comm, vector
        self.buckets = [(int(start), int(stop), int(parts)) for start, stop, parts in buckets]
        self.armed = False

    def begin(self, weight=1.0):
        """Arm every bucket for one step; each is multiplied by ``weight`` just before it is summed."""
        self.weight, self.armed = weight, True
        self.missing = [parts for _, _, parts in self.buckets]
        self.active = {}                          # bucket -> (steps generator, requests it waits on)

    def ready(self, bucket):
        """One more part of ``bucket`` is final; start it if that was the last; advance all."""
        if not self.armed:                        # a backward outside a bucketed step
            return
        if self.missing[bucket] is None:
            raise RuntimeError(f"BucketedAllreduce: bucket {bucket} reported ready after it was started "
                               "(one backward() per step: its hooks say when a gradient is final)")
        self.missing[bucket] -= 1
        if self.missing[bucket] == 0:
            self._start(bucket)
        self.progress()

    def progress(self):
        """Advance every started bucket as far as its completed messages allow; never blocks."""
        for bucket, (steps, requests) in list(self.active.items()):
            while requests is not None and MPI.Request.Testall(requests):
                requests = next(steps, None)
            self._advance(bucket, steps, requests)

    def finish(self):
        """Start the buckets not started yet (in plan order), then wait for all of them.

        All started buckets are advanced together (wait for any message, advance what it freed),
        never one bucket to its end: ranks may have started the buckets in different orders (a
        rank with no rows starts them all here), and waiting for bucket a to finish while the
        partner waits for bucket b would deadlock.
        """
        for bucket, missing in enumerate(self.missing):
            if missing is not None:
                self._start(bucket)
        self.progress()
        while self.active:
            MPI.Request.Waitany([request for _, requests in self.active.values() for request in requests])
            self.progress()
        self.armed = False

    def _start(self, bucket):
        start, stop, _ = self.buckets[bucket]
        piece = self.vector[start:stop]
        piece *= self.weight                      # this rank's share, as the unbucketed step does
        self.missing[bucket] = None               # started
        steps = butterfly_steps(self.comm, piece, BASE + STRIDE * bucket)
        self._advance(bucket, steps, next(steps, None))

    def _advance(self, bucket, steps, requests):
        if requests is None:
            self.active.pop(bucket, None)
        else:
            self.active[bucket] = (steps, requests)


def overlap_prediction(p, bucket_bytes, backward_after, forward_backward, alpha, beta, gamma=0.0):
    """Seconds from the start of a step to a summed gradient, alpha-beta-gamma model, one core per rank.

    ``bucket_bytes[b]`` is bucket b's size (buckets in the order they become ready),
    ``backward_after[b]`` the seconds of backward still to run once bucket b is ready, and
    ``forward_backward`` the seconds of forward + backward. Without overlap: forward_backward +
    one butterfly of all the bytes. With it: bucket b's butterfly starts when it is ready and the
    previous bucket's is done (one link per rank), and the gradient is summed when the last
    bucket's is done. The optimizer step after it costs the same in both. Returns (without, with).
    """
    without = forward_backward + predict("butterfly", p, sum(bucket_bytes), alpha, beta, gamma)
    link_free = 0.0
    for nbytes, after in zip(bucket_bytes, backward_after):
        link_free = max(link_free, forward_backward - after) + predict("butterfly", p, nbytes, alpha, beta, gamma)
    return without, max(forward_backward, link_free)
