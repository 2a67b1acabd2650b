"""One step of each split method, its bytes per part measured by tracemalloc (for algorithms.memory).

    tensor(comm, "lenet5", p=2, batch=64)              # {"params": ..., "grads": ..., "optimizer": ...,
    pipeline("mlp", p=4, batch=64, micro_batches=8, kind="gpipe", recompute=True)   # "activations": ...,
    hybrid(comm, "mlp", p=4, batch=64, micro_batches=8, recompute=False)            # "extra": ...} on this rank
    spatial(comm, "lenet5", batch=64, recompute=True)

Each runs one step with the module's own pieces (``tensor_parallel.split_network``,
``pipeline_parallel.Stage`` and ``schedule``, ``spatial_parallel``'s stages), phase by phase as the
module's heart runs, and reads tracemalloc's live bytes between the phases (``allocations.Meter``), as
``allocations.data_parallel`` does for allreduce SGD (data parallelism and ZeRO run their real steps:
``sharded``). The layout is rank ``comm``'s of ``p`` when ``comm`` has p ranks (the collectives run for
real and their buffers are measured); otherwise rank 0's, in this process, with the sums over ranks
left out and "extra" None (not measured: no peers). Only spatial needs its p ranks.

"extra" is what the implementation adds beyond the method's own parts: the buffers the collectives
keep (the receive blocks the ring caches, measured as the bytes ``release_scratch`` hands back; the
sends still in flight), and the serial copy the tensor, pipeline and hybrid modules keep on every
rank for evaluation and layout-free checkpoints (``serial_copy``: the whole model's flat weights and
gradient, and the pipeline's whole momentum, less the stage's own), measured as the module builds it.
"""
import contextlib
import tracemalloc

import numpy
from mpi4py import MPI

from algorithms import pipeline_parallel, spatial_parallel, tensor_parallel
from algorithms.core.objective import build_model
from algorithms.core.run import allreduce_function
from algorithms.memory import allocations
from algorithms.memory.accounts import EXAMPLE, dataset_of, row
from algorithms.shards.regions import Region
from algorithms.shards.tiling import Tiling
from collectives.buffers import release_scratch
from minidl import functional as F
from minidl.conv.scratch import release
from minidl.flat import FlatParameters, flatten
from minidl.nn import LocallyConnected2d, Sequential
from minidl.optim import SGD
from minidl.tensor import Tensor, no_grad


def layout(comm, p):
    """(rank, real): this rank's place, and whether ``comm`` holds the p ranks to run the collectives."""
    real = comm.Get_size() == p
    return (comm.Get_rank() if real else 0), real


def freed_scratch(meter):
    """The bytes of the collectives' cached receive blocks, handed back now (measured)."""
    meter.take()
    release_scratch()
    return -meter.take()


def tensor(comm, model, p, batch, recompute=False, momentum=0.9, seed=0, net=None):
    """Tensor parallelism, phase by phase: this rank's pieces (``split_network``) and their flat
    vector, forward (g's allreduce: its receive block is comm; with ``recompute``, plus the largest
    block's segment recorded again), backward (f's), the update. ``net``: a network of ``model``'s
    input shape in its place."""
    rank, real = layout(comm, p)
    x, labels = allocations.example_batch(EXAMPLE[model], batch, seed)
    meter = allocations.Meter()
    try:                                                           # the serial model the module keeps: extra
        net = net or build_model(model, seed, dataset_of(model))
        serial = flatten(net)
        serial_bytes = meter.take()
    finally:
        meter.stop()
    summed = allreduce_function("ring") if real and p > 1 else None

    def total(array):
        if summed is not None:
            summed(comm, array.reshape(-1))
        return array
    release_scratch()
    meter = allocations.Meter()
    try:
        layers, parameters = tensor_parallel.split_network(net, serial, rank, p, total, recompute)[:2]
        params = meter.take()
        flat = FlatParameters(parameters)
        grads = meter.take()
        optimizer = SGD([flat.as_parameter()], lr=0.01, momentum=momentum)
        loss, activations = allocations.forward(meter, layers, x, labels, recompute)
        comm_bytes = freed_scratch(meter)
        activations -= comm_bytes              # g's receive block, cached during the forward
        loss.backward()
        del loss
        release()
        comm_bytes += freed_scratch(meter)     # f's, during the backward
        optimizer.step()
        optimizer_bytes = meter.take()
    finally:
        meter.stop()
    return row(params, grads, optimizer_bytes, activations, comm_bytes + serial_bytes if real else None)


def serial_copy(model, momentum, seed, own):
    """The bytes a pipeline rank keeps beyond its stage: the whole model's flat weights and gradient and
    its whole momentum (``pipeline_parallel``'s optimizer steps the whole vector), measured as the module
    builds them, less ``own`` (the stage's params, grads and optimizer, which are part of them)."""
    meter = allocations.Meter()
    try:
        flat = flatten(build_model(model, seed, dataset_of(model)))
        optimizer = SGD([flat.as_parameter()], lr=0.01, momentum=momentum)
        optimizer.step()                                                  # momentum's v, the whole vector
        whole = meter.take()
    finally:
        meter.stop()
    return whole - own


def stage_state(meter, model, p, sample, recompute, momentum, seed):
    """Stage 0's layers alone (the rest of the model dropped), measured: (stage, flat, SGD, {params, grads})."""
    net = build_model(model, seed, dataset_of(model))
    stage = pipeline_parallel.Stage(net, 0, p, sample, recompute)
    del net                                    # only stage 0's layers stay
    release()                                  # the conv workspaces of Stage's one-row pass
    measured = {"params": meter.take()}
    flat = flatten(stage.layers)
    measured["grads"] = meter.take()
    return stage, flat, SGD([flat.as_parameter()], lr=0.01, momentum=momentum), measured


def pipeline(model, p, batch, micro_batches, kind, recompute=False, momentum=0.9, seed=0):
    """Stage 0 of ``pipeline_parallel`` over one step, in this process: its state, its forwards and
    backwards in the order of ``schedule``, each output kept as its Isend keeps it, a random gradient
    in place of stage 1's. The activations are the most bytes alive after a forward (or, with
    ``recompute``, while a backward runs its stage again), less the outputs only a send still
    holds (those are comm); the conv workspaces a backward leaves in the pool are let go after it."""
    x, _ = allocations.example_batch(EXAMPLE[model], batch, seed)
    rng, meter = numpy.random.default_rng(seed), allocations.Meter()
    try:
        stage, flat, optimizer, measured = stage_state(meter, model, p, x[:1], recompute, momentum, seed)
        pieces = [x[rows] for rows in numpy.array_split(numpy.arange(batch), micro_batches)]  # the data: not counted
        release()
        meter.take()
        held, sends, activations, received = {}, [], 0, 0

        def alive():                           # activation bytes alive now: less what only a send holds
            return tracemalloc.get_traced_memory()[0] - meter.mark - \
                sum(buffer.nbytes for j, buffer in enumerate(sends) if j not in held)
        for step, i in pipeline_parallel.schedule(kind, 0, p, micro_batches):
            if step == "forward":
                out = stage.layers(Tensor(pieces[i]))
                if stage.last:
                    out = F.softmax_cross_entropy(out, numpy.zeros(len(pieces[i]), dtype=int))
                else:
                    sends.append(out.data)                 # micro-batch i's send buffer, until the Waitall
                held[i] = out
                activations = max(activations, alive())
                continue
            out = held.pop(i)
            if recompute:                      # the backward's first act: stage 0's forward again, recorded
                held["again"] = stage.layers.module(Tensor(pieces[i]))
                activations = max(activations, alive())
                del held["again"]
            gradient = None if stage.last else \
                rng.standard_normal((len(pieces[i]),) + stage.sends).astype(numpy.float32)
            received = max(received, 0 if gradient is None else gradient.nbytes)
            out.backward(gradient)
            del out, gradient
            release()            # the backward's workspaces: scratch the pool keeps, not activations
        meter.take()
        optimizer.step()
        measured["optimizer"] = meter.take()
    finally:
        meter.stop()
    own = measured["params"] + measured["grads"] + measured["optimizer"]
    return row(measured["params"], measured["grads"], measured["optimizer"], activations,
               sum(buffer.nbytes for buffer in sends) + received + serial_copy(model, momentum, seed, own))


def hybrid(comm, model, p, batch, micro_batches, recompute=False, momentum=0.9, seed=0):
    """Stage 0 of a 2-stage 1F1B pipeline (``pipeline``), and its gradient's ring allreduce over the
    p/2 replicas of its column (``hybrid_step``), whose receive block is added to the extra buffers."""
    measured = pipeline(model, 2, batch, micro_batches, "1f1b", recompute, momentum, seed)
    rank, real = layout(comm, p)
    if not real:                               # no column to allreduce over at p = 2
        return {**measured, "extra": None if p > 2 else measured["extra"]}
    column = comm.Split(color=rank % 2, key=rank // 2)        # hybrid_parallel's grid: rank = replica * 2 + stage
    net = build_model(model, seed, dataset_of(model))
    stage = pipeline_parallel.Stage(net, rank % 2, 2, allocations.example_batch(EXAMPLE[model], 1)[0])
    gradient = numpy.zeros(stage.end - stage.start, dtype=numpy.float32)
    meter = allocations.Meter()
    try:
        release_scratch()
        meter.take()
        if column.Get_size() > 1:
            allreduce_function("ring")(column, gradient)
        block = meter.take()
    finally:
        meter.stop()
        column.Free()
    return {**measured, "extra": measured["extra"] + comm.allreduce(block if rank % 2 == 0 else 0, op=MPI.MAX)}


def spatial(comm, model, batch, recompute=False, momentum=0.9, seed=0):
    """This rank's bytes per part of one step of ``spatial_parallel``, phase by phase as its heart runs:
    the tiles' forward (activations), the gather (extra), the head's forward (activations), the conv
    gradient's ring (extra), the update (optimizer). ``recompute``: the tiles' forward unrecorded, and
    the activations plus the most one stage keeps when the backward runs it again, halo exchange included."""
    x, labels = allocations.example_batch(EXAMPLE[model], batch, seed)
    rank, meter = comm.Get_rank(), allocations.Meter()
    try:
        net, flat, optimizer, measured = allocations.set_up(meter, model, EXAMPLE[model], momentum=momentum, seed=seed)
        tiling = Tiling.of(net, x.shape[2], x.shape[3], comm.Get_size())
        release()
        meter.take()

        def stage_again(s, tile, need_grad):       # stage s from its input tile: its window, then the stage
            window = spatial_parallel.window(comm, tiling, s, x, tile)
            return spatial_parallel.run_stage(tiling.stages[s], window, rank, need_grad=need_grad and s > 0)
        kept, tile = [], None
        for s in range(len(tiling.stages)):
            with no_grad() if recompute else contextlib.nullcontext():
                leaf, tile = stage_again(s, tile, need_grad=True)
            kept.append((None if recompute else leaf, tile))       # recompute: the output tile only
            del leaf
        measured["activations"] = meter.take()
        whole = Tensor(spatial_parallel.gather_rows(comm, tile.data, tiling.final[0]), requires_grad=True)
        measured["extra"] = meter.take()
        loss = F.softmax_cross_entropy(Sequential(*tiling.head)(whole), labels)
        measured["activations"] += meter.take()
        largest = 0
        for s in range(len(tiling.stages) - 1, -1, -1) if recompute else ():    # as the backward runs them
            again = stage_again(s, kept[s - 1][1] if s else None, need_grad=True)
            largest = max(largest, meter.take())
            del again
            meter.take()
        measured["activations"] += largest
        del loss, whole, kept, tile
        release_scratch()
        meter.take()
        if comm.Get_size() > 1:
            allreduce_function("ring")(comm, flat.grad[:tiling.conv_parameters()])
        measured["extra"] += meter.take()
        flat.grad[...] = 0
        optimizer.step()
        measured["optimizer"] = meter.take()
    finally:
        meter.stop()
    return measured


def spatial_local(comm, batch, momentum=0.9, seed=0):
    """``spatial_parallel --layer local`` on the small CNN's locally connected twin, this rank's region:
    its pieces of the weights (params), their flat gradient (grads), the forward (activations: its
    stages' tiles and its rows of the head), the logits' sum (extra: the ring's receive block), the
    update (optimizer). The serial network it is cut from is let go by the module: not counted."""
    x, labels = allocations.example_batch(EXAMPLE["cnn"], batch, seed)
    rank, net = comm.Get_rank(), build_model("local-cnn", seed)
    tiling = Tiling.of(net, x.shape[2], x.shape[3], comm.Get_size(), layer=LocallyConnected2d)
    summed = allreduce_function("ring")

    def total(array):
        summed(comm, array.reshape(-1))
        return array
    release_scratch()
    meter = allocations.Meter()
    try:
        region = Region(tiling, net, rank, flat=False)
        del net
        measured = {"params": meter.take()}
        region.flatten()
        measured["grads"] = meter.take()
        optimizer = SGD([region.flat.as_parameter()], lr=0.01, momentum=momentum)
        release()
        meter.take()
        kept = []                                         # every stage's window and tile, as the step keeps them
        loss = F.softmax_cross_entropy(spatial_parallel.local_logits(comm, tiling, region, x, total, keep=kept),
                                       labels)
        measured["activations"] = meter.take()
        measured["extra"] = freed_scratch(meter)
        measured["activations"] -= measured["extra"]      # the sum's receive block, cached during the forward
        del loss, kept
        release()
        meter.take()
        optimizer.step()
        measured["optimizer"] = meter.take()
    finally:
        meter.stop()
    return measured
