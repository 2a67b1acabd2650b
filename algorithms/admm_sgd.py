"""ADMM SGD: consensus ADMM whose local x-step is a few SGD steps on the augmented loss.

    mpiexec -n 4 python -m algorithms.admm_sgd [--rho 0.1] [--local-steps 8]

Papers: Hegde & Usmani 2016, section 6.1.2 (ADMM SGD: nodes run SGD, a driver combines the
weights by ADMM, no data shuffle needed); Boyd, Parikh, Chu, Peleato & Eckstein, "Distributed
Optimization and Statistical Learning via ADMM", 2011, section 7.1 (global variable consensus,
scaled form, eq. 7.6).

Consensus problem: minimise sum_i f_i(x_i) subject to x_i = z for every rank i, where f_i is the
mean loss on rank i's shard. In the code's names (``admm_round``), scaled form, on rank i:

    x-step   K times:  grad = grad f_i(x) + rho (x - z + u)       (objective.loss_and_grad + penalty)
                       x   <- optimizer.step()                     (an inexact argmin of the augmented loss)
    z-step   z   = (1/p) sum_i (x_i + u_i)                         (one allreduce of x + u)
    u-step   u  <- u + x - z                                       (local)

z is replicated: every rank computes the same z from the same allreduce result. u_i is the
running sum of rank i's disagreements x_i - z, the (scaled) Lagrange multiplier: at a fixed point
x_i = z and rho u_i = -grad f_i(z), and since sum_i u_i = 0 (z is the mean of x + u), the
gradients cancel: sum_i grad f_i(z) = 0, the optimum of the whole problem. That is what an
elastic average without the dual (algorithms/easgd.py) cannot promise when the shards differ.
With one rank, z = x + u and u <- u + x - z = 0 after every round, but ADMM is still not serial
SGD there unless K = 1: during a round z stays fixed while x moves, so from the round's second
local step on the penalty rho (x - z) pulls x back towards the round's start (a proximal step,
not a plain SGD step). A round's first step starts at x = z, u = 0, where the penalty is zero.

Note: the sum of shard means equals the mean over all rows only for equal shards; with
n % p != 0 the consensus optimum weights the shorter shards' rows slightly more.

Communication: one allreduce of the n parameters (x + u) every K steps (ring: 2 (p-1) alpha +
2 (p-1)/p n beta + (p-1)/p n gamma), plus the 8-byte non-finite check. The model evaluated and
returned is z.

Restrictions: rho > 0 (the augmented Lagrangian needs a positive penalty), K >= 1,
p <= number of training examples.

Default run (the defaults ``--help`` shows), measured on 2 shared cores: p = 4 reaches 97.8% test accuracy in
3-4.5 s.
"""
from mpi4py import MPI

from algorithms.core import checkpoint, cli
from algorithms.core.objective import evaluate_at
from algorithms.core.run import Run, Settings, allreduce_function

COMPARE = True       # python -m algorithms.compare runs it beside the other data-parallel algorithms
# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, momentum=0.9, partition="shards")


def admm_round(comm, objective, optimizer, batches, z, u, rho, allreduce):
    """One ADMM iteration (the heart): K SGD steps on the augmented loss, then the z- and u-steps.

    ``batches``: this rank's K batches; ``z`` and ``u`` are updated in place. Returns the K losses.
    """
    x = objective.params
    losses = []
    # BEGIN SOLUTION
    # x-step: argmin f_i(x) + rho/2 |x - z + u|^2, inexactly, by K SGD steps
    for batch in batches:
        if not len(batch.index):                           # an empty piece: no local step
            losses.append(0.0)
            continue
        losses.append(objective.loss_and_grad(batch.index))
        objective.grad += rho * (x - z + u)                # gradient of the penalty term
        optimizer.step()
    # z-step: z = mean_i (x_i + u_i), one allreduce
    total = x + u
    allreduce(comm, total)
    z[...] = total / comm.Get_size()
    # u-step: the running disagreement
    u += x - z
    # END SOLUTION
    return losses


def check_admm(rho, local_steps):
    cli.require("--rho", rho, low=0, low_open=True)
    cli.require("--local-steps K", local_steps, integer=True, low=1)


def train(comm=None, rho=0.1, local_steps=8, allreduce="ring", on_round=None, **settings):
    """Consensus ADMM with SGD x-steps; returns (z as NumPy, the same on every rank; per-epoch history).

    ``on_round(x, z, u)``, if given, is called after every round (tests use it).
    """
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)
    run = Run.start(comm, settings, check=lambda _: (check_admm(rho, local_steps), allreduce_function(allreduce)),
                    replicated=False, writer=checkpoint.Writer("admm_sgd", state={"--rho": rho}))
    summed = allreduce_function(allreduce)
    z = run.keep("z", run.objective.params.copy())         # every rank starts from the same weights
    u = run.keep("u", run.objective.params * 0)

    def round_of(batches):                                 # rounds restart with each epoch
        losses = admm_round(run.counting, run.objective, run.optimizer, batches, z, u, rho, summed)
        if on_round:
            on_round(run.objective.params, z, u)
        return losses

    return run.loop(round_of, group=local_steps, evaluate=lambda: evaluate_at(run.objective, z),
                    result=lambda: z)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], allreduce="ring", **DEFAULTS)
    parser.add_argument("--rho", type=float, default=0.1, help="ADMM penalty (> 0)")
    parser.add_argument("--local-steps", type=int, default=8, help="SGD steps per x-step (K)")
    args = parser.parse_args(argv)
    cli.run_main(train, args, rho=args.rho, local_steps=args.local_steps, allreduce=args.allreduce)


if __name__ == "__main__":
    main()
