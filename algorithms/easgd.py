"""Elastic averaging SGD (synchronous, communication period tau): workers tied to a centre by springs.

    mpiexec -n 4 python -m algorithms.easgd [--tau 4] [--rho R]

Papers: Zhang, Choromanska & LeCun, "Deep Learning with Elastic Averaging SGD", NIPS 2015,
section 3, eqs. (5)-(6) (synchronous EASGD) and algorithm 1's communication period tau;
Ben-Nun & Hoefler 2019 ("model averaging (e.g., elastic)": x_{t+1,i} =
x_{t,i} - eta grad - alpha (x_{t,i} - x_t); the centre x_{t+1} = (1 - beta) x_t + beta mean_i x_{t,i}).

Each rank i keeps its own x_i (``objective.params``) and a copy of the centre x~ (``center``),
identical on every rank. In the code's names (``easgd_step``), with alpha = lr * rho:

    grad_i  = gradient of this rank's batch at x_i
    on steps t with t % tau == 0 (both at the same x_i, x~):
        total   = sum_j x_j                          (one allreduce)
        x_i    <- x_i - alpha (x_i - x~)             (the spring pulls the worker towards the centre)
        x~     <- x~ + alpha (total - p x~)          (... and the centre towards the workers: beta = p alpha)
    x_i <- optimizer.step()                          (local SGD with grad_i; momentum is local)

"Averaging with a spring": unlike model averaging the workers are never overwritten, only pulled,
so they may explore (the paper's point for deep networks), and x~ is a running average of them.
EASGD is a penalty method: with tau = 1 (a spring step every SGD step), at a fixed point each
worker sits where its own gradient balances the spring, x_i = x~ - grad f_i(x_i) / rho, so with
different shards x~ is within O(1/rho) of the optimum, not on it (with tau > 1 the pull acts only
every tau steps and the offset grows with tau) (ADMM's dual variable removes that bias: algorithms/admm_sgd.py).

Communication: one allreduce of the n parameters every tau steps, plus the 8-byte non-finite
check. The model evaluated and returned is the centre x~.

Restrictions: rho > 0; 0 < beta = p * lr * rho <= 1 (beta > 1 moves the centre past the
workers' mean; the paper uses beta = 0.9, which is the default when --rho is not given:
rho = 0.9 / (p lr)); tau >= 1; p <= number of training examples.

Default run (the defaults ``--help`` shows; beta 0.9), measured on 2 shared cores: p = 4 reaches 98.1% test
accuracy (the centre's) in 3-4.5 s.
"""
import math

from mpi4py import MPI

from algorithms.core import checkpoint, cli
from algorithms.core.objective import evaluate_at
from algorithms.core.run import Run, Settings, allreduce_function

COMPARE = True       # python -m algorithms.compare runs it beside the other data-parallel algorithms
# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, momentum=0.9, partition="shards")


def easgd_step(comm, objective, optimizer, batch, center, step, tau, alpha, allreduce):
    """One synchronous EASGD step (the heart); ``center`` is updated in place. Returns the loss."""
    x = objective.params
    # BEGIN SOLUTION
    # the local gradient grad_i at x_i
    loss = objective.loss_and_grad(batch.index) if len(batch.index) else 0.0
    # every tau steps, the elastic exchange (both updates use the old x_i and x~)
    if step % tau == 0:
        total = x.copy()
        allreduce(comm, total)                             # total = sum_j x_j
        elastic = alpha * (x - center)
        x -= elastic                                       # the spring pulls the worker to the centre ...
        center += alpha * (total - comm.Get_size() * center)   # ... and the centre to the workers
    # the local SGD step
    if len(batch.index):
        optimizer.step()                                   # x_i <- x_i - lr * grad_i
    # END SOLUTION
    return loss


def moving_rate(lr, rho, size):
    """alpha = lr * rho, checked: rho > 0 and beta = p alpha in (0, 1]; rho None gives beta = 0.9.
    An lr so small that the default rho (0.9 / (p lr)) overflows, or that alpha underflows to 0, is
    named as the cause, not --rho."""
    if rho is None:
        rho = 0.9 / (size * lr)
        if not math.isfinite(rho):
            raise cli.SettingError(f"--lr {lr} is too small: the default --rho = 0.9 / (W * lr) = 0.9 / ({size} * {lr})"
                                   f" is not a finite number; use a larger --lr")
    cli.require("--rho", rho, low=0, low_open=True)
    alpha = lr * rho
    if not alpha > 0:
        raise cli.SettingError(f"--lr {lr} is too small for --rho {rho}: alpha = lr * rho underflows to {alpha}, "
                               f"so the spring would never pull; use a larger --lr (or --rho)")
    if size * alpha > 1:
        raise cli.SettingError(f"beta = p * lr * rho = {size} * {lr} * {rho} = {size * alpha:.3g} > 1 moves the "
                               f"centre past the workers' mean; use --rho <= {1 / (size * lr):.4g}")
    return alpha


def train(comm=None, tau=4, rho=None, allreduce="ring", **settings):
    """Synchronous EASGD; returns (the centre as NumPy, the same on every rank; per-epoch history)."""
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)

    def check(settings):
        cli.require("--tau", tau, integer=True, low=1)
        moving_rate(settings.lr, rho, comm.Get_size())
        allreduce_function(allreduce)

    run = Run.start(comm, settings, check=check, replicated=False, writer=checkpoint.Writer("easgd"))
    alpha, summed = moving_rate(settings.lr, rho, comm.Get_size()), allreduce_function(allreduce)
    center = run.keep("center", run.objective.params.copy())   # x~ starts at the common initial weights

    def step(batch):
        return easgd_step(run.counting, run.objective, run.optimizer, batch, center, run.step, tau, alpha, summed)

    return run.loop(step, evaluate=lambda: evaluate_at(run.objective, center), result=lambda: center)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], allreduce="ring", **DEFAULTS)
    parser.add_argument("--tau", type=int, default=4, help="communication period (steps)")
    parser.add_argument("--rho", type=float, default=None,
                        help="elastic force; alpha = lr * rho (default: beta = p alpha = 0.9)")
    args = parser.parse_args(argv)
    cli.run_main(train, args, tau=args.tau, rho=args.rho, allreduce=args.allreduce)


if __name__ == "__main__":
    main()
