"""A Sandblaster parameter-server shard: its slice of every vector, its part of the history, the pushes.

Shard k (rank k + 1) holds slice k (``Roles.ranges``) of w, g, d, the trial point and of every
(s_i, y_i) of the L-BFGS history, and performs the coordinator's commands on them (``command``);
between commands it adds the workers' pushed gradients into one accumulator per worker and answers
their fetches of the trial point (``serve``). Once every portion of a batch is in, it sums the
accumulators in worker order, whoever pushed first, so the sum does not depend on timing.
"""
import time

import numpy
from mpi4py import MPI

from algorithms.ps.wire import POLL_SECONDS
from algorithms.sandblaster.wire import CMD, FETCH, PARAMS, PUSH, PUSH_DATA, REPLY
from minidl import backend


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
