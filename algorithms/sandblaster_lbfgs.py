"""Sandblaster L-BFGS: a coordinator that holds only scalars, sharded vectors, backup tasks (Dean et al. 2012).

    mpiexec -n 4 python -m algorithms.sandblaster_lbfgs [--servers 1] [--portions 32] [--backup-threshold 0.9]
        [--push-every 4] [--history 10] [--max-iter 10] [--slow-worker R --slow-factor X] [--deterministic]
        [--problem least-squares]  (and the shared flags --model, --epochs, --lr, --seed, --log, --save, --quiet)

J. Dean et al., *Large Scale Distributed Deep Networks*, NIPS 2012, section 4.2 and figure 2 (right).
Roles, by rank (``Roles``): rank 0 is the **coordinator**, ranks 1 .. S the parameter-server
**shards**, ranks S+1 .. p-1 the **workers** (model replicas); so p >= S + 2.

    flat vectors   w, g, d, s_i, y_i, ...   [  shard 1  |  shard 2  | ... |  shard S  ]   (on the servers)
    coordinator    issues commands; receives one number per shard and command (a dot product's
                   partial sum, a max, an acknowledgement); never a vector
    workers        fetch w at the start of a batch; gradients of small portions; push every few

This file holds the heart and the run; the roles' code is in algorithms/sandblaster/: ``wire``
(``Roles``, the tags), ``coordinator`` (``Shards``, ``Coordinator``), ``shard``, ``batch`` (``Batch``)
and ``worker``.

The coordinator runs ``minidl.optim.LBFGS.step`` line for line, but every vector operation is a
command that each shard performs on its own slice, and every inner product is a sum of the
shards' partial sums (``Shards.dot``). The L-BFGS history (s_i, y_i) lives on the shards beside
the parameters, so the two-loop recursion (``sharded_direction``, the heart) is

    q = g                                            copy         (each shard, its slice)
    for i = k-1 .. 0:  rho_i = 1 / <y_i, s_i>        dot          (S partial sums -> coordinator)
                       a_i = rho_i <s_i, q>          dot
                       q <- q - a_i y_i              axpy         (each shard, its slice)
    q <- (<s_{k-1}, y_{k-1}> / <y_{k-1}, y_{k-1}>) q scale
    for i = 0 .. k-1:  b = rho_i <y_i, q>;  q <- q + (a_i - b) s_i
    d = -q

The step rule is the serial optimizer's, exactly: the backtracking (Armijo) line search of
``minidl.optim.LBFGS`` (largest t in {lr, lr/2, ...} with f(w + t d) <= f(w) + 1e-4 t <g, d>, the
last one tried if all 30 fail; a fresh history's first t scaled by min(1, 1/||g||_1)), its restart
on a non-descent direction, its curvature rule (keep (s, y) only if <s, y> > 1e-10) and its stopping
tests. Why not the paper's fixed schedule: the same rule lets a test tie the distributed run to
serial L-BFGS to 1e-10, and full-batch L-BFGS needs a line search to be safe (each trial point is
one more batch, exactly where load balancing pays). An epoch is one ``LBFGS.step(closure)`` of up
to ``--max-iter`` iterations and one --log record (the last with the final test metrics).

A batch (one evaluation of f and g at a trial point, the full training set here) is cut into
``--portions`` contiguous pieces, many more than workers; the coordinator hands them out one at
a time to whichever worker asks (load balancing, ``Batch``). A worker reports each finished
portion (its loss, a number) and the coordinator answers keep or discard and, every
``--push-every`` kept portions (or when no work is left for it, or near the batch's end), push:
the worker sends its accumulated gradient slices to the shards, which add them up. Backup tasks:
once a fraction ``--backup-threshold`` of the portions is finished, an idle worker receives a
copy of an outstanding portion (one still being computed, or finished but not yet pushed); the
first copy *pushed* wins, later copies are discarded and counted (a worker whose accumulator
holds a portion that someone else pushed drops the whole accumulator: a sum cannot be taken
apart; its other portions go back to the queue). ``--slow-worker R --slow-factor X`` makes
worker rank R take X times as long per portion (it sleeps), to inject a straggler; at the end the
coordinator's stop cancels whatever a worker is still on, so the job does not wait for it.
``--deterministic``: portion i goes to worker i mod W only and there are no backups, so the run
is bit-for-bit reproducible (shards add the workers' accumulators in worker order).

Cost per batch (n parameters, S shards, P portions, W workers, b bytes per value): each worker
fetches n b bytes once; pushes carry at most n b bytes per ``--push-every`` portions per worker
(at least W n b in all); the coordinator exchanges 2 small messages per portion with the
workers and 2 S (reductions) or S (vector commands) small messages per command with the shards,
about 8 k + 20 commands per iteration for a history of k pairs. No vector ever passes through it.

Restrictions: p >= S + 2; S <= n; W <= --portions <= training examples; 0 < --backup-threshold
<= 1 (1: no backups; below 1 only with W >= 2); --slow-worker (a worker rank) and --slow-factor
(>= 1) only together; --model and --dataset not with --problem; --batch-size is refused (a batch
is the training set); --resume is refused (the history would have to be saved too).
Errors: a bad flag stops every rank before the first message (``Run.start``); a non-finite loss,
or one 100 x the first (``divergence.check_divergence``), makes the coordinator stop every worker and
shard and every rank raise the same error; an exception in any role prints ``error: ...`` and
aborts the job (``MPI.Abort(2)``): the other roles would wait for that rank's messages forever.
Both are the parameter-server family's job loop (``algorithms.ps.loop``: ``play``, ``collect``).

Defaults (MLP on the embedded digits, 1 shard and 2 workers at -n 4, 32 portions, push every 4,
backups at 0.9, history 10, 10 epochs x 10 iterations, lr 1), measured on 2 shared cores: 95.8% and
95.3% test accuracy in two runs (training loss below 1e-4; the line search's loss stops changing
after 78 iterations), 15 to 16 s, 77 MB sent in all. ``--problem least-squares`` (512 x 32): the
loss is within 5e-14 of the optimum's after 4 epochs of 5 iterations (tutorials/figures/
make_07_figures.py --part compare; chapter 7 has the comparison with Downpour and the straggler).
"""
import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli, divergence
from algorithms.core.objective import evaluate_at
from algorithms.core.run import Run, Settings, agreed
from algorithms.ps import loop
from algorithms.sandblaster.coordinator import Coordinator
from algorithms.sandblaster.shard import Shard
from algorithms.sandblaster.wire import Roles
from algorithms.sandblaster.worker import work
from collectives.trace import CountingComm, TracedComm
from minidl.data import least_squares

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=10, lr=1.0)


def sharded_direction(shards, pairs):
    """d <- -H g on the shards, by the two-loop recursion (the heart); ``pairs`` = k, the history's length.

    The vectors are named: "g", "q", "d", and ("s", i), ("y", i) for the i-th oldest pair. Only
    numbers come back to the caller; every vector operation happens on the shards.
    """
    # BEGIN SOLUTION
    # q = g
    shards.copy("q", "g")
    # first loop, newest pair first: rho_i = 1/<y_i, s_i>, a_i = rho_i <s_i, q>, q <- q - a_i y_i
    alphas, rhos = [], []
    for i in reversed(range(pairs)):
        rho = 1.0 / shards.dot(("y", i), ("s", i))
        alpha = rho * shards.dot(("s", i), "q")
        shards.axpy(-alpha, ("y", i), "q")
        alphas.append(alpha)
        rhos.append(rho)
    # the initial Hessian: gamma = <s, y> / <y, y> of the newest pair
    if pairs:
        newest = pairs - 1
        shards.scale("q", shards.dot(("s", newest), ("y", newest)) / shards.dot(("y", newest), ("y", newest)))
    # second loop, oldest pair first: b = rho_i <y_i, q>, q <- q + (a_i - b) s_i
    for i, alpha, rho in zip(range(pairs), reversed(alphas), reversed(rhos)):
        beta = rho * shards.dot(("y", i), "q")
        shards.axpy(alpha - beta, ("s", i), "q")
    # the direction: d = -q
    shards.copy("d", "q", factor=-1.0)
    # END SOLUTION


# ---- train / main -----------------------------------------------------------------------------------

def train(comm=None, servers=1, portions=32, backup_threshold=None, push_every=4, history=10, max_iter=10,
          max_backtracks=30, tolerance_grad=1e-7, tolerance_change=1e-12, slow_worker=None, slow_factor=None,
          deterministic=False, report=None, **settings):
    """Sandblaster L-BFGS on ``comm``; returns (final flat parameters, per-epoch history) on every rank.

    ``settings`` are ``run.Settings`` (lr is L-BFGS's first trial step, 1 by default). ``report``
    (a dict) receives the coordinator's traced messages, the batch times, backups and discarded
    results, the bytes sent, and each worker's count of computed portions.
    """
    comm = comm or MPI.COMM_WORLD
    batch_size = settings.pop("batch_size", None)        # refused below: the batch is the training set
    unused = [f"--{name.replace('_', '-')}" for name in ("model", "dataset", "data_dir")   # beside a problem
              if settings.get(name) is not None] if settings.get("problem") is not None else []
    settings = {name: value for name, value in settings.items() if not (value is None and name in ("model", "dataset"))}
    settings = Settings.of(settings, momentum=0.0, model="mlp", **DEFAULTS)
    size, rank = comm.Get_size(), comm.Get_rank()
    threshold = (1.0 if deterministic else 0.9) if backup_threshold is None else backup_threshold
    roles = None

    def check(settings):
        nonlocal roles
        if batch_size is not None:
            raise cli.SettingError("--batch-size is not used by sandblaster_lbfgs: every batch is the whole training "
                                   "set, cut into --portions pieces")
        if settings.resume:
            raise cli.SettingError("--resume is not offered by sandblaster_lbfgs: the L-BFGS history lives on the "
                                   "servers and is not saved")
        cli.require("--servers", servers, integer=True, low=1)
        cli.require("--portions", portions, integer=True, low=1)
        cli.require("--backup-threshold", threshold, low=0, high=1, low_open=True)
        cli.require("--push-every", push_every, integer=True, low=1)
        cli.require("--history", history, integer=True, low=1)
        cli.require("--max-iter", max_iter, integer=True, low=1)
        if unused:
            raise cli.SettingError(f"{', '.join(unused)} not used by sandblaster_lbfgs with --problem: the problem "
                                   "is the model and the data; leave out one or the other")
        if (slow_worker is None) != (slow_factor is None):
            raise cli.SettingError("--slow-worker R and --slow-factor X come together (worker R made X times slower); "
                                   f"got only {'--slow-factor' if slow_worker is None else '--slow-worker'}")
        cli.require("--slow-factor", 1.0 if slow_factor is None else slow_factor, low=1)
        if deterministic and threshold < 1:
            raise cli.SettingError("--deterministic hands portion i to worker i mod W and issues no backup tasks; "
                                   "leave out --backup-threshold")
        roles = Roles(size, servers, servers)    # the rank count alone; the parameters come below
        if portions < roles.workers:
            raise cli.SettingError(f"--portions {portions} is fewer than the {roles.workers} workers "
                                   f"(ranks {roles.worker_ranks[0]}..{size - 1}): some would never work")
        if backup_threshold is not None and backup_threshold < 1 and roles.workers == 1:
            raise cli.SettingError(f"--backup-threshold {backup_threshold} needs 2 or more workers (a backup copy goes "
                                   f"to another worker); {size} ranks with --servers {servers} leave 1")
        if slow_worker is not None and slow_worker not in roles.worker_ranks:
            raise cli.SettingError(f"--slow-worker must be a worker rank ({roles.worker_ranks[0]}..{size - 1}; "
                                   f"rank 0 coordinates and ranks 1..{servers} serve), got {slow_worker}")

    run = Run.start(comm, settings, check=check, writer=checkpoint.Writer("sandblaster_lbfgs"))
    with agreed(comm, catch=(cli.SettingError, ValueError)):   # every rank computes the same
        n = run.objective.n
        if portions > n:
            raise cli.SettingError(f"--portions {portions} is more than the {n} training examples")
        roles = Roles(size, servers, run.objective.params.size)

    options = dict(portions=portions, threshold=threshold, push_every=push_every, history=history, max_iter=max_iter,
                   max_backtracks=max_backtracks, tolerance_grad=tolerance_grad, tolerance_change=tolerance_change,
                   lr=settings.lr, deterministic=deterministic, slow_worker=slow_worker, slow_factor=slow_factor or 1.0)
    counting = CountingComm(comm)
    role = roles.role(rank)
    if role == "coordinator":
        traced = TracedComm(counting)
        coordinator = Coordinator(traced, roles, options, run.logger, sharded_direction)
        loop.play(comm, role, coordinator.train, settings.epochs)
        failure = None if coordinator.failure is None else divergence.Diverged(coordinator.failure)
        mine = dict(error=failure, messages=traced.messages, batch_seconds=coordinator.batch_seconds,
                    backups=coordinator.backups, discarded=coordinator.discarded, evaluations=coordinator.evaluations,
                    final=coordinator.final)
    elif role == "server":
        shard = Shard(counting, roles, rank - 1, run.objective.params, history)
        mine = dict(shard=loop.play(comm, role, shard.serve))
    else:
        rows = numpy.array_split(numpy.arange(run.objective.n), portions)
        mine = dict(computed=loop.play(comm, role, work, counting, roles, run.objective, options, rows))
    mine["bytes"] = counting.bytes_sent

    gathered, params = loop.collect(run, mine, roles.server_ranks)     # the shards' w, joined on every rank
    final = dict(gathered[0]["final"])           # the last epoch, with the test metrics of the joined parameters
    run.logger.epoch(epoch=final.pop("epoch"), train_loss=final.pop("train_loss"),
                     **evaluate_at(run.objective, params), **final)
    if report is not None:
        report.update(gathered[0], roles=roles, bytes=[part["bytes"] for part in gathered],
                      computed={rank: gathered[rank]["computed"] for rank in roles.worker_ranks})
    return loop.finish(run, params)


def default_problem(seed=0):
    """The convex problem of ``--problem least-squares``: 512 rows, 32 features, float64."""
    return least_squares(512, 32, numpy.random.default_rng(seed))


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], model=None, momentum=None, **DEFAULTS)   # model: mlp
    parser.set_defaults(batch_size=None, dataset=None)   # given, refused (--model, --dataset: with --problem)
    parser.add_argument("--servers", type=int, default=1, help="parameter-server shards (ranks 1 .. S)")
    parser.add_argument("--portions", type=int, default=32, help="pieces of each batch, handed out one at a time")
    parser.add_argument("--backup-threshold", type=float, default=None,
                        help="fraction of portions finished before backup copies go out (1: none; default 0.9)")
    parser.add_argument("--push-every", type=int, default=4, help="kept portions accumulated before a push")
    parser.add_argument("--history", type=int, default=10, help="(s, y) pairs kept on the shards")
    parser.add_argument("--max-iter", type=int, default=10, help="L-BFGS iterations per epoch")
    parser.add_argument("--slow-worker", type=int, default=None, help="rank of a worker that is made slow")
    parser.add_argument("--slow-factor", type=float, default=None, help="how many times slower it is (>= 1)")
    parser.add_argument("--deterministic", action="store_true",
                        help="portion i to worker i mod W, no backups: bit-for-bit reproducible")
    parser.add_argument("--problem", choices=["least-squares"], default=None,
                        help="train a synthetic convex problem instead of --model")
    args = parser.parse_args(argv)
    cli.run_main(train, args, servers=args.servers, portions=args.portions, backup_threshold=args.backup_threshold,
                 push_every=args.push_every, history=args.history, max_iter=args.max_iter,
                 slow_worker=args.slow_worker, slow_factor=args.slow_factor, deterministic=args.deterministic,
                 problem=default_problem(args.seed) if args.problem and args.seed >= 0 else None)   # else refused


if __name__ == "__main__":
    main()
