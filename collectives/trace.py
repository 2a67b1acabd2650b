"""A tracing communicator: every point-to-point message, as text or as a space-time diagram.

    traced = TracedComm(MPI.COMM_WORLD)          # behaves like the communicator it wraps
    ring.allreduce(traced, grad, total)
    messages = gather(traced)                    # every rank's records, on rank 0 (None elsewhere)
    if messages is not None:
        print(format_text(messages))
        plot_spacetime(messages, "ring.png")

Each Send, Recv and Sendrecv the algorithm makes is recorded on the rank that makes it as a
`Message`: rank, peer, direction ("send" or "recv"), bytes, start and end time, tag, and the
step label "<phase> <k>" (the phase from the tag, collectives.tags; k counts that rank's calls
with that tag). A Sendrecv is one send record and one receive record with the same times.
Received bytes are what arrived (MPI_Get_count), not the size of the buffer.

`counts(messages, rank)` sums one rank's records into (messages sent, bytes sent, bytes
reduced) - the numbers collectives.cost predicts. Bytes reduced are the bytes received in a
phase whose receiver combines what it receives (tags.PHASES).

Limits: Isend/Irecv are not traced (the algorithms here do not use them; they raise here
rather than go unrecorded). Times are time.perf_counter() on each rank; ranks on one machine
share that clock, across machines they would need aligning. The tracer adds a few
microseconds per call, so traced times are for pictures, not for benchmarks.
"""
import time
from collections import Counter
from dataclasses import dataclass

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


def _nbytes(buffer):
    nbytes = getattr(buffer, "nbytes", None)
    return int(nbytes) if nbytes is not None else len(memoryview(buffer).cast("B"))


class TracedComm:
    """Wraps an mpi4py communicator and records every Send, Recv and Sendrecv in `messages`."""

    def __init__(self, comm):
        self.comm = comm
        self.messages = []
        self._calls = Counter()

    def __getattr__(self, name):                  # Get_rank, Get_size, rank, size, ... as usual
        return getattr(self.comm, name)

    def reset(self):
        """Forget the records (and restart the step counts)."""
        self.messages.clear()
        self._calls.clear()

    def _record(self, direction, peer, nbytes, start, end, tag):
        self.messages.append(Message(self.comm.Get_rank(), peer, direction, nbytes, start, end,
                                     tag, self._calls[tag]))

    def Send(self, buf, dest, tag=0):
        start = time.perf_counter()
        self.comm.Send(buf, dest, tag)
        self._record("send", dest, _nbytes(buf), start, time.perf_counter(), tag)
        self._calls[tag] += 1

    def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        status = status if status is not None else MPI.Status()
        start = time.perf_counter()
        self.comm.Recv(buf, source, tag, status)
        self._record("recv", status.Get_source(), status.Get_count(MPI.BYTE), start,
                     time.perf_counter(), status.Get_tag())
        self._calls[status.Get_tag()] += 1

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE,
                 recvtag=MPI.ANY_TAG, status=None):
        status = status if status is not None else MPI.Status()
        start = time.perf_counter()
        self.comm.Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag, status)
        end = time.perf_counter()
        self._record("send", dest, _nbytes(sendbuf), start, end, sendtag)
        self._record("recv", status.Get_source(), status.Get_count(MPI.BYTE), start, end,
                     status.Get_tag())
        self._calls[sendtag] += 1

    def Isend(self, *args, **kwargs):
        raise NotImplementedError("TracedComm records blocking Send/Recv/Sendrecv only")

    Irecv = Isend


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
    """(messages sent, bytes sent, bytes reduced) of one rank, as collectives.cost.per_rank counts."""
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


def logical_times(messages):
    """Start slot of each call when every call takes one slot and a message takes one slot.

    A rank's calls happen in order; a call that receives cannot start before the call that
    sent it (it ends one slot later). Returns {(rank, tag, step): slot}; the diagram with
    clock="steps" uses it to draw the schedule as the papers do, free of timing noise.
    """
    calls = {}
    for m in messages:
        calls.setdefault(m.rank, [])
        key = (m.rank, m.tag, m.step)
        if key not in calls[m.rank]:
            calls[m.rank].append(key)
    sender_of = {(r.rank, r.tag, r.step): (s.rank, s.tag, s.step) for s, r in match(messages)}
    slot = {key: 0 for keys in calls.values() for key in keys}
    changed = True
    while changed:
        changed = False
        for keys in calls.values():
            for i, key in enumerate(keys):
                earliest = slot[keys[i - 1]] + 1 if i else 0
                if key in sender_of:
                    earliest = max(earliest, slot[sender_of[key]])
                if earliest > slot[key]:
                    slot[key], changed = earliest, True
    return slot


def plot_spacetime(messages, path, title=None, clock="wall"):
    """Space-time diagram as a PNG: ranks as rows, time left to right, an arrow per message.

    clock="wall": arrows from a send's start to its receive's end, in microseconds.
    clock="steps": the logical schedule (logical_times), one column per step.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = match(messages)
    ranks = sorted({m.rank for m in messages} | {m.peer for m in messages}) or [0]
    phases = list(dict.fromkeys(send.phase for send, _ in pairs))
    colours = dict(zip(phases, plt.get_cmap("tab10").colors))
    if clock == "steps":
        slot = logical_times(messages)

        def x_of(send, recv):
            return slot[(send.rank, send.tag, send.step)], slot[(recv.rank, recv.tag, recv.step)] + 1
        xlabel = "step"
    else:
        def x_of(send, recv):
            return send.start * 1e6, recv.end * 1e6
        xlabel = "time (us)"
    figure, axes = plt.subplots(figsize=(8, 0.6 * len(ranks) + 1.4))
    right = 1.0
    for send, recv in pairs:
        x0, x1 = x_of(send, recv)
        right = max(right, x1)
        axes.annotate("", xy=(x1, recv.rank), xytext=(x0, send.rank),
                      arrowprops=dict(arrowstyle="->", color=colours[send.phase], lw=1.3,
                                      shrinkA=0, shrinkB=0))
    for rank in ranks:
        axes.axhline(rank, color="0.8", lw=0.8, zorder=0)
    for phase in phases:
        axes.plot([], [], color=colours[phase], label=phase)
    axes.set_xlim(-0.02 * right, 1.02 * right)
    axes.set_ylim(max(ranks) + 0.5, min(ranks) - 0.5)
    axes.set_yticks(ranks, [f"rank {rank}" for rank in ranks])
    axes.set_xlabel(xlabel)
    if phases:
        axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    axes.set_title(title or "")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path
