"""A sharded parameter server (Dean et al. 2012, section 4.1; Li et al. 2014): what a server decides.

    mpiexec -n 4 python -m algorithms.downpour_sgd --servers 2     # the algorithms run on this server

Ranks 0 .. S-1 are servers, ranks S .. p-1 workers. Server k owns one contiguous range of the
flat parameter vector (``shard_ranges``; lengths differ by at most one):

    flat parameters   [  server 0  |  server 1  | ... |  server S-1  ]
    worker w          pushes grad[start_k:stop_k] to server k, fetches w[start_k:stop_k] from it

For its range only, a server keeps the parameters ``shard``, its own optimizer state (SGD, or
Adagrad, whose rate per parameter is lr / sqrt(sum of that parameter's squared gradients)), a
``version`` (pushes applied) and each worker's ``clock`` (that worker's pushes applied). It
serves whichever worker is ready:

    push(grad_k, read at)   apply_push: shard <- optimizer(shard, grad_k); version += 1; clock[w] += 1
    fetch                   answered with (shard, version) when ``may_answer``:
                              the start:  once every live worker has asked (all read the same w_0)
                              warm start: only worker 0, until it has pushed K steps
                              SSP:        only while clock[w] - min_j clock[j] <= s (``may_proceed``)
                            otherwise held until a push, a goodbye or a drop makes it true
    goodbye                 the worker has finished: its clock leaves the minimum

A push and the fetch that follows it travel as one request, so the server applies the push and
answers the fetch without serving anyone in between: that is what makes s = 0 exactly synchronous.

Deterministic mode (``schedule_seed``): the server serves its workers in an order drawn from the
seed, an epoch's end a barrier for every worker (``ps.schedule``): the run is replayable from its
log, and a run resumed after an epoch is the longer run bit for bit.

A lost worker: server 0 drops a live worker that it is not holding, that has no request waiting
in its queue, and that it has not heard from for ``timeout`` seconds of listening, and tells the
other servers, so all agree on who still trains. Silence is counted from the worker's last
request, on a clock that stops while server 0 is busy with the job's own work (``watch``:
evaluating for the log), so a server's slowness is never a worker's silence; nor does a worker
that waits for server 0 look silent to server 1, which leaves the decision to server 0.
Stopping: a worker whose loss is not finite says so in its goodbye, which reaches every server
(server 0 may also stop the job itself, ``stop``); from then on every fetch is answered STOP.

Cost per worker step with n_fetch = n_push = 1 (n parameters, S servers, b bytes each):
2 S messages of n/S b bytes (push, reply) plus 2 S small ones; each server receives and sends
n/S b bytes per worker step, so S servers split the bandwidth that one server would need.
The messages themselves are ``ps.wire``'s.
"""
import dataclasses
import time

import numpy

from algorithms.core import run
from algorithms.ps import wire
from algorithms.ps.schedule import Schedule
from algorithms.ps.wire import Layout, shard_ranges  # noqa: F401 - the servers' layout, read here
from minidl import backend
from minidl.optim import SGD, Adagrad
from minidl.tensor import Parameter


def may_proceed(clock, clocks, staleness):
    """The stale-synchronous condition (Ho et al. 2013): clock - min(clocks) <= staleness.

    ``clock`` is the asking worker's clock (its pushes applied), ``clocks`` those of every worker
    still training (the asking one included). staleness None means no bound (asynchronous).
    """
    # BEGIN SOLUTION
    # no bound, or at most `staleness` clocks ahead of the slowest worker still training
    return staleness is None or clock - min(clocks) <= staleness
    # END SOLUTION


def server_optimizer(name, param, lr, momentum=0.0):
    """The optimizer a server applies pushes with: 'sgd' (with momentum) or 'adagrad'."""
    if name == "adagrad":
        return Adagrad([param], lr=lr)
    if name == "sgd":
        return SGD([param], lr=lr, momentum=momentum)
    raise ValueError(f"--server-optimizer must be 'sgd' or 'adagrad', got {name!r}")


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
    """Server ``comm.rank`` of ``layout``: owns shard ``layout.ranges[rank]`` of ``initial``.

    ``log`` lists what it did, in order: ("push", Update), ("fetch", worker, version),
    ("goodbye", worker), ("drop", worker). ``watch(server)`` is called between requests: what the
    job does beside serving (rank 0's per-epoch log), kept out of the server's algorithm.

    ``epoch_ends``: (worker, epoch) -> the worker's clock at that epoch's end, the deterministic schedule's
    barriers (``ps.schedule``).

    ``replica_indices`` (model-parallel replicas, ``layout.replica_size`` k > 1): for each position j
    of a replica, the sorted flat indices that rank j of every replica owns (``ps.replica``). A
    worker is then a replica: its request is the requests of those of its ranks that own indices
    of this shard (``senders``), each carrying the gradient of its own indices only, and each
    answered with the parameters at its own indices only.
    """

    def __init__(self, comm, layout, initial, optimizer="sgd", lr=0.05, momentum=0.0, staleness=None,
                 warm_start_steps=0, schedule_seed=None, timeout=None, optimizer_state=None, watch=None,
                 replica_indices=None, epoch_ends=None):
        self.comm, self.layout, self.index = comm, layout, comm.Get_rank()
        start, stop = layout.ranges[self.index]
        self.param = Parameter(backend.xp().asarray(backend.to_numpy(initial)[start:stop]).copy())
        self.param.grad = backend.xp().zeros_like(self.param.data)
        self.host_grad = numpy.empty(stop - start, dtype=backend.to_numpy(initial).dtype)
        self.senders = [(0, None, self.host_grad)]            # (position in the replica, my indices, buffer)
        if replica_indices is not None:
            self.senders = []
            for position, owned in enumerate(replica_indices):
                mine = owned[(owned >= start) & (owned < stop)] - start
                if mine.size:
                    self.senders.append((position, mine, numpy.empty(mine.size, dtype=self.host_grad.dtype)))
        self.optimizer = server_optimizer(optimizer, self.param, lr, momentum)
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self.staleness, self.warm_start_steps = staleness, warm_start_steps
        self.timeout = timeout if self.index == 0 else None   # server 0 decides drops for all
        self.schedule = Schedule(schedule_seed, epoch_ends) if schedule_seed is not None else None
        self.watch = watch or (lambda server: None)
        self.outbox = wire.Outbox(comm, layout)
        self.version, self.stopping = 0, None                 # stopping: the reason, once stopping
        self.failure = None                                   # an exception the algorithm raised
        workers = range(layout.workers)
        self.clock = {w: 0 for w in workers}
        self.steps = {w: 0 for w in workers}                  # steps (not pushes) applied per worker
        self.finished, self.dropped = set(), {}              # dropped: worker -> (steps, silent seconds)
        self.waiting = {}                                     # worker -> its held fetch request
        self.checked_in, self.started = set(), False          # workers heard from; all of them yet?
        self.read = {w: (0, 0) for w in workers}             # (version, min clock) at w's last fetch
        self.log, self.updates = [], []                       # every event; the Updates alone
        self.busy = 0.0                                       # seconds spent in watch(): not listening
        self.last_heard = {w: self.listening() for w in workers}

    # -- the update: the heart of a parameter server -------------------------------------------
    def apply_push(self, worker, grad, request):
        """Apply one worker's gradient to this shard with the server's own optimizer, and log it.

            SGD:      shard <- shard - lr * grad
            Adagrad:  sum_sq <- sum_sq + grad^2;  shard <- shard - lr * grad / (sqrt(sum_sq) + eps)

        Both are elementwise, so S shards updated separately equal one optimizer on the whole vector.
        """
        # BEGIN SOLUTION
        # update: the server's optimizer, on this shard only (the worker's lr plays no part)
        self.param.grad[...] = backend.asarray(grad)
        self.optimizer.step()
        # log: the version the gradient was computed at, and the worker's clock staleness at that read
        version_read = request["version_read"][self.index]
        clock_staleness = self.clock[worker] - request["min_clock_read"][self.index]
        update = Update(worker, version_read, self.version, self.clock[worker], clock_staleness)
        self.log.append(("push", update))
        self.updates.append(update)
        # count: one more version of the shard, one more clock of this worker
        self.version += 1
        self.clock[worker] += 1
        self.steps[worker] += request["steps"]
        # END SOLUTION

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
        if self.schedule is not None and self.schedule.holds(worker, self.clock, self.live()):
            return False                                   # deterministic: an epoch's end is a barrier
        if worker != 0 and self.warm_start_steps and 0 in self.live() and self.steps[0] < self.warm_start_steps:
            return False
        return may_proceed(self.clock[worker], [self.clock[w] for w in self.live()], self.staleness)

    def answer_waiting(self):
        for worker in sorted(self.waiting):
            if worker not in self.waiting:                      # answered STOP by a failure just now
                continue
            if self.stopping is not None:
                del self.waiting[worker]
                self.reply(worker, wire.STOP)
            elif self.guarded(self.may_answer, worker):
                del self.waiting[worker]
                self.last_heard[worker] = self.listening()      # its silence starts now, not when it asked
                self.read[worker] = (self.version, min(self.clock[w] for w in self.live()))
                self.log.append(("fetch", worker, self.version))
                self.reply(worker, wire.OK)

    def reply(self, worker, status):
        shard = backend.to_numpy(self.param.data).copy()     # later pushes must not change what is sent
        for position, mine, _ in self.senders:               # a replica's ranks: each its own indices
            part = shard if mine is None else shard[mine]
            self.outbox.reply(self.layout.rank_of(worker) + position, self.version, self.read[worker][1], status, part)

    def receive(self, worker):
        """Worker's next request (it is there), its gradient in ``host_grad``; from each rank of a replica
        that owns indices of this shard, which together own all of them."""
        request = None
        for position, mine, buffer in self.senders:
            part = wire.receive_request(self.comm, self.layout.rank_of(worker) + position, buffer)
            if mine is not None and part["push"]:
                self.host_grad[mine] = buffer
            request = request or part
            request["stop"] = request["stop"] or part["stop"]
        return request

    def first_sender(self, worker):
        """The rank to probe for worker's next request here (a replica's first rank with indices here)."""
        return self.layout.rank_of(worker) + self.senders[0][0]

    # -- one request -----------------------------------------------------------------------------
    def handle(self, worker):
        """Receive worker's next request (it is there) and act on it."""
        request = self.receive(worker)
        self.last_heard[worker] = self.listening()
        self.checked_in.add(worker)
        if request["stop"] is not None:                        # a worker's loss was not finite
            self.stop(request["stop"])
        if worker in self.dropped or worker in self.finished:   # a late request from a dropped worker
            if request["fetch"]:
                self.reply(worker, wire.DROPPED)
            return
        if request["push"] and self.stopping is None:
            self.guarded(self.apply_push, worker, self.host_grad, request)
        if request["fetch"]:
            self.waiting[worker] = request
        if request["goodbye"]:
            self.finished.add(worker)
            self.log.append(("goodbye", worker))
        self.answer_waiting()

    def stop(self, reason, tell_servers=False):
        """Stop the job: every fetch from now on, and every one held now, is answered STOP."""
        if self.stopping is None:
            self.stopping = reason
            if tell_servers:
                self.outbox.tell_servers({"stop": reason})
        self.answer_waiting()

    def guarded(self, function, *args):
        """``function(*args)``; if it raises, the job stops instead of leaving workers waiting.

        Every held fetch and every later one is answered STOP, the workers say goodbye, and
        ``ps.loop.collect`` raises the exception on every rank (a course task's stub or a bug in
        the server's algorithm fails the run within a poll, not after a test's timeout).
        """
        try:
            return function(*args)
        except Exception as error:                   # noqa: BLE001 - raised on every rank at the end
            self.failure = self.failure or error
            self.stop(f"server {self.index} failed: {type(error).__name__}: {error}")
            return None

    def drop(self, worker, silent=None):
        self.dropped[worker] = (self.steps[worker], silent)
        self.log.append(("drop", worker))
        self.answer_waiting()                                   # a dropped clock no longer holds anyone back

    def listening(self):
        """Seconds this server has spent listening: a clock that stops while it is busy in watch()."""
        return time.monotonic() - self.busy

    def drop_silent(self):
        """Server 0: drop every live worker not held here, with no request waiting, silent too long."""
        if self.timeout is None:
            return
        # BEGIN SOLUTION
        for worker in self.live():
            # silence: listening seconds since its last request; a held worker waits on us, not silent
            silent = self.listening() - self.last_heard[worker]
            if worker in self.waiting or silent <= self.timeout:
                continue
            # a request already in its queue: not lost, only not yet heard
            if wire.waiting_request(self.comm, self.first_sender(worker)) is not None:
                self.last_heard[worker] = self.listening()      # it spoke; this server was slow to hear
                continue
            # drop it here and tell the other servers, so all agree on who still trains
            self.drop(worker, round(silent, 2))
            self.outbox.tell_servers({"drop": worker})
        # END SOLUTION

    def follow(self):
        """Servers 1 .. S-1: apply server 0's decisions (drops, stops) as they arrive."""
        for decision in wire.receive_all(self.comm, wire.CONTROL, source=0) if self.index else ():
            if "stop" in decision:
                self.stop(decision["stop"])
            elif decision["drop"] in self.live():
                self.drop(decision["drop"])

    # -- the serving loop --------------------------------------------------------------------------
    def between_requests(self):
        self.follow()
        self.guarded(self.drop_silent)
        busy_since = time.monotonic()
        self.watch(self)
        self.busy += time.monotonic() - busy_since

    def next_worker(self):
        """The worker whose request to handle next, or None if there is none yet."""
        if self.schedule is None or self.stopping is not None:
            rank = wire.waiting_request(self.comm)
            if rank is None:
                time.sleep(wire.POLL_SECONDS)
            return None if rank is None else self.layout.worker_of(rank)
        ready = sorted(w for w in self.live() if w not in self.waiting)   # deterministic: a seeded choice
        if not ready:
            raise RuntimeError(f"server {self.index}: every live worker is held; this is a bug")
        worker = self.schedule.draw(ready, self.clock, self.live(), self.started)
        while wire.waiting_request(self.comm, self.first_sender(worker)) is None:
            self.between_requests()
            if self.stopping is not None:
                return None
            time.sleep(wire.POLL_SECONDS)
        return worker

    def serve(self):
        """Serve until every worker has finished or been dropped; then wait for every rank."""
        while self.live():
            worker = self.next_worker()
            if worker is not None:
                self.handle(worker)
            self.between_requests()
        run.wait_together(self.comm, while_waiting=self.answer_late)
        self.answer_late()
        self.outbox.complete()

    def answer_late(self):
        """Answer requests of dropped workers that are still alive, and late decisions of server 0."""
        while (rank := wire.waiting_request(self.comm)) is not None:
            self.handle(self.layout.worker_of(rank))
        self.follow()
