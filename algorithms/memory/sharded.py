"""Data parallelism and ZeRO: one real step each, its bytes per part and its peak measured by tracemalloc.

    sharded.measure(comm, "ZeRO-3", "wide-mlp", p=4, batch=16, optimizer="adam")
    # ({"params": ..., "grads": ..., "optimizer": ..., "activations": ..., "extra": ...},
    #  {"peak": bytes, "sent": bytes this rank sent in the step})

The steps are the algorithms' own: allreduce SGD's ``data_parallel_step`` with the ring allreduce,
and ``zero.zero_step`` on a ``shards.units.Shard`` built as ``zero.train`` builds it (which lets go of
what Run.start made whole). Three steps run: the first two make what persists between steps (the
optimizer's state, the collectives' cached receive blocks), the third is measured. The parts, in
the paper's terms, and what this implementation adds:

    params       the weights the rank keeps (set-up), plus the most its gathers hold at once (stage 3:
                 each unit's whole weights, from its gather to its release; measured around each call)
    grads        the gradient: data parallelism's flat vector (set-up); ZeRO's, per step, the most its
                 unit gradients and reduced blocks hold at once (measured around each call)
    optimizer    the state the first step creates (momentum's v; Adam's m and v)
    activations  what the forward keeps for the backward: the model's forward on the batch, measured
                 alone (``allocations.forward``: ZeRO shards no activation)
    extra        what the implementation adds: the ring's cached receive blocks (one per block size),
                 and the arrays the optimizer's update makes and drops (minidl's Adam: 5 of the
                 updated size, momentum SGD 1)

Each part is the most it holds during the step, and they do not all peak at once (the activations
are gone when the optimizer's arrays come), so their sum bounds the step's peak from above; the
peak itself is tracemalloc's, over the third step, of everything allocated since the set-up began
(the batch excepted). ``sent``: the bytes this rank's messages carried in that step (the tracer).

On p ranks (``comm`` of size p) the collectives run for real; in one process standing for rank 0
of p, ``StandIn`` plays the peers: every message goes nowhere and every receive gets zeros, so the
rank runs its own step, buffers, shapes and schedule, with its peers' values left out.
"""
import tracemalloc
from types import SimpleNamespace

import numpy
from mpi4py import MPI

from algorithms import zero
from algorithms.core.objective import Data, NetworkObjective, build_model
from algorithms.core.run import allreduce_function
from algorithms.core.step import data_parallel_step
from algorithms.memory import allocations
from algorithms.memory.accounts import EXAMPLE, dataset_of, row
from algorithms.memory.measured import freed_scratch
from algorithms.shards.units import Shard
from collectives.buffers import release_scratch
from collectives.trace import CountingComm
from minidl.conv.scratch import release
from minidl.recompute import checkpointed

LR = 0.001


class StandIn:
    """Rank ``rank`` of ``size`` in this one process: sends go nowhere, receives get zeros."""

    def __init__(self, size, rank=0):
        self.size, self.rank = size, rank

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Send(self, buf, dest, tag=0):
        pass

    def Recv(self, buf, source=None, tag=None, status=None):
        buf[...] = 0

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=None, recvtag=None, status=None):
        recvbuf[...] = 0

    def Isend(self, buf, dest, tag=0):
        return MPI.REQUEST_NULL

    def Irecv(self, buf, source=None, tag=None):
        buf[...] = 0
        return MPI.REQUEST_NULL


class Watch:
    """tracemalloc's live bytes, and the most they reached since ``start``, across resets of its peak."""

    def __init__(self):
        self.highest = 0

    def start(self):
        tracemalloc.reset_peak()
        self.highest = 0

    def now(self):
        return tracemalloc.get_traced_memory()[0]

    def reset(self):
        """The live bytes now, with tracemalloc's peak restarted here (the highest so far kept)."""
        self.highest = max(self.highest, tracemalloc.get_traced_memory()[1])
        tracemalloc.reset_peak()
        return self.now()

    def risen(self, before):
        """The most the live bytes rose above ``before`` since the last reset."""
        return tracemalloc.get_traced_memory()[1] - before

    def peak(self):
        return max(self.highest, tracemalloc.get_traced_memory()[1])


def measuring(shard_class, watch):
    """``shard_class`` with each moment of a unit measured: the bytes its gathers and its gradients hold
    at once (their most in ``held``), and the most the update's arrays add (``temporaries``)."""
    class Measured(shard_class):
        def __init__(self, *args):
            super().__init__(*args)
            self.restart()

        def measure(self, part, call, *args):
            before = watch.now()
            call(*args)
            self.live[part] += watch.now() - before
            self.held[part] = max(self.held[part], self.live[part])

        def restart(self):
            self.live, self.held, self.temporaries = {"params": 0, "grads": 0}, {"params": 0, "grads": 0}, 0

        def gather(self, comm, unit, prefetch=True):
            self.measure("params", super().gather, comm, unit, prefetch)

        def release(self, unit):
            self.measure("params", super().release, unit)

        def gradient(self, unit):
            before = watch.now()
            gradient = super().gradient(unit)
            self.live["grads"] += watch.now() - before
            self.held["grads"] = max(self.held["grads"], self.live["grads"])
            return gradient

        def reduce_scatter(self, comm, unit):
            self.measure("grads", super().reduce_scatter, comm, unit)

        def update(self):
            before = watch.reset()
            super().update()
            self.temporaries = max(self.temporaries, watch.risen(before))
    return Measured


def measure(comm, method, model, p, batch, recompute=False, optimizer="sgd", momentum=0.9, seed=0,
            shard_class=Shard):
    """This rank's measured parts of one step of ``method`` ("data parallel" or "ZeRO-1".."ZeRO-3"), and
    {"peak": the step's most bytes, "sent": the bytes its messages carried}. ``shard_class``: the Shard
    to run (a test plants a faulty one)."""
    real = comm.Get_size() == p
    counting = CountingComm(comm if real else StandIn(p))
    x, labels = allocations.example_batch(EXAMPLE[model], batch, seed)
    data = Data(x, labels, x[:0], labels[:0])
    piece = SimpleNamespace(index=numpy.arange(batch), total=batch * p)
    settings = SimpleNamespace(lr=LR, momentum=momentum)
    stage = int(method[-1]) if method.startswith("ZeRO") else None
    watch = Watch()
    measured_shard = measuring(shard_class, watch)           # a class: made before the meter starts
    release_scratch()
    release()
    meter = allocations.Meter()
    base = meter.mark
    try:
        net = build_model(model, seed, dataset_of(model))
        parts = {"params": meter.take()}
        if recompute:
            net = checkpointed(net, max(1, round(numpy.sqrt(len(net)))))
        objective = NetworkObjective(net, data)
        parts["grads"] = meter.take()                         # flattened: the weights moved, a gradient vector
        whole = zero.make_optimizer(optimizer)([objective.flat.as_parameter()], settings)
        temporaries = {"bytes": 0}                            # the most the update's arrays add
        if stage is None:
            summed = allreduce_function("ring")
            shard = None
            plain_step = whole.step

            def step_and_watch():
                before = watch.reset()
                plain_step()
                temporaries["bytes"] = max(temporaries["bytes"], watch.risen(before))
            whole.step = step_and_watch

            def step():
                data_parallel_step(counting, objective, whole, piece, summed)
        else:
            run = SimpleNamespace(objective=objective, rank=counting.Get_rank(), size=p, settings=settings,
                                  optimizer=whole)
            shard = measured_shard(run, stage, zero.make_optimizer(optimizer))
            parts["params"] += parts["grads"] + meter.take()  # what the rank keeps of the weights; no gradient
            parts["grads"] = 0

            def step():
                zero.zero_step(counting, objective, shard, piece, stage)
        step()                                                # the optimizer's state, and caches let go:
        release_scratch()                                     # the ring's receive blocks,
        release()                                             # the convolutions' workspaces
        parts["optimizer"] = meter.take()
        step()                                                # the caches again
        meter.take()
        if shard is not None:
            shard.restart()
        counting.bytes_sent, temporaries["bytes"] = 0, 0
        watch.start()
        step()
        peak = watch.peak() - base
        extra = freed_scratch(meter)
    finally:
        meter.stop()
    if shard is not None:
        parts["params"] += shard.held["params"]
        parts["grads"] = shard.held["grads"]
        extra += shard.temporaries
    else:
        extra += temporaries["bytes"]
    net = build_model(model, seed, dataset_of(model))           # the activations: its forward alone
    if recompute:
        net = checkpointed(net, max(1, round(numpy.sqrt(len(net)))))
    meter = allocations.Meter()
    try:
        _, parts["activations"] = allocations.forward(meter, net, x, labels, recompute)
    finally:
        meter.stop()
    return row(parts["params"], parts["grads"], parts["optimizer"], parts["activations"], extra), \
        {"peak": peak - x.nbytes - labels.nbytes, "sent": counting.bytes_sent}
