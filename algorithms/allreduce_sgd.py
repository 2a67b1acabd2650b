"""Synchronous data-parallel SGD: every rank's gradient averaged by one allreduce per step.

    mpiexec -n 4 python -m algorithms.allreduce_sgd [--allreduce ring|tree|butterfly|rabenseifner|naive|auto|mpi]
    mpiexec -n 4 python -m algorithms.allreduce_sgd --allreduce butterfly --buckets 0.004    # overlapped

Papers: Hegde & Usmani 2016, section 6.1 (synchronous update: every mini-batch gradient is taken
at the same weights, the update waits for all of them); Ben-Nun & Hoefler 2019
("Synchronous SGD", and its allreduce cost table); Ueno 2018 (ring allreduce for data-parallel
training). Full references: tutorials/references.md.

The update, in the code's names (``data_parallel_step``, in ``algorithms.core.step``: PBT's members
and the bench take the same step), at step k on rank r:

    index   = this rank's piece of global batch k      (minidl.data.rank_batches, partition "global")
    grad_r  = (1/|index|) sum_{i in index} d loss_i / dw            (objective.loss_and_grad)
    grad_r *= |index| / total                                        (total = rows of global batch k)
    grad    = sum_r grad_r                    (allreduce, in place on the flat gradient buffer)
    w      <- optimizer.step()                (SGD with optional momentum, the same on every rank)

so grad = (1/total) sum over the whole global batch: exactly serial SGD's gradient at batch
p * b, up to the order of the floating-point additions. Every rank applies the same update to the
same weights, so the replicas never drift apart (each allreduce gives every rank the same bits).
Weighting by |index| / total rather than 1/p keeps that true for the last, shorter batch of an
epoch, whose pieces differ in size.

Communication per step: one allreduce of the n-element gradient: for the ring
2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma (see collectives/model/cost.py for the others),
plus one 8-byte Allreduce(MIN) for the non-finite-loss check (divergence.FiniteCheck; every
--check-every steps, counted in the log's bytes). The CNN has n = 6090 float32 parameters, 24 KB:
on one node the latency terms dominate, which is why the log-p algorithms beat the ring here.

Overlap (``--buckets MB``, with ``--allreduce butterfly``; ``bucketed_step``): as PyTorch DDP
(Li et al. 2020) and Horovod, the flat gradient is cut into buckets of about MB megabytes in
reverse layer order (``FlatParameters.buckets``); an autograd hook on each parameter
(``Tensor.register_accumulate_hook``) tells ``collectives.nonblocking.BucketedAllreduce`` when
its gradient is final, and the bucket's nonblocking butterfly starts while backward goes on
through the earlier layers; ``finish()`` waits for all before the update. Each element is summed
by the same additions as in the blocking butterfly, so the parameters are bitwise those of
``--allreduce butterfly`` without ``--buckets``. What it buys on 2 shared cores (little or
nothing: the ranks that compute and the ones that communicate share the cores) and what the
model predicts with a core per rank: tutorials/04_data_parallelism.md.

Memory: ``--recompute`` keeps no activations inside about sqrt(layers) checkpointed segments of
the model and recomputes them in the backward (``minidl.recompute``): bitwise the same gradients,
so the same parameters; ``python -m algorithms.memory`` counts what it saves per rank.

Restrictions: p <= number of training examples (every rank needs a row; checked on every rank
before training); --buckets > 0 and only with --allreduce butterfly.

Default run (the defaults ``--help`` shows), measured on 2 shared cores: p = 4 reaches 98.1% test accuracy in
2.5 s on an idle machine (7 s with other jobs on the cores); p = 1 is serial SGD, 98.9%. See the table in
tutorials/04_data_parallelism.md.
"""
from mpi4py import MPI

from algorithms.core import checkpoint, cli
from algorithms.core.run import Run, Settings, allreduce_function
from algorithms.core.step import data_parallel_step
from collectives.nonblocking import BucketedAllreduce

COMPARE = True       # python -m algorithms.compare runs it beside the other data-parallel algorithms
# the heart of the overlap is fenced as every heart is, but no course task asks for it (tasks.toml)
HEARTS_WITHOUT_A_TASK = ("bucketed_step",)
# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, momentum=0.9, partition="global")


def bucketed_step(comm, objective, optimizer, batch, summed):
    """``data_parallel_step`` with the sum overlapped with backward, bucket by bucket (see the docstring).

    ``summed`` is a ``BucketedAllreduce`` over ``objective.grad`` whose buckets the parameters'
    autograd hooks report ready; the weighting |index| / total is applied to each bucket as it starts.
    """
    # BEGIN SOLUTION
    summed.begin(len(batch.index) / batch.total)         # hooks now start buckets as backward finishes them
    if not len(batch.index):                               # no rows: this rank adds zeros
        objective.grad[...] = 0
    loss = objective.loss_and_grad(batch.index) if len(batch.index) else 0.0
    summed.finish()                                        # start the rest, wait for every bucket
    optimizer.step()
    # END SOLUTION
    return loss


def bucket_settings(buckets, allreduce):
    """The checks of --buckets (every rank, before the first message)."""
    if buckets is None:
        return
    cli.require("--buckets", buckets, low=0, low_open=True)
    if allreduce != "butterfly":
        raise cli.SettingError(f"--buckets sums each bucket by a nonblocking butterfly, bitwise the same as "
                               f"--allreduce butterfly; pass that (got --allreduce {allreduce})")


def overlapped_allreduce(comm, objective, megabytes):
    """A BucketedAllreduce over ``objective.grad`` in buckets of about ``megabytes``, fed by autograd hooks."""
    flat = objective.flat
    plan = flat.buckets(megabytes * 1e6)
    summed = BucketedAllreduce(comm, flat.grad, [(start, stop, len(members)) for start, stop, members in plan])
    for bucket, (_, _, members) in enumerate(plan):
        for index in members:
            flat.parameters[index].register_accumulate_hook(lambda _, bucket=bucket: summed.ready(bucket))
    return summed


def train(comm=None, allreduce="ring", buckets=None, **settings):
    """Synchronous allreduce SGD on ``comm``; returns (final flat parameters as NumPy, history).

    ``settings`` are ``run.Settings`` (the shared flags; ``model`` may be a function returning a
    fresh Module, ``problem`` a synthetic convex problem). Every rank returns the same parameters.
    """
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)
    run = Run.start(comm, settings, check=lambda _: (allreduce_function(allreduce),
                                                     bucket_settings(buckets, allreduce)),
                    writer=checkpoint.Writer("allreduce_sgd", checkpoint.SGD_FAMILY))
    if buckets is not None:
        overlapped = overlapped_allreduce(run.counting, run.objective, buckets)
        return run.loop(lambda batch: bucketed_step(run.counting, run.objective, run.optimizer, batch, overlapped))
    summed = allreduce_function(allreduce)
    return run.loop(lambda batch: data_parallel_step(run.counting, run.objective, run.optimizer, batch, summed))


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], allreduce="ring", recompute=True, **DEFAULTS)
    parser.add_argument("--buckets", type=float, default=None, metavar="MB",
                        help="overlap the sum with backward in buckets of about MB megabytes (needs --allreduce "
                             "butterfly; bitwise the same parameters)")
    args = parser.parse_args(argv)
    cli.run_main(train, args, allreduce=args.allreduce, buckets=args.buckets)


if __name__ == "__main__":
    main()
