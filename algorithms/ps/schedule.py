"""Deterministic mode's schedule: which worker a parameter server serves next, drawn from the seed.

    schedule = Schedule(seed, epoch_ends)              # epoch_ends: (worker, epoch) -> its clock at that epoch's end
    schedule.holds(worker, clock, live)                # True: the worker waits at its epoch's end
    worker = schedule.draw(ready, clock, live, started)

Instead of serving whichever request arrives first, a server in deterministic mode draws the next
worker to serve among the live workers it is not holding (``ready``) and waits for that worker's
request. Every server draws the same sequence and sees the same requests in the same order, so the
whole run is a function of the seed: replayable. (Two servers with different schedules could
deadlock: each waiting for a worker that waits on the other.)

Epochs (``epoch_ends``, from ``ps.job.epoch_ends``; a worker's clock is its pushes applied):

    barrier    a worker whose last push ended epoch e is answered only when every live worker has
               pushed the end of its epoch e
    draws      epoch e's draws come from Generator((seed, e)), from the moment every worker may
               begin it (the start, or the barrier's release), among the workers that have not yet
               pushed its end (their next request is a held fetch, or after the last epoch a goodbye)

So a run resumed at an epoch's start, which starts every worker from the same saved parameters,
is the run that went through that epoch's start, and a run that stops after an epoch ran it as a
longer run does: bit for bit. Without ``epoch_ends`` every draw comes from Generator(seed).
"""
import numpy


class Schedule:
    """The seeded order in which one server serves its workers (every server holds an equal one)."""

    def __init__(self, seed, epoch_ends=None):
        self.seed, self.ends = seed, dict(epoch_ends or {})
        self.ended_by = {(worker, clock): epoch for (worker, epoch), clock in self.ends.items()}
        self.epochs = sorted({epoch for _, epoch in self.ends})
        self.generator, self.epoch = numpy.random.default_rng(seed), None

    def current_epoch(self, clock, live):
        """The epoch every live worker may be in: the first that not every live worker has ended (None: no epochs)."""
        if not self.epochs:
            return None
        ended = [e for e in self.epochs if all(clock[w] >= self.ends[w, e] for w in live)]
        return self.epochs[0] + len(ended)

    def holds(self, worker, clock, live):
        """The barrier: the worker's last push ended an epoch that some live worker has not ended yet."""
        epoch = self.ended_by.get((worker, clock[worker]))
        return epoch is not None and any(clock[w] < self.ends[w, epoch] for w in live)

    def draw(self, ready, clock, live, started):
        """The next worker to serve among ``ready`` (sorted, not empty)."""
        epoch = self.current_epoch(clock, live)
        if started and epoch is not None and epoch != self.epoch:     # a new epoch: its own draws
            self.epoch, self.generator = epoch, numpy.random.default_rng((self.seed, epoch))
        if epoch is not None:                                          # not those that have ended it
            ready = [w for w in ready if self.ended_by.get((w, clock[w])) != epoch] or ready
        return int(self.generator.choice(ready))
