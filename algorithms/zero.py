"""ZeRO: data-parallel SGD whose optimizer state (stage 1), gradients (2) and parameters (3) are sharded.

    mpiexec -n 4 python -m algorithms.zero --stage 1|2|3 [--optimizer sgd|adam] [--recompute]

Paper: Rajbhandari, Rasley, Ruwase & He 2020 (ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models), section 5 (ZeRO-DP: P_os, P_os+g, P_os+g+p) and section 7 (communication).
Full references: tutorials/references.md.

The flat parameter vector (n values; ``minidl.flat``) is cut into p blocks as the ring cuts it
(``collectives.block_counts``: sizes differ by at most one, the first n % p one longer), and rank r
owns block r, [start, stop): its shard. Every rank still computes the gradient of the whole model
on its piece of the global batch, exactly as allreduce SGD does (``allreduce_sgd``); what differs is
what each rank keeps, and so how the sum over ranks is taken (``zero_step``, at step k on rank r):

    grad_r  = (|index| / total) (1/|index|) sum_{i in index} d loss_i / dw      (as allreduce SGD)
    stage 1: grad = sum_r grad_r              allreduce (ring: reduce-scatter + allgather); every rank
                                              keeps the whole gradient but updates only its shard
    stage 2: grad[start:stop] = (sum_r grad_r)[start:stop]     reduce-scatter (the ring's first loop)
    stage 3: as stage 2, and before the forward
             w = allgather_r w[start_r:stop_r]                 allgather (the ring's second loop)
    w[start:stop] <- optimizer step on the shard, with the shard of the state (momentum v, or Adam's m, v)
    stages 1, 2: w = allgather_r w[start_r:stop_r]             every rank's updated shard to every rank
    stage 3:     the whole w is released after backward (filled with nan here: see below)

Every value of the sum is the ring's block sum, and every update is elementwise, so each stage
gives the same bits as ``allreduce_sgd --allreduce ring`` with the same optimizer (tests/test_zero.py).

Memory per rank (the paper's Figure 1, written for float32, n parameters, K bytes of optimizer
state per parameter: K = 4 for momentum SGD's v, 8 for Adam's m and v; gradients float32 too):

    data parallel:  4 n (w) + 4 n (grad) + K n
    stage 1:        4 n + 4 n + K n / p
    stage 2:        4 n + 4 n / p + K n / p
    stage 3:        4 n / p + 4 n / p + K n / p        (+ the whole w and grad during one step)

Communication per step and rank (ring, alpha-beta, n values of 4 bytes; section 7 of the paper):

    stage 1:  allreduce + allgather        3 (p-1) alpha + 3 (p-1)/p 4n beta
    stage 2:  reduce-scatter + allgather   2 (p-1) alpha + 2 (p-1)/p 4n beta   (= one allreduce)
    stage 3:  allgather + reduce-scatter   2 (p-1) alpha + 2 (p-1)/p 4n beta

Stage 3 here gathers the whole model at once (one gathering unit; real ZeRO-3 and FSDP gather
layer by layer, and again in backward, 3 (p-1)/p 4n beta). Our layers' arrays are views into one
flat vector that cannot be handed back to the allocator between steps, so stage 3 fills the whole
vector with nan after the update: nothing may read it before the next step's allgather, and a
forgotten gather shows up as a nan loss instead of as stale weights. Evaluation and --save gather
the parameters and the optimizer state (not counted in the log's bytes).

--optimizer adam: Adam (``minidl.optim.Adam``) with beta1 = --momentum, beta2 = 0.999, eps 1e-8
(default --lr 0.001). --save writes the gathered model and optimizer state, layout-free: a
momentum-SGD file is one of the SGD family (allreduce_sgd, the other stages, any p resume it), an
Adam file resumes in this module with --optimizer adam, any stage, any p.

--recompute: the model in about sqrt(layers) checkpointed segments (``minidl.recompute``), as in
allreduce_sgd: the same bits, fewer activations kept.

Restrictions: p <= n (every rank owns a shard) and p <= the training examples; --stage 1, 2 or 3.

Default run (the defaults ``--help`` shows): the trajectory of allreduce_sgd's default run, bit for bit (98.1%
test accuracy at p = 4, measured on 2 shared cores); --optimizer adam (lr 0.001, 20 epochs): 96.4%. Stage 1's
log counts 1.5 times the bytes of stages 2 and 3 (its allreduce is a reduce-scatter and an allgather of the
gradient).
"""
import numpy
from mpi4py import MPI

import collectives
from algorithms.core import checkpoint, cli
from algorithms.core.run import Run, Settings, agreed, sgd
from minidl import backend
from minidl.optim import Adam
from minidl.tensor import Parameter

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, momentum=0.9, partition="global")

STAGES = (1, 2, 3)
OPTIMIZERS = ("sgd", "adam")
LR = {"sgd": 0.05, "adam": 0.001}       # the default --lr of each optimizer


class Shard:
    """Rank r's block [start, stop) of the flat vector and what this rank keeps only for it: the
    optimizer state; from stage 2 the gradient's block; in stage 3 the parameters' block too."""

    def __init__(self, run, stage, optimizer):
        n, rank, size = run.objective.params.size, run.rank, run.size
        if size > n:
            raise cli.SettingError(f"--stage {stage}: {size} ranks but the model has only {n} parameters: every "
                                   f"rank needs a shard (use at most {n} ranks)")
        self.counts = collectives.block_counts(n, size)
        self.start = sum(self.counts[:rank])
        self.stop = self.start + self.counts[rank]
        whole = run.objective
        xp = backend.get_array_module(whole.params)
        # stage 3 keeps its own copy of its block; stages 1 and 2 update their block of the whole vector
        self.params = whole.params[self.start:self.stop].copy() if stage == 3 else whole.params[self.start:self.stop]
        # stage 1 reads its block of the whole summed gradient; stages 2 and 3 receive only their block
        self.grad = whole.grad[self.start:self.stop] if stage == 1 else xp.zeros(self.counts[rank], whole.grad.dtype)
        parameter = Parameter(self.params)
        parameter.grad = self.grad
        self.optimizer = optimizer([parameter], run.settings)
        self.whole = run.optimizer               # the whole model's optimizer: only for --resume and --save
        for key, value in self.whole.state[0].items():     # a resumed run's state, cut to my block
            self.optimizer.state[0][key] = value[self.start:self.stop].copy()
        self.optimizer.steps = self.whole.steps
        self.whole.state[0] = {}                 # kept sharded: the whole state only exists while saving

    def gather(self, comm, objective, stage, state=True):
        """The whole model (stage 3) and with ``state`` the whole optimizer state on every rank, for
        evaluation and --save (a collective); returns the whole parameter vector."""
        if stage == 3:
            collectives.allgather(comm, self.params, objective.params, check=False)
        for key, value in self.optimizer.state[0].items() if state else ():
            whole = backend.get_array_module(value).empty(objective.params.size, dtype=value.dtype)
            self.whole.state[0][key] = collectives.allgather(comm, value, whole, check=False)
        self.whole.steps = self.optimizer.steps
        return objective.params


def zero_step(comm, objective, shard, batch, stage):
    """One ZeRO step on this rank (the heart); returns this rank's mean loss on its piece (0.0 if empty)."""
    # BEGIN SOLUTION
    # stage 3: allgather every rank's block of w: the whole model, for this step only
    if stage == 3:
        collectives.allgather(comm, shard.params, objective.params, check=False)
    # local gradient on my piece of the global batch, weighted by my share of its rows
    rows = len(batch.index)
    if rows:
        loss = objective.loss_and_grad(batch.index)
    else:                                                  # no rows of the last batch here: I add zeros
        loss = 0.0
        objective.grad[...] = 0
    objective.grad *= rows / batch.total
    if stage == 1:
        # allreduce: the whole summed gradient on every rank (my block of it is shard.grad)
        collectives.allreduce(comm, MPI.IN_PLACE, objective.grad, algorithm="ring", check=False)
    else:
        # reduce-scatter: only my block of the summed gradient reaches me
        collectives.reduce_scatter(comm, objective.grad, shard.grad, check=False)
    # my block of the update, with my block of the optimizer state
    shard.optimizer.step()
    if stage == 3:
        # release: nothing reads the whole w before the next step's allgather
        objective.params[...] = numpy.nan
    else:
        # allgather: every rank's updated block to every rank
        collectives.allgather(comm, MPI.IN_PLACE, objective.params, check=False)
    # END SOLUTION
    return loss


def make_optimizer(name):
    """``optimizer(parameters, settings)`` for ``Run.start`` and the shard: momentum SGD or Adam."""
    if name not in OPTIMIZERS:
        raise cli.SettingError(f"unknown --optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if name == "sgd":
        return sgd
    return lambda parameters, settings: Adam(parameters, lr=settings.lr, betas=(settings.momentum, 0.999))


def check_stage(stage):
    if stage not in STAGES:
        raise cli.SettingError(f"--stage must be 1, 2 or 3 (shard the optimizer state; and the gradients; and "
                               f"the parameters), got {stage!r}")


def train(comm=None, stage=3, optimizer="sgd", **settings):
    """ZeRO stage ``stage`` on ``comm``; returns (final flat parameters as NumPy, history), the same on every rank."""
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, lr=LR.get(optimizer, 0.05), **DEFAULTS)
    adam = optimizer == "adam"
    writer = checkpoint.Writer("zero", None if adam else checkpoint.SGD_FAMILY,
                               state={"optimizer": "adam"} if adam else {},
                               layout={"stage": stage, "shards": comm.Get_size()})
    run = Run.start(comm, settings, check=lambda _: (check_stage(stage), make_optimizer(optimizer)), writer=writer,
                    optimizer=lambda parameters, s: make_optimizer(optimizer)(parameters, s))
    with agreed(comm):
        shard = Shard(run, stage, make_optimizer(optimizer))

    def step(batch):
        shard.optimizer.lr = run.optimizer.lr                  # --lr-scaling and its kin set the whole one's
        return zero_step(run.counting, run.objective, shard, batch, stage)

    def evaluate():
        shard.gather(comm, run.objective, stage, state=False)
        return run.objective.evaluate()

    return run.loop(step, evaluate=evaluate, result=lambda: shard.gather(comm, run.objective, stage))


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], lr=None, recompute=True, **DEFAULTS)
    parser.add_argument("--stage", type=int, default=3, help="1: shard the optimizer state; 2: and the gradients; "
                        "3: and the parameters")
    parser.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS,
                        help="sgd: momentum SGD (--momentum); adam: Adam with beta1 = --momentum, beta2 0.999 "
                             "(default --lr: 0.05 for sgd, 0.001 for adam)")
    args = parser.parse_args(argv)
    if args.lr is None:
        del args.lr                                            # train() picks the optimizer's default
    cli.run_main(train, args, stage=args.stage, optimizer=args.optimizer)


if __name__ == "__main__":
    main()
