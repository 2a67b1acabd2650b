"""One Sandblaster batch as the coordinator keeps it: portions, pushes and backup tasks.

A batch (f and g at one trial point, the whole training set) is cut into many more portions than
workers, handed out one at a time to whichever worker asks: load balancing. Near the batch's end
(a fraction ``threshold`` of the portions finished) an idle worker gets a backup copy of an
outstanding portion; the first copy pushed wins (algorithms/sandblaster_lbfgs.py has the rules).
"""
import collections


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
