"""ZeRO's units and shards: what ``algorithms/zero.py`` gathers and reduces at once, and what a rank keeps.

    units = units_of(net, "layer")                 # the model cut into gathering units (Sequentials)
    shard = Shard(run, stage, optimizer, unit)     # this rank's block of every unit, and their optimizer
    shard.gather(comm, unit); shard.release(unit)  # stage 3: the unit's whole weights, come and gone
    shard.gradient(unit); shard.reduce_scatter(comm, unit); shard.update()

The moments of a unit as ``zero.zero_step`` calls them, each a few lines on the ring's halves
(``collectives.reduce_scatter``, ``collectives.allgather``) and on ``minidl.flat``'s ``point`` and
``release``, which make a layer's parameters views into a vector that comes and goes; ``Gathered``
runs the model unit by unit for evaluation. The algorithm, its memory and its bytes: zero.py's header.
"""
import numpy
from mpi4py import MPI

import collectives
from algorithms.core import cli
from algorithms.core.objective import NetworkObjective
from collectives.nonblocking import start_allgather
from minidl import backend
from minidl.flat import absent, point, release
from minidl.nn import Module, Sequential
from minidl.tensor import Parameter

UNITS = ("layer", "model")


def units_of(net, unit):
    """The gathering units of ``net``, each a Sequential of consecutive layers ("layer": a layer with
    parameters starts one, a layer without joins the one before; "model": the whole net)."""
    if unit == "model":
        return [net]
    if not isinstance(net, Sequential):
        raise cli.SettingError(f"--unit layer cuts a Sequential into its layers, got a {type(net).__name__}: "
                               f"use --unit model")
    groups = []
    for layer in net:
        if groups and not (layer.parameters() and any(child.parameters() for child in groups[-1])):
            groups[-1].append(layer)
        else:
            groups.append([layer])
    return [Sequential(*group) for group in groups]


class Unit:
    """One gathering unit: ``layers`` and their ``parameters``, values [offset, offset + n) of the
    whole model's flat vector; this rank keeps block [start, stop) of them (``shard``)."""

    def __init__(self, layers, whole, offset, rank, size, stage):
        self.layers, self.parameters = layers, layers.parameters()
        self.offset, self.n = offset, sum(parameter.size for parameter in self.parameters)
        counts = collectives.block_counts(self.n, size)
        self.start = sum(counts[:rank])
        self.stop = self.start + counts[rank]
        # stages 1, 2: the whole weights stay, and my block is a view of them; stage 3: my own copy
        self.whole = whole[offset:offset + self.n] if stage < 3 else None
        block = whole[offset + self.start:offset + self.stop]
        self.shard = Parameter(block if stage < 3 else block.copy())
        self.gradient = None                     # the unit's whole gradient, from its backward to its reduction


class Shard:
    """This rank's part of ZeRO: the units, the blocks it keeps of each, and the optimizer of those blocks.

    Takes over what ``Run.start`` built whole: stage 3 lets go of the whole weights, and no stage
    keeps the whole gradient between steps."""

    def __init__(self, run, stage, optimizer, unit="layer", prefetch=False):
        objective, rank, size = run.objective, run.rank, run.size
        n = objective.params.size
        if size > n:
            raise cli.SettingError(f"--stage {stage}: {size} ranks but the model has only {n} parameters: every "
                                   f"rank needs a shard (use at most {n} ranks)")
        if not isinstance(objective, NetworkObjective):
            raise cli.SettingError("ZeRO's units are a network's layers: a convex problem has none (give --model)")
        self.stage, self.prefetch, self.size = stage, prefetch, size
        self.units, offset = [], 0
        for layers in units_of(objective.net, unit):
            self.units.append(Unit(layers, objective.params, offset, rank, size, stage))
            offset += self.units[-1].n
        in_order = [parameter for unit_ in self.units for parameter in unit_.parameters]
        assert [id(p) for p in in_order] == [id(p) for p in objective.flat.parameters], "units out of flat order"
        self.optimizer = optimizer([unit_.shard for unit_ in self.units], run.settings)
        self.whole = run.optimizer               # the whole model's optimizer: only for --resume and --save
        for key, value in self.whole.state[0].items():     # a resumed run's state, cut to my blocks
            for index, unit_ in enumerate(self.units):
                self.optimizer.state[index][key] = value[unit_.offset + unit_.start:unit_.offset + unit_.stop].copy()
        self.optimizer.steps = self.whole.steps
        self.whole.state[0] = {}                 # kept sharded: the whole state only exists while saving
        self.params = objective.params if stage < 3 else None       # stages 1, 2 keep the whole weights
        self.let_go_of_whole(objective)
        self.started, self.gathers = None, 0     # --prefetch: the gather in flight, this step's gathers so far

    def let_go_of_whole(self, objective):
        """Drop the whole gradient Run.start made (each unit's comes per step), and in stage 3 the whole weights."""
        flat, whole = objective.flat, self.whole.params[0]
        release(flat.parameters, "grad")
        objective.grad = flat.grad = whole.grad = None
        if self.stage == 3:
            release(flat.parameters)
            objective.params = flat.data = whole.data = absent(whole.shape, whole.dtype)

    # ---- the moments of a unit, as zero_step calls them ----------------------------------------------

    def gather(self, comm, unit, prefetch=True):
        """Stage 3: the unit's whole weights, every rank's block allgathered into a fresh vector that its
        layers now compute with (stages 1 and 2 keep them: nothing to do). With --prefetch, then start the
        step's next gather (forward in order, backward in reverse) without waiting for it."""
        if self.stage < 3:
            return
        if self.started is not None and self.started[0] is unit:      # prefetched: wait for the rest of it
            _, vector, started = self.started
            started.wait()
            self.started = None
        else:
            vector = self.with_my_block(unit)
            collectives.allgather(comm, MPI.IN_PLACE, vector, check=False)
        point(unit.parameters, vector)
        if self.prefetch and prefetch:
            self.gathers = (self.gathers + 1) % (2 * len(self.units))
            following = (self.units + self.units[::-1])[self.gathers]
            if self.gathers and following is not unit:               # not past the step, not this one again
                ahead = self.with_my_block(following)
                self.started = (following, ahead, start_allgather(comm, ahead))
        self.advance()

    @staticmethod
    def with_my_block(unit):
        """A fresh vector for the unit's whole weights, my block at its place (an allgather's input)."""
        vector = backend.get_array_module(unit.shard.data).empty(unit.n, dtype=unit.shard.data.dtype)
        vector[unit.start:unit.stop] = unit.shard.data
        return vector

    def release(self, unit):
        """Stage 3: let go of the unit's whole weights (its layers hold a stand-in until the next gather)."""
        if self.stage == 3:
            release(unit.parameters)
        self.advance()

    def gradient(self, unit):
        """A fresh zero vector for the unit's whole gradient: its parameters' .grad are views into it."""
        unit.gradient = backend.get_array_module(unit.shard.data).zeros(unit.n, dtype=unit.shard.data.dtype)
        point(unit.parameters, unit.gradient, "grad")
        return unit.gradient

    def reduce_scatter(self, comm, unit):
        """My block of the unit's gradient summed over ranks (the ring's reduce-scatter, in place), as the
        grad of my block; stages 2, 3 then let go of the unit's whole gradient (stage 1 at the update)."""
        collectives.reduce_scatter(comm, MPI.IN_PLACE, unit.gradient, check=False)
        block = unit.gradient[unit.start:unit.stop]
        unit.shard.grad = block if self.stage == 1 else block.copy()
        if self.stage > 1:
            release(unit.parameters, "grad")
            unit.gradient = None
        self.advance()

    def update(self):
        """My block of every unit, updated with my block of the optimizer state; then no gradient is kept."""
        self.optimizer.step()
        for unit in self.units:
            release(unit.parameters, "grad")
            unit.gradient = unit.shard.grad = None

    def advance(self):
        """Let a prefetched gather go as far as its messages allow (MPI moves it only inside MPI calls)."""
        if self.started is not None:
            self.started[2].test()

    # ---- evaluation and --save -----------------------------------------------------------------------

    def whole_model(self, comm, state=False):
        """The whole parameter vector on every rank (stage 3: gathered unit by unit into a fresh one), what
        train() returns; with ``state`` (--save only), the whole optimizer state too, on rank 0 only, in the
        whole model's optimizer that writes the file (``let_go_of_state`` drops it after). A collective."""
        first = self.units[0].shard.data
        xp = backend.get_array_module(first)
        n = self.units[-1].offset + self.units[-1].n
        params = xp.empty(n, dtype=first.dtype) if self.stage == 3 else None
        for unit in self.units if self.stage == 3 else ():
            collectives.allgather(comm, unit.shard.data, params[unit.offset:unit.offset + unit.n], check=False)
        for key in self.optimizer.state[0] if state else ():     # every rank's blocks to rank 0 (MPI's Gatherv)
            whole = numpy.empty(n, dtype=backend.to_numpy(first).dtype) if comm.Get_rank() == 0 else None
            for index, unit in enumerate(self.units):
                counts = collectives.block_counts(unit.n, self.size)
                comm.Gatherv(backend.to_numpy(self.optimizer.state[index][key]),
                             None if whole is None else [whole[unit.offset:unit.offset + unit.n], counts], root=0)
            if whole is not None:
                self.whole.state[0][key] = whole
        self.whole.steps = self.optimizer.steps
        return params if self.stage == 3 else self.params

    def let_go_of_state(self):
        """Drop the whole optimizer state --save gathered (written: only the blocks stay)."""
        self.whole.state[0] = {}


class Gathered(Module):
    """The model run unit by unit, each unit gathered just before it runs and released after (stage 3's
    evaluation: a gather at evaluation time instead of a whole copy kept for it)."""

    def __init__(self, shard, comm):
        super().__init__()
        self.layers = Sequential(*(unit.layers for unit in shard.units))     # so that .eval() reaches them
        self.shard, self.comm = shard, comm

    def forward(self, x):
        for unit in self.shard.units:
            self.shard.gather(self.comm, unit, prefetch=False)
            x = unit.layers(x)
            self.shard.release(unit)
        return x
