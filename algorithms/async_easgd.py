"""Asynchronous elastic averaging SGD: workers pulled towards a centre on parameter-server shards.

    mpiexec -n 4 python -m algorithms.async_easgd [--tau 4] [--rho R] [--servers 1] [--deterministic]
        (and the flags every algorithm shares)

Zhang, Choromanska & LeCun, "Deep Learning with Elastic Averaging SGD", NIPS 2015, algorithm 2
(asynchronous EASGD) with its communication period tau. The centre x~ lives on the parameter
server shards (ranks 0 .. S-1, ``ps.server``); each worker i (ranks S .. p-1) keeps its own
x_i and, in the code's names (``async_easgd_step``), at step i of each of its epochs:

    grad    = gradient of the worker's batch at x_i               (before the spring moves x_i)
    if i % tau == 0:                                              (no waiting for the other workers)
        x~      <- fetch()                                        (the centre as the servers hold it now)
        elastic  = alpha (x_i - x~)                               (alpha = lr * rho)
        x_i     <- x_i - elastic                                  (the spring pulls the worker ...)
        push(-elastic)      server: x~ <- x~ - 1 * (-elastic)     (... and the centre, by the same amount)
    x_i <- x_i - lr * grad                                        (local SGD)

The server applies what it receives as a gradient with rate 1 (plain SGD, no momentum), so the
centre moves by exactly +elastic; it serves whichever worker is ready, or in ``--deterministic``
mode in an order drawn from the seed (replayable, as Downpour's). The exchange counter restarts
each epoch (an epoch's end is a boundary, as Downpour's n_push): with one worker and tau dividing
the steps per epoch this is exactly synchronous EASGD (``algorithms/easgd.py``) at p = 1.

Unlike the synchronous form no worker waits for another: a slow worker only exchanges less
often, and the centre is a running average of whatever the workers sent. alpha is checked as the
synchronous form checks it, with W workers: 0 < beta = W alpha <= 1 (default beta = 0.9).

Communication per exchange (every tau steps of a worker): one fetch (S replies, n values in all)
and one push (n values), against Downpour's push and fetch every step: tau trades traffic for
how tightly the workers follow the centre.

Restrictions: at least S + 1 ranks; tau >= 1; no --momentum (the local step is plain SGD, as in
algorithm 2); --resume restarts the workers from the centre.

Default run (the defaults ``--help`` shows; 1 server + 3 workers at -n 4, beta 0.9), measured on 2 shared
cores: the centre reaches 94.7% to 95.3% test accuracy over three runs, in about 1.4 s. Against the
synchronous form on the MLP (3 seeds): tutorials/07_sandblaster_and_asynchrony.md, section 3.
"""
import dataclasses
import functools

from mpi4py import MPI

from algorithms import easgd
from algorithms.core import checkpoint, cli
from algorithms.core.run import Settings
from algorithms.ps import flags, job as ps_job
from minidl import backend

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, lr=0.05)


@dataclasses.dataclass
class Spring:
    """What a worker's exchange needs: the period, the elastic rate alpha, its own lr, a buffer for x~."""
    tau: int
    alpha: float
    lr: float
    center: object = None


def async_easgd_step(spring, replica, rows, i, end_of_epoch, last_step):
    """Step ``i`` of an epoch of an asynchronous EASGD worker (the heart); returns the batch loss."""
    x = replica.objective.params
    if spring.center is None:
        spring.center = backend.xp().empty_like(x)
    # BEGIN SOLUTION
    # the local gradient at x_i, before the spring moves it
    loss = replica.objective.loss_and_grad(rows)
    # every tau steps: read the centre, move both ends of the spring by the same elastic amount
    if i % spring.tau == 0:
        replica.servers.fetch(spring.center)
        elastic = spring.alpha * (x - spring.center)
        x -= elastic
        replica.servers.push(-elastic, 1)            # the server: x~ <- x~ - 1 * (-elastic)
    # the local SGD step with the gradient taken at the old x_i
    x -= spring.lr * replica.objective.grad
    # END SOLUTION
    return loss


def train(comm=None, tau=4, rho=None, servers=1, deterministic=False, report=None, **settings):
    """Asynchronous EASGD; returns (the centre as NumPy, the same on every rank; per-epoch history)."""
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, momentum=0.0, **DEFAULTS)   # no momentum in its update
    workers = comm.Get_size() - servers
    try:                                          # every rank computes the same: every rank raises alike
        cli.require("--tau", tau, integer=True, low=1)
        cli.require("--lr", settings.lr, low=0, low_open=True)
        if settings.momentum:
            raise cli.SettingError("--momentum is not offered: algorithm 2's local step is plain SGD")
        alpha = easgd.moving_rate(settings.lr, rho, max(workers, 1))     # checked as synchronous EASGD's
    except cli.SettingError as error:
        raise cli.SettingError(str(error), every_rank=True) from None
    spring = Spring(tau, alpha, settings.lr)
    server_settings = dataclasses.replace(settings, lr=1.0)   # the server adds the elastic moves as sent
    ps = ps_job.Settings(servers=servers, n_fetch=tau, n_push=tau, staleness=None, server_optimizer="sgd",
                         deterministic=deterministic)
    writer = checkpoint.Writer("async_easgd", layout={"servers": servers})
    return ps_job.run_job(comm, functools.partial(async_easgd_step, spring), server_settings, ps,
                          name="async easgd", writer=writer, report=report)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], momentum=None, **DEFAULTS)
    parser.add_argument("--tau", type=int, default=4, help="communication period (steps)")
    parser.add_argument("--rho", type=float, default=None,
                        help="elastic force; alpha = lr * rho (default: beta = W alpha = 0.9)")
    flags.add_server_flags(parser, "--servers", "--deterministic")
    args = parser.parse_args(argv)
    cli.run_main(train, args, tau=args.tau, rho=args.rho, **flags.server_flags(args))


if __name__ == "__main__":
    main()
