"""Nonblocking, bucketed allreduce: sum a vector over ranks piece by piece, each piece started as
soon as it is ready, so communication runs while the caller still computes (the rest of backward).

Papers: Li et al. (VLDB 2020), PyTorch Distributed: gradient bucketing, autograd hooks that
start each bucket's allreduce as soon as its gradients are final, and a wait before the optimizer
step; Sergeev & Del Balso (2018), Horovod: the same idea as tensor fusion. The per-bucket
algorithm is the butterfly of collectives/butterfly.py (Thakur, Rabenseifner & Gropp 2005), with
the same fold-in for non-powers of two, run one message at a time so that many buckets can be
in flight at once.

    summed = BucketedAllreduce(comm, grad, [(start, stop, parts), ...])
    summed.begin(weight)        # each step: arm the buckets, scale by weight when started
    summed.ready(b)             # one more of bucket b's `parts` is final (an autograd hook);
                                # the last one scales and starts bucket b; every call advances
                                # all started buckets as far as their messages allow (progress)
    summed.finish()             # start what is not started yet, wait for all: grad summed

    gathering = start_allgather(comm, data)     # any one collective, started (``Started``):
    gathering.test()            # advance it when the caller has a moment; wait() before using data

Why the bits do not depend on the cut: the butterfly reduces every element by the same tree of
additions (fold-in pairs, then partners at distance 1, 2, 4, ...) and both partners compute
lower <- lower + higher with the lower rank's vector first. Cutting the vector into buckets
changes which message an element travels in, never the additions it goes through, so
``--buckets`` gives bitwise the parameters of ``--allreduce butterfly``. (Not so for the ring or
Rabenseifner: there the chunk an element falls in decides at which rank its sum starts.)

How a blocking heart runs nonblocking: each started bucket runs chapter 3's own heart,
``butterfly.butterfly_allreduce_in_place`` (tasks 3.6 and 3.7 in a student tree), in a thread of
its own, on a ``StepComm``: a communicator whose blocking ``Send``, ``Recv`` and ``Sendrecv``
post the matching ``Isend``/``Irecv``, hand the requests to the caller and wait until the caller
has seen them complete. Only one thread runs at a time (the caller waits while a heart posts, a
heart waits while the caller tests), so MPI sees its calls one after another
(MPI_THREAD_SERIALIZED is enough). The caller keeps every bucket's requests and advances each
bucket when its messages are done, so buckets overlap each other and backward.

Progress: without an MPI progress thread, a message moves only inside MPI calls. Eager sends
(small buckets) are copied out at Isend; a receive is matched and the next butterfly round
posted only when this rank calls ``ready`` (Testall) or ``finish`` (Waitall). So the first round
of each bucket overlaps backward; later rounds overlap only up to the next hook.

Cost: the butterfly's lg p alpha + lg p n_b beta + lg p n_b gamma per bucket of n_b elements,
p a power of two (plus the fold-in's 2 alpha + 2 n_b beta + n_b gamma otherwise): B buckets pay
B times the latency, and all of it except the last bucket's can hide behind backward.
``overlap_prediction`` gives that model's step time with one core per rank.

Tags: bucket b sends the heart's tag t as BASE + STRIDE b + (t mod STRIDE), so messages of
different buckets never match each other, whatever order the ranks advance them in. Within a
bucket, the heart's own tags and partners keep its messages apart as they do in chapter 3.
"""
import queue
import threading

from mpi4py import MPI

from .butterfly import butterfly_allreduce_in_place
from .model.cost import predict
from .ring import ring_allgather_in_place

BASE = 7200                    # above tags.py's range
STRIDE = 64                    # tags per bucket
MAX_BUCKETS = (32767 - BASE) // STRIDE     # MPI guarantees tags up to 32767


class StepComm:
    """The communicator a heart sees when it runs one message at a time (see the module docstring).

    Each blocking call posts its nonblocking twin on ``comm`` with the bucket's tag, puts the
    requests on ``posted`` and waits on ``go_on`` until the caller has seen them complete.
    """

    def __init__(self, comm, tag):
        self.comm, self.tag = comm, tag
        self.posted, self.go_on = queue.Queue(maxsize=1), queue.Queue(maxsize=1)

    def Get_rank(self):
        return self.comm.Get_rank()

    def Get_size(self):
        return self.comm.Get_size()

    def _tag(self, tag):
        return self.tag + tag % STRIDE

    def _wait(self, requests):
        self.posted.put(requests)
        self.go_on.get()

    def Isend(self, buf, dest, tag=0):
        return self.comm.Isend(buf, dest, self._tag(tag))

    def Irecv(self, buf, source, tag=0):
        return self.comm.Irecv(buf, source, self._tag(tag))

    def Send(self, buf, dest, tag=0):
        self._wait([self.Isend(buf, dest, tag)])

    def Recv(self, buf, source, tag=0, status=None):
        self._wait([self.Irecv(buf, source, tag)])

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=None, recvtag=0, status=None):
        self._wait([self.Isend(sendbuf, dest, sendtag), self.Irecv(recvbuf, source, recvtag)])


def heart_steps(comm, heart, tag):
    """A blocking heart, ``heart(step_comm)``, run one message at a time: a generator whose each
    ``yield`` hands back the requests this rank must see completed before the heart can go on."""
    steps, outcome = StepComm(comm, tag), []

    def run():
        try:
            heart(steps)
        except BaseException as error:            # handed to the caller, raised there
            outcome.append(error)
        steps.posted.put(None)

    threading.Thread(target=run, daemon=True).start()
    while (requests := steps.posted.get()) is not None:
        yield requests
        steps.go_on.put(True)
    if outcome:
        raise outcome[0]


def butterfly_steps(comm, data, tag):
    """collectives/butterfly.py's heart (sum, in place) as a generator of steps (``heart_steps``)."""
    return heart_steps(comm, lambda steps: butterfly_allreduce_in_place(steps, data, "sum"), tag)


class Started:
    """One collective started without waiting for it: ``heart(step_comm)`` run a message at a time
    in tag slot ``slot`` (``BASE + STRIDE slot``); ``test()`` advances it as far as its messages
    allow and says whether it is done, ``wait()`` finishes it. ZeRO-3's prefetch runs the ring's
    allgather so, while the previous unit computes (``algorithms.zero``)."""

    def __init__(self, comm, heart, slot):
        if not 0 <= slot < MAX_BUCKETS:
            raise ValueError(f"Started: slot {slot} outside 0..{MAX_BUCKETS - 1}")
        self.steps = heart_steps(comm, heart, BASE + STRIDE * slot)
        self.requests = next(self.steps, None)

    def test(self):
        while self.requests is not None and MPI.Request.Testall(self.requests):
            self.requests = next(self.steps, None)
        return self.requests is None

    def wait(self):
        while self.requests is not None:
            MPI.Request.Waitall(self.requests)
            self.requests = next(self.steps, None)


def start_allgather(comm, data, slot=MAX_BUCKETS - 1):
    """The ring's allgather of ``data`` (this rank's block already at its place), started (``Started``)."""
    return Started(comm, lambda steps: ring_allgather_in_place(steps, data), slot)


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
        if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            raise RuntimeError("BucketedAllreduce runs each bucket's butterfly in a thread of its own and needs "
                               "MPI initialised with at least MPI_THREAD_SERIALIZED (mpi4py's default is MULTIPLE)")
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
