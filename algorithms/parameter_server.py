"""A sharded parameter server over MPI (Dean et al. 2012, section 4.1; Li et al.'s server groups).

    mpiexec -n 4 python -m algorithms.downpour_sgd --servers 2     # the algorithms run on this server

Ranks 0 .. S-1 are servers, ranks S .. p-1 are workers (worker index = rank - S). Server k owns
one contiguous range of the flat parameter vector (``shard_ranges``; lengths differ by at most one):

    flat parameters   [  server 0  |  server 1  | ... |  server S-1  ]
    worker w          pushes grad[start_k:stop_k] to server k, fetches w[start_k:stop_k] from it

Workers never talk to each other; servers never talk to each other about training (server k
sends rank 0 only its snapshot at each epoch's end, for the log). Each server keeps, for its
range only: the parameters ``shard``, its own optimizer state (``SGD``, or ``Adagrad`` whose
rate per parameter is lr / sqrt(sum of that parameter's squared gradients)), a ``version``
(pushes applied so far) and each worker's ``clock`` (that worker's pushes applied so far).
It serves whichever worker is ready:

    push(grad_k, version read)   apply_push: shard <- optimizer(shard, grad_k); version += 1;
                                 log (worker, version read, version applied, clock staleness)
    fetch                        reply (shard, version), once every worker has checked in (its
                                 first fetch), at once; or, with a staleness bound s,
                                 only while clock[w] - min_j clock[j] <= s (``may_proceed``, SSP);
                                 or, during a warm start, only to the first worker
    goodbye                      the worker has finished

A push and the fetch that follows it travel as one request, so the server applies the push and
answers the fetch without serving anyone in between: that is what makes s = 0 exactly synchronous.

Deterministic mode (``schedule_seed``): instead of serving whichever request arrives first, the
server draws the next worker to serve from Generator(schedule_seed) among the workers it is not
holding, and waits for that worker's request. Every server draws the same sequence and sees the
same requests in the same order, so the whole run is a function of the seed: replayable. (Two
servers with different schedules could deadlock: each waiting for a worker that waits on the other.)

Worker failure: a server that has heard nothing from a worker it is not holding for ``timeout``
seconds drops it: its clock leaves the minimum, its later requests are answered "dropped",
and training finishes with the others. See ``ps_job`` for how a failed worker is simulated.

Wire format: a request is a small pickled dict (mpi4py's lowercase ``send``); arrays travel as raw
buffers (``Send``/``Isend``): a gradient slice after its request; a reply is an int64 header
(version, min clock, status) followed by the shard. Receives are posted before sends, and a
server replies with ``Isend`` from a copy, so a slow worker never blocks a server.

Cost per worker step with n_fetch = n_push = 1 (n parameters, S servers, b bytes each):
2 S messages of n/S b bytes (push, reply) plus 2 S small ones; each server receives and sends
n/S b bytes per worker step, so S servers split the bandwidth that one server would need.
"""
import dataclasses
import time

import numpy
from mpi4py import MPI

from minidl import backend
from minidl.data import shard_sizes
from minidl.optim import SGD, Adagrad
from minidl.tensor import Parameter

TAG_REQUEST, TAG_GRAD, TAG_REPLY, TAG_PARAMS, TAG_SNAPSHOT = 501, 502, 503, 504, 505
OK, DROPPED = 0, 1                                    # status field of a reply
POLL_SECONDS = 0.0002                                 # sleep between probes: ranks share cores


# ---- sharding -----------------------------------------------------------------------------------

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
    """Who is what: ranks 0 .. servers-1 serve ``ranges``; the rest are workers."""
    size: int
    servers: int
    ranges: tuple

    @classmethod
    def make(cls, size, servers, n_params):
        """The layout, or a ValueError that every rank raises alike (it depends only on the arguments)."""
        if not isinstance(servers, int) or servers < 1:
            raise ValueError(f"--servers must be an integer >= 1, got {servers!r}")
        if size < servers + 1:
            raise ValueError(f"{size} rank(s) cannot hold {servers} server(s) and at least one worker; "
                             f"run with mpiexec -n {servers + 1} or more, or fewer --servers")
        return cls(size, servers, tuple(shard_ranges(n_params, servers)))

    @property
    def server_ranks(self):
        return range(self.servers)

    @property
    def worker_ranks(self):
        return range(self.servers, self.size)

    @property
    def workers(self):
        return self.size - self.servers

    def is_server(self, rank):
        return rank < self.servers


def may_proceed(clock, clocks, staleness):
    """The stale-synchronous condition (Ho et al. 2013): clock - min(clocks) <= staleness.

    ``clock`` is the asking worker's clock (its pushes applied), ``clocks`` those of every worker
    still training (the asking one included). staleness None means no bound (asynchronous).
    """
    return staleness is None or clock - min(clocks) <= staleness


# ---- the worker's side --------------------------------------------------------------------------

class WorkerDropped(Exception):
    """A server answered "dropped": it gave up on this worker (its timeout passed)."""


class ServerShards:
    """A worker's handle on the S servers: ``push`` gradients and ``fetch`` parameters.

    ``versions[k]`` / ``min_clocks[k]`` are what server k reported at the last fetch; ``basis`` is
    what the next push reports as "version read": the fetch current when its first step began.
    """

    def __init__(self, comm, layout, dtype):
        self.comm, self.layout = comm, layout
        self.versions = numpy.zeros(layout.servers, dtype=numpy.int64)
        self.min_clocks = numpy.zeros(layout.servers, dtype=numpy.int64)
        self.basis = (self.versions.copy(), self.min_clocks.copy())
        self.clock = 0                                     # pushes sent
        self.replies = numpy.zeros((layout.servers, 3), dtype=numpy.int64)
        self.host_params = numpy.empty(layout.ranges[-1][1], dtype=dtype)
        self.outbox = numpy.empty(layout.ranges[-1][1], dtype=dtype)
        self.sending = []                                  # requests of the last non-blocking push

    def fetch(self, params_out):
        """params_out <- the servers' current parameters (waits until every server answers)."""
        self._request({"push": False, "fetch": True}, None, params_out)

    def push(self, grad, steps, epoch, epoch_done, loss_sum, batches, fetch_into=None):
        """Send ``grad`` (summed over ``steps`` steps) to the servers; with ``fetch_into``, fetch too.

        Without a fetch the push is non-blocking: the worker computes on while it travels.
        """
        self.clock += 1
        meta = {"push": True, "fetch": fetch_into is not None, "steps": steps, "epoch": epoch,
                "epoch_done": epoch_done, "loss_sum": loss_sum, "batches": batches,
                "version_read": self.basis[0].tolist(), "min_clock_read": self.basis[1].tolist()}
        self._request(meta, grad, fetch_into)
        self.basis = (self.versions.copy(), self.min_clocks.copy())

    def goodbye(self):
        self._request({"push": False, "fetch": False, "goodbye": True}, None, None)
        self.wait()

    def wait(self):
        """Complete the last non-blocking push (its buffers may be reused afterwards)."""
        MPI.Request.Waitall(self.sending)
        self.sending = []

    def _request(self, meta, grad, params_out):
        self.wait()
        receives = []
        if params_out is not None:                       # post the receives before sending
            for k, (start, stop) in enumerate(self.layout.ranges):
                receives.append(self.comm.Irecv(self.replies[k], source=k, tag=TAG_REPLY))
                receives.append(self.comm.Irecv(self.host_params[start:stop], source=k, tag=TAG_PARAMS))
        if grad is not None:
            self.outbox[...] = backend.to_numpy(grad)    # the caller may change grad right away
        for k, (start, stop) in enumerate(self.layout.ranges):
            self.sending.append(self.comm.isend(meta, dest=k, tag=TAG_REQUEST))
            if grad is not None:
                self.sending.append(self.comm.Isend(self.outbox[start:stop], dest=k, tag=TAG_GRAD))
        if params_out is not None:
            MPI.Request.Waitall(receives)
            self.wait()
            if (self.replies[:, 2] == DROPPED).any():
                raise WorkerDropped()
            self.versions[...] = self.replies[:, 0]
            self.min_clocks[...] = self.replies[:, 1]
            params_out[...] = backend.asarray(self.host_params)


def wait_together(comm):
    """A barrier: at the start (so the servers' silence timers start when every rank is ready)
    and at a worker's end (the barrier the servers enter once training is over, ``shut_down``).

    Polled with sleeps rather than a blocking ``Barrier``, so a rank that waits here leaves its
    core to the ranks still training (several ranks share each core in our runs).
    """
    barrier = comm.Ibarrier()
    while not barrier.Test():
        time.sleep(0.005)


# ---- the server ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Update:
    """One applied push, as the server logs it."""
    worker: int            # worker index (rank - S)
    version_read: int      # this shard's version when the worker fetched what the gradient used
    version: int           # this shard's version when the push was applied (before it)
    clock: int             # the worker's clock before this push
    clock_staleness: int   # clock - min(clocks) at that fetch: <= s under SSP

    @property
    def staleness(self):
        """Pushes by anyone applied between the read and this update."""
        return self.version - self.version_read


class ShardServer:
    """Server ``index`` of ``layout``: owns shard ``layout.ranges[index]`` of ``initial``."""

    def __init__(self, comm, layout, initial, optimizer="sgd", lr=0.05, momentum=0.0, staleness=None,
                 warm_start_steps=0, schedule_seed=None, timeout=None, first_epoch=0, epochs=1,
                 optimizer_state=None, on_epoch=None):
        self.comm, self.layout = comm, layout
        self.index = comm.rank
        start, stop = layout.ranges[self.index]
        xp = backend.xp()
        self.param = Parameter(xp.asarray(backend.to_numpy(initial)[start:stop]).copy())
        self.param.grad = xp.zeros_like(self.param.data)
        self.host_grad = numpy.empty(stop - start, dtype=backend.to_numpy(initial).dtype)
        if optimizer == "sgd":
            self.optimizer = SGD([self.param], lr=lr, momentum=momentum)
        elif optimizer == "adagrad":
            self.optimizer = Adagrad([self.param], lr=lr)
        else:
            raise ValueError(f"--server-optimizer must be 'sgd' or 'adagrad', got {optimizer!r}")
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        if staleness is not None and warm_start_steps:
            raise ValueError("a warm start cannot be combined with a staleness bound: "
                             "the waiting workers' clocks would hold the first worker back")
        self.staleness, self.warm_start_steps, self.timeout = staleness, warm_start_steps, timeout
        self.schedule = numpy.random.default_rng(schedule_seed) if schedule_seed is not None else None
        self.version = 0
        workers = range(layout.workers)
        self.clock = {w: 0 for w in workers}
        self.steps = {w: 0 for w in workers}                 # steps (not pushes) applied per worker
        self.epochs_done = {w: first_epoch for w in workers}
        self.finished, self.dropped = set(), {}             # dropped: worker -> (steps, silent seconds)
        self.waiting = {}                                     # worker -> its held fetch request
        self.checked_in, self.started = set(), False          # workers heard from; all of them yet?
        self.read = {w: (0, 0) for w in workers}             # (version, min clock) at w's last fetch
        self.log = []                                         # ("push", Update) and ("fetch", w, version)
        self.updates = []                                     # the Updates alone, in order
        self.last_heard = {w: time.monotonic() for w in workers}
        self.sends = []                                       # outstanding (request, buffer) pairs
        # epoch snapshots, for the per-epoch log on rank 0
        self.epochs, self.next_snapshot, self.snapshot_from = epochs, first_epoch, 0
        self.candidates = {}                                  # epoch -> (shard, len(updates)) at its end
        self.on_epoch, self.parts, self.next_report = on_epoch, {}, first_epoch
        self.loss = {}                                        # epoch -> [loss sum, batches] (rank 0)

    # -- the update: the heart of a parameter server -----------------------------------------
    def apply_push(self, worker, grad, request):
        """Apply one worker's gradient to this shard with the server's own optimizer, and log it.

            SGD:      shard <- shard - lr * grad
            Adagrad:  sum_sq <- sum_sq + grad^2;  shard <- shard - lr * grad / (sqrt(sum_sq) + eps)

        Both are elementwise, so S shards updated separately equal one optimizer on the whole vector.
        """
        self.param.grad[...] = backend.asarray(grad)
        self.optimizer.step()
        version_read = request["version_read"][self.index]
        clock_staleness = self.clock[worker] - request["min_clock_read"][self.index]
        update = Update(worker, version_read, self.version, self.clock[worker], clock_staleness)
        self.log.append(("push", update))
        self.updates.append(update)
        self.version += 1
        self.clock[worker] += 1
        self.steps[worker] += request["steps"]

    # -- who may be answered -------------------------------------------------------------------
    def live(self):
        return [w for w in self.clock if w not in self.finished and w not in self.dropped]

    def may_answer(self, worker):
        """Start: nobody before every live worker has asked for its first parameters (so all start
        from the same w, before anyone's first push). Warm start: then only worker 0 until it has
        pushed warm_start_steps steps. SSP: the clock bound."""
        if not self.started:
            self.started = all(w in self.checked_in for w in self.live())
            if not self.started:
                return False
        if worker != 0 and self.warm_start_steps and 0 in self.live() and self.steps[0] < self.warm_start_steps:
            return False
        return may_proceed(self.clock[worker], [self.clock[w] for w in self.live()], self.staleness)

    def answer_waiting(self):
        for worker in sorted(self.waiting):
            if self.may_answer(worker):
                del self.waiting[worker]
                self.last_heard[worker] = time.monotonic()      # its silence starts now, not when it asked
                self.read[worker] = (self.version, min(self.clock[w] for w in self.live()))
                self.log.append(("fetch", worker, self.version))
                self.reply(worker, OK)

    def reply(self, worker, status):
        header = numpy.array([self.version, self.read[worker][1], status], dtype=numpy.int64)
        shard = backend.to_numpy(self.param.data).copy()     # later pushes must not change what is sent
        rank = worker + self.layout.servers
        self.sends.append((self.comm.Isend(header, dest=rank, tag=TAG_REPLY), header))
        self.sends.append((self.comm.Isend(shard, dest=rank, tag=TAG_PARAMS), shard))
        if len(self.sends) > 64:                               # forget the sends that have completed
            self.sends = [(r, b) for r, b in self.sends if not r.Test()]

    # -- one request -----------------------------------------------------------------------------
    def handle(self, worker):
        """Receive worker's next request (it is there) and act on it."""
        rank = worker + self.layout.servers
        request = self.comm.recv(source=rank, tag=TAG_REQUEST)
        self.last_heard[worker] = time.monotonic()
        self.checked_in.add(worker)
        grad = None
        if request["push"]:
            self.comm.Recv(self.host_grad, source=rank, tag=TAG_GRAD)
            grad = self.host_grad
        if worker in self.dropped or worker in self.finished:   # a late request from a dropped worker
            if request["fetch"]:
                self.reply(worker, DROPPED)
            return
        if request["push"]:
            self.apply_push(worker, grad, request)
            if self.index == 0:
                total = self.loss.setdefault(request["epoch"], [0.0, 0])
                total[0] += request["loss_sum"]
                total[1] += request["batches"]
            if request["epoch_done"]:
                self.epochs_done[worker] = request["epoch"] + 1
                # the shard as the latest worker to finish this epoch left it (see take_snapshots)
                self.candidates[request["epoch"]] = (backend.to_numpy(self.param.data).copy(), len(self.updates))
        if request["fetch"]:
            self.waiting[worker] = request
        if request.get("goodbye"):
            self.finished.add(worker)
        self.answer_waiting()
        self.take_snapshots()

    def drop_silent(self):
        """Drop every live worker not held here and silent for longer than the timeout."""
        if self.timeout is None:
            return
        now = time.monotonic()
        silent = [w for w in self.live() if w not in self.waiting and now - self.last_heard[w] > self.timeout]
        for worker in silent:
            self.dropped[worker] = (self.steps[worker], round(now - self.last_heard[worker], 2))
        if silent:
            self.answer_waiting()             # a dropped clock no longer holds anyone back
            self.take_snapshots()

    # -- the serving loop --------------------------------------------------------------------------
    def next_worker(self):
        """The worker whose request to handle next, or None if none came within one poll."""
        if self.schedule is not None:                          # deterministic: a seeded choice
            ready = sorted(w for w in self.live() if w not in self.waiting)
            if not ready:
                raise RuntimeError(f"server {self.index}: every live worker is held; this is a bug")
            worker = int(self.schedule.choice(ready))
            rank = worker + self.layout.servers
            while not self.comm.Iprobe(source=rank, tag=TAG_REQUEST):
                self.collect_parts()
                time.sleep(POLL_SECONDS)
            return worker
        status = MPI.Status()
        if self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST, status=status):
            return status.Get_source() - self.layout.servers
        time.sleep(POLL_SECONDS)
        return None

    def serve(self):
        """Serve until every worker has finished or been dropped; then shut down cleanly."""
        self.take_snapshots()
        while self.live():
            worker = self.next_worker()
            if worker is not None:
                self.handle(worker)
            self.drop_silent()
            self.collect_parts()
        self.shut_down()

    def shut_down(self):
        """Wait for every rank (Ibarrier), answering late requests of dropped workers meanwhile.

        A dropped worker may still be alive (the timeout was too short, or it is the simulated
        crash waiting to exit): it must find every request answered and no message unmatched.
        """
        barrier = self.comm.Ibarrier()
        status = MPI.Status()
        while not barrier.Test():
            while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST, status=status):
                self.handle(status.Get_source() - self.layout.servers)
            self.collect_parts()
            time.sleep(POLL_SECONDS)
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST, status=status):
            self.handle(status.Get_source() - self.layout.servers)
        if self.index == 0:
            while self.next_report < self.epochs:
                self.collect_parts(block=True)
        MPI.Request.Waitall([request for request, _ in self.sends])
        self.sends = []

    # -- epoch snapshots (for the per-epoch log on rank 0) ----------------------------------------
    def take_snapshots(self):
        """Snapshot the shard when every live worker has pushed the end of the next epoch."""
        while self.next_snapshot < self.epochs and all(self.epochs_done[w] > self.next_snapshot
                                                       for w in self.live()):
            # A worker dropped before finishing this epoch would otherwise delay the snapshot until
            # the timeout; take the shard as it was when the last surviving worker finished instead.
            shard, until = self.candidates.pop(self.next_snapshot, (backend.to_numpy(self.param.data).copy(),
                                                                     len(self.updates)))
            window = self.updates[self.snapshot_from:until]
            part = {"epoch": self.next_snapshot, "server": self.index, "params": shard,
                    "updates": len(window),   # every push reaches every server: server 0's staleness is the log's
                    "staleness": [u.staleness for u in window] if self.index == 0 else [],
                    "clock_staleness": [u.clock_staleness for u in window] if self.index == 0 else []}
            self.snapshot_from = until
            self.next_snapshot += 1
            if self.index == 0:
                self.receive_part(part)
            else:
                self.sends.append((self.comm.isend(part, dest=0, tag=TAG_SNAPSHOT), part))

    def collect_parts(self, block=False):
        if self.index != 0:
            return
        while block or self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_SNAPSHOT):
            self.receive_part(self.comm.recv(source=MPI.ANY_SOURCE, tag=TAG_SNAPSHOT))
            block = False

    def receive_part(self, part):
        self.parts.setdefault(part["epoch"], {})[part["server"]] = part
        while len(self.parts.get(self.next_report, ())) == self.layout.servers:
            parts = [self.parts[self.next_report][k] for k in range(self.layout.servers)]
            del self.parts[self.next_report]
            if self.on_epoch is not None:
                params = numpy.concatenate([part["params"] for part in parts])
                staleness = numpy.array(parts[0]["staleness"], dtype=numpy.int64)
                clock_staleness = numpy.array(parts[0]["clock_staleness"], dtype=numpy.int64)
                loss_sum, batches = self.loss.get(self.next_report, (0.0, 0))
                self.on_epoch(self.next_report, params, loss_sum / max(batches, 1), staleness, clock_staleness)
            self.next_report += 1
