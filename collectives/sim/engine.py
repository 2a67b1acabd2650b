"""The discrete-event engine: one coroutine per rank, a clock per rank, a queue of wake-up times.

How it runs. Each simulated rank runs its program (an allreduce heart, unchanged) in its own
greenlet, a coroutine that can stop in the middle of a call and be resumed later. A queue holds
(time, rank) wake-ups. Taking the earliest sets that rank's clock to the time and switches to its
greenlet, which runs Python as usual until it makes a blocking call (Send, Recv, Sendrecv, Wait,
Barrier). The call posts its messages; the rank goes on the queue again at the time its call
completes (as soon as that is known: when its messages have matched), and takes the next wake-up
itself. Ranks therefore run one at a time, in the order of simulated time, and the run ends when
every rank's program has returned (or, if some rank still waits when the queue is empty, with
Deadlock, naming who waits for whom).

The queue: a heap of the distinct wake-up times, and for each time the ranks waiting for it in the
order they were queued. Wake-ups at one time leave first in, first out, as on a heap of (time,
sequence number) pairs; but a ring whose steps all end at one time costs one heap operation per
step, not one per rank (at p = 4096 a heap push and pop of a tuple was a third of the run).

Messages. A send and a receive match when their (source, destination, tag) agree, in the order
they were posted (MPI's non-overtaking rule). A message starts once both sides are posted and
its ports are free (a rendezvous: MPI's protocol for long messages), and is timed by the link's
LogGP parameters (network.message_times):

    start   = max(send posted + o, receive posted, the sender's send port free, the receiver's receive port free)
    ports busy until start + max(g, m G)
    done    = start + L + m G          (the sender's call completes: the data has arrived)
    done + o                           (the receiver's call completes: it has taken the data in)

Ports. Every rank has a send port and a receive port (its CPU's copy engine: one message in and one
out at a time). A message between nodes also needs the sending node's network card (NIC) free to
send and the receiving node's free to receive: a node's c ranks share its K NICs (network.Topology:
local rank i uses NIC i mod K), so ranks of one node that send off the node at once take turns on
their NIC, each holding it for max(g, m G). With K >= c every rank has a NIC of its own, and the
NICs never delay a message that its ranks' own ports would not.

A blocking call completes when all its messages are done, so with o = g = 0 every message on a
chain of blocking calls costs L + m G = alpha + m beta, exactly what collectives.model.cost charges per
message on the critical path. Isend and Irecv return at once; their Wait blocks.

Data. With move_data the bytes are copied from the send buffer into the receive buffer when the
message is matched (the sender cannot touch its buffer until its call completes, nor the receiver
read its buffer), so an allreduce ends with the real sum. Without it (sizes only) nothing is
copied: only each buffer's nbytes is read, and the buffers may be sim.sized.Sized stand-ins.
"""
import contextvars
import gc
from collections import deque
from heapq import heappop, heappush

import numpy as np
from greenlet import getcurrent, greenlet

from ..buffers import SCRATCH_CACHE
from .network import message_times


class Deadlock(RuntimeError):
    """Some rank waits for a message that no rank will send."""


class Request:
    """An Isend's or Irecv's request; `done` is its completion time once matched (None before)."""
    __slots__ = ("engine", "owner", "is_send", "peer", "tag", "done", "waited", "count")

    def __init__(self, engine, owner, is_send, peer, tag):
        self.engine, self.owner, self.is_send, self.peer, self.tag = engine, owner, is_send, peer, tag
        self.done, self.waited, self.count = None, False, 0

    def Wait(self, status=None):
        self.engine.wait(self.owner, (self,))
        if status is not None and not self.is_send:
            fill_status(status, self)

    def Test(self, status=None):
        """True if done by now; if not, this rank lets simulated time move on to the next event."""
        engine = self.engine
        if self.done is None or self.done > engine.clock[self.owner]:
            engine.idle(self.owner, self.done)
        finished = self.done is not None and self.done <= engine.clock[self.owner]
        if finished and status is not None and not self.is_send:
            fill_status(status, self)
        return finished

    @staticmethod
    def Waitall(requests, statuses=None):
        if requests:
            requests[0].engine.wait(requests[0].owner, tuple(requests))
        for request, status in zip(requests, statuses or ()):
            if not request.is_send:
                fill_status(status, request)


def fill_status(status, request):
    """An mpi4py Status as MPI would fill it for this receive: source, tag, bytes received."""
    from mpi4py import MPI
    status.Set_source(request.peer)
    status.Set_tag(request.tag)
    status.Set_elements(MPI.BYTE, request.count)


def byte_view(buffer):
    """The bytes of a contiguous numpy array (a message's payload)."""
    return buffer.reshape(-1).view(np.uint8)


class Engine:
    """Runs `program(comm)` on every rank of `topology` (network.Topology) and times the messages."""

    def __init__(self, topology, move_data=True, record=False):
        self.p = p = topology.ranks
        c = topology.ranks_per_node
        self.topology, self.move_data = topology, move_data
        self.c, self.intra, self.inter = c, topology.intra, topology.inter
        self.clock = [0.0] * p                 # each rank's simulated time
        self.send_free = [0.0] * p             # when each rank's send port is free again
        self.recv_free = [0.0] * p
        nics = topology.nics_per_node
        self.shared = nics < c                 # do ranks share NICs? (else the NICs never delay anyone)
        self.nic = [rank // c * nics + rank % c % nics for rank in range(p)] if self.shared else None
        self.nic_out = [0.0] * (topology.nodes * nics)    # when each NIC is free to send again
        self.nic_in = [0.0] * (topology.nodes * nics)
        self.sends, self.receives = {}, {}     # (source, dest, tag) -> the unmatched post(s), see post
        self.times, self.due = [], {}          # the queue: a heap of wake-up times; time -> deque of ranks
        self.pending = [0] * p                 # requests a blocked rank still waits for
        self.resume = [0.0] * p                # when a blocked rank may go on (the latest done so far)
        self.at_barrier = []
        self.finished = [None] * p
        self.messages = self.bytes = self.events = 0
        self.log = [] if record else None      # (source, dest, tag, bytes) of every message
        self.overheads = bool(self.intra.o or self.inter.o)

    # ---- the loop ---------------------------------------------------------------------------

    def push(self, time, rank):
        """Wake `rank` at `time` (after every rank already queued for that time)."""
        waiting = self.due.get(time)
        if waiting is None:
            self.due[time] = deque((rank,))
            heappush(self.times, time)
        else:
            waiting.append(rank)

    def run(self, program, make_comm):
        """Run program(make_comm(engine, rank)) on every rank; returns the simulated time of the last."""
        self.scheduler = getcurrent()
        self.ranks = ranks = []
        collecting = gc.isenabled()
        gc.disable()                          # its passes over every live request cost 5% of a run; none are cycles
        try:
            for rank in range(self.topology.ranks):
                coroutine = greenlet(self._body(program, make_comm, rank), parent=self.scheduler)
                coroutine.gr_context = contextvars.Context()      # its own scratch buffers (buffers.scratch)
                ranks.append(coroutine)
                coroutine.switch()            # started from here, so it has this stack's depth, not a chain's
                self.push(0.0, rank)
            while self.times:                 # a rank that ends returns here; one that blocks goes on itself
                self.next(None)
        finally:
            if collecting:
                gc.enable()
        stuck = [rank for rank, end in enumerate(self.finished) if end is None]
        if stuck:
            raise Deadlock(f"{len(stuck)} ranks wait forever, e.g. " + "; ".join(
                self.describe(rank) for rank in stuck[:4]))
        return max(self.finished)

    def _body(self, program, make_comm, rank):
        def body():
            SCRATCH_CACHE.set({})
            self.scheduler.switch()                   # started; wait for the first wake-up
            program(make_comm(self, rank))
            self.finished[rank] = self.clock[rank]
        return body

    def describe(self, rank):
        waiting = [f"send to {dest} tag {tag}" for source, dest, tag in self.sends if source == rank]
        waiting += [f"receive from {source} tag {tag}" for source, dest, tag in self.receives if dest == rank]
        return f"rank {rank}: " + (", ".join(waiting) if waiting else "at a barrier")

    def next(self, me):
        """Run the earliest waiting event: go on as `me` if it is mine, else switch to its rank.
        (A blocked rank calls this itself, so control passes from rank to rank without a detour
        through the loop in run, and a rank whose own wake-up is the earliest does not switch.)"""
        times = self.times
        if not times:
            self.scheduler.switch()               # nothing left to run: back to run(), which reports
            return
        time = times[0]
        waiting = self.due[time]
        rank = waiting.popleft()
        if not waiting:
            heappop(times)
            del self.due[time]
        self.events += 1
        if time > self.clock[rank]:
            self.clock[rank] = time
        if rank != me:
            self.ranks[rank].switch()

    # ---- blocking ---------------------------------------------------------------------------

    def wait(self, rank, requests):
        """Block `rank` until every request (Isend, Irecv) is done; it resumes at the latest completion time."""
        latest, pending = self.clock[rank], 0
        for request in requests:
            done = request.done
            if done is None:
                request.waited = True
                pending += 1
            elif done > latest:
                latest = done
        if pending:
            self.pending[rank], self.resume[rank] = pending, latest
        else:
            self.push(latest, rank)
        self.next(rank)

    def sendrecv(self, rank, sendbuf, dest, sendtag, recvbuf, source, recvtag):
        """A blocking Sendrecv (every step of most hearts): post both, go on when both are done.
        Blocking calls make no Request: the rank waits for `pending` messages from the start, and
        each one, matched now or later, counts itself off (finish)."""
        self.pending[rank], self.resume[rank] = 2, self.clock[rank]
        self.post(rank, True, dest, sendtag, sendbuf, None)
        self.post(rank, False, source, recvtag, recvbuf, None)
        self.next(rank)

    def blocking(self, rank, is_send, peer, tag, buf):
        """A blocking Send (is_send) or Recv: post it, go on when it is done (no Request: see sendrecv)."""
        self.pending[rank], self.resume[rank] = 1, self.clock[rank]
        self.post(rank, is_send, peer, tag, buf, None)
        self.next(rank)

    def start(self, rank, is_send, peer, tag, buf):
        """Isend (is_send) or Irecv: post the message and return its Request at once."""
        request = Request(self, rank, is_send, peer, tag)
        self.post(rank, is_send, peer, tag, buf, request)
        return request

    def idle(self, rank, until=None):
        """Let time move on: resume `rank` at `until`, or at the next event of another rank."""
        later = until if until is not None else (self.times[0] if self.times else self.clock[rank])
        self.push(max(later, self.clock[rank]), rank)
        self.next(rank)

    def barrier(self, rank):
        """Every rank resumes at the time the last one arrived (a barrier that costs nothing)."""
        self.at_barrier.append(rank)
        if len(self.at_barrier) == self.topology.ranks:
            time = max(self.clock[other] for other in self.at_barrier)
            for other in self.at_barrier:
                self.push(time, other)
            self.at_barrier = []
        self.next(rank)

    # ---- messages ---------------------------------------------------------------------------

    def post(self, rank, is_send, peer, tag, buf, request):
        """Post a send (to peer) or receive (from peer) at `rank`'s clock; match it if its twin waits.

        request: the Request of an Isend or Irecv (its done time is set when matched), or None for a
        blocking call's message (its rank waits for it: finish). Unmatched posts wait under their
        (source, dest, tag) as (buffer, time posted, request): one such tuple, or a deque of them in
        posting order when several do (a dictionary look-up, not a queue, in the common case)."""
        if not 0 <= peer < self.p:
            raise ValueError(f"rank {rank}: peer {peer} is not a rank of a {self.p}-rank communicator")
        clock = self.clock
        if is_send:
            if self.overheads:                         # the sender's CPU posts the message
                clock[rank] += (self.intra if rank // self.c == peer // self.c else self.inter).o
            key, mine, twins = (rank, peer, tag), self.sends, self.receives
        else:
            key, mine, twins = (peer, rank, tag), self.receives, self.sends
        twin = twins.get(key)
        if twin is None:
            held = mine.get(key)
            if held is None:
                mine[key] = (buf, clock[rank], request)
            elif type(held) is deque:
                held.append((buf, clock[rank], request))
            else:
                mine[key] = deque((held, (buf, clock[rank], request)))
            return
        if type(twin) is deque:
            first = twin.popleft()
            if not twin:
                del twins[key]
            twin = first
        else:
            del twins[key]
        twin_buf, twin_posted, twin_request = twin
        if is_send:
            done, twin_done = self.transfer(rank, peer, tag, buf, twin_buf, clock[rank], twin_posted)
        else:
            twin_done, done = self.transfer(peer, rank, tag, twin_buf, buf, twin_posted, clock[rank])
        count = (buf if is_send else twin_buf).nbytes
        if twin_request is None:                       # the twin's rank first, then mine (the order they resume in)
            self.finish(peer, twin_done)
        else:
            twin_request.done, twin_request.count = twin_done, count
            if twin_request.waited:
                self.finish(peer, twin_done)
        if request is None:
            self.finish(rank, done)
        else:
            request.done, request.count = done, count

    def transfer(self, source, dest, tag, sent_buf, into_buf, sent, posted):
        """Time one matched message (LogGP, see the header) and move its bytes: (send done, receive done)."""
        nbytes = sent_buf.nbytes
        if nbytes > into_buf.nbytes:
            raise ValueError(f"message truncated: rank {source} sent {nbytes} bytes (tag {tag}) into "
                             f"rank {dest}'s {into_buf.nbytes}-byte buffer")
        out, into = self.send_free[source], self.recv_free[dest]
        if source // self.c == dest // self.c:
            _, free, send_done, receive_done = message_times(self.intra, nbytes, sent, posted, out, into)
        elif not self.shared:
            _, free, send_done, receive_done = message_times(self.inter, nbytes, sent, posted, out, into)
        else:                                           # the nodes' NICs too: the later of each pair of ports
            a, b = self.nic[source], self.nic[dest]
            nic_out, nic_in = self.nic_out, self.nic_in
            _, free, send_done, receive_done = message_times(
                self.inter, nbytes, sent, posted, out if out > nic_out[a] else nic_out[a],
                into if into > nic_in[b] else nic_in[b])
            nic_out[a] = nic_in[b] = free
        self.send_free[source] = self.recv_free[dest] = free
        if self.move_data and nbytes:
            byte_view(into_buf)[:nbytes] = byte_view(sent_buf)
        self.messages += 1
        self.bytes += nbytes
        if self.log is not None:
            self.log.append((source, dest, tag, nbytes))
        return send_done, receive_done

    def finish(self, owner, done):
        """One message `owner` waits for is done: wake the owner when it was the last one (push, inlined:
        twice per event)."""
        resume, pending = self.resume, self.pending
        if done > resume[owner]:
            resume[owner] = done
        pending[owner] -= 1
        if not pending[owner]:
            time = resume[owner]
            waiting = self.due.get(time)
            if waiting is None:
                self.due[time] = deque((owner,))
                heappush(self.times, time)
            else:
                waiting.append(owner)
