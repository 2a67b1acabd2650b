"""The parameter server's wire: who is what, the messages, and a worker's handle on the servers.

    layout = Layout.make(size, servers, n_params)      # ranks 0 .. S-1 serve, the rest work
    servers = ServerShards(comm, layout, dtype)         # a worker's side: push, fetch, goodbye
    request = receive_request(comm, rank, grad_buffer)  # a server's side of one request
    outbox.reply(rank, version, min_clock, status, shard)
    wait_for(comm, source, tag)                         # probe until it is there, sleeping POLL_SECONDS between

``ps.server`` holds what a server decides; this module only moves it. The messages:

    tag       from -> to                 what
    REQUEST   worker -> every server     a small pickled dict: push?, fetch?, steps, the version and
                                         min clock the gradient was read at, goodbye?, stop reason
    GRAD      worker -> server k         grad[start_k:stop_k], a raw buffer, after a push's REQUEST
    REPLY     server k -> worker         int64 (version, min clock, status), status OK/DROPPED/STOP
    PARAMS    server k -> worker         w[start_k:stop_k], a raw buffer, after its REPLY
    CONTROL   server 0 -> servers 1..    server 0's decisions for all servers: {"drop": w}, {"stop": why}
    SNAPSHOT  server k -> rank 0         the shard at an epoch's end            } rank 0's per-epoch log,
    EPOCH     worker -> rank 0           the worker's loss over an epoch        } not the servers' algorithm

Receives are posted before sends, and a server replies with ``Isend`` from a copy, so a slow
worker never blocks a server and a server never blocks a worker that waits for another server.

The end: every rank waits for every other (``run.wait_together``, an Ibarrier polled with sleeps);
a server keeps answering late requests while it waits (``ShardServer.serve``), so a dropped worker
that turns out to be alive finds each request answered and no message is left unmatched.
"""
import dataclasses
import time

import numpy
from mpi4py import MPI

from algorithms.core import tags
from minidl import backend
from minidl.data import shard_sizes

REQUEST, GRAD, REPLY, PARAMS, CONTROL, SNAPSHOT, EPOCH = (tags.PS_REQUEST, tags.PS_GRAD, tags.PS_REPLY, tags.PS_PARAMS,
                                                        tags.PS_CONTROL, tags.PS_SNAPSHOT, tags.PS_EPOCH)
OK, DROPPED, STOP = 0, 1, 2                           # the status of a reply
POLL_SECONDS = 0.0002                                 # sleep between probes: ranks share cores


def wait_for(comm, source, tag):
    """Probe until a message from ``source`` with ``tag`` is there (sleeping, not spinning); its source."""
    status = MPI.Status()
    while not comm.Iprobe(source=source, tag=tag, status=status):
        time.sleep(POLL_SECONDS)
    return status.Get_source()


# ---- who is what ---------------------------------------------------------------------------------

def shard_ranges(n, servers):
    """[(start, stop)] of each of ``servers`` contiguous ranges of a vector of ``n`` elements.

    The ranges are disjoint, in order, cover 0 .. n-1 exactly, and their lengths differ by at most
    one (the first n % servers are longer), as ``minidl.data.shard_sizes`` does for data rows.
    """
    if not isinstance(servers, int) or servers < 1:
        raise ValueError(f"--servers must be an integer >= 1, got {servers!r}")
    if servers > n:
        raise ValueError(f"--servers {servers} is more than the {n} parameters: a server would own nothing")
    stops = numpy.cumsum(shard_sizes(n, servers))
    starts = stops - shard_sizes(n, servers)
    return [(int(start), int(stop)) for start, stop in zip(starts, stops)]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Ranks 0 .. servers-1 serve ``ranges``; the rest are workers (worker index = rank - servers).

    ``replica_size`` k > 1: a worker is a model-parallel replica of k consecutive ranks (``ps.replica``);
    worker w is ranks servers + w k .. servers + w k + k - 1, and ``rank_of(w)`` the first of them.
    """
    size: int
    servers: int
    ranges: tuple
    replica_size: int = 1

    @classmethod
    def make(cls, size, servers, n_params, replica_size=1):
        """The layout, or a ValueError that every rank raises alike (it depends only on the arguments)."""
        if not isinstance(servers, int) or servers < 1:
            raise ValueError(f"--servers must be an integer >= 1, got {servers!r}")
        if size < servers + 1:
            raise ValueError(f"{size} rank(s) cannot hold {servers} server(s) and at least one worker; "
                             f"run with mpiexec -n {servers + 1} or more, or fewer --servers")
        if (size - servers) % replica_size:
            raise ValueError(f"--replica-size {replica_size} does not divide the {size - servers} worker ranks "
                             f"({size} ranks - {servers} server(s)); use a multiple of {replica_size} worker ranks")
        return cls(size, servers, tuple(shard_ranges(n_params, servers)), replica_size)

    server_ranks = property(lambda self: range(self.servers))
    worker_ranks = property(lambda self: range(self.servers, self.size))
    workers = property(lambda self: (self.size - self.servers) // self.replica_size)

    def is_server(self, rank):
        return rank < self.servers

    def rank_of(self, worker):
        return worker * self.replica_size + self.servers

    def worker_of(self, rank):
        return (rank - self.servers) // self.replica_size


# ---- the worker's side ---------------------------------------------------------------------------

class WorkerDropped(Exception):
    """A server answered DROPPED: it gave up on this worker (the timeout passed)."""


class Stopped(Exception):
    """A server answered STOP: the job is stopping (some worker's loss was not finite, or the run diverged)."""


class ServerShards:
    """A worker's handle on the S servers: ``push`` gradients and ``fetch`` parameters.

    ``server_ranks``: the ranks of the servers (default 0 .. S-1; a hierarchical job's workers talk
    to their group server instead, ``ps.relay``). ``slices``: for each server, the (start, stop)
    of this rank's vector that it holds (default ``layout.ranges``: the whole vector, cut as the
    servers cut it). A rank of a model-parallel replica holds only its own parameters, and talks only
    to the servers whose slice is not empty (``ps.replica``). ``values_pushed`` and
    ``values_fetched`` count the gradient and parameter values this rank has sent and received.

    ``versions[k]`` / ``min_clocks[k]`` are what server k reported at the last fetch; ``basis`` is
    what the next push reports as "read at": the fetch current when its first step began.
    """

    def __init__(self, comm, layout, dtype, server_ranks=None, slices=None):
        self.comm, self.layout = comm, layout
        self.server_ranks = list(server_ranks) if server_ranks is not None else list(layout.server_ranks)
        self.slices = list(slices) if slices is not None else list(layout.ranges)
        self.talks_to = [k for k, (start, stop) in enumerate(self.slices) if stop > start]
        self.versions = numpy.zeros(layout.servers, dtype=numpy.int64)
        self.min_clocks = numpy.zeros(layout.servers, dtype=numpy.int64)
        self.basis = (self.versions.copy(), self.min_clocks.copy())
        self.replies = numpy.zeros((layout.servers, 3), dtype=numpy.int64)
        self.host_params = numpy.empty(self.slices[-1][1], dtype=dtype)
        self.outbox = numpy.empty(self.slices[-1][1], dtype=dtype)
        self.sending = []                                  # requests of the last non-blocking sends
        self.values_pushed = self.values_fetched = 0

    def fetch(self, params_out):
        """params_out <- the servers' current parameters (waits until every server answers)."""
        self._request(dict(push=False, fetch=True), None, params_out)

    def push(self, grad, steps, fetch_into=None):
        """Send ``grad`` (summed over ``steps`` steps) to the servers; with ``fetch_into``, fetch too.

        Without a fetch the push is non-blocking: the worker computes on while it travels.
        """
        meta = dict(push=True, fetch=fetch_into is not None, steps=steps,
                    version_read=self.basis[0].tolist(), min_clock_read=self.basis[1].tolist())
        self._request(meta, grad, fetch_into)
        self.basis = (self.versions.copy(), self.min_clocks.copy())

    def goodbye(self, stop=None):
        """This worker is done; ``stop`` (a reason) asks every server to stop the job."""
        self._request(dict(push=False, fetch=False, goodbye=True, stop=stop), None, None)
        self.wait()

    def report_epoch(self, **report):
        """A line for rank 0's per-epoch log (not for the servers' algorithm): sent, not waited for."""
        self.sending.append(self.comm.isend(report, dest=0, tag=EPOCH))

    def wait(self):
        """Complete the last non-blocking sends (their buffers may be reused afterwards)."""
        MPI.Request.Waitall(self.sending)
        self.sending = []

    def _request(self, meta, grad, params_out):
        meta = {"goodbye": False, "stop": None, **meta}
        self.wait()
        receives = []
        if params_out is not None:                       # post the receives before sending
            for k in self.talks_to:
                (start, stop), rank = self.slices[k], self.server_ranks[k]
                receives.append(self.comm.Irecv(self.replies[k], source=rank, tag=REPLY))
                receives.append(self.comm.Irecv(self.host_params[start:stop], source=rank, tag=PARAMS))
            self.values_fetched += self.host_params.size
        if grad is not None:
            self.outbox[...] = backend.to_numpy(grad)    # the caller may change grad right away
            self.values_pushed += self.outbox.size
        for k in self.talks_to:
            start, stop = self.slices[k]
            self.sending.append(self.comm.isend(meta, dest=self.server_ranks[k], tag=REQUEST))
            if grad is not None:
                self.sending.append(self.comm.Isend(self.outbox[start:stop], dest=self.server_ranks[k], tag=GRAD))
        if params_out is not None:
            MPI.Request.Waitall(receives)
            self.wait()
            if (self.replies[:, 2] == STOP).any():
                raise Stopped()
            if (self.replies[:, 2] == DROPPED).any():
                raise WorkerDropped()
            self.versions[...] = self.replies[:, 0]
            self.min_clocks[...] = self.replies[:, 1]
            params_out[...] = backend.asarray(self.host_params)


# ---- the server's side ---------------------------------------------------------------------------

def waiting_request(comm, rank=MPI.ANY_SOURCE):
    """The rank of a worker whose request is waiting (``rank``'s, or anyone's), else None."""
    status = MPI.Status()
    if comm.Iprobe(source=rank, tag=REQUEST, status=status):
        return status.Get_source()
    return None


def receive_request(comm, rank, grad_buffer):
    """Worker ``rank``'s next request (it is there); a push's gradient slice lands in ``grad_buffer``."""
    request = comm.recv(source=rank, tag=REQUEST)
    if request["push"]:
        comm.Recv(grad_buffer, source=rank, tag=GRAD)
    return request


def receive_all(comm, tag, source=MPI.ANY_SOURCE):
    """Every pickled message with ``tag`` that is waiting (from ``source``), in arrival order."""
    messages = []
    while comm.Iprobe(source=source, tag=tag):
        messages.append(comm.recv(source=source, tag=tag))
    return messages


class Outbox:
    """A server's non-blocking sends, each kept with its buffer until it has completed."""

    def __init__(self, comm, layout):
        self.comm, self.layout = comm, layout
        self.pending = []                                  # (request, buffer) pairs

    def reply(self, rank, version, min_clock, status, shard):
        header = numpy.array([version, min_clock, status], dtype=numpy.int64)
        self.pending.append((self.comm.Isend(header, dest=rank, tag=REPLY), header))
        self.pending.append((self.comm.Isend(shard, dest=rank, tag=PARAMS), shard))
        if len(self.pending) > 64:                         # forget the sends that have completed
            self.pending = [(request, buffer) for request, buffer in self.pending if not request.Test()]

    def send(self, message, dest, tag):
        """A pickled message (a decision for another server, a snapshot for rank 0)."""
        self.pending.append((self.comm.isend(message, dest=dest, tag=tag), message))

    def tell_servers(self, decision):
        """Server 0's decision, for servers 1 .. S-1."""
        for k in range(1, self.layout.servers):
            self.send(decision, k, CONTROL)

    def complete(self):
        MPI.Request.Waitall([request for request, _ in self.pending])
        self.pending = []
