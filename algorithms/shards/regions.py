"""A rank's region of a locally connected network: the weights of the rows it computes (the spatial split).

    region = Region(tiling, net, rank)        # my rows of every stage's weights and of the head's first Linear
    region.flat                               # their values as one vector (and .grad), the optimizer's
    params, momentum = region.gather(comm, [region.flat.data, v])   # the serial model's flat vectors

A locally connected layer (``minidl.nn.LocallyConnected2d``, weight (Ho, Wo, F, C, k, k), bias
(Ho, Wo, F)) has weights of its own for every output position, so the rank that computes output
rows [lo, hi) of a stage (``Tiling``'s ``conv_rows``) needs weight[lo:hi] and bias[lo:hi] and no
other. The head is cut by rows too: the first Linear's rows that multiply my features (my rows of
the last map, in Flatten's order: channel, row, column), its bias on rank 0, the layers after it
whole on every rank. ``spatial_parallel --layer local`` trains the region (its header tells how);
this module is only what a rank keeps, and where each value sits in the serial model's flat vector.
"""
import numpy
from mpi4py import MPI

from algorithms.core.cli import SettingError
from minidl.flat import FlatParameters, release
from minidl.nn import Flatten, Linear, Module, Sequential
from minidl.tensor import Parameter


class Region(Module):
    """Rank ``rank``'s pieces of the tiled network ``net``: ``pieces`` (per stage, (weight, bias) of my rows),
    ``head_weight`` and ``head_bias`` (rank 0's; None elsewhere), ``rest`` (the head after its first Linear).
    As a model (evaluation), it runs ``logits(x)``, which the algorithm that trains it sets."""

    def __init__(self, tiling, net, rank, flat=True):
        super().__init__()
        head = tiling.head
        if len(head) < 2 or not isinstance(head[0], Flatten) or not isinstance(head[1], Linear):
            raise SettingError("--layer local partitions the head by rows: it must start with Flatten, Linear")
        start, offsets = 0, {}
        for parameter in net.parameters():
            offsets[id(parameter)] = start
            start += parameter.size
        self.mine, self.positions, self.shared = [], [], []

        def own(parameter, rows, shared=False):   # my rows (first axis) of a serial parameter: a copy
            piece = Parameter(parameter.data[rows])
            self.positions.append((offsets[id(parameter)], numpy.asarray(rows), parameter.size // parameter.shape[0]))
            self.shared.append(shared)
            self.mine.append(piece)
            return piece
        self.pieces = [(own(stage.conv.weight, rows), own(stage.conv.bias, rows))
                       for stage in tiling.stages for rows in [numpy.arange(*stage.conv_rows(rank))]]
        (lo, hi), (channels, height, width) = tiling.final[0][rank], tiling.final[1]
        features = [c * height * width + h * width + w for c in range(channels) for h in range(lo, hi)
                    for w in range(width)]
        linear = head[1]
        self.head_weight = own(linear.weight, numpy.array(features, dtype=int))
        self.head_bias = own(linear.bias, numpy.arange(linear.bias.size)) if rank == 0 else None
        self.rest = Sequential(*head[2:])
        for parameter in self.rest.parameters():       # whole on every rank: kept by all, saved from rank 0
            own(parameter, numpy.arange(parameter.shape[0]), shared=True)
        self.n, self.rank, self.logits = start, rank, None
        if flat:
            self.flatten()

    def forward(self, x):
        return self.logits(x.data)

    def take_over(self, run, optimizer):
        """From what Run.start built: my values of a resumed momentum into ``optimizer``; then the serial
        model and its momentum (every rank's whole copies) are let go, only my region stays."""
        whole = run.optimizer.params[0]
        if "momentum" in run.optimizer.state[0]:
            optimizer.state[0]["momentum"] = run.optimizer.state[0]["momentum"][numpy.concatenate(self.where())]
        optimizer.steps, run.optimizer.state[0] = run.optimizer.steps, {}
        release(run.objective.flat.parameters)
        run.objective.params = run.objective.grad = run.objective.flat = whole.data = whole.grad = None

    def saved(self, comm, optimizer, whole, state=False):
        """The serial model's flat parameters, gathered on every rank (train()'s return); with ``state``
        (--save only) its momentum too, on rank 0 only, into ``whole`` (the serial model's optimizer, which
        rank 0 writes)."""
        params, = self.gather(comm, [self.flat.data])
        momentum = self.gather(comm, list(optimizer.state[0].values()), root=0) if state else []
        if comm.Get_rank() == 0:
            whole.state[0] = dict(zip(optimizer.state[0], momentum))
        whole.steps = optimizer.steps
        return params

    def flatten(self):
        """My pieces as one flat vector, and one for their gradient (``minidl.flat``): the optimizer's."""
        self.flat = FlatParameters(self.mine)

    def where(self):
        """For each of my pieces, the positions of its values in the serial model's flat vector."""
        return [((offset + rows * per_row)[:, None] + numpy.arange(per_row)).reshape(-1)
                for offset, rows, per_row in self.positions]

    def gather(self, comm, vectors, root=None):
        """The serial model's flat vectors from every rank's pieces of ``vectors`` (vectors in my flat order),
        each value from its one owner (rank 0 for what all hold): on every rank, summed over ranks (exact,
        x + 0 = x); or with ``root``, on that rank only, every rank's own values sent to it (None elsewhere).
        MPI's own collectives: for --save and the end only, not part of the algorithm."""
        positions, take, start = [], [], 0
        for where, shared in zip(self.where(), self.shared):
            if self.rank == 0 or not shared:
                positions.append(where)
                take.append(numpy.arange(start, start + where.size))
            start += where.size
        positions, take = numpy.concatenate(positions), numpy.concatenate(take)
        wholes = []
        for vector in vectors:
            pieces = [(positions, vector[take])] if root is None else comm.gather((positions, vector[take]), root)
            whole = None if pieces is None else numpy.zeros(self.n, dtype=vector.dtype)
            for where, values in pieces or ():
                whole[where] = values
            if root is None:
                comm.Allreduce(MPI.IN_PLACE, whole, op=MPI.SUM)
            wholes.append(whole)
        return wholes


def twin(model, recompute=False):
    """The locally connected network ``spatial_parallel --layer local`` trains: local-cnn, the small CNN's
    twin, for --model cnn (or local-cnn, or a model function); anything else is a SettingError."""
    if recompute:
        raise SettingError("--recompute is not offered with --layer local")
    if callable(model) or model == "local-cnn":
        return model
    if model == "cnn":
        return "local-cnn"
    raise SettingError(f"--layer local trains a locally connected network: --model cnn (its twin, local-cnn) or "
                       f"local-cnn, not {model!r}")
