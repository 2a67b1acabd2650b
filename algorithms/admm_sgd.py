"""ADMM SGD: consensus ADMM whose local x-step is a few SGD steps on the augmented loss.

    mpiexec -n 4 python -m algorithms.admm_sgd [--rho 0.5] [--local-steps K]

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
With one rank, z = x + u and u <- u + x - z = 0, so the consensus equals the local solution.

Note: the sum of shard means equals the mean over all rows only for equal shards; with
n % p != 0 the consensus optimum weights the shorter shards' rows slightly more.

Communication: one allreduce of the n parameters (x + u) every K steps (ring: 2 (p-1) alpha +
2 (p-1)/p n beta + (p-1)/p n gamma), plus the 8-byte non-finite check. The model evaluated and
returned is z.

Restrictions: rho > 0 (the augmented Lagrangian needs a positive penalty), K >= 1,
p <= number of training examples.

Default run (small CNN, embedded digits, 20 epochs, batch 32, lr 0.05, momentum 0.9, rho 0.1,
K = 8, iid shards, ring), measured on 2 shared cores: p = 4 reaches 97.8% test accuracy in
3-4.5 s.
"""
import math

from mpi4py import MPI

from algorithms import common


def admm_round(comm, objective, optimizer, batches, z, u, rho, allreduce):
    """One ADMM iteration (the heart): K SGD steps on the augmented loss, then the z- and u-steps.

    ``batches``: this rank's K batches; ``z`` and ``u`` are updated in place. Returns the losses.
    """
    x = objective.params
    losses = []
    for batch in batches:                                  # x-step: argmin f_i(x) + rho/2 |x - z + u|^2, inexactly
        if not len(batch.index):                           # an empty piece: no local step
            losses.append((0.0, 0))
            continue
        losses.append((objective.loss_and_grad(batch.index), len(batch.index)))
        objective.grad += rho * (x - z + u)                # gradient of the penalty term
        optimizer.step()
    total = x + u                                          # z-step: z = mean_i (x_i + u_i)
    allreduce(comm, total)
    z[...] = total / comm.Get_size()
    u += x - z                                             # u-step: the running disagreement
    return losses


def check_admm(rho, local_steps):
    if not (isinstance(rho, (int, float)) and math.isfinite(rho) and rho > 0):
        raise ValueError(f"--rho must be a finite number > 0, got {rho!r}")
    if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1:
        raise ValueError(f"--local-steps K must be an integer >= 1, got {local_steps!r}")


def train(comm=None, dataset="digits", model="cnn", epochs=20, lr=0.05, momentum=0.9, batch_size=32,
          seed=0, rho=0.1, local_steps=8, allreduce="ring", partition="shards", log=None, save=None,
          resume=None, quiet=False, data=None, data_dir=None, problem=None, check_every=1, on_round=None):
    """Consensus ADMM with SGD x-steps; returns (z as NumPy, the same on every rank; per-epoch history).

    ``on_round(x, z, u)``, if given, is called after every round (tests use it).
    """
    comm = comm or MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    common.check_common(epochs, lr, batch_size, momentum)
    check_admm(rho, local_steps)
    step_allreduce = common.allreduce_function(allreduce)
    run = common.start_run(comm, model=model, dataset=dataset, seed=seed, data=data, data_dir=data_dir,
                           problem=problem, lr=lr, momentum=momentum, batch_size=batch_size, resume=resume,
                           log=log, quiet=quiet, check_every=check_every)
    objective, optimizer = run.objective, run.optimizer
    z = objective.params.copy()                            # every rank starts from the same weights
    u = objective.params * 0                               # (after --resume too: u restarts at 0)
    step = 0
    for epoch in range(run.first_epoch, epochs):
        batches = common.rank_batches(objective.n, batch_size, rank, size, seed, epoch, partition,
                                      objective.labels)
        loss_sum, rows = 0.0, 0
        for start in range(0, len(batches), local_steps):  # rounds restart with each epoch
            round_batches = batches[start:start + local_steps]
            losses = admm_round(run.counting, objective, optimizer, round_batches, z, u, rho, step_allreduce)
            for loss, count in losses:
                loss_sum += loss * count
                rows += count
                run.finite(loss, step)
                step += 1
            if on_round:
                on_round(objective.params, z, u)
        run.finite.agree()
        record = {"epoch": epoch + 1, "train_loss": common.epoch_mean(comm, loss_sum, rows)}
        record.update(common.evaluate_at(objective, z))
        record["bytes"] = run.counting.total_bytes()
        run.logger.epoch(**record)
    return run.finish(save, epochs, params=z)


def main(argv=None):
    parser = common.parallel_parser(__doc__.splitlines()[0], partition="shards", epochs=20, lr=0.05,
                                    momentum=0.9)
    parser.add_argument("--rho", type=float, default=0.1, help="ADMM penalty (> 0)")
    parser.add_argument("--local-steps", type=int, default=8, help="SGD steps per x-step (K)")
    args = parser.parse_args(argv)
    common.run_main(train, args, rho=args.rho, local_steps=args.local_steps, allreduce=args.allreduce)


if __name__ == "__main__":
    main()
