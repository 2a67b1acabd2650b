"""Model-parallel SGD (DistBelief): one replica's fully connected layers partitioned across P ranks.

    mpiexec -n 4 python -m algorithms.model_parallel --model mlp [--split output|input]

Papers: Dean et al. 2012, section 3 (a model partitioned across machines; "only those nodes with
edges that cross partition boundaries will need to have their state transmitted between
machines"); Ben-Nun & Hoefler 2019 (model parallelism: parameters distributed, the mini-batch
copied to every processor, all-to-all communication in every layer). Full references:
tutorials/references.md.

The network is an MLP, Linear -> ReLU -> ... -> Linear (after an optional Flatten). Layer k maps
a_k (N, i_k) to z_k = a_k W_k + b_k (N, o_k). Every rank holds a piece of every layer, and every
rank sees the whole batch. Two ways to cut W_k (i_k, o_k), uneven blocks allowed (``shard``):

    --split output   rank r owns the output neurons cols_r: W_k[:, cols_r], b_k[cols_r]
      forward    z_r = a_k W_k[:, cols_r] + b_k[cols_r]              (N, i_k) @ (i_k, o_r)
                 a_k+1 = allgather_r relu(z_r)          every neuron's value goes to every other rank
      backward   dW_k[:, cols_r] = a_k^T dz_r, db_k[cols_r] = sum_rows dz_r
                 da_k = sum_r dz_r W_k[:, cols_r]^T      (N, i_k): a sum over ranks, of which rank q
                 needs only its own neurons' columns: a reduce-scatter

    --split input    rank r owns the input features rows_r: W_k[rows_r, :] (and rank 0 owns b_k)
      forward    z = sum_r a_k[:, rows_r] W_k[rows_r, :]  (+ b_k)   a reduction: reduce-scatter +
                 allgather over z's columns, so every rank holds all of z; a_k+1 = relu(z)
      backward   dW_k[rows_r, :] = a_k[:, rows_r]^T dz, da_k[:, rows_r] = dz W_k[rows_r, :]^T
                 and the previous layer needs all of da_k: an allgather

The loss (mean softmax cross-entropy over the batch) is computed on every rank from the whole
logits, so its gradient needs no message. Each rank then updates its own pieces with SGD: the
same arithmetic as the unpartitioned model, up to the order of the additions in the reductions.

Communication: every message is a Sendrecv between two ranks of exactly what crosses the
partition (``exchange``: in step k of P-1, rank r sends to r+k and receives from r-k). Bytes all
ranks send per step, for N rows, widths i_k -> o_k, K layers (``bytes_per_step``):

    output:  (P-1) N (sum_k o_k + sum_{k>=1} i_k) itemsize      allgather of each layer's output,
                                                                reduce-scatter of each da_k, k >= 1
    input:   (P-1) N (2 sum_k o_k + sum_{k>=1} i_k) itemsize    reduce-scatter + allgather of z_k,
                                                                allgather of each da_k, k >= 1

Compare a data-parallel step, which sends 2 (P-1) n itemsize for n parameters whatever N is: model
parallelism pays per row of the batch, data parallelism per parameter (tutorials/06).

Restrictions: an MLP of Linear and ReLU layers (no convolutions); P <= the width being split of
every layer (a rank needs a neuron, or a feature, of each); --save and --resume are refused (the
optimizer state lives in pieces); the whole batch on every rank (one replica; see hybrid_parallel
for replicas of a partitioned model).

Default run (the MLP on the embedded digits, 10 epochs, batch 32, lr 0.05, momentum 0.9): the
same trajectory as serial SGD on the same MLP; measured at P = 4: 97.5% test accuracy, as
``serial_sgd --model mlp`` (17 s with other jobs on the 2 cores, against 2 s serially: this MLP is
far too small for its layers to be worth splitting; tutorials/06 counts the bytes).
"""
import numpy
from mpi4py import MPI

from algorithms import cli, run
from algorithms.cli import SettingError
from algorithms.objective import build_model
from minidl.data import shard
from minidl.flat import FlatParameters
from minidl.nn import Flatten, Linear, ReLU, Sequential
from minidl.tensor import Parameter

SPLITS = ("output", "input")
EXCHANGE = 8100                        # the tag of every partition-crossing message


def exchange(comm, outgoing, incoming):
    """Rank r sends outgoing[q] to every other rank q and receives incoming[q] from it (P-1 Sendrecvs).

    In step k rank r sends to r+k and receives from r-k: every pair of ranks meets in one step
    as sender and in one as receiver, and a Sendrecv cannot deadlock.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    for step in range(1, size):
        to, source = (rank + step) % size, (rank - step) % size
        comm.Sendrecv(numpy.ascontiguousarray(outgoing[to]), dest=to, sendtag=EXCHANGE,
                      recvbuf=incoming[source], source=source, recvtag=EXCHANGE)


def allgather_columns(comm, mine, widths):
    """Each rank's block of columns (N, widths[r]) -> the whole (N, sum widths) on every rank."""
    rank = comm.Get_rank()
    blocks = [numpy.empty((len(mine), width), dtype=mine.dtype) for width in widths]
    blocks[rank] = mine
    exchange(comm, [mine] * len(widths), blocks)
    return numpy.concatenate(blocks, axis=1)


def reduce_scatter_columns(comm, partial, widths):
    """sum over ranks of ``partial`` (N, sum widths), of which rank r keeps only its columns block."""
    rank, edges = comm.Get_rank(), numpy.cumsum([0] + list(widths))
    outgoing = [partial[:, edges[q]:edges[q + 1]] for q in range(len(widths))]
    incoming = [numpy.empty_like(outgoing[rank]) for _ in widths]   # every rank's partial of my block
    exchange(comm, outgoing, incoming)
    incoming[rank] = outgoing[rank]
    return sum(incoming[1:], start=incoming[0].copy())     # in rank order


class Piece:
    """Rank r's piece of one Linear layer: its weight and bias blocks, and where they sit."""

    def __init__(self, layer, rank, size, split):
        weight, bias = layer.weight.data, layer.bias.data
        self.inputs, self.outputs = weight.shape
        self.in_widths = [len(shard(self.inputs, q, size)) for q in range(size)]
        self.out_widths = [len(shard(self.outputs, q, size)) for q in range(size)]
        self.rows = shard(self.inputs, rank, size)             # my input features (split input)
        self.cols = shard(self.outputs, rank, size)            # my output neurons (split output)
        if split == "output":
            self.weight = Parameter(weight[:, self.cols].copy())
            self.bias = Parameter(bias[self.cols].copy())
        else:
            self.weight = Parameter(weight[self.rows, :].copy())
            self.bias = Parameter(bias.copy()) if rank == 0 else None

    def parameters(self):
        return [self.weight] + ([self.bias] if self.bias is not None else [])


def softmax_cross_entropy(logits, labels):
    """(mean loss, d loss / d logits) of softmax cross-entropy over the rows of ``logits``."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - numpy.log(numpy.exp(shifted).sum(axis=1, keepdims=True))
    rows = numpy.arange(len(labels))
    gradient = numpy.exp(log_probabilities)
    gradient[rows, labels] -= 1
    return float(-log_probabilities[rows, labels].mean()), gradient / len(labels)


def model_parallel_gradient(comm, pieces, x, labels, split):
    """The gradient of this rank's pieces for the batch (x, labels) (the heart); returns the mean loss.

    ``pieces``: this rank's Piece of every Linear layer, in order; ReLU between layers.
    """
    # BEGIN SOLUTION
    last = len(pieces) - 1
    # forward, layer by layer; keep each layer's input and pre-activation for the backward
    a, kept = x, []
    for k, piece in enumerate(pieces):
        if split == "output":
            z = a @ piece.weight.data + piece.bias.data           # (N, i) @ (i, o_r) -> my neurons
            a_next = z if k == last else numpy.maximum(z, 0)
            a_next = allgather_columns(comm, a_next, piece.out_widths)   # my neurons to every rank
        else:
            z = a[:, piece.rows] @ piece.weight.data               # (N, i_r) @ (i_r, o): a partial sum
            if piece.bias is not None:
                z = z + piece.bias.data                            # the bias is rank 0's, added once
            z = allgather_columns(comm, reduce_scatter_columns(comm, z, piece.out_widths), piece.out_widths)
            a_next = z if k == last else numpy.maximum(z, 0)
        kept.append((a, z))
        a = a_next
    # the loss from the whole logits, on every rank: its gradient needs no message
    loss, dz = softmax_cross_entropy(a, labels)
    if split == "output":
        dz = dz[:, pieces[last].cols]
    # backward, layer by layer
    for k in range(last, -1, -1):
        piece, (a, z) = pieces[k], kept[k]
        if k < last:
            dz = dz * (z > 0)                                      # through the ReLU
        if split == "output":
            piece.weight.grad[...] = a.T @ dz                      # (i, N) @ (N, o_r)
            piece.bias.grad[...] = dz.sum(axis=0)
            if k > 0:                                              # da = sum over ranks; keep my neurons'
                dz = reduce_scatter_columns(comm, dz @ piece.weight.data.T, pieces[k - 1].out_widths)
        else:
            piece.weight.grad[...] = a[:, piece.rows].T @ dz      # (i_r, N) @ (N, o)
            if piece.bias is not None:
                piece.bias.grad[...] = dz.sum(axis=0)
            if k > 0:                                              # my features' da to every rank
                dz = allgather_columns(comm, dz @ piece.weight.data.T, piece.in_widths)
    return loss
    # END SOLUTION


def linear_layers(net):
    """The Linear layers of an MLP (optional Flatten, then Linear, ReLU, ..., Linear); ValueError otherwise."""
    layers = list(net) if isinstance(net, Sequential) else [net]
    if layers and isinstance(layers[0], Flatten):
        layers = layers[1:]
    kinds = [Linear if index % 2 == 0 else ReLU for index in range(len(layers))]
    if not layers or len(layers) % 2 == 0 or any(type(layer) is not kind for layer, kind in zip(layers, kinds)):
        raise ValueError("model parallelism here partitions an MLP (Linear, ReLU, ..., Linear); "
                         "use --model mlp")
    return layers[::2]


def check(settings, size, split):
    """The model-parallel settings, checked on every rank before the first message."""
    if split not in SPLITS:
        raise SettingError(f"unknown --split {split!r}; choose one of {', '.join(SPLITS)}")
    if settings.save or settings.resume:
        raise SettingError("model_parallel does not offer --save or --resume: its optimizer state lives in pieces")
    if settings.problem is not None:
        raise SettingError("model parallelism needs a network of layers, not a convex problem")
    model = settings.model
    net = model() if callable(model) else build_model(model, settings.seed, settings.dataset)
    try:
        layers = linear_layers(net)
    except ValueError as error:
        raise SettingError(f"--model {model if isinstance(model, str) else 'given'}: {error}") from None
    for k, layer in enumerate(layers):
        width = layer.out_features if split == "output" else layer.in_features
        if size > width:
            raise SettingError(f"{size} ranks cannot split layer {k} ({layer.in_features} -> {layer.out_features}) by "
                               f"{split}: it has only {width} {'neurons' if split == 'output' else 'input features'} "
                               f"(use at most {width} ranks, or the other --split)")


def bytes_per_step(rows, widths, size, itemsize, split):
    """Bytes all ranks send in one step (the formula of the docstring); widths = [i_0, o_0 = i_1, ..., o_K-1]."""
    outputs, inner_inputs = sum(widths[1:]), sum(widths[1:-1])
    return (size - 1) * rows * ((2 if split == "input" else 1) * outputs + inner_inputs) * itemsize


def assemble(comm, pieces, layers, split):
    """Every rank's pieces into the whole layers on every rank (evaluation only: not counted)."""
    for piece, layer in zip(pieces, layers):
        every = comm.allgather((piece.weight.data, None if piece.bias is None else piece.bias.data))
        if split == "output":
            layer.weight.data[...] = numpy.concatenate([weight for weight, _ in every], axis=1)
            layer.bias.data[...] = numpy.concatenate([bias for _, bias in every])
        else:
            layer.weight.data[...] = numpy.concatenate([weight for weight, _ in every], axis=0)
            layer.bias.data[...] = every[0][1]


def train(comm=None, split="output", **settings):
    """Model-parallel SGD on ``comm``: one replica, its layers in P pieces; returns (final flat
    parameters of the whole model, on every rank, history)."""
    comm = comm or MPI.COMM_WORLD
    settings = run.Settings.of(settings, epochs=10, momentum=0.9, partition="global", model="mlp")
    job = run.start(comm, settings, check=lambda s: check(s, comm.Get_size(), split), reader=(0, 1))
    layers = linear_layers(job.objective.net)
    pieces = [Piece(layer, job.rank, job.size, split) for layer in layers]
    flat = FlatParameters([parameter for piece in pieces for parameter in piece.parameters()])
    optimizer = type(job.optimizer)([flat.as_parameter()], lr=settings.lr, momentum=settings.momentum)
    x_all, y_all = job.objective.data.x_train, job.objective.data.y_train

    def step(batch):
        x = numpy.asarray(x_all[batch.index]).reshape(len(batch.index), -1)
        loss = model_parallel_gradient(job.counting, pieces, x, y_all[batch.index], split)
        optimizer.step()                               # every rank: its own pieces only
        return loss

    def evaluate():
        assemble(job.comm, pieces, layers, split)
        return job.objective.evaluate()

    return job.loop(step, evaluate=evaluate)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], epochs=10, momentum=0.9, model="mlp")
    parser.add_argument("--split", default="output", choices=SPLITS,
                        help="output: each rank owns some output neurons of every layer; input: some input features")
    args = parser.parse_args(argv)
    cli.run_main(train, args, split=args.split)


if __name__ == "__main__":
    main()
