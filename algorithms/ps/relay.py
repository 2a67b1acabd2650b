"""A group server of a hierarchical parameter server: one push to the root per round of its workers.

A hierarchical server (``groups`` G, >= 1; Ben-Nun & Hoefler's hierarchical parameter server):
ranks 0 .. S-1 are the root shards, ranks S .. S+G-1 group servers, the rest workers, cut into G
groups of equal size k in rank order. A group server (``relay``) collects one request from each
of its workers (a round: with n_fetch = n_push = 1 each carries one step's gradient), pushes their
sum to the root shards as one push and answers every worker of the group with the parameters it
fetched. To the root a group server is one worker, so the root receives one push per k worker
steps: its bytes drop by the group size. Inside a group the workers are synchronous (the sum of k
gradients at the same parameters); across groups they are as asynchronous as Downpour's.

The sum of a round is taken in rank order, and a stop reason of any worker reaches the root
shards with the group server's goodbye.
"""
import time

import numpy

from algorithms.core import run
from algorithms.ps import wire
from minidl import backend


def relay(job):
    """A group server: one push to the root per round of its workers' steps, the answer to all of them."""
    comm, ps = job.comm, job.ps
    size, first = comm.Get_size(), ps.servers + ps.groups
    group_size = (size - first) // ps.groups
    group = comm.Get_rank() - ps.servers
    members = list(range(first + group * group_size, first + (group + 1) * group_size))
    dtype = backend.to_numpy(job.objective.params).dtype
    root = wire.ServerShards(comm, job.layout, dtype)          # to the root, this rank is one worker
    grad = numpy.empty(job.objective.params.size, dtype=dtype)
    total, params = numpy.zeros_like(grad), numpy.zeros_like(grad)
    pushed = {rank: numpy.zeros_like(grad) for rank in members}      # each worker's gradient in this round
    outbox = wire.Outbox(comm, job.layout)
    live, waiting, steps, stop, status = set(members), set(), 0, None, wire.OK
    while live or steps:
        for rank in sorted(live - waiting):      # the next request of each worker not yet in this round
            if wire.waiting_request(comm, rank) is None:
                continue
            request = wire.receive_request(comm, rank, grad)
            stop = stop or request["stop"]
            if request["push"]:
                pushed[rank] += grad
                steps += request["steps"]
            if request["goodbye"]:
                live.discard(rank)
            elif request["fetch"]:
                waiting.add(rank)
        if live and not live <= waiting:
            time.sleep(wire.POLL_SECONDS)
            continue
        # a round: every worker still training has asked; one push (and fetch) for all of them. The sum
        # is taken in rank order, not in the order the requests came: floating-point addition is not
        # associative, and arrival order would make the same seed give different bits.
        for rank in members:
            total += pushed[rank]
            pushed[rank][...] = 0
        if status == wire.OK and stop is None:
            try:
                if steps:
                    root.push(total, steps, fetch_into=params if waiting else None)
                elif waiting:
                    root.fetch(params)
            except wire.Stopped:
                status = wire.STOP
        elif stop is not None:
            status = wire.STOP
        total[...], steps = 0, 0
        for rank in sorted(waiting):
            outbox.reply(rank, int(root.versions[0]), int(root.min_clocks[0]), status, params.copy())
        waiting = set()
    root.goodbye(stop=stop)                      # a worker's stop reason reaches the root shards
    run.wait_together(comm)
    outbox.complete()
    return {"ending": "relayed", "error": None}
