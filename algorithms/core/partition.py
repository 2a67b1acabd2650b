"""A model cut into pieces across the ranks of a communicator: what model parallelism shares.

    blocks = blocks_of(net)                          # [(Flattens before, Linear or Conv2d, ReLUs and poolings after)]
    pieces = [Piece(block, rank, size, split) for block in blocks]      # this rank's piece of every block
    mine = Partition(run, comm, split)               # the pieces as one flat vector, with its optimizer
                                                     # (a Placement: tensor parallelism's pieces are one too)

Model-parallel SGD (``algorithms/model_parallel.py``, whose header explains the two splits and
whose heart ``model_parallel_gradient`` runs the pieces), the hybrid grid's model-parallel rows
(``algorithms/hybrid_parallel.py``) and Downpour's model-parallel replicas (``algorithms/ps/replica.py``)
all cut the network the same way; this module is that cut:

    --split output   rank r owns the output neurons (channels) cols_r of every layer: W_k[:, cols_r], b_k[cols_r]
    --split input    rank r owns the input features rows_r: W_k[rows_r, :] (and rank 0 owns b_k); MLP only

uneven blocks allowed (``minidl.data.shard``). ``check`` refuses, before any message, a model or a
rank count that cannot be cut so. ``Partition`` keeps where each piece value sits in the serial
model's flat vector (``serial_positions``), so evaluation, --save and --resume see the serial
model whatever the layout: checkpoints are layout-free.
"""
import numpy

from algorithms.core.cli import SettingError
from algorithms.core.objective import build_model
from minidl.data import shard
from minidl.flat import FlatParameters
from minidl.nn import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential
from minidl.tensor import Parameter

SPLITS = ("output", "input")
WEIGHT_LAYERS, LOCAL_LAYERS = (Linear, Conv2d), (ReLU, MaxPool2d)   # ReLU and pooling act per channel


def blocks_of(net):
    """The network as blocks [(before, weight layer, after)]: ``before`` the Flattens in front of the
    weight layer (run on the whole input), ``after`` the ReLUs and poolings behind it (run on this rank's
    channels alone). ValueError for a layer of another kind."""
    layers = list(net) if isinstance(net, Sequential) else [net]
    blocks, before = [], []
    for layer in layers:
        if isinstance(layer, Flatten):
            before.append(layer)
        elif isinstance(layer, WEIGHT_LAYERS):
            blocks.append((before, layer, []))
            before = []
        elif isinstance(layer, LOCAL_LAYERS) and blocks and not before:
            blocks[-1][2].append(layer)
        else:
            raise ValueError(f"model parallelism here partitions Linear and Conv2d layers with ReLU and max "
                             f"pooling between them, not a {type(layer).__name__} there")
    if not blocks or before:
        raise ValueError("model parallelism here needs a network that ends in a Linear or Conv2d layer")
    return blocks


def is_mlp(blocks):
    """Linear, ReLU, ..., Linear (after an optional Flatten): what --split input partitions."""
    return all(isinstance(layer, Linear) and [type(a) for a in after] == ([ReLU] if k < len(blocks) - 1 else [])
               and (k == 0 or not before) for k, (before, layer, after) in enumerate(blocks))


def cut(layer, keep):
    """A copy of the Linear or Conv2d ``layer`` with only the output neurons or channels ``keep``."""
    rng, dtype = numpy.random.default_rng(0), layer.weight.dtype     # the weights are overwritten below
    if isinstance(layer, Linear):
        piece = Linear(layer.in_features, len(keep), rng=rng, dtype=dtype)
        piece.weight.data[...] = layer.weight.data[:, keep]
    else:
        piece = Conv2d(layer.in_channels, len(keep), layer.kernel_size, rng=rng, stride=layer.stride,
                       padding=layer.padding, algorithm=layer.algorithm, dtype=dtype)
        piece.weight.data[...] = layer.weight.data[keep]
    piece.bias.data[...] = layer.bias.data[keep]
    return piece


class Piece:
    """Rank r's piece of one block (a Linear or Conv2d layer and the layers around it).

    split output: ``module`` = the Flattens before, the layer cut to my neurons (channels) ``cols``, the
    ReLU and pooling after; split input (Linear only): my rows ``rows`` of the weight, and the bias on
    rank 0. ``weight`` and ``bias`` are my parameters either way (``bias`` None on ranks 1.. of input).
    """

    def __init__(self, block, rank, size, split):
        before, layer, after = block
        if isinstance(layer, Conv2d):                          # weight (out channels, in channels, k, k)
            self.outputs, self.inputs = layer.weight.shape[:2]
        else:                                                  # weight (in features, out features)
            self.inputs, self.outputs = layer.weight.shape
        self.in_widths = [len(shard(self.inputs, q, size)) for q in range(size)]
        self.out_widths = [len(shard(self.outputs, q, size)) for q in range(size)]
        self.rows = shard(self.inputs, rank, size)             # my input features (split input)
        self.cols = shard(self.outputs, rank, size)            # my output neurons or channels (split output)
        if split == "output":
            mine = cut(layer, self.cols)
            self.module = Sequential(*before, mine, *after)
            self.weight, self.bias = mine.weight, mine.bias
        else:
            self.weight = Parameter(layer.weight.data[self.rows, :].copy())
            self.bias = Parameter(layer.bias.data.copy()) if rank == 0 else None

    def parameters(self):
        return [self.weight] + ([self.bias] if self.bias is not None else [])


def check(settings, size, split):
    """The model-parallel settings, checked on every rank before the first message."""
    if split not in SPLITS:
        raise SettingError(f"unknown --split {split!r}; choose one of {', '.join(SPLITS)}")
    if settings.problem is not None:
        raise SettingError("model parallelism needs a network of layers, not a convex problem")
    model = settings.model
    name = f"--model {model}" if isinstance(model, str) else "the model"
    net = model() if callable(model) else build_model(model, settings.seed, settings.dataset)
    try:
        blocks = blocks_of(net)
    except ValueError as error:
        raise SettingError(f"{name}: {error}") from None
    if split == "input" and not is_mlp(blocks):
        raise SettingError(f"{name}: --split input partitions an MLP (Linear, ReLU, ..., Linear); use --split output")
    for k, (_, layer, _) in enumerate(blocks):
        piece = Piece(([], layer, []), 0, 1, split)
        width, what = (piece.outputs, "outputs") if split == "output" else (piece.inputs, "inputs")
        if size > width:
            raise SettingError(f"{size} ranks cannot split layer {k} ({piece.inputs} -> {piece.outputs}) by "
                               f"{split}: it has only {width} {what} (use at most {width} ranks"
                               f"{', or the other --split' if isinstance(layer, Linear) else ''})")


def serial_positions(pieces, blocks, flat, split):
    """Where this rank's piece values sit in the serial model's flat vector ``flat``, in the order of
    the pieces' own flat vector (weight, bias, piece by piece)."""
    offsets = {id(parameter): start for parameter, (start, _) in zip(flat.parameters, flat.offsets)}
    where = []
    for piece, (_, layer, _) in zip(pieces, blocks):
        weight = offsets[id(layer.weight)] + numpy.arange(layer.weight.size).reshape(layer.weight.shape)
        bias = offsets[id(layer.bias)] + numpy.arange(layer.bias.size)
        if split == "output":                                  # my output channels' (neurons') axis
            where += [(weight[piece.cols] if isinstance(layer, Conv2d) else weight[:, piece.cols]).ravel(),
                      bias[piece.cols]]
        else:                                                  # my input features' rows; the bias on rank 0
            where += [weight[piece.rows].ravel()] + ([bias] if piece.bias is not None else [])
    return numpy.concatenate(where)


class Placement:
    """This rank's own parameters of ``run``'s model, whatever the split: one flat vector with its own
    optimizer, and where each value sits in the serial model (``own``: positions in ``run``'s flat
    vector, in the order of ``parameters``), so the whole model and its optimizer state can be
    assembled for evaluation and --save, and a --resume file (the serial model's order, loaded by
    Run.start) cut back into this rank's values. A value several ranks hold (tensor parallelism's
    replicated layers) is written by each, the same."""

    def __init__(self, run, comm, parameters, own):
        self.comm = comm
        self.flat = FlatParameters(parameters)
        self.optimizer = type(run.optimizer)([self.flat.as_parameter()], lr=run.settings.lr,
                                             momentum=run.settings.momentum)
        self.objective, self.serial = run.objective, run.optimizer
        self.where = comm.allgather(own)                       # every rank's positions, once
        for key, value in self.serial.state[0].items():        # a resumed run's momentum, cut to my values
            self.optimizer.state[0][key] = value[own].copy()
        self.optimizer.steps = self.serial.steps

    def assemble(self, local):
        """Every rank's ``local`` values as one vector in the serial model's order (on every rank)."""
        whole = numpy.empty(self.objective.params.size, dtype=local.dtype)
        for where, values in zip(self.where, self.comm.allgather(local)):
            whole[where] = values
        return whole

    def gather(self):
        """This rank's values into the serial model, their momentum into its optimizer, on every rank
        (evaluation and --save only: not counted)."""
        self.objective.params[...] = self.assemble(self.flat.data)
        for key, value in self.optimizer.state[0].items():
            self.serial.state[0][key] = self.assemble(value)
        self.serial.steps = self.optimizer.steps

    def evaluate(self):
        """The serial model's test metrics, with this run's values gathered into it (``Run.loop``'s evaluate)."""
        self.gather()
        return self.objective.evaluate()


class Partition(Placement):
    """This rank's pieces of every layer of ``run``'s model, split over ``comm`` by ``split`` (a
    ``Placement`` of the pieces' parameters, at their ``serial_positions``)."""

    def __init__(self, run, comm, split):
        self.split = split
        self.blocks = blocks_of(run.objective.net)
        self.pieces = [Piece(block, comm.Get_rank(), comm.Get_size(), split) for block in self.blocks]
        own = serial_positions(self.pieces, self.blocks, run.objective.flat, split)
        super().__init__(run, comm, [parameter for piece in self.pieces for parameter in piece.parameters()], own)
