"""Parallel SGD / model averaging: local SGD on each rank's shard, parameters averaged every H steps.

    mpiexec -n 4 python -m algorithms.model_averaging [--period H | --period end] [--partition shards|sorted|global]

Papers: Zinkevich, Weimer, Smola & Li, "Parallelized Stochastic Gradient Descent", NIPS 2010
(algorithm 3, SimuParallelSGD: each machine runs SGD on its own data, the models are averaged
once at the end); Hegde & Usmani 2016, section 6.1.1 (Parallel SGD: shuffle so every node's data
represents the whole set, train locally, average at a driver, redistribute, repeat); Ben-Nun &
Hoefler 2019 (model averaging on the consistency spectrum).

The update, in the code's names (``parallel_sgd_step``), at step k on rank r:

    grad_r = gradient of this rank's batch at its own w_r         (objective.loss_and_grad)
    w_r   <- optimizer.step()                                     (local SGD, local momentum)
    every H steps, and after the last step:
        w_r <- (1/p) sum_j w_j                                    (allreduce of w, divided by p)

H = 1 with plain SGD is synchronous SGD (averaging w_r = w - lr g_r gives w - lr mean_r g_r),
and, because the momentum update is linear, also with momentum: the local velocities differ but
their mean is the synchronous velocity. That holds when every rank's piece of each batch has the
same size (--partition global with p b dividing n): averaging weighs every rank by 1/p, while
synchronous SGD weighs a rank by its rows, so an uneven last batch makes the two differ. H = end (``--period end``)
is Zinkevich's one-shot
averaging: p independent runs and one allreduce. In between, communication falls by H while the
replicas drift apart between averages; with iid shards the drift is small and averaging works,
with label-sorted shards (``--partition sorted``) each replica learns different classes and the
average of far-apart networks can be worse than any of them (tutorials/04_data_parallelism.md).

Communication: one allreduce of the n parameters every H steps (ring: 2 (p-1) alpha +
2 (p-1)/p n beta + (p-1)/p n gamma), i.e. 1/H of allreduce SGD's volume; plus the 8-byte
non-finite check (divergence.FiniteCheck). The per-epoch test accuracy is that of the average of the
ranks' current parameters, computed by an extra evaluation-only allreduce that does not change
any rank's parameters and is not counted in ``bytes``.

Restrictions: H >= 1 (or 'end'); p <= number of training examples; every rank takes the same
number of steps per epoch (minidl.data.rank_batches), so the averages line up. --save keeps every
rank's own parameters and momentum too, so --resume (on as many ranks) continues bit for bit.

Default run (the defaults ``--help`` shows), measured on 2 shared cores: p = 4 reaches 98.1% test accuracy in
2-5 s (one-shot, --period end: 97.2%; with --partition sorted --period end: 48%).
"""
from mpi4py import MPI

from algorithms.core import checkpoint, cli
from algorithms.core.objective import evaluate_at
from algorithms.core.run import Run, Settings, allreduce_function, mean_over_ranks

COMPARE = True       # python -m algorithms.compare runs it beside the other data-parallel algorithms
# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, momentum=0.9, partition="shards")


def parallel_sgd_step(comm, objective, optimizer, batch, step, period, allreduce):
    """One step of local SGD (the heart), then the model average when ``step + 1`` is a multiple of H.

    ``period`` None means: never here (only the final average after training). Returns the loss.
    """
    # BEGIN SOLUTION
    # local SGD on this rank's own batch, at its own w_r
    loss = 0.0
    if len(batch.index):                                   # an empty piece: no local step
        loss = objective.loss_and_grad(batch.index)
        optimizer.step()                                   # w_r <- w_r - lr * grad_r
    # every H steps: the model average
    if period is not None and (step + 1) % period == 0:
        average(comm, objective.params, allreduce)
    # END SOLUTION
    return loss


def average(comm, params, allreduce):
    """w <- (1/p) sum_r w_r, in place, on every rank."""
    allreduce(comm, params)                                # w <- sum_r w_r
    params /= comm.Get_size()                              # ... / p


def check_period(period):
    if period is not None:
        cli.require("--period H", period, integer=True, low=1)


def train(comm=None, period=8, allreduce="ring", **settings):
    """Local SGD with model averaging every ``period`` steps (None: once at the end).

    Returns (final averaged parameters as NumPy, the same on every rank; per-epoch history).
    The log evaluates the mean of the ranks' current parameters (an evaluation-only reduction).
    """
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)
    run = Run.start(comm, settings, check=lambda _: (check_period(period), allreduce_function(allreduce)),
                    replicated=False, writer=checkpoint.Writer("model_averaging"))
    summed = allreduce_function(allreduce)

    def step(batch):
        return parallel_sgd_step(run.counting, run.objective, run.optimizer, batch, run.step, period, summed)

    final = []                                             # the average after the last step

    def final_average(epoch):                              # Zinkevich's only average, if not just done
        if epoch == settings.epochs - 1:                   # (on a copy: each rank's own w_r is kept
            final.append(run.objective.params.copy())      #  for --save, so --resume continues exactly)
            if period is None or run.step % period:
                average(run.counting, final[0], summed)

    def evaluate():
        consensus = final[0] if final else mean_over_ranks(comm, run.objective.params)
        return evaluate_at(run.objective, consensus)

    return run.loop(step, evaluate=evaluate, end_of_epoch=final_average, result=lambda: final[0])


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], allreduce="ring", **DEFAULTS)
    parser.add_argument("--period", type=cli.parse_period, default=8,
                        help="average every H steps; 'end': once after training (Zinkevich)")
    args = parser.parse_args(argv)
    cli.run_main(train, args, period=args.period, allreduce=args.allreduce)


if __name__ == "__main__":
    main()
