"""A Sandblaster worker: ask for a portion, compute its gradient, report, push every few.

The worker fetches the batch's trial point from every shard when a new batch starts, computes the
loss and gradient of each portion it is given, reports the loss to the coordinator, and adds the
gradient into its accumulator when told to keep it (drops the accumulator when told to, pushes it
one slice per shard when told to). ``--slow-worker`` makes one worker sleep after each portion.
"""
import time

import numpy

from algorithms.ps.wire import POLL_SECONDS, wait_for
from algorithms.sandblaster.wire import FETCH, PARAMS, PUSH, PUSH_DATA, REPORT, WORK
from minidl import backend


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
