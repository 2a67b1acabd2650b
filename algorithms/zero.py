"""ZeRO: data-parallel SGD whose optimizer state (stage 1), gradients (2) and parameters (3) are sharded, unit by unit.

    mpiexec -n 4 python -m algorithms.zero --stage 1|2|3 [--unit layer|model] [--prefetch] [--optimizer sgd|adam]

Paper: Rajbhandari, Rasley, Ruwase & He 2020 (ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models), section 5 (ZeRO-DP: P_os, P_os+g, P_os+g+p) and section 7 (communication); the
unit by unit gathering is also PyTorch FSDP's (Zhao et al. 2023). Full references: tutorials/references.md.

Units (``algorithms/shards/units.py``). The model is cut into gathering units (``units_of``):
``--unit layer`` (the default) makes each layer with parameters a unit, the parameter-free layers
after it joining it (the MLP 64-128-64-10: Flatten Linear ReLU | Linear ReLU | Linear); ``--unit
model`` makes the whole model one unit; with ``--recompute`` a unit is a checkpointed segment. A
unit's parameters, in the flat order, are one vector of n_u values cut into p blocks as the ring
cuts it (``collectives.block_counts``), and rank r keeps block r of every unit: ``unit.shard``,
whose ``data`` is that block of the weights and whose ``grad`` that block of the summed gradient.
Every rank computes the gradient of its piece of the global batch, as allreduce SGD does; what
differs is what it keeps (``zero_step``, step k, rank r):

    forward,  u = 1..U:  stage 3: w_u = allgather_r w_u[block r]     into a fresh vector (gather)
                         h_u = unit_u(h_u-1)
                         stage 3: let go of w_u                                            (release)
    backward, u = U..1:  stage 3: w_u = allgather again
                         g_u = (|index| / total) d loss / d w_u         into a fresh vector (gradient)
                         stages 2, 3: g_u[block r] = reduce-scatter_r g_u; let go of g_u   (reduce_scatter)
    stage 1, after the backward: the same reduce-scatter of every unit's g_u
    w_u[block r] <- optimizer step, with the state of block r only; let go of the gradients  (update)
    stages 1, 2: w_u = allgather_r w_u[block r]           every rank's updated block to every rank

Memory per rank (the paper's Figure 1, written for float32: 4 bytes a weight and a gradient, K of
optimizer state: 4 for momentum SGD's v, 8 for Adam's m and v; n parameters, n_max the largest unit):

    data parallel:  4 n + 4 n + K n
    stage 1:        4 n + 4 n + K n / p                   the whole gradient from backward to update only
    stage 2:        4 n + (4 n / p + 4 n_max) + K n / p    one unit's whole gradient at a time
    stage 3:        (4 n / p + 4 n_max) + (4 n / p + 4 n_max) + K n / p    one unit whole at a time

``--prefetch`` (stage 3; FSDP's forward and backward prefetch): as soon as a unit's weights are
gathered, the next gather of the step is started without waiting (``collectives.nonblocking``:
the ring's own allgather, a message at a time) and advanced whenever the shard is called, so it
runs while the unit computes; two units are then whole at once. The same bits either way. On 2
shared cores it buys nothing and costs time (the MLP's 10 epochs at p = 2: 14-22 s against 3-7 s,
tutorials/figures/out/11_runs.json): the ranks that would overlap share the cores, and each message
of the started allgather goes through a thread hand-off.

Every layer reads its weights again when its backward runs (``weight.data``: Linear's product, the
convolution's kernel, the locally connected layer) and keeps no array of them in between, so a
unit's gathered vector is freed at its release: one unit whole at a time, convolutions included.

Communication per step and rank (section 7; ring, alpha-beta, 4-byte values), U units:

    stages 1, 2:  reduce-scatter + allgather                   2 U (p-1) alpha + 2 (p-1)/p 4 n beta
    stage 3:      allgather, allgather again, reduce-scatter   3 U (p-1) alpha + 3 (p-1)/p 4 n beta

Stage 3 sends 1.5 times an allreduce, as the paper says: the weights travel twice.

Bits. Every element's sum over ranks is the ring's over its unit, and every update is elementwise.
With ``--unit model`` that ring is the whole vector's, so every stage gives the bits of
``allreduce_sgd --allreduce ring``. With ``--unit layer`` each unit's ring starts its blocks at
other ranks than the whole vector's: at p <= 2 the sum of two values does not care (a + b = b + a),
at p >= 3 an element's p values are added in another order. Every stage then gives bit for bit the
parameters of allreduce SGD whose ring runs unit by unit, and ``--allreduce ring``'s up to rounding
(tests/test_zero.py: the float64 MLP after one epoch at p = 3..5, within 1e-13 relative).

Evaluation, the end and --save: stages 1 and 2 keep the whole weights; stage 3 evaluates unit by
unit, each gathered and released (``Gathered``: no whole copy is kept for it), and at the end
gathers the whole weights once, what train() returns (``whole_model``). Only --save gathers the
optimizer state, onto rank 0, which writes it, and drops it once written. None of this is counted
in the log's bytes.

--optimizer adam: Adam (``minidl.optim.Adam``) with beta1 = --momentum, beta2 = 0.999, eps 1e-8
(default --lr 0.001). --save writes the gathered model and optimizer state, layout-free: a
momentum-SGD file is one of the SGD family (allreduce_sgd, the other stages, any p resume it), an
Adam file resumes in this module with --optimizer adam, any stage, any unit, any p.

Restrictions: a network that is a Sequential (for --unit layer), not a convex problem; p <= n and
p <= the training examples; --prefetch only at stage 3.

Default run (the defaults ``--help`` shows): allreduce SGD's accuracy and final losses, 98.05% at p = 4
as ``allreduce_sgd`` (its weights at most 2.6e-3 apart after 20 epochs in float32: the layers' rings add in
another order, and SGD's 900 steps grow the difference), 1.5 times its bytes at stage 3.
"""
from mpi4py import MPI

import collectives
from algorithms.core import checkpoint, cli
from algorithms.core.objective import evaluate
from algorithms.core.run import Run, Settings, agreed, sgd
from algorithms.shards.units import UNITS, Gathered, Shard
from minidl import backend, functional as F
from minidl.optim import Adam
from minidl.tensor import Tensor

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, momentum=0.9, partition="global")

STAGES = (1, 2, 3)
OPTIMIZERS = ("sgd", "adam")
LR = {"sgd": 0.05, "adam": 0.001}       # the default --lr of each optimizer


def zero_step(comm, objective, shard, batch, stage):
    """One ZeRO step on this rank, unit by unit (the heart); returns this rank's mean loss on its piece
    (0.0 if empty: a rank without rows still takes part in every gather and reduction, adding zeros)."""
    # BEGIN SOLUTION
    weight = len(batch.index) / batch.total                # my share of the global batch's mean
    rows = batch.index if len(batch.index) else [0]         # no rows here: one, weighted 0, for the collectives
    # forward, unit by unit: stage 3 gathers a unit's weights just before it runs, releases them after
    h, kept = Tensor(backend.asarray(objective.data.x_train[rows])), []
    for unit in shard.units:
        shard.gather(comm, unit)
        start = Tensor(h.data, requires_grad=bool(kept))   # the first unit reads the data: no gradient
        h = unit.layers(start)
        shard.release(unit)
        kept.append([start, h])
    kept[-1][1] = F.softmax_cross_entropy(h, backend.asarray(objective.data.y_train[rows]))
    loss, grad = float(kept[-1][1].item()) if len(batch.index) else 0.0, None
    # backward, unit by unit from the last: gathered again, its gradient into a fresh vector, weighted
    for unit in reversed(shard.units):
        start, out = kept.pop()
        shard.gather(comm, unit)
        shard.gradient(unit)                               # a fresh zero vector, the parameters' .grad views
        out.backward(grad)
        unit.gradient *= weight
        shard.release(unit)
        if stage > 1:                                      # my block of the sum at once; the rest let go
            shard.reduce_scatter(comm, unit)
        grad = start.grad
    for unit in shard.units if stage == 1 else ():         # stage 1: the whole gradient was kept until now
        shard.reduce_scatter(comm, unit)
    # my block of every unit updated with my block of the state; stages 1, 2: every rank's block to every rank
    shard.update()
    for unit in shard.units if stage < 3 else ():
        collectives.allgather(comm, MPI.IN_PLACE, unit.whole, check=False)
    # END SOLUTION
    return loss


def make_optimizer(name):
    """``optimizer(parameters, settings)`` for ``Run.start`` and the shard: momentum SGD or Adam."""
    if name not in OPTIMIZERS:
        raise cli.SettingError(f"unknown --optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if name == "sgd":
        return sgd
    return lambda parameters, settings: Adam(parameters, lr=settings.lr, betas=(settings.momentum, 0.999))


def check_layout(stage, unit, prefetch):
    if stage not in STAGES:
        raise cli.SettingError(f"--stage must be 1, 2 or 3 (shard the optimizer state; and the gradients; and "
                               f"the parameters), got {stage!r}")
    if unit not in UNITS:
        raise cli.SettingError(f"--unit must be layer or model (what is gathered and reduced at once), got {unit!r}")
    if prefetch and stage != 3:
        raise cli.SettingError(f"--prefetch starts stage 3's next gather early; stage {stage} gathers no weights "
                               f"before a unit runs")


def train(comm=None, stage=3, optimizer="sgd", unit="layer", prefetch=False, **settings):
    """ZeRO stage ``stage`` on ``comm``; returns (final flat parameters as NumPy, history), the same on every rank
    (the whole weights, gathered at the end; the optimizer state stays sharded but for --save)."""
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, lr=LR.get(optimizer, 0.05), **DEFAULTS)
    adam = optimizer == "adam"
    writer = checkpoint.Writer("zero", None if adam else checkpoint.SGD_FAMILY,
                               state={"optimizer": "adam"} if adam else {},
                               layout={"stage": stage, "shards": comm.Get_size()})
    run = Run.start(comm, settings, check=lambda _: (check_layout(stage, unit, prefetch), make_optimizer(optimizer)),
                    writer=writer, optimizer=lambda parameters, s: make_optimizer(optimizer)(parameters, s))
    with agreed(comm):
        shard = Shard(run, stage, make_optimizer(optimizer), unit, prefetch)
    objective = run.objective

    def step(batch):
        shard.optimizer.lr = run.optimizer.lr                  # --lr-scaling and its kin set the whole one's
        return zero_step(run.counting, objective, shard, batch, stage)

    def evaluate_gathered():                                   # stage 3: unit by unit, on the uncounted comm
        loss, accuracy = evaluate(Gathered(shard, comm), objective.data.x_test, objective.data.y_test)
        return {"test_loss": loss, "test_accuracy": accuracy}

    params, history = run.loop(step, evaluate=evaluate_gathered if stage == 3 else objective.evaluate,
                               result=lambda: shard.whole_model(comm, state=bool(settings.save)))
    shard.let_go_of_state()                                    # --save has written it
    return params, history


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], lr=None, recompute=True, **DEFAULTS)
    parser.add_argument("--stage", type=int, default=3, help="1: shard the optimizer state; 2: and the gradients; "
                        "3: and the parameters")
    parser.add_argument("--unit", default="layer", choices=UNITS, help="what is gathered and reduced at once: "
                        "layer (each layer with parameters) or model (the whole model: allreduce_sgd --allreduce "
                        "ring's bits)")
    parser.add_argument("--prefetch", action="store_true", help="stage 3: start the next unit's gather while this "
                        "one computes")
    parser.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS,
                        help="sgd: momentum SGD (--momentum); adam: Adam with beta1 = --momentum, beta2 0.999 "
                             "(default --lr: 0.05 for sgd, 0.001 for adam)")
    args = parser.parse_args(argv)
    if args.lr is None:
        del args.lr                                            # train() picks the optimizer's default
    cli.run_main(train, args, stage=args.stage, optimizer=args.optimizer, unit=args.unit, prefetch=args.prefetch)


if __name__ == "__main__":
    main()
