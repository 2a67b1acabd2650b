"""A serial replay of a logged parameter-server run (the oracle of the hidden asynchronous tests).

Given the servers' logs of a run (each server's ("push", Update) / ("fetch", worker, version) /
("goodbye", worker) / ("drop", worker) events in the order it handled them), the replay re-runs
everything in one process:

    each worker      a generator that does what a Downpour worker does (fetch, grad, accrue,
                     local step, push), but gets its fetched parameters from the replay
    each server      walks its own log: a "fetch" hands the worker its shard as it is now,
                     a "push" applies that worker's next gradient with a fresh minidl optimizer

No MPI, no timing: the order comes from the log alone. If the parallel run and the replay end
with the same parameters, the run was exactly "each gradient computed at the logged version and
applied in the logged order", which is what an asynchronous run claims to be.
"""
import numpy as np

from algorithms.core import objective
from algorithms.ps.worker import worker_batches
from minidl.flat import flatten
from minidl.optim import SGD, Adagrad
from minidl.tensor import Parameter


def worker_program(worker, workers, data, model, seed, epochs, batch_size, lr, n_fetch, n_push):
    """Yields ("push", grad) and ("fetch",); after each ("fetch",) it is sent the full parameters.

    The schedule of ``downpour_sgd``'s header: before the first step a fetch; after step i of an
    epoch of m steps a push if (i + 1) % n_push == 0 or i == m - 1, then a fetch if
    (i + 1) % n_fetch == 0 or i == m - 1 (but not after the run's last step).
    """
    net = objective.build_model(model, seed)
    flat = flatten(net)
    accrued = np.zeros_like(flat.grad)
    plan = [worker_batches(len(data.x_train), seed, epoch, worker, workers, batch_size)
            for epoch in range(epochs)]
    total = sum(len(batches) for batches in plan)
    step = 0
    for batches in plan:
        for i, index in enumerate(batches):
            if step == 0:
                flat.data[...] = yield ("fetch",)
            flat.zero_grad()
            objective.loss_and_grad(net, data.x_train[index], data.y_train[index])
            accrued += flat.grad
            flat.data -= lr * flat.grad
            end_of_epoch, last = i == len(batches) - 1, step == total - 1
            fetch = ((i + 1) % n_fetch == 0 or end_of_epoch) and not last
            if (i + 1) % n_push == 0 or end_of_epoch:
                yield ("push", accrued.copy())
                accrued[...] = 0
            if fetch:
                flat.data[...] = yield ("fetch",)
            step += 1


def replay(logs, ranges, initial, programs, optimizer="sgd", lr=0.05, momentum=0.0):
    """Final parameters of the serial replay of ``logs``; raises AssertionError if the log is impossible."""
    shards, optimizers = [], []
    for start, stop in ranges:
        param = Parameter(initial[start:stop].copy())
        param.grad = np.zeros_like(param.data)
        shards.append(param)
        optimizers.append(Adagrad([param], lr=lr) if optimizer == "adagrad" else SGD([param], lr=lr, momentum=momentum))
    workers = len(programs)
    pushes = [[[] for _ in ranges] for _ in range(workers)]    # pushes[w][k]: gradients waiting at server k
    fetches = [[0 for _ in ranges] for _ in range(workers)]    # fetch requests waiting at server k
    parts = [dict() for _ in range(workers)]                    # shards delivered to a waiting worker
    waiting = [False] * workers

    def advance(w, params=None):
        """Run worker w until it waits for a fetch (or ends)."""
        try:
            message = programs[w].send(params) if params is not None else next(programs[w])
        except StopIteration:
            return
        while message is not None:
            if message[0] == "fetch":
                for k in range(len(ranges)):
                    fetches[w][k] += 1
                waiting[w] = True
                return
            for k, (start, stop) in enumerate(ranges):
                pushes[w][k].append(message[1][start:stop])
            message = next(programs[w], None)

    for w in range(workers):
        advance(w)
    position = [0] * len(ranges)
    versions = [0] * len(ranges)
    progress = True
    while progress:
        progress = False
        for k, log in enumerate(logs):
            while position[k] < len(log):
                event = log[position[k]]
                if event[0] in ("goodbye", "drop"):
                    pass                                        # no parameters move
                elif event[0] == "push":
                    update = event[1]
                    if not pushes[update.worker][k]:
                        break                                   # that gradient is not computed yet
                    assert update.version == versions[k], f"server {k}: logged version {update.version}"
                    shards[k].grad[...] = pushes[update.worker][k].pop(0)
                    optimizers[k].step()
                    versions[k] += 1
                else:
                    _, w, version = event
                    if not fetches[w][k]:
                        break
                    assert version == versions[k], f"server {k}: fetch logged at version {version}"
                    fetches[w][k] -= 1
                    parts[w][k] = shards[k].data.copy()
                    if len(parts[w]) == len(ranges):
                        params = np.concatenate([parts[w][j] for j in range(len(ranges))])
                        parts[w] = {}
                        waiting[w] = False
                        advance(w, params)
                position[k] += 1
                progress = True
    for k, log in enumerate(logs):
        assert position[k] == len(log), f"server {k}: the replay stuck at event {position[k]} of {len(log)}"
    return np.concatenate([shard.data for shard in shards])
