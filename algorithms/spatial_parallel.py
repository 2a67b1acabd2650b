"""Spatial model parallelism (DistBelief): every feature map cut into blocks of rows, one per rank.

    mpiexec -n 2 python -m algorithms.spatial_parallel [--model cnn] [--recompute]
    mpiexec -n 4 python -m algorithms.spatial_parallel --model lenet5 --dataset mnist --data-dir DIR
    mpiexec -n 2 python -m algorithms.spatial_parallel --layer local      # DistBelief's locally connected split

Paper: Dean et al. 2012, section 3 and Figure 1: a locally connected or convolutional layer is
partitioned by blocks of the feature map, so "only those nodes with edges that cross partition
boundaries will need to have their state transmitted between machines". Ben-Nun & Hoefler 2019
call it spatial (domain) decomposition. Full references: tutorials/references.md.

Rank r holds rows [lo_r, hi_r) of every feature map, all channels, the whole width and the whole
batch (``algorithms.shards.tiling``: uneven tiles allowed, aligned to the pooling windows). A k x k
convolution with padding p needs, for its output rows, k - 1 rows more than it owns: the halo, which
the neighbours r - 1 (above) and r + 1 (below) own. Per stage s (``spatial_gradient``):

    forward   window_s = [top halo from r-1 | my rows | bottom halo from r+1]   (halo_exchange)
              tile_s+1 = maxpool_q(relu(conv_s(window_s zero-padded at the map's edges only)))
    head      map = the tiles of the last stage, gathered on every rank (gather_rows); the FC
              layers and the loss run whole on every rank: the same numbers everywhere
    backward  d map -> my rows of it (no message); per stage, backward through pool, relu, conv:
              d window_s, whose halo rows go back to the neighbour that owns them and are added
              there (return_halo_gradient): the adjoint of the exchange
    weights   every rank holds every weight (the convolution's weights are shared by all
              positions); its conv gradient is its tiles' share, summed over ranks by the ring
              allreduce; the head's gradient is already whole on every rank

so the step is serial SGD's up to the order of the additions in the conv weights' gradient sum
(tests/test_spatial_parallel.py: loss, gradients and 10 SGD steps against serial, float64).

Pooling and the head, a choice: tiles are aligned to pooling windows (a rank's conv rows are
[q c_r, q d_r) for its pooled rows [c_r, d_r)), so pooling needs no message; the FC head sees every
pixel, so the last map is gathered before it (an allgather of (N, C, H, W) per step) and run whole
everywhere. The first convolution reads its halo from the image, which every rank holds: no message.

Communication per step (batch N, itemsize b; ``bytes_per_step``), all ranks together:

    halo     2 sum_{s >= 1} H_s^halo N C_s W_s b      H_s^halo: halo rows of stage s over all ranks
                                                      (a same-padded k x k conv: 2 (P - 1) (k - 1)/2)
    gather   (P - 1) N C_S H_S W_S b                  the last map, every tile to every other rank
    weights  2 (P - 1) n_conv b                       ring allreduce of the conv weights' gradient

and with --recompute the halo term is 3 sum_{s >= 1} H_s^halo N C_s W_s b: the backward runs each
stage again from its input tile, which needs the halo rows again, so every forward halo message
is sent twice (in the forward and in the backward, before that stage's gradient halo goes back).
The halo pays per boundary row, not per pixel (DistBelief's argument); model_parallel sends whole maps.

--layer local (the paper's own case): a locally connected network, weights unshared between positions
(``minidl.nn.LocallyConnected2d``; --model cnn runs its twin, ``minidl.models.local_cnn``). Rank r owns the
weights of the rows it computes (``algorithms.shards.regions``) and its rows of the head's first Linear,
Megatron's row split: z = sum_r x_r W[features_r] + b (g, ``reduce_from_parallel``; b on rank 0). Per step
(``local_gradient``): the halos and one ring allreduce of the (N, classes) logits; no weight gradient summed,
no map gathered; parameters, gradient and momentum 1/P of the model's per rank, up to uneven tiles. The split
network is evaluated; the end gathers its weights, --save its momentum on rank 0 only. Serial SGD up to the
order of the additions in the boundary rows' input gradients and the logits (tests/test_spatial_local.py).

--recompute (Chen et al. 2016): the forward runs each stage unrecorded, keeping its output tile; the
backward, from the last stage, exchanges that stage's halo again, runs it again recording, and back-
propagates: the stages' output tiles and one stage's activations instead of every stage's, and the
same bits (tests/test_split_recompute.py).

Restrictions: stages of a Conv2d (--layer local: a LocallyConnected2d; no --recompute) of stride 1,
an optional ReLU and a MaxPool2d of stride = kernel, then a head of Flatten, Linear and ReLU layers;
>= 1 pooled row of every map per rank (the small CNN on 8x8 digits: P <= 2; LeNet-5 on 28x28: P <= 4)
and a halo no wider than a neighbour's tile. --save writes the serial model's layout-free ``params``,
and --resume reads any SGD-family file.

Default run (the defaults ``--help`` shows): serial SGD's trajectory, 98.9% test accuracy at P = 2.
"""
import contextlib
import functools

import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli, tags
from algorithms.core.objective import evaluate
from algorithms.core.run import Run, Settings, agreed, allreduce_function
from algorithms.shards.regions import Region, twin
from algorithms.shards.tiling import Tiling
from minidl import functional as F
from minidl.nn import LocallyConnected2d, Sequential
from minidl.optim import SGD
from minidl.tensor import Tensor, no_grad

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=10, momentum=0.9)

HALO, GATHER = tags.SPATIAL_HALO, tags.SPATIAL_GATHER
LAYERS = ("conv", "local")


def shift(comm, dest, sendbuf, source, recvbuf, tag=HALO):
    """One hop along the chain of ranks: send to ``dest``, receive from ``source`` (None: no partner).

    Within one call every message goes the same way (all down or all up), so the waits form a chain,
    never a cycle: no deadlock, whatever MPI's eager limit."""
    if dest is not None and source is not None:
        comm.Sendrecv(sendbuf, dest=dest, sendtag=tag, recvbuf=recvbuf, source=source, recvtag=tag)
    elif dest is not None:
        comm.Send(sendbuf, dest=dest, tag=tag)
    elif source is not None:
        comm.Recv(recvbuf, source=source, tag=tag)


def rows_of(array, lo, hi, first):
    """Rows [lo, hi) (absolute) of ``array`` whose row 0 is absolute row ``first``, as a contiguous copy."""
    return numpy.ascontiguousarray(array[:, :, lo - first:hi - first])


def halo_exchange(comm, tile, stage):
    """My tile (N, C, my rows, W) -> my window (N, C, needed rows, W): halo rows from both neighbours."""
    # BEGIN SOLUTION
    rank, size = comm.Get_rank(), comm.Get_size()
    (own_lo, own_hi), (need_lo, need_hi) = stage.owned[rank], stage.needed[rank]
    window = numpy.empty(tile.shape[:2] + (need_hi - need_lo,) + tile.shape[3:], dtype=tile.dtype)
    lo, hi = max(need_lo, own_lo), min(need_hi, own_hi)
    window[:, :, lo - need_lo:hi - need_lo] = tile[:, :, lo - own_lo:hi - own_lo]
    # down: rank + 1's top halo (my last rows) to it, mine from rank - 1; then up, the mirror image
    for to, source, halo in ((rank + 1, rank - 1, stage.top), (rank - 1, rank + 1, stage.bottom)):
        send_lo, send_hi = halo(to) if 0 <= to < size else (0, 0)
        recv_lo, recv_hi = halo(rank)
        received = numpy.empty(tile.shape[:2] + (recv_hi - recv_lo,) + tile.shape[3:], dtype=tile.dtype)
        shift(comm, to if send_hi > send_lo else None, rows_of(tile, send_lo, send_hi, own_lo),
              source if recv_hi > recv_lo else None, received)
        window[:, :, recv_lo - need_lo:recv_hi - need_lo] = received
    return window
    # END SOLUTION


def return_halo_gradient(comm, grad_window, stage):
    """d window (N, C, needed rows, W) -> d my tile: my rows of it, plus the gradients of the rows my
    neighbours borrowed, sent back by them (the adjoint of ``halo_exchange``: receives become sends)."""
    # BEGIN SOLUTION
    rank, size = comm.Get_rank(), comm.Get_size()
    (own_lo, own_hi), (need_lo, need_hi) = stage.owned[rank], stage.needed[rank]
    grad_tile = numpy.zeros(grad_window.shape[:2] + (own_hi - own_lo,) + grad_window.shape[3:],
                            dtype=grad_window.dtype)
    lo, hi = max(need_lo, own_lo), min(need_hi, own_hi)
    grad_tile[:, :, lo - own_lo:hi - own_lo] += grad_window[:, :, lo - need_lo:hi - need_lo]
    # down: my bottom halo's gradient to rank + 1, whose rows they are; rank - 1's of my first rows to me
    for to, source, halo in ((rank + 1, rank - 1, stage.bottom), (rank - 1, rank + 1, stage.top)):
        send_lo, send_hi = halo(rank)
        recv_lo, recv_hi = halo(source) if 0 <= source < size else (0, 0)
        received = numpy.empty(grad_window.shape[:2] + (recv_hi - recv_lo,) + grad_window.shape[3:],
                               dtype=grad_window.dtype)
        shift(comm, to if send_hi > send_lo else None, rows_of(grad_window, send_lo, send_hi, need_lo),
              source if recv_hi > recv_lo else None, received)
        grad_tile[:, :, recv_lo - own_lo:recv_hi - own_lo] += received
    return grad_tile
    # END SOLUTION


def gather_rows(comm, tile, tiles):
    """Every rank's tile (N, C, rows_r, W), in row order, on every rank: P - 1 steps around the ring
    (step k: pass on the tile of rank r - k to r + 1, receive rank r - k - 1's from r - 1)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    parts = [numpy.empty(tile.shape[:2] + (hi - lo,) + tile.shape[3:], dtype=tile.dtype) for lo, hi in tiles]
    parts[rank] = numpy.ascontiguousarray(tile)
    for step in range(size - 1):
        send, receive = (rank - step) % size, (rank - step - 1) % size
        comm.Sendrecv(parts[send], dest=(rank + 1) % size, sendtag=GATHER, recvbuf=parts[receive],
                      source=(rank - 1) % size, recvtag=GATHER)
    return numpy.concatenate(parts, axis=2)


def run_stage(stage, window, rank, need_grad, piece=None):
    """conv (zero padding only at the map's edges) -> ReLU -> pooling, through minidl's autograd;
    (the padded window as a leaf, my rows of the next map). ``piece``: (weight, bias) of my output
    rows of a locally connected stage (--layer local); None: the convolution's shared weights."""
    (top, bottom), p = stage.padding(rank), stage.conv.padding
    padded = numpy.pad(window, ((0, 0), (0, 0), (top, bottom), (p, p)))
    leaf = Tensor(padded, requires_grad=need_grad)
    if piece is None:
        out = F.conv2d(leaf, stage.conv.weight, stage.conv.bias, 1, 0, stage.conv.algorithm)
    else:
        out = F.locally_connected2d(leaf, *piece, 1, 0)
    out = F.relu(out) if stage.relu else out
    out = F.max_pool2d(out, stage.pool) if stage.pool > 1 else out
    return leaf, out


def window(comm, tiling, s, x, tile):
    """Stage s's input rows on this rank: the image's own (every rank holds the image: no message), or
    my tile of the previous stage's output with the halo from the neighbours (``halo_exchange``)."""
    if s == 0:
        lo, hi = tiling.stages[0].needed[comm.Get_rank()]
        return x[:, :, lo:hi]
    return halo_exchange(comm, tile.data, tiling.stages[s])


def spatial_gradient(comm, tiling, x, labels, sum_conv_gradient, recompute=False):
    """The gradient of the whole model for the batch (x, labels) on every rank (the heart); the mean loss.

    Every rank holds the whole model (``tiling``'s layers); gradients accumulate into their .grad,
    and ``sum_conv_gradient()`` sums the conv layers' over ranks at the end. ``recompute``: each
    stage's forward keeps only its output tile, and the backward runs the stage again, halo and all."""
    # BEGIN SOLUTION
    rank = comm.Get_rank()
    kept, tile = [], None
    # forward, stage by stage: my window (my rows and the halo), then my rows of the next map
    for s, stage in enumerate(tiling.stages):
        with no_grad() if recompute else contextlib.nullcontext():   # recompute: nothing recorded
            leaf, tile = run_stage(stage, window(comm, tiling, s, x, tile), rank, need_grad=s > 0)
        kept.append((None if recompute else leaf, tile))            # recompute: the output tile only
    # head: the whole last map on every rank, the FC layers and the loss on it (the same on every rank)
    tiles, _ = tiling.final
    whole = Tensor(gather_rows(comm, tile.data, tiles), requires_grad=True)
    loss = F.softmax_cross_entropy(Sequential(*tiling.head)(whole), labels)
    loss.backward()
    lo, hi = tiles[rank]
    grad = whole.grad[:, :, lo:hi]                     # my rows: no message
    # backward, stage by stage: through pool, ReLU, conv; the halo's gradient back to its owner
    for s in range(len(tiling.stages) - 1, -1, -1):
        leaf, tile = kept.pop()
        if recompute:                                  # the stage again from its input tile: the halo exchanged again
            window_s = window(comm, tiling, s, x, kept[-1][1] if s else None)
            leaf, tile = run_stage(tiling.stages[s], window_s, rank, need_grad=s > 0)
            del window_s
        tile.backward(numpy.ascontiguousarray(grad))
        if s > 0:
            stage, p = tiling.stages[s], tiling.stages[s].conv.padding
            top, bottom = stage.padding(rank)
            grad_window = leaf.grad[:, :, top:leaf.shape[2] - bottom, p:leaf.shape[3] - p]
            grad = return_halo_gradient(comm, grad_window, stage)
        del leaf, tile
    # the shared conv weights: every rank's tiles contributed, so sum over ranks
    sum_conv_gradient()
    # END SOLUTION
    return float(loss.item())


def local_logits(comm, tiling, region, x, total, keep=None):
    """--layer local: my region of the network on x (the logits, on every rank); ``keep`` receives each
    stage's (window leaf, output tile), for the backward."""
    tile, rank = None, comm.Get_rank()
    for s, stage in enumerate(tiling.stages):
        leaf, tile = run_stage(stage, window(comm, tiling, s, x, tile), rank, need_grad=keep is not None and s > 0,
                               piece=region.pieces[s])
        if keep is not None:
            keep.append((leaf, tile))
    mine = F.reshape(tile, (tile.shape[0], -1))                  # my rows' features, in the head's order
    return region.rest(F.reduce_from_parallel(F.linear(mine, region.head_weight, region.head_bias), total))


def local_gradient(comm, tiling, region, x, labels, total):
    """--layer local: the gradient of my region of the network for the batch (x, labels), into its pieces'
    .grad (a heart); the mean loss, the same on every rank. ``total(array)`` sums an array over ranks."""
    # BEGIN SOLUTION
    kept = []                                       # forward: my rows of every map, my rows of the head
    loss = F.softmax_cross_entropy(local_logits(comm, tiling, region, x, total, keep=kept), labels)
    loss.backward()                                 # my head rows, my last stage's weights and window
    # backward, stage by stage: the halo's gradient back to the rank that owns those rows
    for s in range(len(tiling.stages) - 1, 0, -1):
        stage, (leaf, _) = tiling.stages[s], kept[s]
        top, bottom = stage.padding(comm.Get_rank())
        p = stage.conv.padding
        grad = return_halo_gradient(comm, leaf.grad[:, :, top:leaf.shape[2] - bottom, p:leaf.shape[3] - p], stage)
        kept[s - 1][1].backward(numpy.ascontiguousarray(grad))
    # no weight gradient is summed over ranks: the weights of my rows are mine alone
    # END SOLUTION
    return float(loss.item())


def train_local(comm, recompute, settings):
    """``train(layer="local")``: DistBelief's locally connected network, each rank its region's weights."""
    with agreed(comm):
        settings.model = twin(settings.model, recompute)
    run = Run.start(comm, settings, check=no_problem, reader=(0, 1), writer=checkpoint.Writer(
        "spatial_parallel", checkpoint.SGD_FAMILY, layout={"tiles": comm.Get_size(), "layer": "local"}))
    net, data, summed = run.objective.net, run.objective.data, allreduce_function("ring")

    def total(array, over=run.counting):                         # g's sum, in place on its own copy
        summed(over, array.reshape(-1))
        return array
    with agreed(comm):
        tiling = Tiling.of(net, *data.x_train.shape[2:], comm.Get_size(), f"--model {settings.model}",
                           layer=LocallyConnected2d)
        region = Region(tiling, net, comm.Get_rank())
    optimizer = SGD([region.flat.as_parameter()], lr=settings.lr, momentum=settings.momentum)
    region.take_over(run, optimizer)                             # the serial model let go: only my region stays
    region.logits = lambda x: local_logits(comm, tiling, region, x, lambda array: total(array, comm))

    def step(batch):
        region.flat.zero_grad()
        optimizer.lr = run.optimizer.lr
        loss = local_gradient(run.counting, tiling, region, data.x_train[batch.index], data.y_train[batch.index],
                              total)
        optimizer.step()
        return loss

    params, history = run.loop(step, evaluate=lambda: dict(zip(("test_loss", "test_accuracy"),   # the split network
                                                               evaluate(region, data.x_test, data.y_test))),
                               result=lambda: region.saved(comm, optimizer, run.optimizer, bool(settings.save)))
    run.optimizer.state[0] = {}                                  # written: only my region's momentum stays
    return params, history


def bytes_per_step(tiling, batch, itemsize, recompute=False):
    """Bytes all ranks send in one step (the formula of the docstring); ``recompute``: the forward halos twice."""
    weights = 2 * (tiling.size - 1) * tiling.conv_parameters() * itemsize
    halo = tiling.halo_bytes(batch, itemsize)                  # forward rows and their gradients: 2 x
    return halo + (halo // 2 if recompute else 0) + tiling.gather_bytes(batch, itemsize) + weights


def no_problem(settings):
    if settings.problem is not None:
        raise cli.SettingError("the spatial split needs a convolutional network, not a convex problem")


def train(comm=None, recompute=False, layer="conv", **settings):
    """Spatially partitioned SGD on ``comm``: one replica, every feature map in P row blocks; returns
    (final flat parameters, the same on every rank, history). ``recompute``: each stage recomputed.
    ``layer``: "conv", or "local": the locally connected twin, every rank owning its region's weights."""
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)
    if layer not in LAYERS:
        raise cli.SettingError(f"--layer must be conv or local, got {layer!r}", every_rank=True)
    if layer == "local":
        return train_local(comm, recompute, settings)
    run = Run.start(comm, settings, check=no_problem, reader=(0, 1), writer=checkpoint.Writer(
        "spatial_parallel", checkpoint.SGD_FAMILY, layout={"tiles": comm.Get_size()}))
    objective = run.objective
    _, _, height, width = objective.data.x_train.shape
    with agreed(comm):                     # after the shared flags' checks, before any message of the run
        name = f"--model {settings.model}" if isinstance(settings.model, str) else "the model"
        tiling = Tiling.of(objective.net, height, width, comm.Get_size(), name)
    conv_gradient = objective.grad[:tiling.conv_parameters()]       # the conv layers come first in the flat vector
    sum_conv_gradient = functools.partial(allreduce_function("ring"), run.counting, conv_gradient)

    def step(batch):
        objective.flat.zero_grad()
        loss = spatial_gradient(run.counting, tiling, objective.data.x_train[batch.index],
                                objective.data.y_train[batch.index], sum_conv_gradient, recompute)
        run.optimizer.step()                            # the same update on every rank
        return loss

    return run.loop(step)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], recompute="tile", **DEFAULTS)
    parser.add_argument("--layer", default="conv", choices=LAYERS, help="conv: shared weights on every rank; local: "
                        "the locally connected twin (cnn: local-cnn), each rank its region's weights")
    args = parser.parse_args(argv)
    cli.run_main(train, args, layer=args.layer)


if __name__ == "__main__":
    main()
