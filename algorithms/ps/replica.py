"""A model-parallel replica as one Downpour worker: k ranks, each with its pieces of every layer.

    mpiexec -n 5 python -m algorithms.downpour_sgd --replica-size 2     # 1 server, 2 replicas of 2 ranks

Dean et al. 2012, sections 3 and 4.1: a Downpour model replica is itself a model partitioned
across machines, and "each machine [of a replica] needs to communicate with just the subset of
parameter server shards that hold the model parameters relevant to its partition". Here rank j of
a replica of k ranks holds piece j of every layer (``core.partition.Piece``, split by output
neurons or channels); the replica's forward and backward pass is the ``gradient`` the algorithm
hands in (Downpour's: ``model_parallel.model_parallel_gradient``) on the replica's own
communicator, and Downpour's step (``downpour_sgd.downpour_step``) runs unchanged on every rank
of it, on that rank's parameters only.

Which parameters a rank pushes and fetches: an index map. The servers keep the flat parameter
vector in the model's own order, cut into S contiguous shards as for one-rank workers, and rank j
owns the flat indices ``owned_indices(objective, k, j)``: for a Linear layer W (i, o) the columns
cols_j of each row, for a convolution the output channels cols_j, and b[cols_j]:

    flat vector        [ W_0 (row by row)   | b_0 | W_1 ... ]     shards: [ server 0 | server 1 ]
    rank 0 of 2 owns   [ xx..  xx..  xx..   | x.  | ...     ]
    rank 1 of 2 owns   [ ..xx  ..xx  ..xx   | .x  | ...     ]

The pieces' own flat vector (their ``FlatParameters``: each layer's cut weight row by row, then its
cut bias) lists these indices in increasing order, so the part of it that server k holds is one
contiguous slice (``slices``), and the rank sends exactly that slice to server k, and to no server
whose shard holds none of its parameters. Server k, on the other side, knows the same map
(``ShardServer(replica_indices=...)``): it takes a replica's request as one request made of those
of its ranks that own indices in its shard, scatters their values into its shard's gradient (the
ranks' indices partition the vector, so the gradient is whole) and answers each rank with the
parameters at its own indices. To the server a replica is one worker: one clock, one version per
push, one place in the deterministic schedule.

Why an index map rather than laying the flat vector out piece by piece: everything else about the
server (its shards, the checkpoint, the per-epoch snapshots rank 0 evaluates, the logs) stays in
the model's order and is bit for bit what a job of one-rank workers has; only who sends which
values to whom changes, which is what the paper changes.

Cost per replica step with n_push = n_fetch = 1, for a rank owning n_j of the n parameters: it
pushes n_j gradient values and fetches n_j parameter values (a one-rank worker: n each), to and
from the shards that hold them; inside the replica it sends model_parallel's activations and
gradients, (k - 1) N (sum_l o_l + sum_{l>=1} i_l) itemsize bytes per step for the whole replica,
for N rows and layers l of widths i_l -> o_l (``model_parallel.bytes_per_step``). Measured for the
default CNN (tutorials/06, section 5): a rank of a replica of 2 moves 24360 bytes a step to and
from the server instead of a one-rank worker's 48720, and sends 49792 inside its replica for a
batch of 32.

Restrictions: the output split only; k <= the narrowest split width of the model
(``core.partition.check``); k dividing the p - S worker ranks; not with --groups or --fail-worker;
no convex problems.
"""
import numpy

from algorithms.core import partition
from collectives.trace import CountingComm
from minidl.data import shard
from minidl.flat import FlatParameters
from minidl.nn import Linear

SPLIT = "output"


def owned_indices(objective, size, position):
    """The flat indices (into ``objective.params``, increasing) of the parameters that rank ``position``
    of a replica of ``size`` ranks owns."""
    offsets = {id(parameter): start for parameter, (start, _) in zip(objective.flat.parameters, objective.flat.offsets)}
    owned = []
    for _, layer, _ in partition.blocks_of(objective.net):
        axis = 1 if isinstance(layer, Linear) else 0          # the axis of the output neurons or channels
        cols = shard(layer.weight.shape[axis], position, size)
        for parameter, along in ((layer.weight, axis), (layer.bias, 0)):
            flat = numpy.arange(parameter.size).reshape(parameter.shape) + offsets[id(parameter)]
            owned.append(numpy.take(flat, cols, axis=along).reshape(-1))
    owned = numpy.concatenate(owned)
    if (numpy.diff(owned) <= 0).any():                        # the slices below rely on it
        raise ValueError("the model's parameters are not in layer order (weight, bias): no index map")
    return owned


def slices(owned, ranges):
    """For each server's range (start, stop) of the flat vector, the (start, stop) of a rank's own vector
    (its ``owned`` indices, increasing) that falls into it: one contiguous slice each, maybe empty."""
    return [(int(numpy.searchsorted(owned, start)), int(numpy.searchsorted(owned, stop))) for start, stop in ranges]


class ReplicaPart:
    """What ``downpour_step`` sees as ``replica.objective`` on rank j of a replica: ``params`` and
    ``grad`` (the vectors of this rank's pieces), and ``loss_and_grad(rows)`` (model-parallel:
    ``gradient(comm, pieces, x, labels, split)``, the mean loss, the pieces' gradients in their .grad).
    ``group.bytes_sent``: the bytes this rank has sent to the other ranks of its replica."""

    def __init__(self, objective, group, gradient):
        self.objective, self.group, self.gradient = objective, CountingComm(group), gradient
        rank, size = group.Get_rank(), group.Get_size()
        self.owned = owned_indices(objective, size, rank)
        self.pieces = [partition.Piece(block, rank, size, SPLIT) for block in partition.blocks_of(objective.net)]
        self.flat = FlatParameters([parameter for piece in self.pieces for parameter in piece.parameters()])
        self.params, self.grad = self.flat.data, self.flat.grad

    def loss_and_grad(self, rows):
        data = self.objective.data
        return self.gradient(self.group, self.pieces, data.x_train[rows], data.y_train[rows], SPLIT)
