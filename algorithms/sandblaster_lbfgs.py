"""Sandblaster L-BFGS: a coordinator that holds only scalars, sharded vectors, backup tasks (Dean et al. 2012).

    mpiexec -n 4 python -m algorithms.sandblaster_lbfgs [--servers 1] [--portions 32] [--backup-threshold 0.9]
        [--push-every 4] [--history 10] [--max-iter 10] [--slow-worker R --slow-factor X] [--deterministic]
        [--problem least-squares]  (and the shared flags --model, --epochs, --lr, --seed, --log, --save, --quiet)

J. Dean et al., *Large Scale Distributed Deep Networks*, NIPS 2012, section 4.2 and figure 2 (right).
Roles, by rank (``Roles``): rank 0 is the **coordinator**, ranks 1 .. S the parameter-server
**shards**, ranks S+1 .. p-1 the **workers** (model replicas); so p >= S + 2.

    flat vectors   w, g, d, s_i, y_i, ...   [  shard 1  |  shard 2  | ... |  shard S  ]   (on the servers)
    coordinator    issues commands; receives one number per shard and command (a dot product's
                   partial sum, a max, an acknowledgement); never a vector
    workers        fetch w at the start of a batch; gradients of small portions; push every few

The coordinator runs ``minidl.optim.LBFGS.step`` line for line, but every vector operation is a
command that each shard performs on its own slice, and every inner product is a sum of the
shards' partial sums (``Shards.dot``). The L-BFGS history (s_i, y_i) lives on the shards beside
the parameters, so the two-loop recursion (``sharded_direction``, the heart) is

    q = g                                            copy         (each shard, its slice)
    for i = k-1 .. 0:  rho_i = 1 / <y_i, s_i>        dot          (S partial sums -> coordinator)
                       a_i = rho_i <s_i, q>          dot
                       q <- q - a_i y_i              axpy         (each shard, its slice)
    q <- (<s_{k-1}, y_{k-1}> / <y_{k-1}, y_{k-1}>) q scale
    for i = 0 .. k-1:  b = rho_i <y_i, q>;  q <- q + (a_i - b) s_i
    d = -q

The step rule is the serial optimizer's, exactly: the backtracking (Armijo) line search of
``minidl.optim.LBFGS`` (largest t in {lr, lr/2, ...} with f(w + t d) <= f(w) + 1e-4 t <g, d>, the
last one tried if all 30 fail; a fresh history's first t scaled by min(1, 1/||g||_1)), its restart
on a non-descent direction, its curvature rule (keep (s, y) only if <s, y> > 1e-10) and its stopping
tests. Why not the paper's fixed schedule: the same rule lets a test tie the distributed run to
serial L-BFGS to 1e-10, and full-batch L-BFGS needs a line search to be safe (each trial point is
one more batch, exactly where load balancing pays). An epoch is one ``LBFGS.step(closure)`` of up
to ``--max-iter`` iterations and one --log record (the last with the final test metrics).

A batch (one evaluation of f and g at a trial point, the full training set here) is cut into
``--portions`` contiguous pieces, many more than workers; the coordinator hands them out one at
a time to whichever worker asks (load balancing, ``Batch``). A worker reports each finished
portion (its loss, a number) and the coordinator answers keep or discard and, every
``--push-every`` kept portions (or when no work is left for it, or near the batch's end), push:
the worker sends its accumulated gradient slices to the shards, which add them up. Backup tasks:
once a fraction ``--backup-threshold`` of the portions is finished, an idle worker receives a
copy of an outstanding portion (one still being computed, or finished but not yet pushed); the
first copy *pushed* wins, later copies are discarded and counted (a worker whose accumulator
holds a portion that someone else pushed drops the whole accumulator: a sum cannot be taken
apart; its other portions go back to the queue). ``--slow-worker R --slow-factor X`` makes
worker rank R take X times as long per portion (it sleeps), to inject a straggler; at the end the
coordinator's stop cancels whatever a worker is still on, so the job does not wait for it.
``--deterministic``: portion i goes to worker i mod W only and there are no backups, so the run
is bit-for-bit reproducible (shards add the workers' accumulators in worker order).

Cost per batch (n parameters, S shards, P portions, W workers, b bytes per value): each worker
fetches n b bytes once; pushes carry at most n b bytes per ``--push-every`` portions per worker
(at least W n b in all); the coordinator exchanges 2 small messages per portion with the
workers and 2 S (reductions) or S (vector commands) small messages per command with the shards,
about 8 k + 20 commands per iteration for a history of k pairs. No vector ever passes through it.

Restrictions: p >= S + 2; S <= n; W <= --portions <= training examples; 0 < --backup-threshold
<= 1 (1: no backups; below 1 only with W >= 2); --slow-worker (a worker rank) and --slow-factor
(>= 1) only together; --model and --dataset not with --problem; --batch-size is refused (a batch
is the training set); --resume is refused (the history would have to be saved too).
Errors: a bad flag stops every rank before the first message (``run.start``); a non-finite loss,
or one 100 x the first (``run.check_divergence``), makes the coordinator stop every worker and
shard and every rank raise the same error; an exception in any role prints ``error: ...`` and
aborts the job (``MPI.Abort(2)``): the other roles would wait for that rank's messages forever.

Defaults (MLP on the embedded digits, 1 shard and 2 workers at -n 4, 32 portions, push every 4,
backups at 0.9, history 10, 10 epochs x 10 iterations, lr 1), measured on 2 shared cores: 95.8% and
95.3% test accuracy in two runs (training loss below 1e-4; the line search's loss stops changing
after 78 iterations), 15 to 16 s, 77 MB sent in all. ``--problem least-squares`` (512 x 32): the
loss is within 5e-14 of the optimum's after 4 epochs of 5 iterations (tutorials/figures/
make_07_figures.py --part compare; chapter 7 has the comparison with Downpour and the straggler).
"""
import collections
import math
import time

import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli, run, tags
from algorithms.core.objective import evaluate_at
from algorithms.ps.wire import shard_ranges
from collectives.trace import CountingComm, TracedComm
from minidl import backend
from minidl.data import least_squares

CMD, REPLY, REPORT, WORK, PUSH, PUSH_DATA, FETCH, PARAMS = (tags.SB_CMD, tags.SB_REPLY, tags.SB_REPORT, tags.SB_WORK,
                                                           tags.SB_PUSH, tags.SB_PUSH_DATA, tags.SB_FETCH, tags.SB_PARAMS)
POLL_SECONDS = 0.0002                    # sleep between probes: ranks share the cores
CURVATURE = 1e-10                        # minidl.optim.LBFGS keeps (s, y) only if <s, y> > this


def wait_for(comm, source, tag):
    """Probe until a message from ``source`` with ``tag`` is there (sleeping, not spinning); its source."""
    status = MPI.Status()
    while not comm.Iprobe(source=source, tag=tag, status=status):
        time.sleep(POLL_SECONDS)
    return status.Get_source()


class Roles:
    """Rank 0 coordinates, ranks 1 .. S serve the shards, ranks S+1 .. p-1 work."""

    def __init__(self, size, servers, n_params):
        if size < servers + 2:
            raise cli.SettingError(f"{size} ranks cannot hold a coordinator, {servers} server(s) and a worker; "
                                   f"run with mpiexec -n {servers + 2} or more, or fewer --servers")
        self.size, self.servers = size, servers
        self.ranges = shard_ranges(n_params, servers)
        self.server_ranks = list(range(1, servers + 1))
        self.worker_ranks = list(range(servers + 1, size))
        self.workers = len(self.worker_ranks)

    def role(self, rank):
        return "coordinator" if rank == 0 else "server" if rank <= self.servers else "worker"


# ---- the coordinator's handle on the shards: commands out, numbers back ------------------------------

class Shards:
    """Commands to every shard. ``dot``, ``max_abs``, ``norm1`` return a number reduced from one
    partial result per shard (added in shard order); the vector commands return nothing and need
    no answer: each shard performs them in the order sent (MPI keeps one sender's order)."""

    def __init__(self, comm, server_ranks):
        self.comm, self.ranks = comm, server_ranks

    def order(self, op, **args):
        for rank in self.ranks:
            self.comm.send((op, args), dest=rank, tag=CMD)

    def ask(self, op, **args):
        """Send the command, then collect each shard's number, in shard order."""
        self.order(op, **args)
        return [self.comm.recv(source=wait_for(self.comm, rank, REPLY), tag=REPLY) for rank in self.ranks]

    def dot(self, a, b):
        return sum(self.ask("dot", a=a, b=b))

    def max_abs(self, a):
        return max(self.ask("max_abs", a=a))

    def norm1(self, a):
        return sum(self.ask("norm1", a=a))

    def copy(self, target, source, factor=1.0):
        self.order("copy", target=target, source=source, factor=factor)

    def axpy(self, alpha, x, y):
        self.order("axpy", alpha=alpha, x=x, y=y)

    def scale(self, name, factor):
        self.order("scale", name=name, factor=factor)


def sharded_direction(shards, pairs):
    """d <- -H g on the shards, by the two-loop recursion (the heart); ``pairs`` = k, the history's length.

    The vectors are named: "g", "q", "d", and ("s", i), ("y", i) for the i-th oldest pair. Only
    numbers come back to the caller; every vector operation happens on the shards.
    """
    # BEGIN SOLUTION
    # q = g
    shards.copy("q", "g")
    # first loop, newest pair first: rho_i = 1/<y_i, s_i>, a_i = rho_i <s_i, q>, q <- q - a_i y_i
    alphas, rhos = [], []
    for i in reversed(range(pairs)):
        rho = 1.0 / shards.dot(("y", i), ("s", i))
        alpha = rho * shards.dot(("s", i), "q")
        shards.axpy(-alpha, ("y", i), "q")
        alphas.append(alpha)
        rhos.append(rho)
    # the initial Hessian: gamma = <s, y> / <y, y> of the newest pair
    if pairs:
        newest = pairs - 1
        shards.scale("q", shards.dot(("s", newest), ("y", newest)) / shards.dot(("y", newest), ("y", newest)))
    # second loop, oldest pair first: b = rho_i <y_i, q>, q <- q + (a_i - b) s_i
    for i, alpha, rho in zip(range(pairs), reversed(alphas), reversed(rhos)):
        beta = rho * shards.dot(("y", i), "q")
        shards.axpy(alpha - beta, ("s", i), "q")
    # the direction: d = -q
    shards.copy("d", "q", factor=-1.0)
    # END SOLUTION


# ---- a parameter-server shard: its slices, its part of the history, the pushes --------------------

class Shard:
    """Server of one slice: w, g, d, the trial point, the history, and the workers' accumulators."""

    def __init__(self, comm, roles, index, initial, history_size):
        self.comm, self.roles, self.history_size = comm, roles, history_size
        start, stop = roles.ranges[index]
        w = numpy.array(backend.to_numpy(initial)[start:stop], copy=True)
        self.vectors = {name: numpy.zeros_like(w) for name in ("g", "d", "q", "s", "y", "new_g")}
        self.vectors["w"], self.vectors["trial"] = w, w.copy()
        self.s_history, self.y_history = [], []
        self.accrued = numpy.zeros((roles.workers, w.size), dtype=w.dtype)   # one per worker: a fixed sum order
        self.received, self.expected = 0, None                               # portions pushed, this batch
        self.pending = []                                                    # Isends and their buffers

    def vector(self, name):
        if isinstance(name, tuple):                                           # ("s", i) / ("y", i)
            return (self.s_history if name[0] == "s" else self.y_history)[name[1]]
        return self.vectors[name]

    def command(self, op, args):
        """Perform one command; return the number to send back, or None if the command needs none."""
        v = self.vector
        if op == "dot":
            return float((v(args["a"]) * v(args["b"])).sum())
        if op == "max_abs":
            return float(abs(v(args["a"])).max())
        if op == "norm1":
            return float(abs(v(args["a"])).sum())
        if op == "bytes":                        # for the log: what this shard has sent so far
            return float(self.comm.bytes_sent)
        if op == "copy":
            v(args["target"])[...] = v(args["source"]) if args["factor"] == 1.0 else args["factor"] * v(args["source"])
        elif op == "axpy":
            v(args["y"])[...] += args["alpha"] * v(args["x"])
        elif op == "scale":
            v(args["name"])[...] *= args["factor"]
        elif op == "begin":                      # a new batch at w + t d (t None: at w)
            t = args["t"]
            self.vectors["trial"][...] = self.vectors["w"] if t is None else self.vectors["w"] + t * self.vectors["d"]
            self.accrued[...] = 0
            self.received, self.expected = 0, None
            return 0.0                           # an acknowledgement: workers may fetch now
        elif op == "finish":                     # answered once every portion's gradient is in
            self.expected = args["portions"]
        elif op == "take_gradient":              # g <- new_g (the start of an epoch)
            self.vectors["g"][...] = self.vectors["new_g"]
        elif op == "accept":                     # s = t d, y = new_g - g; <s, y> back
            self.vectors["s"][...] = args["t"] * self.vectors["d"]
            self.vectors["y"][...] = self.vectors["new_g"] - self.vectors["g"]
            return float((self.vectors["s"] * self.vectors["y"]).sum())
        elif op == "remember":                   # the pair joins the history; the oldest leaves
            self.s_history.append(self.vectors["s"].copy())
            self.y_history.append(self.vectors["y"].copy())
            del self.s_history[:-self.history_size], self.y_history[:-self.history_size]
        elif op == "forget":
            self.s_history, self.y_history = [], []
        elif op == "advance":                    # w <- w + s, g <- new_g
            self.vectors["w"] += self.vectors["s"]
            self.vectors["g"][...] = self.vectors["new_g"]
        else:
            raise ValueError(f"unknown command {op!r}")
        return None

    def finish_if_complete(self):
        if self.expected is not None and self.received == self.expected:
            total = self.vectors["new_g"]
            total[...] = 0
            for row in self.accrued:             # worker order: the same sum whoever pushed first
                total += row
            self.expected = None
            self.comm.send(0.0, dest=0, tag=REPLY)

    def serve(self):
        """Answer commands, pushes and fetches until the coordinator says stop."""
        status = MPI.Status()
        while True:
            if not self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
                time.sleep(POLL_SECONDS)
                continue
            source, tag = status.Get_source(), status.Get_tag()
            if tag == CMD:
                op, args = self.comm.recv(source=0, tag=CMD)
                if op == "stop":
                    break
                answer = self.command(op, args)
                if answer is not None:
                    self.comm.send(answer, dest=0, tag=REPLY)
            elif tag == PUSH:
                portions = self.comm.recv(source=source, tag=PUSH)
                slice_ = numpy.empty_like(self.vectors["w"])
                self.comm.Recv(slice_, source=source, tag=PUSH_DATA)
                self.accrued[self.roles.worker_ranks.index(source)] += slice_
                self.received += portions
            elif tag == FETCH:
                self.comm.recv(source=source, tag=FETCH)
                trial = self.vectors["trial"].copy()          # a later batch must not change what is sent
                self.pending.append((self.comm.Isend(trial, dest=source, tag=PARAMS), trial))
            else:
                raise RuntimeError(f"server got an unexpected message (tag {tag}) from rank {source}")
            self.finish_if_complete()
        MPI.Request.Waitall([request for request, _ in self.pending])
        return self.vectors["w"]


# ---- the coordinator's bookkeeping of one batch: portions, pushes, backup tasks ---------------------

class Batch:
    """Which portion goes to whom, which result is kept, when to push, when to issue backups.

    A portion is *finished* by a worker when reported, and *done* when pushed to the shards: the
    first push wins. ``report`` answers (keep, drop, push): keep the portion's gradient, drop the
    whole accumulator first (it holds a portion that another worker pushed), push the
    accumulator now (how many portions it holds). ``next_for`` is the next portion for a worker,
    a backup copy of an outstanding one near the end, or None (wait).
    """

    def __init__(self, number, portions, workers, threshold, push_every, deterministic):
        self.number, self.portions, self.threshold, self.push_every = number, portions, threshold, push_every
        self.deterministic = deterministic
        if deterministic:                        # portion i -> worker i mod W, in order
            self.queues = [collections.deque(range(w, portions, workers)) for w in range(workers)]
        else:
            self.queue = collections.deque(range(portions))
        self.running = collections.defaultdict(set)          # portion -> workers computing it
        self.held = collections.defaultdict(list)            # worker -> [(portion, loss)] not yet pushed
        self.done, self.losses = set(), {}
        self.discarded = self.backups = 0

    def pending(self, worker):
        return self.queues[worker] if self.deterministic else self.queue

    def finished(self):
        return self.done | {portion for held in self.held.values() for portion, _ in held}

    def in_tail(self):
        return len(self.finished()) >= self.threshold * self.portions

    def report(self, worker, portion, loss):
        self.running[portion].discard(worker)
        drop = any(p in self.done for p, _ in self.held[worker])
        if drop:                                 # someone pushed one of ours first: the sum is spoilt
            for p, _ in self.held[worker]:
                if p in self.done:
                    self.discarded += 1
                elif not self.running[p] and not any(p == q for w, held in self.held.items() if w != worker
                                                     for q, _ in held):
                    self.pending(worker).appendleft(p)         # nobody else has it: back to the queue
            self.held[worker] = []
        keep = portion not in self.done
        if keep:
            self.held[worker].append((portion, loss))
        else:
            self.discarded += 1
        push = 0
        held = self.held[worker]
        if held and (len(held) >= self.push_every or self.in_tail() or not self.pending(worker)):
            for p, portion_loss in held:         # pushed: done, and this copy's loss is the one counted
                self.done.add(p)
                self.losses[p] = portion_loss
            push, self.held[worker] = len(held), []
        return keep, drop, push

    def next_for(self, worker):
        queue = self.pending(worker)
        if queue:
            portion = queue.popleft()
        elif self.deterministic or self.threshold >= 1 or not self.in_tail():
            return None
        else:                                    # a backup copy of an outstanding portion
            holders = collections.Counter(p for held in self.held.values() for p, _ in held)
            outstanding = [p for p in range(self.portions) if p not in self.done
                           and worker not in self.running[p] and p not in dict(self.held[worker])]
            if not outstanding:
                return None
            portion = min(outstanding, key=lambda p: (len(self.running[p]) + holders[p], p))
            self.backups += 1
        self.running[portion].add(worker)
        return portion

    def complete(self):
        return len(self.done) == self.portions

    def close(self):
        """The batch is over: results still held or being computed will be discarded."""
        self.discarded += sum(map(len, self.held.values())) + sum(map(len, self.running.values()))


class Coordinator:
    """Rank 0: runs L-BFGS on the shards (numbers only) and schedules the workers' portions."""

    def __init__(self, comm, roles, options, log):
        self.comm, self.roles, self.options, self.log = comm, roles, options, log
        self.shards = Shards(comm, roles.server_ranks)
        self.batch, self.number, self.idle = None, 0, []   # idle: workers waiting for a portion
        self.discarded = self.backups = self.evaluations = 0
        self.batch_seconds, self.worker_bytes = [], [0] * roles.workers   # worker_bytes: as last reported
        self.failure = self.reference = self.final = None   # why it stopped early; f(w0); the last epoch's record

    # -- one batch: f and g at w + t d, from the workers ----------------------------------------------
    def evaluate(self, t):
        o = self.options
        started = time.perf_counter()
        self.shards.ask("begin", t=t)            # every shard has its trial point before anyone fetches
        self.number += 1
        self.batch = Batch(self.number, o["portions"], self.roles.workers, o["threshold"], o["push_every"],
                           o["deterministic"])
        self.give_work()
        while not self.batch.complete():
            self.handle(self.next_report())
        self.shards.ask("finish", portions=o["portions"])     # answered when every pushed gradient is in
        self.batch.close()
        self.discarded += self.batch.discarded
        self.backups += self.batch.backups
        self.evaluations += 1
        self.batch_seconds.append(time.perf_counter() - started)
        return sum(self.batch.losses[p] for p in range(o["portions"]))   # portion order: reproducible

    def next_report(self):
        source = wait_for(self.comm, MPI.ANY_SOURCE, REPORT)
        return source, self.comm.recv(source=source, tag=REPORT)

    def handle(self, report):
        rank, message = report
        worker = self.roles.worker_ranks.index(rank)
        self.worker_bytes[worker] = message["bytes"]
        reply = {"keep": False, "drop": False, "push": 0, "portion": None, "batch": None, "stop": False}
        if message["batch"] is not None and message["batch"] != self.batch.number:
            reply["drop"] = True                 # a result of a closed batch: discarded, counted at the close
        elif message["batch"] is not None:
            reply["keep"], reply["drop"], reply["push"] = self.batch.report(worker, message["portion"],
                                                                            message["loss"])
        portion = None if self.batch.complete() else self.batch.next_for(worker)
        reply["portion"], reply["batch"] = portion, self.batch.number
        self.comm.send(reply, dest=rank, tag=WORK)
        if portion is None:
            self.idle.append(worker)
        self.give_work()                          # a report may open the tail: backups for the idle

    def give_work(self):
        for worker in list(self.idle):
            portion = None if self.batch.complete() else self.batch.next_for(worker)
            if portion is not None:
                self.idle.remove(worker)
                self.comm.send({"keep": False, "drop": False, "push": 0, "portion": portion,
                                "batch": self.batch.number, "stop": False},
                               dest=self.roles.worker_ranks[worker], tag=WORK)

    def stop(self):
        """Every worker told to stop at once, also one still on a portion (a straggler is not waited for);
        late reports are read up to each worker's last, "stopped"; then every shard is told to stop."""
        for rank in self.roles.worker_ranks:
            self.comm.send({"stop": True, "drop": True}, dest=rank, tag=WORK)
        stopped = 0
        while stopped < self.roles.workers:
            stopped += bool(self.next_report()[1].get("stopped"))
        self.shards.order("stop")

    # -- L-BFGS: minidl.optim.LBFGS.step, line for line, on the shards ----------------------------------
    def train(self, epochs):
        """L-BFGS for ``epochs``; then every worker and shard is told to stop, also after a non-finite loss."""
        try:
            self.lbfgs(epochs)
        except run.Diverged as diverged:         # raised on every rank after the stop (collect)
            self.failure = str(diverged)
        self.stop()

    def check(self, loss, iteration):
        """Diverged on a nan or inf loss, or on one more than 100 x the start's (``run.check_divergence``)."""
        if not math.isfinite(loss):
            raise run.Diverged(f"loss became {'nan' if math.isnan(loss) else 'inf'} at L-BFGS iteration "
                               f"{iteration}; lower --lr or check the data")
        self.reference = loss if self.reference is None else self.reference
        run.check_divergence(loss, self.reference, f"L-BFGS iteration {iteration}'s")

    def lbfgs(self, epochs):
        o, shards = self.options, self.shards
        pairs, steps = 0, 0
        for epoch in range(epochs):
            loss = self.evaluate(None)                          # f(w), g(w)
            self.check(loss, steps)
            shards.order("take_gradient")
            for _ in range(o["max_iter"]):
                if shards.max_abs("g") <= o["tolerance_grad"]:
                    break
                sharded_direction(shards, pairs)                # d = -H g
                slope = shards.dot("g", "d")
                if slope >= 0:                                  # not a descent direction: restart from -g
                    shards.order("forget")
                    pairs = 0
                    shards.copy("d", "g", factor=-1.0)
                    slope = -shards.dot("g", "g")
                t = o["lr"] if pairs else min(1.0, 1.0 / shards.norm1("g")) * o["lr"]
                for trial in range(o["max_backtracks"]):      # if every trial fails, the last is taken
                    t = t if trial == 0 else 0.5 * t
                    new_loss = self.evaluate(t)
                    if new_loss <= loss + 1e-4 * t * slope:
                        break
                if sum(shards.ask("accept", t=t)) > CURVATURE:      # s = t d, y = new_g - g; <s, y>
                    shards.order("remember")
                    pairs = min(pairs + 1, o["history"])
                shards.order("advance")                         # w <- w + s, g <- new_g
                change, loss = abs(new_loss - loss), new_loss
                self.check(loss, steps)
                steps += 1
                if change <= o["tolerance_change"]:
                    break
            sent = self.comm.bytes_sent + sum(shards.ask("bytes")) + sum(self.worker_bytes)
            record = dict(epoch=epoch + 1, train_loss=loss, iterations=steps, evaluations=self.evaluations,
                          backups=self.backups, discarded=self.discarded, bytes=int(sent),
                          seconds=round(time.perf_counter() - self.log.started, 3))
            if epoch + 1 < epochs:                              # the last: collect logs it, with the test metrics
                self.log.epoch(**record)
            self.final = record


# ---- a worker: portions of each batch, pushed every few ----------------------------------------------

def work(comm, roles, objective, options, rows):
    """Ask for portions until told to stop; returns how many portions this worker computed."""
    rank, n = comm.Get_rank(), objective.n
    accrued, computed = numpy.zeros_like(backend.to_numpy(objective.grad)), 0
    fetched, slow = None, options["slow_factor"] if rank == options["slow_worker"] else 1.0
    report = {"batch": None, "portion": None, "loss": None, "bytes": 0}
    host = numpy.empty_like(accrued)
    while True:
        if report is not None:
            comm.send(report, dest=0, tag=REPORT)
        wait_for(comm, 0, WORK)
        reply = comm.recv(source=0, tag=WORK)
        if reply.get("drop"):
            accrued[...] = 0
        if reply.get("keep"):
            accrued += host
        if reply.get("push"):                    # the accumulated gradient, one slice per shard
            for server, (start, stop) in zip(roles.server_ranks, roles.ranges):
                comm.send(reply["push"], dest=server, tag=PUSH)
                comm.Send(accrued[start:stop], dest=server, tag=PUSH_DATA)
            accrued[...] = 0
        while not reply["stop"] and reply["portion"] is None:   # nothing to do yet: wait for work
            wait_for(comm, 0, WORK)
            reply = comm.recv(source=0, tag=WORK)
        if reply["stop"]:
            comm.send({"stopped": True}, dest=0, tag=REPORT)      # the last message to the coordinator
            return computed
        if reply["batch"] != fetched:            # a new batch: fetch its parameters from every shard
            for server in roles.server_ranks:
                comm.send(None, dest=server, tag=FETCH)
            params = numpy.empty_like(accrued)
            for server, (start, stop) in zip(roles.server_ranks, roles.ranges):
                wait_for(comm, server, PARAMS)
                comm.Recv(params[start:stop], source=server, tag=PARAMS)
            objective.params[...] = backend.asarray(params)
            fetched = reply["batch"]
        began = time.perf_counter()
        index = rows[reply["portion"]]
        loss = objective.loss_and_grad(index) * len(index) / n          # this portion's share of the mean
        host[...] = backend.to_numpy(objective.grad) * (len(index) / n)
        computed += 1
        until = time.perf_counter() + (slow - 1) * (time.perf_counter() - began)   # the injected straggler
        while time.perf_counter() < until and not comm.Iprobe(source=0, tag=WORK):
            time.sleep(POLL_SECONDS)
        report = None if comm.Iprobe(source=0, tag=WORK) else {   # a WORK message now can only be the stop
            "batch": reply["batch"], "portion": reply["portion"], "loss": loss, "bytes": comm.bytes_sent}


# ---- train / main -----------------------------------------------------------------------------------

def abort_on_error(comm, role, function, *args):
    """``function(*args)``; an exception stops the job (MPI.Abort) instead of leaving the others waiting."""
    try:
        return function(*args)
    except Exception as error:                   # noqa: BLE001 - the other roles wait for this rank
        if comm.Get_size() == 1:
            raise
        cli.abort_job(comm, f"{error} ({type(error).__name__} in the {role} on rank {comm.Get_rank()})")


def train(comm=None, servers=1, portions=32, backup_threshold=None, push_every=4, history=10, max_iter=10,
          max_backtracks=30, tolerance_grad=1e-7, tolerance_change=1e-12, slow_worker=None, slow_factor=None,
          deterministic=False, report=None, **settings):
    """Sandblaster L-BFGS on ``comm``; returns (final flat parameters, per-epoch history) on every rank.

    ``settings`` are ``run.Settings`` (lr is L-BFGS's first trial step, 1 by default). ``report``
    (a dict) receives the coordinator's traced messages, the batch times, backups and discarded
    results, the bytes sent, and each worker's count of computed portions.
    """
    comm = comm or MPI.COMM_WORLD
    batch_size = settings.pop("batch_size", None)        # refused below: the batch is the training set
    unused = [f"--{name.replace('_', '-')}" for name in ("model", "dataset", "data_dir")   # beside a problem
              if settings.get(name) is not None] if settings.get("problem") is not None else []
    settings = {name: value for name, value in settings.items() if not (value is None and name in ("model", "dataset"))}
    settings = run.Settings.of(settings, epochs=10, lr=1.0, momentum=0.0, model="mlp")
    size, rank = comm.Get_size(), comm.Get_rank()
    threshold = (1.0 if deterministic else 0.9) if backup_threshold is None else backup_threshold
    roles = None

    def check(settings):
        nonlocal roles
        if batch_size is not None:
            raise cli.SettingError("--batch-size is not used by sandblaster_lbfgs: every batch is the whole training "
                                   "set, cut into --portions pieces")
        if settings.resume:
            raise cli.SettingError("--resume is not offered by sandblaster_lbfgs: the L-BFGS history lives on the "
                                   "servers and is not saved")
        cli.require("--servers", servers, integer=True, low=1)
        cli.require("--portions", portions, integer=True, low=1)
        cli.require("--backup-threshold", threshold, low=0, high=1, low_open=True)
        cli.require("--push-every", push_every, integer=True, low=1)
        cli.require("--history", history, integer=True, low=1)
        cli.require("--max-iter", max_iter, integer=True, low=1)
        if unused:
            raise cli.SettingError(f"{', '.join(unused)} not used by sandblaster_lbfgs with --problem: the problem "
                                   "is the model and the data; leave out one or the other")
        if (slow_worker is None) != (slow_factor is None):
            raise cli.SettingError("--slow-worker R and --slow-factor X come together (worker R made X times slower); "
                                   f"got only {'--slow-factor' if slow_worker is None else '--slow-worker'}")
        cli.require("--slow-factor", 1.0 if slow_factor is None else slow_factor, low=1)
        if deterministic and threshold < 1:
            raise cli.SettingError("--deterministic hands portion i to worker i mod W and issues no backup tasks; "
                                   "leave out --backup-threshold")
        roles = Roles(size, servers, servers)    # the rank count alone; the parameters come below
        if portions < roles.workers:
            raise cli.SettingError(f"--portions {portions} is fewer than the {roles.workers} workers "
                                   f"(ranks {roles.worker_ranks[0]}..{size - 1}): some would never work")
        if backup_threshold is not None and backup_threshold < 1 and roles.workers == 1:
            raise cli.SettingError(f"--backup-threshold {backup_threshold} needs 2 or more workers (a backup copy goes "
                                   f"to another worker); {size} ranks with --servers {servers} leave 1")
        if slow_worker is not None and slow_worker not in roles.worker_ranks:
            raise cli.SettingError(f"--slow-worker must be a worker rank ({roles.worker_ranks[0]}..{size - 1}; "
                                   f"rank 0 coordinates and ranks 1..{servers} serve), got {slow_worker}")

    job = run.start(comm, settings, check=check, writer=checkpoint.Writer("sandblaster_lbfgs"))
    error = None
    try:
        n = job.objective.n
        if portions > n:
            raise cli.SettingError(f"--portions {portions} is more than the {n} training examples")
        roles = Roles(size, servers, job.objective.params.size)
    except (cli.SettingError, ValueError) as caught:     # every rank computes the same: agreed below
        error = caught
    run.agree_on_errors(comm, error)

    options = dict(portions=portions, threshold=threshold, push_every=push_every, history=history, max_iter=max_iter,
                   max_backtracks=max_backtracks, tolerance_grad=tolerance_grad, tolerance_change=tolerance_change,
                   lr=settings.lr, deterministic=deterministic, slow_worker=slow_worker, slow_factor=slow_factor or 1.0)
    counting = CountingComm(comm)
    role = roles.role(rank)
    if role == "coordinator":
        traced = TracedComm(counting)
        coordinator = Coordinator(traced, roles, options, job.logger)
        abort_on_error(comm, role, coordinator.train, settings.epochs)
        mine = dict(failure=coordinator.failure, messages=traced.messages, batch_seconds=coordinator.batch_seconds,
                    backups=coordinator.backups, discarded=coordinator.discarded, evaluations=coordinator.evaluations,
                    final=coordinator.final)
    elif role == "server":
        shard = Shard(counting, roles, rank - 1, job.objective.params, history)
        mine = dict(shard=abort_on_error(comm, role, shard.serve))
    else:
        rows = numpy.array_split(numpy.arange(job.objective.n), portions)
        mine = dict(computed=abort_on_error(comm, role, work, counting, roles, job.objective, options, rows))
    mine["bytes"] = counting.bytes_sent
    return collect(comm, job, roles, mine, report)


def collect(comm, job, roles, mine, report):
    """After the run (not part of the algorithm): the shards' w joined on every rank, the log, --save."""
    gathered = comm.allgather(mine)
    if gathered[0]["failure"] is not None:       # a non-finite loss: the same error on every rank
        job.logger.close()
        raise run.Diverged(gathered[0]["failure"])
    params = numpy.concatenate([gathered[rank]["shard"] for rank in roles.server_ranks])
    job.logger.history = comm.bcast(job.logger.history, root=0)
    final = dict(gathered[0]["final"])           # the last epoch, with the test metrics of the joined parameters
    job.logger.epoch(epoch=final.pop("epoch"), train_loss=final.pop("train_loss"),
                     **evaluate_at(job.objective, params), **final)
    if report is not None:
        report.update(gathered[0], roles=roles, bytes=[part["bytes"] for part in gathered],
                      computed={rank: gathered[rank]["computed"] for rank in roles.worker_ranks})
    if job.settings.save:
        checkpoint.write(comm, job.settings.save, params, job.optimizer, job.settings.epochs, meta=job.meta)
    job.logger.close()
    return params, job.logger.history


def default_problem(seed=0):
    """The convex problem of ``--problem least-squares``: 512 rows, 32 features, float64."""
    return least_squares(512, 32, numpy.random.default_rng(seed))


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], epochs=10, lr=1.0, model=None, momentum=None)   # model: mlp
    parser.set_defaults(batch_size=None, dataset=None)   # given, refused (--model, --dataset: with --problem)
    parser.add_argument("--servers", type=int, default=1, help="parameter-server shards (ranks 1 .. S)")
    parser.add_argument("--portions", type=int, default=32, help="pieces of each batch, handed out one at a time")
    parser.add_argument("--backup-threshold", type=float, default=None,
                        help="fraction of portions finished before backup copies go out (1: none; default 0.9)")
    parser.add_argument("--push-every", type=int, default=4, help="kept portions accumulated before a push")
    parser.add_argument("--history", type=int, default=10, help="(s, y) pairs kept on the shards")
    parser.add_argument("--max-iter", type=int, default=10, help="L-BFGS iterations per epoch")
    parser.add_argument("--slow-worker", type=int, default=None, help="rank of a worker that is made slow")
    parser.add_argument("--slow-factor", type=float, default=None, help="how many times slower it is (>= 1)")
    parser.add_argument("--deterministic", action="store_true",
                        help="portion i to worker i mod W, no backups: bit-for-bit reproducible")
    parser.add_argument("--problem", choices=["least-squares"], default=None,
                        help="train a synthetic convex problem instead of --model")
    args = parser.parse_args(argv)
    cli.run_main(train, args, servers=args.servers, portions=args.portions, backup_threshold=args.backup_threshold,
                 push_every=args.push_every, history=args.history, max_iter=args.max_iter,
                 slow_worker=args.slow_worker, slow_factor=args.slow_factor, deterministic=args.deterministic,
                 problem=default_problem(args.seed) if args.problem and args.seed >= 0 else None)   # else refused


if __name__ == "__main__":
    main()
