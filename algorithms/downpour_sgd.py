"""Downpour SGD: asynchronous model replicas against a sharded parameter server (Dean et al. 2012).

    mpiexec -n 4 python -m algorithms.downpour_sgd [--servers 1] [--n-fetch 1] [--n-push 1]
        [--server-optimizer adagrad|sgd] [--warm-start-steps 20] [--deterministic]
        [--fail-worker R --fail-step K --timeout T] [--groups G]  (and the flags every algorithm shares)
    mpiexec -n 5 python -m algorithms.downpour_sgd --replica-size 2   # 1 server, 2 replicas of 2 ranks

J. Dean et al., *Large Scale Distributed Deep Networks*, NIPS 2012, section 4.1 (and figure 2):
each worker (model replica) trains on its own share of the data and talks only to the parameter
server shards (``ps.server``); nobody waits for anybody. A worker's step i of an epoch of
m steps, in this code's names (``downpour_step``; the DownpourSGDClient of the paper's
supplementary material):

    grad     = d loss(w; batch) / dw                         (at a w that may be stale)
    accrued += grad
    w       <- w - lr * grad                                 (local step until the next fetch)
    if (i + 1) % n_push == 0 or i == m - 1:    push(accrued); accrued <- 0
    if (i + 1) % n_fetch == 0 or i == m - 1:   w <- fetch()  (from every server shard)

and before the run's first step, w <- fetch(). An epoch's end is a boundary for both phases:
the worker pushes what it has accrued and fetches, so every epoch starts from the servers'
parameters and counts its n_push and n_fetch steps afresh, as the first epoch does (and as a run
resumed at that epoch does). With m = 15 and n_fetch = 4 a worker fetches after the 4th, 8th,
12th and 15th step of every epoch (and not after the run's last step). A server shard, on each
push (``ShardServer.apply_push``):

    sgd:      w_k <- w_k - lr * accrued_k
    adagrad:  sum_sq_k <- sum_sq_k + accrued_k^2;  w_k <- w_k - lr * accrued_k / sqrt(sum_sq_k)

Adagrad gives each parameter its own rate, which Dean et al. found made many asynchronous
replicas stable (their figure 4: Downpour with Adagrad beats fixed-rate Downpour and a single
replica). Warm start: worker 0 (rank S) trains alone for ``--warm-start-steps`` steps before the
servers answer anyone else's first fetch (at the run's start; a resumed run has none).
``--deterministic``: the servers serve workers in an order drawn from Generator((seed, epoch)),
an epoch's end is a barrier for every worker, and the run can be replayed from its log; a run
resumed (--resume) after epoch e is the longer run bit for bit (``ps.server``).
``--fail-worker R --fail-step K``: rank R goes silent at its step K; server 0 drops it after
``--timeout`` seconds and the others finish (``ps.job`` explains how the crash is simulated).
``--groups G``: a hierarchical server; ranks S .. S+G-1 are group servers that sum one step of each
of their workers and push it to the root shards as one push (``ps.relay``; needs n_fetch =
n_push = 1 and G dividing the p - S - G workers).
``--replica-size k``: each model replica is k consecutive ranks, as in DistBelief (a
communicator per replica, ``comm.Split``): rank j of a replica holds piece j of every layer
(``model_parallel``, split by output neurons or channels), the replica computes its gradient with
``model_parallel_gradient``, and every rank runs ``downpour_step`` on its own parameters, pushing
and fetching only those, to and from the shards that hold them (``ps.replica``: an index map).
To the servers a replica is one worker. Not with --groups or --fail-worker; k must divide p - S
and fit the model's narrowest layer.

Restrictions: at least S + 1 ranks; S <= number of parameters; n_fetch, n_push >= 1.
Communication per worker step: a push every n_push steps (S messages of n/S gradient values) and a
fetch every n_fetch steps (S replies of n/S values): raising them trades traffic for staleness.
With --replica-size k a replica rank owning n_j of the parameters pushes and fetches n_j values
(sum_j n_j = n), and sends model_parallel's activations and gradients inside its replica.

Default run (the defaults ``--help`` shows; 1 server + 3 workers at -n 4): measured on 2 shared cores, 96.7%
to 98.9% test accuracy over five runs (the order of updates, hence the result, varies from run to run), about
3 seconds; the test checks >= 90%.
"""
from algorithms import model_parallel
from algorithms.core import checkpoint, cli
from algorithms.core.run import Settings
from algorithms.ps import flags, job as ps_job

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=10, lr=0.05, momentum=0.0)


def downpour_step(replica, rows, i, end_of_epoch, last_step):
    """Step ``i`` of an epoch of a Downpour model replica (the heart); returns the batch loss."""
    objective = replica.objective
    # BEGIN SOLUTION
    # gradient at the replica's w, which may be several pushes old by now
    loss = objective.loss_and_grad(rows)
    replica.accrued += objective.grad
    replica.accrued_steps += 1
    # local step: the replica moves on its own until the next fetch overwrites w
    objective.params -= replica.lr * objective.grad
    # push every n_push steps, fetch every n_fetch steps; an epoch's end is a boundary for both
    push = (i + 1) % replica.n_push == 0 or end_of_epoch
    fetch = ((i + 1) % replica.n_fetch == 0 or end_of_epoch) and not last_step
    if push:           # a fetch due as well rides on the same request: applied, then answered
        replica.servers.push(replica.accrued, replica.accrued_steps, fetch_into=objective.params if fetch else None)
        replica.accrued[...] = 0
        replica.accrued_steps = 0
    elif fetch:
        replica.servers.fetch(objective.params)
    # END SOLUTION
    return loss


def train(comm=None, servers=1, n_fetch=1, n_push=1, server_optimizer="adagrad", warm_start_steps=0,
          deterministic=False, fail_worker=None, fail_step=None, timeout=10.0, groups=None, replica_size=1, report=None,
          **settings):
    """Downpour SGD on ``comm``; returns (final flat parameters as NumPy, per-epoch history) on every rank.

    ``settings`` are ``run.Settings`` (the shared flags). ``report`` (a dict) receives the servers'
    update logs and the lost workers (see ``ps.job.run_job``).
    """
    settings = Settings.of(settings, **DEFAULTS)
    ps = ps_job.Settings(servers=servers, n_fetch=n_fetch, n_push=n_push, staleness=None,
                         warm_start_steps=warm_start_steps, server_optimizer=server_optimizer,
                         deterministic=deterministic, fail_worker=fail_worker, fail_step=fail_step, timeout=timeout,
                         groups=groups, replica_size=replica_size)
    writer = checkpoint.Writer("downpour_sgd", checkpoint.SERVER_FAMILY, state={"--server-optimizer": server_optimizer},
                               layout={"servers": servers, "groups": groups, "replica_size": replica_size})
    return ps_job.run_job(comm, downpour_step, settings, ps, name="downpour", writer=writer, report=report,
                          replica_gradient=model_parallel.model_parallel_gradient)


def main(argv=None):
    parser = flags.add_server_flags(cli.parser(__doc__.splitlines()[0], **DEFAULTS))
    parser.add_argument("--n-fetch", type=int, default=1, help="fetch parameters every n_fetch steps")
    parser.add_argument("--n-push", type=int, default=1, help="push the accrued gradient every n_push steps")
    parser.add_argument("--warm-start-steps", type=int, default=0,
                        help="steps worker 0 trains alone before the others start")
    parser.add_argument("--groups", type=int, default=None,
                        help="group servers between the workers and the root shards (default: none, flat)")
    parser.add_argument("--replica-size", type=int, default=1,
                        help="ranks per model replica, its layers split by output neurons among them (default 1)")
    args = parser.parse_args(argv)
    cli.run_main(train, args, n_fetch=args.n_fetch, n_push=args.n_push, warm_start_steps=args.warm_start_steps,
                 groups=args.groups, replica_size=args.replica_size, **flags.server_flags(args))


if __name__ == "__main__":
    main()
