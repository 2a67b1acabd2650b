"""Synchronous data-parallel SGD: every rank's gradient averaged by one allreduce per step.

    mpiexec -n 4 python -m algorithms.allreduce_sgd [--allreduce ring|tree|butterfly|rabenseifner|naive|auto|mpi]

Papers: Hegde & Usmani 2016, section 6.1 (synchronous update: every mini-batch gradient is taken
at the same weights, the update waits for all of them); Ben-Nun & Hoefler 2019
("Synchronous SGD", and its allreduce cost table); Ueno 2018 (ring allreduce for data-parallel
training). Full references: tutorials/references.md.

The update, in the code's names (``data_parallel_step``), at step k on rank r:

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
2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma (see collectives/cost.py for the others),
plus one 8-byte Allreduce(MIN) for the non-finite-loss check (run.FiniteCheck; every
--check-every steps, counted in the log's bytes). The CNN has n = 6090 float32 parameters, 24 KB: on one node the latency
terms dominate, which is why the log-p algorithms beat the ring here.

Restrictions: p <= number of training examples (every rank needs a row; checked on every rank
before training). Bucketed overlap of the allreduce with the backward pass is not built: on the
2 shared cores this project targets, computing and communicating ranks compete for the same
cores, so there is no idle link time to hide; see tutorials/04_data_parallelism.md.

Default run (small CNN, embedded digits, 20 epochs, batch 32 per rank, lr 0.05, momentum 0.9,
ring), measured on 2 shared cores: p = 4 reaches 98.1% test accuracy in 2.5 s on an idle
machine (7 s with other jobs on the cores); p = 1 is serial SGD, 98.9%. See the table in
tutorials/04_data_parallelism.md.
"""
from mpi4py import MPI

from algorithms import cli, run


def data_parallel_step(comm, objective, optimizer, batch, allreduce):
    """One synchronous step (the heart): local gradient, weighted, summed over ranks, same update everywhere.

    Returns this rank's mean loss on its piece (0.0 for an empty piece).
    """
    # BEGIN SOLUTION
    # local gradient on this rank's piece of the global batch
    if len(batch.index):
        loss = objective.loss_and_grad(batch.index)
        objective.grad *= len(batch.index) / batch.total   # this rank's share of the global mean
    else:                                                  # a rank with no rows in the last batch
        loss = 0.0
        objective.grad[...] = 0
    # sum over ranks: grad <- (1/total) sum over the whole global batch, on every rank
    allreduce(comm, objective.grad)
    # the same update on every rank: w <- w - lr * grad (with momentum: through v)
    optimizer.step()
    # END SOLUTION
    return loss


def train(comm=None, allreduce="ring", **settings):
    """Synchronous allreduce SGD on ``comm``; returns (final flat parameters as NumPy, history).

    ``settings`` are ``run.Settings`` (the shared flags; ``model`` may be a function returning a
    fresh Module, ``problem`` a synthetic convex problem). Every rank returns the same parameters.
    """
    comm = comm or MPI.COMM_WORLD
    settings = run.Settings.of(settings, epochs=20, momentum=0.9, partition="global")
    job = run.start(comm, settings, check=lambda _: run.allreduce_function(allreduce))
    summed = run.allreduce_function(allreduce)
    return job.loop(lambda batch: data_parallel_step(job.counting, job.objective, job.optimizer, batch, summed))


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], epochs=20, momentum=0.9, partition="global", allreduce="ring")
    args = parser.parse_args(argv)
    cli.run_main(train, args, allreduce=args.allreduce)


if __name__ == "__main__":
    main()
