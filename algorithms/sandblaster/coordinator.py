"""Rank 0 of Sandblaster L-BFGS: L-BFGS on the shards with numbers only, and the batches it schedules.

``Shards`` is the coordinator's handle on the parameter-server shards: every vector operation is a
command each shard performs on its own slice, every inner product the sum of the shards' partial
sums. ``Coordinator.lbfgs`` is ``minidl.optim.LBFGS.step`` line for line on that handle (the
direction from the two-loop recursion it is given, ``sharded_direction``); ``Coordinator.evaluate``
is one batch, f and g at a trial point, cut into portions that the workers ask for one at a time
(``Batch``: load balancing and backup tasks). algorithms/sandblaster_lbfgs.py explains both.
"""
import time

from mpi4py import MPI

from algorithms.core import divergence
from algorithms.ps.wire import wait_for
from algorithms.sandblaster.batch import Batch
from algorithms.sandblaster.wire import CMD, REPLY, REPORT, WORK

CURVATURE = 1e-10                        # minidl.optim.LBFGS keeps (s, y) only if <s, y> > this


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


class Coordinator:
    """Rank 0: runs L-BFGS on the shards (numbers only) and schedules the workers' portions."""

    def __init__(self, comm, roles, options, log, direction):
        self.comm, self.roles, self.options, self.log = comm, roles, options, log
        self.direction = direction                # d <- -H g on the shards (the heart: sharded_direction)
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
        except divergence.Diverged as diverged:         # raised on every rank after the stop (ps.loop.collect)
            self.failure = str(diverged)
        self.stop()

    def check(self, loss, iteration):
        """Diverged on a nan or inf loss, or on one more than 100 x the start's (``divergence.check_divergence``)."""
        if divergence.nonfinite(loss):
            raise divergence.loss_became(divergence.nonfinite(loss), f"L-BFGS iteration {iteration}")
        self.reference = loss if self.reference is None else self.reference
        divergence.check_divergence(loss, self.reference, f"L-BFGS iteration {iteration}'s")

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
                self.direction(shards, pairs)                   # d = -H g
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
            if epoch + 1 < epochs:                              # the last: train logs it, with the test metrics
                self.log.epoch(**record)
            self.final = record
