"""Tensor parallelism (Megatron-LM): each MLP block's two weight matrices split over the ranks, column then row.

    mpiexec -n 4 python -m algorithms.tensor_parallel [--model mlp|lenet5] [--allreduce ring|...] [--recompute]

Paper: Shoeybi, Patwary, Puri, LeGresley, Casper & Catanzaro 2019 (Megatron-LM), section 3 and its
Figure 3 (the MLP block, the conjugate operators f and g). Full references: tutorials/references.md.

A block is Linear, ReLU, Linear: Z = relu(X A + a) B + b, X (N, i), A (i, h), B (h, o). Rank r of
p owns the columns cols_r of A (and of a) and the same rows of B (uneven blocks allowed,
``minidl.data.shard``), so relu(X A + a) is computed by columns, with no message, and Y B is a sum
of p partial products (``tensor_parallel_block``, on rank r):

    X   = f(X)                          identity;     backward: dX = sum_r dX_r       (allreduce)
    Y_r = relu(X A[:, cols_r] + a[cols_r])          (N, i) @ (i, h_r): my columns of Y
    Z_r = Y_r B[cols_r, :]                          (N, h_r) @ (h_r, o): my part of Y B
    Z   = g(Z_r) + b                    allreduce;    backward: dZ_r = dZ             (identity)

f and g (``minidl.functional.copy_to_parallel`` and ``reduce_from_parallel``) are conjugate: each is
the identity one way and an allreduce the other. A block therefore costs two allreduces per step
of N o and N i values, g's in forward and f's in backward, whatever p; the block that reads the
data itself skips f's (the data needs no gradient), so an MLP classifier pays 2 k - 1 for k blocks.
Every other layer (the convolutions of LeNet-5, the output layer after the blocks) is replicated:
every rank holds it whole and computes it on the same input, so it needs no message either.
Every rank sees the whole batch; the loss and its gradient are the same on every rank.

Split this way: --model mlp (64 -> 128 -> 64 -> 10: one block 64 -> 128 -> 64, the output layer
replicated) and --model lenet5 (its head 400 -> 120 -> 84 is the block, the convolutions and the
84 -> 10 layer replicated); the small CNN has one Linear layer only and is refused.

Communication per step (ring allreduce, itemsize s): 2 (p-1)/p N (o + i) s bytes per block and
rank; compare data parallelism's 2 (p-1)/p n s for n parameters: the block's cost grows with the
batch, not with the weights, and each rank holds only i h_r + h_r + h_r o + o of the block's
i h + h + h o + o values.

--recompute (Chen et al. 2016; Megatron's activation checkpointing): each block's f, column
Linear, ReLU and row product Y_r B[cols_r, :] run as one checkpointed segment (``minidl.recompute``),
g and the bias after it. Of the segment the forward keeps only its input X and its output Z_r,
not the two (N, h_r) arrays inside; the backward runs the segment again from X. One block alone
saves nothing (the same arrays are recorded again, with a fresh Z_r); several blocks take turns.
That recomputed forward communicates nothing: f is the identity forward, and g, outside the
segment, is not run again. So a step still pays two allreduces per block (g's forward, f's
backward, counted by tests/test_split_recompute.py) and the parameters are bitwise those of the
plain run.

Restrictions: p <= h of every block (a rank needs a column; more ranks are refused); one replica
(see hybrid_parallel for replicas of a split model). Checkpoints are layout-free: --save writes
the serial model and its momentum, so any SGD-family algorithm resumes the file and this one
resumes theirs (``partition.Placement``).

Default run (the defaults ``--help`` shows): serial SGD's trajectory up to rounding, 97.5% test accuracy as
``serial_sgd --model mlp``.
"""
import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli, partition
from algorithms.core.objective import build_model, loss_and_grad
from algorithms.core.run import Run, Settings, allreduce_function
from minidl import functional as F, recompute as recomputation
from minidl.data import shard
from minidl.nn import Linear, Module, ReLU, Sequential
from minidl.tensor import Parameter

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=10, momentum=0.9, model="mlp")


def tensor_parallel_block(x, column, row_weight, row_bias, total):
    """Megatron's MLP block on this rank (the heart): relu(x A + a) B + b with my columns of A, a and
    my rows of B. ``column``: Linear(i, h_r); ``row_weight`` (h_r, o), ``row_bias`` (o,) the whole b;
    ``total(array)``: the sum over the tensor-parallel ranks."""
    # BEGIN SOLUTION
    x = F.copy_to_parallel(x, total)                  # f: forward identity, backward allreduce of dX
    y = column(x).relu()                              # (N, i) @ (i, h_r): my columns of relu(X A + a)
    z = F.linear(y, row_weight)                       # (N, h_r) @ (h_r, o): my part of Y B
    return F.reduce_from_parallel(z, total) + row_bias   # g: forward allreduce, backward identity
    # END SOLUTION


def blocks_of(net):
    """[(k, k + 2)]: the layer indices of each Linear, ReLU, Linear that tensor parallelism splits
    (column-parallel k, row-parallel k + 2), scanned left to right without overlap."""
    layers, found, k = list(net), [], 0
    while k + 2 < len(layers):
        if isinstance(layers[k], Linear) and isinstance(layers[k + 1], ReLU) and isinstance(layers[k + 2], Linear):
            found.append((k, k + 2))
            k += 3
        else:
            k += 1
    return found


def check(settings, size):
    """The tensor-parallel settings, checked on every rank before the first message."""
    if settings.problem is not None:
        raise cli.SettingError("tensor parallelism needs a network of layers, not a convex problem")
    model = settings.model
    name = f"--model {model}" if isinstance(model, str) else "the model"
    net = model() if callable(model) else build_model(model, settings.seed, settings.dataset)
    blocks = blocks_of(net) if isinstance(net, Sequential) else []
    if not blocks:
        raise cli.SettingError(f"{name}: tensor parallelism splits Linear -> ReLU -> Linear blocks and this network "
                               f"has none; use --model mlp or lenet5")
    for number, (k, _) in enumerate(blocks):
        width = net[k].out_features
        if size > width:
            raise cli.SettingError(f"{size} tensor-parallel ranks cannot split block {number} ({net[k].in_features} -> "
                                   f"{width} -> {net[k + 2].out_features}): it has only {width} columns (use at "
                                   f"most {width} ranks)")


class Block:
    """This rank's piece of one block, a callable layer: the column Linear and the rows of B; with
    ``recompute``, ``module`` is the checkpointed segment (f, column, ReLU, row product), g after it."""

    def __init__(self, column, row_weight, row_bias, total, recompute=False):
        self.column, self.row_weight, self.row_bias, self.total = column, row_weight, row_bias, total
        self.module = Segment(column, row_weight, total) if recompute else None

    def __call__(self, x):
        if self.module is None:
            return tensor_parallel_block(x, self.column, self.row_weight, self.row_bias, self.total)
        z = recomputation.checkpoint(self.module, x)        # f, column, ReLU, row product: kept X and Z_r only
        return F.reduce_from_parallel(z, self.total) + self.row_bias        # g, outside: never run again


class Segment(Module):
    """The recomputed part of a block, the heart's first three lines: f, relu(X A_r + a_r), its product with B_r."""

    def __init__(self, column, row_weight, total):
        super().__init__()
        self.column, self.row_weight, self.total = column, row_weight, total

    def forward(self, x):
        return F.linear(self.column(F.copy_to_parallel(x, self.total)).relu(), self.row_weight)


def split_network(net, flat, rank, size, total, recompute=False):
    """This rank's network (a list of callables: its Blocks and whole copies of the other layers), its
    parameters and their positions in ``flat`` (the serial model's flat vector, ``partition.Placement``);
    ``recompute``: each Block a checkpointed segment."""
    offsets = {id(parameter): start for parameter, (start, _) in zip(flat.parameters, flat.offsets)}

    def positions(parameter):                  # where each value of a serial parameter sits, shaped like it
        return offsets[id(parameter)] + numpy.arange(parameter.size).reshape(parameter.shape)

    layers, blocks = list(net), dict(blocks_of(net))
    mine, parameters, where, k = [], [], [], 0
    while k < len(layers):
        layer = layers[k]
        if k in blocks:                        # column k, its ReLU, row k + 2
            first, second = layer, layers[k + 2]
            cols = shard(first.out_features, rank, size)
            column = partition.cut(first, cols)
            row_weight = Parameter(second.weight.data[cols, :].copy())
            row_bias = Parameter(second.bias.data.copy())
            mine.append(Block(column, row_weight, row_bias, total, recompute))
            parameters += [column.weight, column.bias, row_weight, row_bias]
            where += [positions(first.weight)[:, cols], positions(first.bias)[cols],
                      positions(second.weight)[cols, :], positions(second.bias)]
            k += 3
            continue
        if layer.parameters():                 # a Linear or Conv2d outside the blocks: replicated
            layer = partition.cut(layer, numpy.arange(layer.bias.size))
            parameters += [layer.weight, layer.bias]
            where += [positions(layers[k].weight), positions(layers[k].bias)]
        mine.append(layer)                     # Flatten, ReLU, pooling: no parameters, shared
        k += 1
    return mine, parameters, numpy.concatenate([w.ravel() for w in where])


class TensorParallel(partition.Placement):
    """This rank's split network over ``comm``, placed in ``run``'s serial model; summing by ``allreduce``."""

    def __init__(self, run, comm, allreduce, recompute=False):
        summed = allreduce_function(allreduce)

        def total(array):
            summed(comm, array.reshape(-1))        # in place: ``array`` is a fresh contiguous copy
            return array
        self.layers, parameters, own = split_network(run.objective.net, run.objective.flat, comm.Get_rank(),
                                                     comm.Get_size(), total, recompute)
        super().__init__(run, comm, parameters, own)

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def train(comm=None, allreduce="ring", recompute=False, **settings):
    """Tensor-parallel SGD on ``comm``: one replica, its blocks split over the ranks; returns (final flat
    parameters of the whole model, on every rank, history). ``recompute``: each block a checkpointed segment."""
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)
    writer = checkpoint.Writer("tensor_parallel", checkpoint.SGD_FAMILY, layout={"tensor_ranks": comm.Get_size()})
    run = Run.start(comm, settings, check=lambda s: (check(s, comm.Get_size()), allreduce_function(allreduce)),
                    reader=(0, 1), writer=writer)
    mine = TensorParallel(run, run.counting, allreduce, recompute)
    x_all, y_all = run.objective.data.x_train, run.objective.data.y_train

    def step(batch):
        mine.flat.zero_grad()
        loss = loss_and_grad(mine, x_all[batch.index], y_all[batch.index])
        mine.optimizer.step()                          # every rank: its own pieces and its replicated copies
        return loss

    return run.loop(step, evaluate=mine.evaluate)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], allreduce="ring", recompute="block", **DEFAULTS)
    args = parser.parse_args(argv)
    cli.run_main(train, args, allreduce=args.allreduce)


if __name__ == "__main__":
    main()
