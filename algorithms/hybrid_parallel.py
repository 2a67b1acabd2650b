"""Hybrid parallel SGD: a 2-D grid of ranks, R data-parallel replicas x P pipeline stages.

    mpiexec -n 4 python -m algorithms.hybrid_parallel --stages 2 [--schedule 1f1b] [--micro-batches 4]

Papers: Ben-Nun & Hoefler 2019 (hybrid parallelism: data, model and pipeline parallelism
combined); Dean et al. 2012, section 3-4 (DistBelief's replicas are themselves partitioned
models); Huang et al. 2019 and Narayanan et al. 2021 for the pipeline inside each replica
(algorithms/pipeline_parallel.py). Full references: tutorials/references.md.

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
serial SGD at batch R b, up to the order of the additions.

Communication per step: each replica's pipeline sends 2 b (sum of boundary widths) itemsize
bytes (pipeline_parallel.bytes_per_step); each column allreduces its stage's n_s parameters (for
the ring 2 (R-1)/R n_s itemsize per rank). Data parallelism alone would allreduce all n
parameters on every rank; here each rank allreduces only its stage's n_s ~ n / P. The per-epoch
log adds both counts (bytes_pipeline, bytes_allreduce).

Restrictions: size divisible by --stages; the pipeline's (P <= layers, 1 <= m <= --batch-size,
--batch-size is per replica) and the data-parallel one (R <= training rows).

Default run (the small CNN on the embedded digits, 20 epochs, batch 32 per replica, 2 stages,
1F1B with 4 micro-batches, ring allreduce, lr 0.05, momentum 0.9): the trajectory of serial SGD at
batch 32 R; measured at 4 ranks (2 x 2): 97.8% test accuracy, as ``serial_sgd --epochs 20
--batch-size 64``.
"""
from mpi4py import MPI

from algorithms import cli, pipeline_parallel, run
from algorithms.cli import SettingError
from collectives.trace import CountingComm


def hybrid_step(pipeline, replicas, stage, objective, optimizer, batch, micro_batches, kind, allreduce):
    """One hybrid step (the heart): this stage's pipeline gradient of this replica's piece, summed over
    the replicas, then the update. ``pipeline``: this replica's ranks; ``replicas``: this stage's column.

    Returns this replica's mean loss on its piece.
    """
    # BEGIN SOLUTION
    # pipeline parallel: this stage's gradient of the replica's piece, weighted by rows / (R b)
    loss = pipeline_parallel.pipeline_gradient(pipeline, stage, objective, batch, micro_batches, kind)
    # data parallel: the sum over the replicas, of this stage's slice only
    allreduce(replicas, objective.grad[stage.start:stage.end])
    # the same update on every replica: only this stage's slice has a gradient
    optimizer.step()
    # END SOLUTION
    return loss


def check(settings, size, stages, kind, micro_batches):
    cli.require("--stages", stages, integer=True, low=1)
    if size % stages:
        raise SettingError(f"{size} ranks do not form a grid of --stages {stages}: use a multiple of {stages} ranks")
    pipeline_parallel.check(settings, stages, kind, micro_batches)


def train(comm=None, stages=2, schedule="1f1b", micro_batches=4, allreduce="ring", **settings):
    """Hybrid SGD on ``comm``, size / stages replicas of a ``stages``-deep pipeline; returns (final
    flat parameters, on every rank, history)."""
    comm = comm or MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    settings = run.Settings.of(settings, epochs=20, momentum=0.9, partition="global")

    def check_all(s):
        check(s, size, stages, schedule, micro_batches)
        run.allreduce_function(allreduce)

    replica, stage_index = divmod(rank, stages) if isinstance(stages, int) and stages >= 1 else (0, 0)
    job = run.start(comm, settings, check=check_all, reader=(replica, size // max(stages, 1)))
    pipeline = CountingComm(comm.Split(color=replica, key=stage_index))      # a row of the grid
    replicas = CountingComm(comm.Split(color=stage_index, key=replica))      # a column
    stage = pipeline_parallel.Stage(job.objective.net, stage_index, stages, job.objective.data.x_train[:1])
    summed = run.allreduce_function(allreduce)

    def step(batch):
        loss = hybrid_step(pipeline, replicas, stage, job.objective, job.optimizer, batch, micro_batches,
                           schedule, summed)
        return pipeline.comm.bcast(loss, root=stages - 1)   # the replica's loss, for the log

    def evaluate():
        pipeline_parallel.share_stages(pipeline.comm, stage, job.objective, job.optimizer)
        return {**job.objective.evaluate(), "bytes_pipeline": job.comm.allreduce(pipeline.bytes_sent),
                "bytes_allreduce": job.comm.allreduce(replicas.bytes_sent)}

    result = job.loop(step, evaluate=evaluate)
    pipeline.comm.Free()
    replicas.comm.Free()
    return result


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], epochs=20, momentum=0.9, allreduce="ring")
    parser.add_argument("--stages", type=int, default=2, help="pipeline depth P; size / P data-parallel replicas")
    parser.add_argument("--schedule", default="1f1b", choices=pipeline_parallel.SCHEDULES)
    parser.add_argument("--micro-batches", type=int, default=4, help="micro-batches per replica's batch")
    args = parser.parse_args(argv)
    cli.run_main(train, args, stages=args.stages, schedule=args.schedule, micro_batches=args.micro_batches,
                 allreduce=args.allreduce)


if __name__ == "__main__":
    main()
