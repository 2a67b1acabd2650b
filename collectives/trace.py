"""Communicators that watch the messages: TracedComm records every one, CountingComm counts bytes.

    traced = TracedComm(MPI.COMM_WORLD)          # behaves like the communicator it wraps
    ring.allreduce(traced, grad, total)
    messages = gather(traced)                    # every rank's records, on rank 0 (None elsewhere)
    if messages is not None:
        print(format_text(messages))
        spacetime.plot_spacetime(messages, "ring.png")   # the picture: collectives.spacetime

    counting = CountingComm(MPI.COMM_WORLD)      # bytes this rank sends, for a training log
    ring.allreduce(counting, grad, total)
    counting.bytes_sent, counting.total_bytes()  # this rank's bytes; the sum over ranks

Both derive from `WatchedComm`, which forwards every attribute to the wrapped communicator
and, around each point-to-point call (Send, Recv, Sendrecv, Isend, and the pickling send,
recv, sendrecv, isend), calls `watch(start, end, sent, received)` with what the call sent
and received: (peer, bytes, tag) each, or None. A subclass only says what it does with that.

TracedComm. Each message is recorded on the rank that sends or receives it as a `Message`:
rank, peer, direction ("send" or "recv"), bytes, start and end time, tag, and the step label
"<phase> <k>" (the phase from the tag, collectives.tags; k counts that rank's calls with that
tag). A Sendrecv is one send record and one receive record with the same times. Received
bytes are what arrived (MPI_Get_count), not the size of the buffer. `counts(messages, rank)`
sums one rank's records into (messages sent, bytes sent, bytes reduced) - the numbers
collectives.model.cost predicts. Bytes reduced are the bytes received in a phase whose receiver
combines what it receives (tags.PHASES).
Limits: nonblocking calls (Isend, Irecv, isend, irecv) raise rather than go unrecorded with a
wrong end time (the algorithms here use none). MPI's own collectives (Allreduce, Bcast, ...)
pass through unrecorded. Times are time.perf_counter() on each rank; ranks on one machine
share that clock, across machines they would need aligning. The tracer adds a few
microseconds per call, so traced times are for pictures, not for benchmarks.

CountingComm. `bytes_sent` is the number of bytes this rank has sent: every point-to-point
send adds its buffer's size (exact for the algorithms here and for any code on Send, Isend,
Sendrecv); a pickling send adds the size of the pickle (the object is pickled once more to
measure it). MPI's own collectives send inside the library, where nothing can be counted, so
two are estimated: `Allreduce` of n bytes as what a bandwidth-optimal allreduce sends per
rank, 2 (p - 1) / p n bytes (ring or Rabenseifner, collectives.model.cost), and the pickling
`allreduce` of a Python object alike, with n the bytes numpy stores it in for a number or a
numpy array (8 for a Python int or float: one MPI int64 or double), and the pickle's size
for anything else. Other collectives pass through uncounted.
`total_bytes()` sums bytes_sent over ranks with one small allreduce, which is not counted.
"""
import time
from collections import Counter
from dataclasses import dataclass
from numbers import Number

import numpy as np
from mpi4py import MPI

from .tags import CHECK, PHASES


@dataclass
class Message:
    rank: int           # the rank that recorded it
    peer: int           # destination of a send, source of a receive
    direction: str      # "send" or "recv"
    nbytes: int
    start: float        # seconds (perf_counter on the recording rank; relative after `gather`)
    end: float
    tag: int
    step: int           # how many calls with this tag the rank made before this one

    @property
    def phase(self):
        return PHASES.get(self.tag, (f"tag {self.tag}", False))[0]

    @property
    def label(self):
        return f"{self.phase} {self.step}"


def buffer_nbytes(buffer):
    """Bytes in an mpi4py buffer argument: an array, bytes, or [array, ...] with an MPI datatype.

    A list's first entry is taken whole (as in [array, MPI.DOUBLE]); an explicit count in
    [array, count, datatype] is not read.
    """
    if isinstance(buffer, (list, tuple)):
        buffer = buffer[0]
    nbytes = getattr(buffer, "nbytes", None)
    return int(nbytes) if nbytes is not None else len(memoryview(buffer).cast("B"))


def pickled_nbytes(obj):
    """Bytes mpi4py sends for a Python object: the size of its pickle."""
    return len(MPI.pickle.dumps(obj))


class WatchedComm:
    """Wraps an mpi4py communicator: behaves like it, and calls `watch` after each point-to-point call."""

    def __init__(self, comm):
        self.comm = comm

    def __getattr__(self, name):                  # Get_rank, Get_size, rank, size, Barrier, ... as usual
        return getattr(self.comm, name)

    def watch(self, start, end, sent=None, received=None):
        """One call has finished; sent and received are (peer, bytes, tag) or None. Subclasses act."""

    # buffers (numpy arrays, bytes, [array, datatype] lists)

    def Send(self, buf, dest, tag=0):
        start = time.perf_counter()
        self.comm.Send(buf, dest, tag)
        self.watch(start, time.perf_counter(), sent=(dest, buffer_nbytes(buf), tag))

    def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        status = status if status is not None else MPI.Status()
        start = time.perf_counter()
        self.comm.Recv(buf, source, tag, status)
        self.watch(start, time.perf_counter(),
                   received=(status.Get_source(), status.Get_count(MPI.BYTE), status.Get_tag()))

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE,
                 recvtag=MPI.ANY_TAG, status=None):
        status = status if status is not None else MPI.Status()
        start = time.perf_counter()
        self.comm.Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag, status)
        self.watch(start, time.perf_counter(), sent=(dest, buffer_nbytes(sendbuf), sendtag),
                   received=(status.Get_source(), status.Get_count(MPI.BYTE), status.Get_tag()))

    def Isend(self, buf, dest, tag=0):
        start = time.perf_counter()
        request = self.comm.Isend(buf, dest, tag)
        self.watch(start, time.perf_counter(), sent=(dest, buffer_nbytes(buf), tag))
        return request

    # pickled Python objects

    def send(self, obj, dest, tag=0):
        start = time.perf_counter()
        self.comm.send(obj, dest, tag)
        self.watch(start, time.perf_counter(), sent=(dest, pickled_nbytes(obj), tag))

    def recv(self, buf=None, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        status = status if status is not None else MPI.Status()
        start = time.perf_counter()
        obj = self.comm.recv(buf, source, tag, status)
        self.watch(start, time.perf_counter(),
                   received=(status.Get_source(), status.Get_count(MPI.BYTE), status.Get_tag()))
        return obj

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE,
                 recvtag=MPI.ANY_TAG, status=None):
        status = status if status is not None else MPI.Status()
        start = time.perf_counter()
        obj = self.comm.sendrecv(sendobj, dest, sendtag, recvbuf, source, recvtag, status)
        self.watch(start, time.perf_counter(), sent=(dest, pickled_nbytes(sendobj), sendtag),
                   received=(status.Get_source(), status.Get_count(MPI.BYTE), status.Get_tag()))
        return obj

    def isend(self, obj, dest, tag=0):
        start = time.perf_counter()
        request = self.comm.isend(obj, dest, tag)
        self.watch(start, time.perf_counter(), sent=(dest, pickled_nbytes(obj), tag))
        return request


class TracedComm(WatchedComm):
    """Records every Send, Recv and Sendrecv (and pickling send/recv/sendrecv) in `messages`."""

    def __init__(self, comm):
        super().__init__(comm)
        self.messages = []
        self._calls = Counter()

    def reset(self):
        """Forget the records (and restart the step counts)."""
        self.messages.clear()
        self._calls.clear()

    def watch(self, start, end, sent=None, received=None):
        rank = self.comm.Get_rank()
        for direction, message in (("send", sent), ("recv", received)):
            if message is not None:
                peer, nbytes, tag = message
                self.messages.append(Message(rank, peer, direction, nbytes, start, end, tag,
                                             self._calls[tag]))
        # one call: its send and receive share a step; a call counts once per tag it used
        for tag in {message[2] for message in (sent, received) if message is not None}:
            self._calls[tag] += 1

    def Isend(self, *args, **kwargs):
        raise NotImplementedError("TracedComm records blocking calls only (Send, Recv, Sendrecv)")

    Irecv = isend = irecv = Isend


class CountingComm(WatchedComm):
    """Counts in `bytes_sent` the bytes this rank sends (MPI's Allreduce and allreduce estimated)."""

    def __init__(self, comm):
        super().__init__(comm)
        self.bytes_sent = 0

    def watch(self, start, end, sent=None, received=None):
        if sent is not None:
            self.bytes_sent += sent[1]

    def _allreduce_estimate(self, nbytes):
        """What a bandwidth-optimal allreduce of nbytes sends per rank: 2 (p - 1) / p n."""
        size = self.comm.Get_size()
        return 2 * (size - 1) * nbytes // size

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):   # sendbuf may be MPI.IN_PLACE
        self.bytes_sent += self._allreduce_estimate(buffer_nbytes(recvbuf))
        return self.comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM if op is None else op)

    def allreduce(self, sendobj, op=MPI.SUM):
        if isinstance(sendobj, (Number, np.number, np.bool_, np.ndarray)):
            nbytes = np.asarray(sendobj).nbytes       # 8 for a Python int or float
        else:
            nbytes = pickled_nbytes(sendobj)
        self.bytes_sent += self._allreduce_estimate(nbytes)
        return self.comm.allreduce(sendobj, op=MPI.SUM if op is None else op)

    def total_bytes(self):
        """Bytes sent by all ranks together (a collective call; the allreduce itself is not counted)."""
        return int(self.comm.allreduce(self.bytes_sent))


def gather(traced, root=0):
    """All ranks' records on `root` (None elsewhere), times relative to the earliest start.

    Collective over traced.comm (uses mpi4py's pickling gather: this is the tool, not an algorithm).
    """
    every = traced.comm.gather(traced.messages, root=root)
    if every is None:
        return None
    messages = [message for rank_messages in every for message in rank_messages]
    origin = min((message.start for message in messages), default=0.0)
    return sorted((Message(m.rank, m.peer, m.direction, m.nbytes, m.start - origin, m.end - origin,
                           m.tag, m.step) for m in messages), key=lambda m: (m.start, m.rank))


def counts(messages, rank, include_check=False):
    """(messages sent, bytes sent, bytes reduced) of one rank, as collectives.model.cost.per_rank counts."""
    mine = [m for m in messages if m.rank == rank and (include_check or m.tag != CHECK)]
    sent = [m for m in mine if m.direction == "send"]
    reduced = sum(m.nbytes for m in mine if m.direction == "recv" and PHASES.get(m.tag, ("", False))[1])
    return len(sent), sum(m.nbytes for m in sent), reduced


def format_text(messages, directions=("send", "recv")):
    """One line per record, in time order: when, who, to or from whom, how much, which step."""
    lines = [f"{'start us':>9} {'took us':>8}  {'rank':<12} {'bytes':>9}  step"]
    for m in messages:
        if m.direction not in directions:
            continue
        arrow = f"{m.rank} -> {m.peer}" if m.direction == "send" else f"{m.rank} <- {m.peer}"
        lines.append(f"{m.start * 1e6:9.1f} {(m.end - m.start) * 1e6:8.1f}  {arrow:<12} {m.nbytes:9d}  {m.label}")
    return "\n".join(lines)


def match(messages):
    """Pair each send with its receive: (send, recv) tuples.

    MPI does not overtake: between one sender and one receiver, messages with one tag arrive
    in the order they were sent, so the k-th send from a to b with tag t is the k-th receive.
    """
    sends, receives = {}, {}
    for m in messages:
        key = (m.rank, m.peer, m.tag) if m.direction == "send" else (m.peer, m.rank, m.tag)
        (sends if m.direction == "send" else receives).setdefault(key, []).append(m)
    return [pair for key in sends for pair in zip(sends[key], receives.get(key, []))]
