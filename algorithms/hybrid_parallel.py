"""Hybrid parallel SGD: a 2-D grid of ranks, R data-parallel replicas x P pipeline stages or model pieces.

    mpiexec -n 4 python -m algorithms.hybrid_parallel --stages 2 [--schedule 1f1b] [--micro-batches 4]
    mpiexec -n 4 python -m algorithms.hybrid_parallel --stages 2 --group model [--split output|input]

Papers: Ben-Nun & Hoefler 2019 (hybrid parallelism: data, model and pipeline parallelism
combined); Dean et al. 2012, sections 3-4 (DistBelief's replicas are themselves partitioned
models: --group model, algorithms/model_parallel.py); Huang et al. 2019 and Narayanan et al. 2021
for a pipeline inside each replica (--group pipeline, algorithms/pipeline_parallel.py). Full
references: tutorials/references.md.

The grid, for R = size / P replicas (``comm.Split`` twice):

                 stage 0   stage 1  ...  stage P-1
    replica 0    rank 0    rank 1        rank P-1        <- a pipeline: pipeline_parallel
    replica 1    rank P    rank P+1      rank 2P-1
    ...            |          |              |
                 allreduce of each stage's gradient slice among the R replicas (one column)

One step, on the rank at (replica q, stage s), for global batch k of R b rows (``hybrid_step``):

    index_q  = replica q's piece of global batch k (b rows; minidl.data.rank_batches, "global")
    grad_s   = sum over the m micro-batches of d loss_i / dw_s, loss_i weighted by rows_i / (R b)
               (pipeline_parallel.pipeline_gradient: the schedule moves activations and gradients
               between the stages of replica q only)
    grad_s   = sum over the replicas of grad_s      (allreduce within column s, collectives)
    w_s     <- optimizer step on w_s               (the same on every replica)

so grad_s is serial SGD's gradient at batch R b restricted to stage s's layers: R x P ranks ==
serial SGD at batch R b, up to the order of the additions. With --group model the row is one
partitioned replica instead (model_parallel: rank s of the row owns piece s of every layer), its
pieces' gradient is weighted by rows / (R b) and allreduced in column s the same way.

Communication per step: each replica's pipeline sends 2 b (sum of boundary widths) itemsize
bytes (pipeline_parallel.bytes_per_step); each column allreduces its stage's n_s parameters (for
the ring 2 (R-1)/R n_s itemsize per rank). Data parallelism alone would allreduce all n
parameters on every rank; here each rank allreduces only its stage's n_s ~ n / P. The per-epoch
log adds both counts (bytes_pipeline or bytes_model, and bytes_allreduce).

Restrictions: size divisible by --stages; the pipeline's (P <= layers, 1 <= m <= --batch-size,
--batch-size is per replica) or the model's (P <= every split width), and the data-parallel one
(R <= training rows); --split only with --group model, --schedule, --micro-batches and --recompute
(each stage one checkpointed segment, as in pipeline_parallel) only with --group pipeline.
Checkpoints are layout-free: --save writes the serial model and its momentum (gathered), which any SGD-family
algorithm resumes on any layout, this one included.

Default run (the defaults ``--help`` shows; 1F1B with 4 micro-batches): the trajectory of serial SGD at batch
32 R; measured at 4 ranks (2 x 2): 97.8% test accuracy, as ``serial_sgd --epochs 20 --batch-size 64``.
"""
from mpi4py import MPI

from algorithms import model_parallel, pipeline_parallel
from algorithms.core import checkpoint, cli, partition
from algorithms.core.cli import SettingError
from algorithms.core.run import Run, Settings, allreduce_function
from collectives.trace import CountingComm

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, momentum=0.9)

GROUPS = ("pipeline", "model")


def hybrid_step(replicas, share, optimizer, replica_gradient, allreduce):
    """One hybrid step (the heart): this rank's share of its replica's gradient, summed over the
    replicas, then the update; returns this replica's mean loss on its piece of the batch.

    ``replica_gradient()``: the pipeline- or model-parallel gradient of this rank's share (a stage's
    slice, or its pieces of every layer) on its replica's piece of the global batch, weighted by
    rows / (R b), into ``share`` (a contiguous vector); ``replicas``: the ranks holding the same share.
    """
    # BEGIN SOLUTION
    # pipeline or model parallel: this rank's share of its replica's gradient
    loss = replica_gradient()
    # data parallel: the sum over the replicas, of this share only
    allreduce(replicas, share)
    # the same update on every replica
    optimizer.step()
    # END SOLUTION
    return loss


def check(settings, size, stages, group, split, kind, micro_batches):
    cli.require("--stages", stages, integer=True, low=1)
    if group not in GROUPS:
        raise SettingError(f"unknown --group {group!r}; choose one of {', '.join(GROUPS)}")
    if size % stages:
        raise SettingError(f"{size} ranks do not form a grid of --stages {stages}: use a multiple of {stages} ranks")
    if group == "pipeline":
        pipeline_parallel.check(settings, stages, kind, micro_batches)
    else:
        partition.check(settings, stages, split)


def model_share_gradient(row, share, batch):
    """This rank's pieces' gradient (``partition.Partition`` ``share``) of its replica's rows,
    weighted by rows / (R b); the pieces' messages go on the replica's communicator ``row``."""
    rows = batch.index
    if not len(rows):                          # a replica without rows in the epoch's last batch
        share.flat.grad[...] = 0
        return 0.0
    data = share.objective.data
    loss = model_parallel.model_parallel_gradient(row, share.pieces, data.x_train[rows], data.y_train[rows],
                                                  share.split)
    share.flat.grad *= len(rows) / batch.total
    return loss


def train(comm=None, stages=2, group="pipeline", split=None, schedule=None, micro_batches=None, allreduce="ring",
          recompute=False, **settings):
    """Hybrid SGD on ``comm``: size / stages replicas, each a ``stages``-deep pipeline (``group``
    "pipeline", ``schedule`` and ``micro_batches`` as in pipeline_parallel, default 1f1b and 4) or
    partitioned into ``stages`` model pieces (``group`` "model", ``split`` as in model_parallel,
    default output); returns (final flat parameters, on every rank, history). A setting of the other
    group is refused; ``recompute`` (each stage one checkpointed segment) only with "pipeline"."""
    comm = comm or MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    settings = Settings.of(settings, **DEFAULTS)

    given = {"pipeline": {"--split": split},
             "model": {"--schedule": schedule, "--micro-batches": micro_batches, "--recompute": recompute or None}}
    split, schedule, micro_batches = split or "output", schedule or "1f1b", micro_batches or 4

    def check_all(s):
        ignored = [flag for flag, value in given.get(group, {}).items() if value is not None]
        if ignored:
            raise SettingError(f"{' and '.join(ignored)} set{'s' if len(ignored) == 1 else ''} how a "
                               f"{'model' if group == 'pipeline' else 'pipeline'} replica runs; this run has "
                               f"--group {group}")
        check(s, size, stages, group, split, schedule, micro_batches)
        allreduce_function(allreduce)

    replica, position = divmod(rank, stages) if isinstance(stages, int) and stages >= 1 else (0, 0)
    layout = {"stages": stages, "group": group, **({"split": split} if group == "model" else
                                                    {"schedule": schedule, "micro_batches": micro_batches})}
    run = Run.start(comm, settings, check=check_all, reader=(replica, size // max(stages, 1)),
                    writer=checkpoint.Writer("hybrid_parallel", checkpoint.SGD_FAMILY, layout=layout))
    row = CountingComm(comm.Split(color=replica, key=position))          # one replica: a pipeline or a model
    column = CountingComm(comm.Split(color=position, key=replica))       # the same share in every replica
    summed = allreduce_function(allreduce)
    if group == "pipeline":
        stage = pipeline_parallel.Stage(run.objective.net, position, stages, run.objective.data.x_train[:1],
                                        recompute)
        share, optimizer = run.objective.grad[stage.start:stage.end], run.optimizer

        def replica_gradient(batch):
            return pipeline_parallel.pipeline_gradient(row, stage, run.objective, batch, micro_batches, schedule)

        def gather():
            pipeline_parallel.share_stages(row.comm, stage, run.objective, run.optimizer)
    else:
        mine = partition.Partition(run, row.comm, split)    # gathers for evaluation: not counted
        share, optimizer, gather = mine.flat.grad, mine.optimizer, mine.gather

        def replica_gradient(batch):
            return model_share_gradient(row, mine, batch)

    def step(batch):
        loss = hybrid_step(column, share, optimizer, lambda: replica_gradient(batch), summed)
        return row.comm.bcast(loss, root=stages - 1)           # the replica's loss, for the log

    def evaluate():
        gather()
        return {**run.objective.evaluate(), f"bytes_{group}": run.comm.allreduce(row.bytes_sent),
                "bytes_allreduce": run.comm.allreduce(column.bytes_sent)}

    result = run.loop(step, evaluate=evaluate)
    row.comm.Free()
    column.comm.Free()
    return result


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], allreduce="ring", recompute="stage", **DEFAULTS)
    parser.add_argument("--stages", type=int, default=2,
                        help="ranks per replica P (pipeline stages, or model pieces); size / P replicas")
    parser.add_argument("--group", default="pipeline", choices=GROUPS, help="how each replica is split")
    parser.add_argument("--split", default=None, choices=partition.SPLITS,
                        help="with --group model only (default output)")
    parser.add_argument("--schedule", default=None, choices=pipeline_parallel.SCHEDULES,
                        help="with --group pipeline only (default 1f1b)")
    parser.add_argument("--micro-batches", type=int, default=None,
                        help="with --group pipeline only: per replica's batch (default 4)")
    args = parser.parse_args(argv)
    cli.run_main(train, args, stages=args.stages, group=args.group, split=args.split, schedule=args.schedule,
                 micro_batches=args.micro_batches, allreduce=args.allreduce)


if __name__ == "__main__":
    main()
