"""Stale-synchronous SGD: asynchronous workers whose clocks may drift apart by at most s.

    mpiexec -n 4 python -m algorithms.ssp_sgd --staleness 2 [--servers 1] [--server-optimizer sgd]
        [--deterministic] [--fail-worker R --fail-step K --timeout T]  (and the flags every algorithm shares)
        [--straggler R --straggler-delay SECONDS]

Q. Ho et al., *More Effective Distributed ML via a Stale Synchronous Parallel Parameter Server*,
NIPS 2013; the consistency spectrum of Ben-Nun & Hoefler 2019 (synchronous,
stale-synchronous, asynchronous). A worker's clock c counts its steps (pushes); the rule is

    a worker at clock c may compute its step c only while  c - min_j clock_j <= s

    s = 0     every step waits for the slowest worker: synchronous SGD
    s = k     the fastest worker may run k steps ahead of the slowest
    s = inf   nobody waits: asynchronous SGD (Downpour with n_fetch = n_push = 1)

The worker's step (``ssp_step``): compute the gradient at the parameters read for clock c, push it
and, in the same request, ask for clock c + 1's parameters. The servers enforce the rule where
the parameters are read (``ps.server.may_proceed``): a fetch is answered only once the
asking clock is within s of the slowest live worker's. Because the push and the next fetch are
one request, with s = 0 every worker reads exactly the parameters after all clock c - 1 updates
and before any clock c update: the same w_c as synchronous SGD, whose step is
w_{c+1} = w_c - lr * sum_workers grad_w(w_c) (summed, not averaged: each push is applied with lr).

Each applied update is logged with its clock staleness (c - min clock at the read, <= s by the
rule) and its version staleness (pushes by anyone applied between its read and its update).
A worker that has finished, or that server 0 dropped after ``--timeout`` seconds of silence,
leaves the minimum; without that timeout a dead worker would stall every other one forever,
as it would in synchronous SGD.

A straggler (``--straggler R --straggler-delay D``, off by default): worker rank R sleeps D seconds
before each of its steps, a slow machine, so that the bound binds: with it the fast workers reach
clock staleness s and then wait, while with s = inf they run ahead (tutorials/05, section 3).

Restrictions: at least S + 1 ranks; s >= 0 (``--staleness inf`` for no bound).
Communication per step: one push + fetch request, 2 S messages of n/S values each way.

Default run (the defaults ``--help`` shows; 1 server + 3 workers at -n 4): measured on 2 shared cores, 93.9%
and 96.7% test accuracy in two runs, about 3 seconds. (Each push is applied with lr, so 3 workers step like
serial SGD at 3 lr.)
"""
import time

from mpi4py import MPI

from algorithms.core import checkpoint, cli
from algorithms.core.run import Settings
from algorithms.ps import flags, job as ps_job

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=10, lr=0.05, momentum=0.0)


def ssp_step(replica, rows, i, end_of_epoch, last_step):
    """One clock of a stale-synchronous worker (the heart); returns the batch loss."""
    objective = replica.objective
    # BEGIN SOLUTION
    # clock c's gradient, at the parameters read for clock c
    loss = objective.loss_and_grad(rows)
    # push it and fetch clock c + 1's parameters in one request: the servers apply the push, then
    # answer only once c + 1 - min(clocks) <= s (the run's last clock fetches nothing)
    replica.servers.push(objective.grad, 1, fetch_into=None if last_step else objective.params)
    # END SOLUTION
    return loss


def parse_staleness(text):
    """'inf' (or 'none') -> None (no bound); otherwise an integer (checked later: >= 0)."""
    if str(text).lower() in ("inf", "none", "async"):
        return None
    return int(text)


def slowed(step, seconds):
    """``step`` after a sleep of ``seconds``: the straggler's step (a slow machine, same arithmetic)."""
    def slow_step(*args, **kwargs):
        time.sleep(seconds)
        return step(*args, **kwargs)
    return slow_step


def check_straggler(straggler, delay, servers, size):
    """A SettingError (on every rank alike) unless ``straggler`` is a worker rank and ``delay`` >= 0."""
    try:                                          # every rank computes the same: every rank raises alike
        if straggler is None and delay:
            raise cli.SettingError("--straggler-delay needs --straggler R (the slow worker rank)")
        if straggler is not None:
            cli.require("--straggler", straggler, integer=True, low=servers, high=size - 1)
            cli.require("--straggler-delay", delay, low=0)
    except cli.SettingError as error:
        raise cli.SettingError(str(error), every_rank=True) from None


def train(comm=None, staleness=2, servers=1, server_optimizer="sgd", deterministic=False, fail_worker=None,
          fail_step=None, timeout=10.0, report=None, straggler=None, straggler_delay=0.0, **settings):
    """Stale-synchronous SGD with bound ``staleness`` (None: none); returns (final parameters, history).

    ``settings`` are ``run.Settings`` (the shared flags); ``report`` as in ``ps.job.run_job``;
    ``straggler`` (a worker rank) sleeps ``straggler_delay`` seconds before each step.
    """
    comm = comm if comm is not None else MPI.COMM_WORLD
    check_straggler(straggler, straggler_delay, servers, comm.Get_size())
    step = slowed(ssp_step, straggler_delay) if comm.Get_rank() == straggler else ssp_step
    settings = Settings.of(settings, **DEFAULTS)
    ps = ps_job.Settings(servers=servers, n_fetch=1, n_push=1, staleness=staleness,
                         server_optimizer=server_optimizer, deterministic=deterministic,
                         fail_worker=fail_worker, fail_step=fail_step, timeout=timeout)
    writer = checkpoint.Writer("ssp_sgd", checkpoint.SERVER_FAMILY, state={"--server-optimizer": server_optimizer},
                               layout={"servers": servers})
    return ps_job.run_job(comm, step, settings, ps, name=f"ssp s={staleness}", writer=writer, report=report)


def main(argv=None):
    parser = flags.add_server_flags(cli.parser(__doc__.splitlines()[0], **DEFAULTS))
    parser.set_defaults(server_optimizer="sgd")
    parser.add_argument("--staleness", type=parse_staleness, default=2,
                        help="the bound s (an integer >= 0, or 'inf' for none)")
    parser.add_argument("--straggler", type=int, default=None, help="a worker rank that is slow (default: none)")
    parser.add_argument("--straggler-delay", type=float, default=0.0,
                        help="seconds the straggler sleeps before each step")
    args = parser.parse_args(argv)
    cli.run_main(train, args, staleness=args.staleness, straggler=args.straggler,
                 straggler_delay=args.straggler_delay, **flags.server_flags(args))


if __name__ == "__main__":
    main()
