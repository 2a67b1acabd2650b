"""DistBelief's locally connected split: every rank owns its region's weights (``spatial_parallel --layer local``).

    mpiexec -n 2 python -m algorithms.spatial_parallel --layer local       # the small CNN's locally connected twin

Paper: Dean et al. 2012, section 3 and Figure 1: a locally connected network partitioned across
machines by blocks of its feature maps, each machine holding the weights of its own block, "only
those nodes with edges that cross partition boundaries will need to have their state transmitted".
Full references: tutorials/references.md.

The tiles are ``spatial_parallel``'s (``algorithms.core.tiling``: rank r computes output rows
[lo_r, hi_r) of every stage's map, reading a halo of k - 1 rows from its neighbours). A locally
connected layer (``minidl.nn.LocallyConnected2d``) has weights of its own for every output position,
so the weights of my output rows, weight[lo_r:hi_r] and bias[lo_r:hi_r], are all a rank needs, and
their gradient is all mine: no weight gradient is summed over ranks, as the convolution's must be.
The head is partitioned by rows too (Megatron's row-parallel Linear, Shoeybi et al. 2019): rank r
owns the rows of the first Linear that its features (its rows of the last map) multiply,

    z_r = x_r W[features_r]        z = sum_r z_r + b          (g: ``minidl.functional.reduce_from_parallel``)

with b on rank 0 and the layers after it (ReLU, Linear: none in the small CNN's twin) whole on every
rank; g's backward is the identity, so d x_r = d z W[features_r]^T needs no message. Per step
(``local_gradient``): the forward halos and their gradients back (``halo_exchange`` and its adjoint),
and one ring allreduce of the (N, classes) logits: (P - 1)/P N classes b per rank, twice. No weight
moves, no map is gathered. Per rank: the parameters, their gradient and momentum of its rows,
1/P of the model's up to the tiles' uneven rows (and the head's bias, on rank 0).

Evaluation runs the split network itself (its logits are on every rank after g), on the plain
communicator (not counted); --save gathers every rank's pieces into the serial model's flat vector
(``LocalSplit.gather``), so the file is layout-free: serial SGD on the twin resumes it.

The same arithmetic as serial SGD on the same network, up to the order of the additions in the
boundary rows' input gradients (a halo row's gradient is summed on two ranks) and in the logits
(sum_r of partial products): tests/test_spatial_local.py, float64, loss, gradient and 10 steps.
Restrictions: as ``spatial_parallel``'s, every stage a LocallyConnected2d; the head starts with
Flatten, Linear; no --recompute.
"""
import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli
from algorithms.core.objective import evaluate
from algorithms.core.run import Run, agreed, allreduce_function
from algorithms.core.tiling import Tiling
from algorithms.spatial_parallel import return_halo_gradient, run_stage, window
from minidl import functional as F
from minidl.flat import FlatParameters, release
from minidl.nn import Flatten, Linear, LocallyConnected2d, Module, Sequential
from minidl.optim import SGD
from minidl.tensor import Parameter

HEARTS_WITHOUT_A_TASK = ("local_gradient",)


class LocalSplit(Module):
    """Rank ``rank``'s region of the tiled locally connected network: per stage the weights of its output
    rows, its rows of the head's first Linear (and its bias on rank 0), the rest of the head whole, and
    where each of these values sits in the serial model's flat vector (``positions``)."""

    def __init__(self, tiling, net, rank, comm, total, flat=True):
        super().__init__()
        head = tiling.head
        if len(head) < 2 or not isinstance(head[0], Flatten) or not isinstance(head[1], Linear):
            raise cli.SettingError("--layer local partitions the head by rows: it must start with Flatten, Linear")
        start, offsets = 0, {}
        for parameter in net.parameters():
            offsets[id(parameter)] = start
            start += parameter.size
        mine, self.positions, self.shared = [], [], []

        def own(parameter, rows, shared=False):   # my rows (first axis) of a serial parameter, copied
            piece = Parameter(parameter.data[rows])
            self.positions.append((offsets[id(parameter)], numpy.asarray(rows), parameter.size // parameter.shape[0]))
            self.shared.append(shared)
            mine.append(piece)
            return piece
        self.pieces = []
        for stage in tiling.stages:
            rows = numpy.arange(*stage.conv_rows(rank))
            self.pieces.append((own(stage.conv.weight, rows), own(stage.conv.bias, rows)))
        (lo, hi), (channels, height, width) = tiling.final[0][rank], tiling.final[1]
        self.features = numpy.array([c * height * width + h * width + w for c in range(channels)
                                     for h in range(lo, hi) for w in range(width)])
        linear = head[1]
        self.head_weight = own(linear.weight, self.features)
        self.head_bias = own(linear.bias, numpy.arange(linear.bias.size)) if rank == 0 else None
        self.rest = Sequential(*head[2:])
        for parameter in self.rest.parameters():       # whole on every rank: kept by all, saved from rank 0
            own(parameter, numpy.arange(parameter.shape[0]), shared=True)
        self.n, self.comm, self.total, self.tiling, self.rank, self.mine = start, comm, total, tiling, rank, mine
        if flat:
            self.flatten()

    def flatten(self):
        """My pieces as one flat vector, and one for their gradient (``minidl.flat``): the optimizer's."""
        self.flat = FlatParameters(self.mine)

    def logits(self, x, comm, total, keep=None):
        """The network on x (N, C, H, W), my region of it: my rows of every map from my window, my rows
        of the head summed over ranks (g); the logits, the same on every rank. ``keep``: a list that
        receives each stage's (window leaf, output tile), for the backward."""
        tile = None
        for s, stage in enumerate(self.tiling.stages):
            leaf, tile = run_stage(stage, window(comm, self.tiling, s, x, tile), self.rank,
                                   need_grad=keep is not None and s > 0, piece=self.pieces[s])
            if keep is not None:
                keep.append((leaf, tile))
        mine = F.reshape(tile, (tile.shape[0], -1))           # my rows' features, in the head's order
        partial = F.linear(mine, self.head_weight, self.head_bias)
        return self.rest(F.reduce_from_parallel(partial, total))

    def forward(self, x):                        # evaluation: the split network, on the plain communicator
        return self.logits(x.data, self.comm, self.total)

    def where(self):
        """For each of my pieces, the positions of its values in the serial model's flat vector."""
        return [((offset + rows * per_row)[:, None] + numpy.arange(per_row)).reshape(-1)
                for offset, rows, per_row in self.positions]

    def gather(self, vectors):
        """The serial model's flat vectors, from every rank's pieces of ``vectors`` (my flat vector and its
        momentum, in my order), summed over ranks where each value has one owner (rank 0 for the head's
        bias and the replicated layers): exact, x + 0 = x. Not part of the algorithm: --save and the end."""
        wholes = []
        for vector in vectors:
            whole = numpy.zeros(self.n, dtype=vector.dtype)
            start = 0
            for positions, shared in zip(self.where(), self.shared):
                if self.rank == 0 or not shared:
                    whole[positions] = vector[start:start + positions.size]
                start += positions.size
            self.comm.Allreduce(MPI.IN_PLACE, whole, op=MPI.SUM)
            wholes.append(whole)
        return wholes


def local_gradient(comm, tiling, split, x, labels, total):
    """This rank's gradient of its region of the network for the batch (x, labels), into its pieces' .grad
    (the heart); the mean loss, the same on every rank. ``total(array)`` sums an array over ranks."""
    # BEGIN SOLUTION
    kept = []
    # forward: my rows of every map, from my window (halo from the neighbours), with my rows' weights;
    # the head: my rows' features times my rows of its weights, summed over ranks
    loss = F.softmax_cross_entropy(split.logits(x, comm, total, keep=kept), labels)
    loss.backward()                        # my head rows, my last stage's weights and its window
    # backward, stage by stage: the halo's gradient back to the rank that owns those rows
    for s in range(len(tiling.stages) - 1, 0, -1):
        stage, (leaf, _) = tiling.stages[s], kept[s]
        top, bottom = stage.padding(comm.Get_rank())
        p = stage.conv.padding
        grad = return_halo_gradient(comm, leaf.grad[:, :, top:leaf.shape[2] - bottom, p:leaf.shape[3] - p], stage)
        kept[s - 1][1].backward(numpy.ascontiguousarray(grad))
    # no weight gradient is summed: the weights of my rows are mine alone
    # END SOLUTION
    return float(loss.item())


def let_go_of_serial(run):
    """Run.start built the serial model whole on every rank (for --resume); each rank keeps its pieces only."""
    release(run.objective.flat.parameters)
    release(run.objective.flat.parameters, "grad")
    whole = run.optimizer.params[0]
    run.objective.params = run.objective.grad = run.objective.flat = whole.data = whole.grad = None


def twin(model):
    """The locally connected network ``--layer local`` trains: the small CNN's twin for --model cnn."""
    if callable(model) or model == "local-cnn":
        return model
    if model == "cnn":
        return "local-cnn"
    raise cli.SettingError(f"--layer local trains a locally connected network: --model cnn (its twin, local-cnn) "
                           f"or local-cnn, not {model!r}")


def train_local(comm, recompute, settings, check):
    """``spatial_parallel.train(layer="local")``: DistBelief's partitioned locally connected network;
    ``check(settings)``: the module's own checks."""
    with agreed(comm):
        if recompute:
            raise cli.SettingError("--recompute is not offered with --layer local")
        settings.model = twin(settings.model)
    run = Run.start(comm, settings, check=check, reader=(0, 1), writer=checkpoint.Writer(
        "spatial_parallel", checkpoint.SGD_FAMILY, layout={"tiles": comm.Get_size(), "layer": "local"}))
    objective, rank = run.objective, comm.Get_rank()
    _, _, height, width = objective.data.x_train.shape
    summed = allreduce_function("ring")

    def total(array, over=run.counting):                       # g's sum: in place on its own copy
        summed(over, array.reshape(-1))
        return array
    with agreed(comm):
        tiling = Tiling.of(objective.net, height, width, comm.Get_size(), f"--model {settings.model}",
                           layer=LocallyConnected2d)
        split = LocalSplit(tiling, objective.net, rank, comm, lambda array: total(array, comm))
    optimizer = SGD([split.flat.as_parameter()], lr=settings.lr, momentum=settings.momentum)
    if "momentum" in run.optimizer.state[0]:                   # --resume: my values of the serial momentum
        optimizer.state[0]["momentum"] = run.optimizer.state[0]["momentum"][numpy.concatenate(split.where())]
    optimizer.steps = run.optimizer.steps
    let_go_of_serial(run)

    def step(batch):
        split.flat.zero_grad()
        optimizer.lr = run.optimizer.lr
        loss = local_gradient(run.counting, tiling, split, objective.data.x_train[batch.index],
                              objective.data.y_train[batch.index], total)
        optimizer.step()
        return loss

    def evaluated():
        loss, accuracy = evaluate(split, objective.data.x_test, objective.data.y_test)
        return {"test_loss": loss, "test_accuracy": accuracy}

    def result():
        vectors = [split.flat.data] + [state["momentum"] for state in optimizer.state if "momentum" in state]
        params, *momentum = split.gather(vectors)
        run.optimizer.state[0] = {"momentum": momentum[0]} if momentum else {}
        run.optimizer.steps = optimizer.steps
        return params

    return run.loop(step, evaluate=evaluated, result=result)


if __name__ == "__main__":
    cli.fail("run it as: mpiexec -n 2 python -m algorithms.spatial_parallel --layer local")
