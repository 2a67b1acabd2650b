"""Rank 0's per-epoch log of a parameter-server job: not the servers' algorithm, it watches them.

A worker pushes at the end of each of its epochs (Downpour's flush), so worker w's epoch e ends
with its push number ``ends[w, e]``, known in advance (``ps.job.epoch_ends``). Each server
snapshots its shard right after the last of the live workers' epoch-e pushes (``watch``, called
by the server between requests) and sends it to rank 0 on its own tag; rank 0 joins the S
snapshots, evaluates them and logs epoch e with the mean training loss the workers report at
their epochs' ends. Asynchronous workers drift apart, so "epoch e" is the state after every
worker's epoch e, while the faster ones may already be into epoch e + 1. Rank 0 also stops the
job when an epoch's mean training loss is more than 100x the loss at the start
(``divergence.check_divergence``).
"""
import time

import numpy

from algorithms.core import divergence, objective as objectives
from algorithms.ps import wire
from minidl import backend


class EpochLog:
    """Each server's snapshots at epochs' ends, and rank 0's per-epoch log of them (see the header)."""

    def __init__(self, job, ends):
        self.job, self.layout = job, job.layout
        self.first, self.epochs = job.first_epoch, job.settings.epochs
        self.ends = ends                         # (worker, epoch) -> that worker's clock at its end
        self.ended_by = {(w, clock): epoch for (w, epoch), clock in self.ends.items()}
        self.next_snapshot = self.next_log = self.first
        self.seen = self.window_start = 0        # updates looked at; the first of the next window
        self.candidates = {}                     # epoch -> (shard, updates) after the latest push ending it
        self.parts, self.windows, self.reports = {}, {}, {}     # rank 0: epoch -> ...
        self.received, self.reference = 0, None
        self.reporters = range(self.layout.workers)   # the workers whose epoch reports make an epoch's loss

    def watch(self, server):
        """Called by the server between requests (so after at most one new push)."""
        for update in server.updates[self.seen:]:
            epoch = self.ended_by.get((update.worker, update.clock + 1))
            if epoch is not None:                # a worker's epoch ended with this push
                self.candidates[epoch] = (backend.to_numpy(server.param.data).copy(), len(server.updates))
        self.seen = len(server.updates)
        while self.next_snapshot < self.epochs and all(server.clock[w] >= self.ends[w, self.next_snapshot]
                                                       for w in server.live()):
            # A worker lost before the end of this epoch is not waited for: the snapshot is the shard
            # as the last surviving worker to end it left it (or as it is, if none did).
            shard, until = self.candidates.pop(self.next_snapshot, (backend.to_numpy(server.param.data).copy(),
                                                                     len(server.updates)))
            if server.index == 0:
                self.parts.setdefault(self.next_snapshot, {})[0] = shard
                self.windows[self.next_snapshot] = server.updates[self.window_start:until]
            else:
                server.outbox.send({"epoch": self.next_snapshot, "server": server.index, "shard": shard},
                                   0, wire.SNAPSHOT)
            self.window_start, self.next_snapshot = until, self.next_snapshot + 1
        if server.index == 0:
            self.receive()
            self.log_ready(server)

    def receive(self):
        for part in wire.receive_all(self.job.comm, wire.SNAPSHOT):
            self.parts.setdefault(part["epoch"], {})[part["server"]] = part["shard"]
            self.received += 1
        for report in wire.receive_all(self.job.comm, wire.EPOCH):
            self.reports.setdefault(report["epoch"], {})[report["worker"]] = report

    def log_ready(self, server):
        """Log each next epoch whose S snapshots are in and that every worker not lost has reported."""
        while self.next_log < self.epochs and server.stopping is None:
            parts, reports = self.parts.get(self.next_log, {}), self.reports.get(self.next_log, {})
            if len(parts) < self.layout.servers or not reports or any(
                    w not in reports for w in self.reporters if w not in server.dropped):
                return
            self.log_epoch(server, self.next_log, parts, reports)
            self.next_log += 1

    def log_epoch(self, server, epoch, parts, reports):
        train_loss = sum(r["loss_sum"] for r in reports.values()) / max(sum(r["batches"] for r in reports.values()), 1)
        if self.reference is None:               # the loss at the start: the workers' first steps
            self.reference = float(numpy.mean([r["first_loss"] for r in reports.values()]))
        try:
            divergence.check_divergence(train_loss, self.reference, f"epoch {epoch + 1}'s mean training")
        except divergence.Diverged as diverged:
            server.stop(str(diverged), tell_servers=True)
            return
        params = numpy.concatenate([parts[k] for k in range(self.layout.servers)])
        window = self.windows.pop(epoch)         # server 0's updates: every push reaches every server
        staleness = numpy.array([u.staleness for u in window], dtype=numpy.int64)
        clock_staleness = numpy.array([u.clock_staleness for u in window], dtype=numpy.int64)
        self.job.logger.epoch(epoch=epoch + 1, train_loss=train_loss,
                              **objectives.evaluate_at(self.job.objective, params),
                              updates=int(staleness.size),
                              staleness_mean=float(staleness.mean()) if staleness.size else 0.0,
                              staleness_max=int(staleness.max()) if staleness.size else 0,
                              clock_staleness_max=int(clock_staleness.max()) if clock_staleness.size else 0)

    def finish(self, server):
        """Rank 0, after serving: receive every snapshot still on its way, log every epoch still due."""
        if server.index != 0:
            return
        expected = (self.layout.servers - 1) * (self.epochs - self.first)
        lost_all = all(w in server.dropped for w in range(self.layout.workers))
        while self.received < expected or not (self.next_log == self.epochs or server.stopping is not None
                                               or lost_all):
            time.sleep(wire.POLL_SECONDS)
            self.receive()
            self.log_ready(server)
