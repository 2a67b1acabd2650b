"""Model-parallel SGD (DistBelief): every layer of one replica partitioned across P ranks.

    mpiexec -n 4 python -m algorithms.model_parallel [--model mlp|cnn|lenet5] [--split output|input]

Papers: Dean et al. 2012, section 3 (a model partitioned across machines; "only those nodes with
edges that cross partition boundaries will need to have their state transmitted between
machines"); Ben-Nun & Hoefler 2019 (model parallelism: parameters distributed, the mini-batch
copied to every processor, all-to-all communication in every layer). Full references:
tutorials/references.md.

The network is a Sequential of blocks (``partition.blocks_of``: the cut lives in
algorithms/core/partition.py, which the hybrid grid and Downpour's replicas share): a Linear or
Conv2d layer, the Flattens in front of it, the ReLUs and max-poolings behind it. For an MLP,
layer k maps a_k (N, i_k) to z_k = a_k W_k + b_k (N, o_k). Every rank holds a piece of every
layer, and every rank sees the whole batch. Two ways to cut W_k (i_k, o_k), uneven blocks allowed
(``minidl.data.shard``):

    --split output   rank r owns the output neurons cols_r: W_k[:, cols_r], b_k[cols_r]
      forward    z_r = a_k W_k[:, cols_r] + b_k[cols_r]              (N, i_k) @ (i_k, o_r)
                 a_k+1 = allgather_r relu(z_r)          every neuron's value goes to every other rank
      backward   dW_k[:, cols_r] = a_k^T dz_r, db_k[cols_r] = sum_rows dz_r
                 da_k = sum_r dz_r W_k[:, cols_r]^T      (N, i_k): a sum over ranks, of which rank q
                 needs only its own neurons' columns: a reduce-scatter
      a convolution is cut the same way by output channels (its weight's first axis; DistBelief
      itself cuts convolutional layers spatially, by blocks of the feature map); ReLU and
      pooling act on each channel alone, so they run on the rank that owns it, and the allgather
      and reduce-scatter move blocks of channels (N, c_r, H, W) instead of columns. The output
      split runs through minidl's autograd on each rank's piece (``partition.Piece.module``).

    --split input    rank r owns the input features rows_r: W_k[rows_r, :] (and rank 0 owns b_k)
      forward    z = sum_r a_k[:, rows_r] W_k[rows_r, :]  (+ b_k)   a reduction: reduce-scatter +
                 allgather over z's columns, so every rank holds all of z; a_k+1 = relu(z)
      backward   dW_k[rows_r, :] = a_k[:, rows_r]^T dz, da_k[:, rows_r] = dz W_k[rows_r, :]^T
                 and the previous layer needs all of da_k: an allgather

The input split is written out in NumPy for an MLP only. The loss (mean softmax cross-entropy
over the batch) is computed on every rank from the whole logits, so its gradient needs no message.
Each rank then updates its own pieces with SGD: the same arithmetic as the unpartitioned model, up
to the order of the additions in the reductions (and to the float32 rounding of a smaller matrix
product: in float32 the CNN's trajectory drifts from serial SGD's by rounding, 0.2051 against
0.2042 training loss after 2 epochs at P = 4; in float64 the two agree to 4e-16).

Communication: every message is a Sendrecv between two ranks of exactly what crosses the
partition (``exchange``: in step k of P-1, rank r sends to r+k and receives from r-k). Bytes all
ranks send per step, for N rows, widths i_k -> o_k, K layers (``bytes_per_step``):

(for a convolution, o_k counts a row's features of block k's output, channels x height x width
after pooling, and i_k = o_k-1)

    output:  (P-1) N (sum_k o_k + sum_{k>=1} i_k) itemsize      allgather of each layer's output,
                                                                reduce-scatter of each da_k, k >= 1
    input:   (P-1) N (2 sum_k o_k + sum_{k>=1} i_k) itemsize    reduce-scatter + allgather of z_k,
                                                                allgather of each da_k, k >= 1

Compare a data-parallel step, which sends 2 (P-1) n itemsize for n parameters whatever N is: model
parallelism pays per row of the batch, data parallelism per parameter (tutorials/06).

Restrictions: Linear and Conv2d layers with ReLU and max pooling (any other layer is refused);
--split input for an MLP only; P <= the width being split of every layer (a rank needs a neuron,
a channel or a feature of each); the whole batch on every rank (one replica; see hybrid_parallel
for replicas of a partitioned model). Checkpoints are layout-free (``partition.Partition``): --save writes the
pieces and their momentum in the serial model's order, and --resume cuts such a file, written by any
SGD-family algorithm on any number of ranks, back into this run's pieces.

Default run (the defaults ``--help`` shows): the same trajectory as serial SGD on the same MLP; measured at P
= 4: 97.5% test accuracy, as ``serial_sgd --model mlp`` (17 s with other jobs on the 2 cores, against 2 s
serially: this MLP is far too small for its layers to be worth splitting; tutorials/06 counts the bytes).
"""
import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli, partition, tags
from algorithms.core.run import Run, Settings
from minidl.tensor import Tensor

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=10, momentum=0.9, model="mlp")

EXCHANGE = tags.MODEL_PARALLEL         # the tag of every partition-crossing message


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


def allgather_blocks(comm, mine, widths):
    """Each rank's block along axis 1, (N, widths[r], ...) -> the whole (N, sum widths, ...) on every rank."""
    rank = comm.Get_rank()
    blocks = [numpy.empty((len(mine), width) + mine.shape[2:], dtype=mine.dtype) for width in widths]
    blocks[rank] = mine
    exchange(comm, [mine] * len(widths), blocks)
    return numpy.concatenate(blocks, axis=1)


def reduce_scatter_blocks(comm, partial, widths):
    """The sum over ranks of ``partial`` (N, sum widths, ...), of which rank r keeps only its block
    along axis 1."""
    rank, edges = comm.Get_rank(), numpy.cumsum([0] + list(widths))
    outgoing = [partial[:, edges[q]:edges[q + 1]] for q in range(len(widths))]
    incoming = [numpy.empty_like(outgoing[rank]) for _ in widths]   # every rank's partial of my block
    exchange(comm, outgoing, incoming)
    incoming[rank] = outgoing[rank]
    return sum(incoming[1:], start=incoming[0].copy())     # in rank order


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

    ``pieces``: this rank's Piece of every block, in order. The gradients overwrite the pieces' .grad.
    """
    # BEGIN SOLUTION
    for piece in pieces:
        for parameter in piece.parameters():
            parameter.zero_grad()
    last = len(pieces) - 1
    if split == "output":
        # forward: my neurons (channels) of each block from the whole input, then every rank's to every rank
        a, kept = x, []
        for piece in pieces:
            a = Tensor(a, requires_grad=bool(kept))            # the whole input: the same on every rank
            mine = piece.module(a)                             # (N, my o_r, ...): my neurons or channels
            kept.append((a, mine))
            a = allgather_blocks(comm, mine.data, piece.out_widths)
        # the loss from the whole logits, on every rank: its gradient needs no message
        loss, grad = softmax_cross_entropy(a, labels)
        grad = grad[:, pieces[last].cols]
        # backward: my piece's gradients, and my share of da, which the ranks sum for each other
        for k in range(last, -1, -1):
            a, mine = kept[k]
            mine.backward(grad)                                # dW, db of my piece; a.grad = my share of da
            if k > 0:                                          # summed over ranks, each keeps its channels
                grad = reduce_scatter_blocks(comm, a.grad, pieces[k - 1].out_widths)
        return loss
    # split input (an MLP): forward, each layer a reduction over the ranks' input features
    a, kept = x.reshape(len(x), -1), []
    for k, piece in enumerate(pieces):
        z = a[:, piece.rows] @ piece.weight.data               # (N, i_r) @ (i_r, o): a partial sum
        if piece.bias is not None:
            z = z + piece.bias.data                            # the bias is rank 0's, added once
        z = allgather_blocks(comm, reduce_scatter_blocks(comm, z, piece.out_widths), piece.out_widths)
        kept.append((a, z))
        a = z if k == last else numpy.maximum(z, 0)
    loss, dz = softmax_cross_entropy(a, labels)                # the same on every rank
    # backward: my rows of dW, and my features' columns of da, to every rank
    for k in range(last, -1, -1):
        piece, (a, z) = pieces[k], kept[k]
        if k < last:
            dz = dz * (z > 0)                                  # through the ReLU
        piece.weight.grad[...] = a[:, piece.rows].T @ dz      # (i_r, N) @ (N, o)
        if piece.bias is not None:
            piece.bias.grad[...] = dz.sum(axis=0)
        if k > 0:
            dz = allgather_blocks(comm, dz @ piece.weight.data.T, piece.in_widths)
    return loss
    # END SOLUTION


def bytes_per_step(rows, widths, size, itemsize, split):
    """Bytes all ranks send in one step (the formula of the docstring); widths = [i_0, o_0 = i_1, ..., o_K-1]."""
    outputs, inner_inputs = sum(widths[1:]), sum(widths[1:-1])
    return (size - 1) * rows * ((2 if split == "input" else 1) * outputs + inner_inputs) * itemsize


def train(comm=None, split="output", **settings):
    """Model-parallel SGD on ``comm``: one replica, its layers in P pieces; returns (final flat
    parameters of the whole model, on every rank, history)."""
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)
    writer = checkpoint.Writer("model_parallel", checkpoint.SGD_FAMILY, layout={"pieces": comm.Get_size(),
                                                                                "split": split})
    run = Run.start(comm, settings, check=lambda s: partition.check(s, comm.Get_size(), split), reader=(0, 1),
                    writer=writer)
    mine = partition.Partition(run, run.comm, split)
    x_all, y_all = run.objective.data.x_train, run.objective.data.y_train

    def step(batch):
        loss = model_parallel_gradient(run.counting, mine.pieces, x_all[batch.index], y_all[batch.index], split)
        mine.optimizer.step()                          # every rank: its own pieces only
        return loss

    return run.loop(step, evaluate=mine.evaluate)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], **DEFAULTS)
    parser.add_argument("--split", default="output", choices=partition.SPLITS,
                        help="output: each rank owns some output neurons (channels) of every layer; input: some "
                             "input features (MLP only)")
    args = parser.parse_args(argv)
    cli.run_main(train, args, split=args.split)


if __name__ == "__main__":
    main()
