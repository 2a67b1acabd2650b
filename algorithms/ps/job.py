"""Running a parameter-server job: start, serve or work, end (rank 0's per-epoch log: ``ps.log``).

Downpour SGD (``downpour_sgd``) and stale-synchronous SGD (``ssp_sgd``) share everything here and
differ only in the worker's step (``worker_step``) and the servers' staleness bound:

    start     every rank, before any message: check every setting, build the model and data, read
              --resume, open --log, check --save; then one allgather: every rank goes on, or every
              rank stops with the same ``error: ...`` (the contract of ``algorithms.core.cli``)
    serve     ranks 0 .. S-1: ShardServer(...).serve(), with the epoch log (``EpochLog``) beside it
    work      ranks S .. p-1: for each step: worker_step(replica, rows, ...)  (``ps.worker``; pushes
              and fetches inside)
    relay     ranks S .. S+G-1 of a hierarchical server: a group server (``ps.relay``)
    end       every rank: one allgather of the shards, the servers' logs and any error (``ps.loop``,
              the job loop Sandblaster shares); then either
              the same error on every rank, or rank 0 prints the summary and writes --save

Data: worker w trains on block w of each epoch's permutation (``ps.worker.worker_batches``).

Epochs: a worker pushes at the end of each of its epochs (Downpour's flush); rank 0 logs epoch e
once every server has snapshotted its shard after the last live worker's epoch-e push
(``ps.log.EpochLog``, which watches the servers and has its own messages).

Errors: a worker whose loss is not finite stops the job (its goodbye carries the reason to every
server, which then answers every worker's next fetch with STOP); rank 0 stops it the same way
when an epoch's mean training loss is more than 100x the loss at the start
(``divergence.check_divergence``; the start is the mean loss of the workers' first steps). Losing every
worker is an error too. Every rank then raises the same error in ``end``: exit 2 everywhere.

A hierarchical server (``groups`` G): ranks S .. S+G-1 are group servers between the workers and
the root shards (``ps.relay``).

Model-parallel replicas (``replica_size`` k > 1, ``ps.replica``): the worker ranks form replicas
of k consecutive ranks, each with its own communicator (one ``comm.Split`` by every rank in
``run_job``). A replica trains on its share of the data as one worker does; each of its ranks runs
the worker's step on its own pieces and pushes and fetches only its own parameters; its first
rank reports the epochs. The servers count a replica as one worker (``Layout.worker_of``).

A simulated worker failure (``fail_worker`` rank R, ``fail_step`` K): ``ps.worker`` explains it.
"""
import dataclasses
import math

import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli, divergence, objective as objectives, partition, run
from algorithms.core.cli import SettingError
from algorithms.core.log import Log
from algorithms.ps import loop, replica as ps_replica, server as parameter_server, wire
from algorithms.ps.log import EpochLog
from algorithms.ps.loop import JobFailed
from algorithms.ps.relay import relay
from algorithms.ps.worker import steps_per_epoch, work
from minidl import backend

DEFAULT_TIMEOUT = 10.0


@dataclasses.dataclass
class Settings:
    """The parameter-server flags (the shared ones are ``run.Settings``)."""
    servers: int = 1
    n_fetch: int = 1
    n_push: int = 1
    staleness: int = None              # None: no bound (asynchronous)
    warm_start_steps: int = 0
    server_optimizer: str = "sgd"
    deterministic: bool = False
    fail_worker: int = None            # a rank
    fail_step: int = None
    timeout: float = 10.0              # seconds of silence before server 0 drops a worker (DEFAULT_TIMEOUT)
    groups: int = None                 # a hierarchical server with this many group servers; None: flat
    replica_size: int = 1              # ranks per worker: a model-parallel replica (ps.replica) when > 1

    @property
    def hierarchical(self):
        return self.groups is not None

    def check(self, momentum):
        """The flags by themselves: every rank raises alike, before any data is read."""
        cli.require("--n-fetch", self.n_fetch, integer=True, low=1)
        cli.require("--n-push", self.n_push, integer=True, low=1)
        if self.staleness is not None:
            cli.require("--staleness", self.staleness, integer=True, low=0)
        cli.require("--warm-start-steps", self.warm_start_steps, integer=True, low=0)
        if self.staleness is not None and self.warm_start_steps:
            raise SettingError("a warm start cannot be combined with a staleness bound: "
                               "the waiting workers' clocks would hold the first worker back")
        if self.server_optimizer not in ("sgd", "adagrad"):
            raise SettingError(f"--server-optimizer must be 'sgd' or 'adagrad', got {self.server_optimizer!r}")
        if self.server_optimizer == "adagrad" and momentum:
            raise SettingError("--momentum applies to --server-optimizer sgd only")
        if self.timeout is not None:
            cli.require("--timeout", self.timeout, low=0, low_open=True)
        if (self.deterministic or self.hierarchical) and self.timeout not in (None, DEFAULT_TIMEOUT):
            raise SettingError(f"--timeout {self.timeout}: a --deterministic or --groups run never drops a silent "
                               f"worker, so it has no timeout")
        if (self.fail_worker is None) != (self.fail_step is None):
            raise SettingError("--fail-worker and --fail-step go together")
        if self.fail_worker is not None and self.deterministic:
            raise SettingError("--deterministic cannot be combined with --fail-worker: "
                               "a failure is detected by a timeout, which no schedule can fix")
        if self.fail_worker is not None and self.timeout is None:
            raise SettingError("--fail-worker needs a --timeout: without one the servers wait forever")
        cli.require("--replica-size", self.replica_size, integer=True, low=1)
        if self.replica_size > 1 and (self.hierarchical or self.fail_worker is not None):
            raise SettingError("--replica-size > 1 cannot be combined with --groups or --fail-worker: "
                               "a group server and a failure both see one rank per worker")
        if self.hierarchical:
            cli.require("--groups", self.groups, integer=True, low=1)
            if self.n_fetch != 1 or self.n_push != 1:
                raise SettingError("--groups needs --n-fetch 1 and --n-push 1: a group server sums one step of "
                                   "each of its workers per round")
            if self.staleness is not None or self.warm_start_steps or self.fail_worker is not None:
                raise SettingError("--groups cannot be combined with --staleness, --warm-start-steps or "
                                   "--fail-worker: the root sees group servers, not workers")

    def check_layout(self, layout, n_train, batch_size, epochs):
        """What depends on the ranks and the data (``epochs``: those this run trains)."""
        if n_train < layout.workers:
            raise SettingError(f"{n_train} training examples cannot feed {layout.workers} workers")
        steps = steps_per_epoch(n_train, batch_size, 0, layout.workers)
        if self.deterministic and self.warm_start_steps > steps:
            raise SettingError(f"--warm-start-steps {self.warm_start_steps} is more than worker 0's {steps} steps in "
                               "an epoch: with --deterministic an epoch's end is a barrier for every worker")
        if self.fail_worker is not None:
            if self.fail_worker not in layout.worker_ranks:
                raise SettingError(f"--fail-worker must be a worker rank ({layout.servers}..{layout.size - 1}), "
                                   f"got {self.fail_worker}")
            steps = epochs * steps_per_epoch(n_train, batch_size, self.fail_worker - layout.servers, layout.workers)
            if not isinstance(self.fail_step, int) or not 0 <= self.fail_step < steps:
                raise SettingError(f"--fail-step must lie in [0, {steps}) (rank {self.fail_worker}'s steps), "
                                   f"got {self.fail_step!r}")


def epoch_ends(job):
    """{(worker, epoch): that worker's clock (pushes) at the end of the epoch}: known in advance,
    because a worker pushes every n_push steps and at each epoch's end. With groups the root's
    workers are the group servers, one push per round: the round of their slowest worker's last step."""
    ends = {}
    if job.ps.hierarchical:
        workers = job.comm.Get_size() - job.ps.servers - job.ps.groups
        size = workers // job.ps.groups
        for g in range(job.ps.groups):
            steps = [steps_per_epoch(job.objective.n, job.settings.batch_size, w, workers)
                     for w in range(g * size, (g + 1) * size)]
            for epoch in range(job.first_epoch, job.settings.epochs):
                ends[g, epoch] = (epoch - job.first_epoch + 1) * max(steps)
        return ends
    for w in range(job.layout.workers):
        steps = steps_per_epoch(job.objective.n, job.settings.batch_size, w, job.layout.workers)
        for epoch in range(job.first_epoch, job.settings.epochs):
            ends[w, epoch] = (epoch - job.first_epoch + 1) * math.ceil(steps / job.ps.n_push)
    return ends


@dataclasses.dataclass
class Job:
    """What ``start`` set up on this rank."""
    comm: object
    settings: run.Settings
    ps: Settings
    layout: wire.Layout
    objective: object                  # this rank's model and data (objective.build)
    optimizer: object                  # the server optimizer over the whole vector: --resume, --save
    first_epoch: int
    logger: Log
    meta: dict = None                  # what --save records (checkpoint.Writer.meta)


def start(comm, settings, ps, writer):
    """The agreed set-up: every setting checked on every rank before any message; returns a Job.
    ``writer``: the ``checkpoint.Writer`` of the algorithm (what --save records, --resume compares)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    job = None
    with run.agreed(comm):
        settings.check()
        ps.check(settings.momentum)
        if rank == 0:
            checkpoint.check_save(settings.save)
        meta = writer.meta(settings, size)
        objective = objectives.build(settings.model, settings.dataset, settings.seed, settings.data,
                                     settings.data_dir, settings.problem)
        if ps.replica_size > 1:                    # the model's widths: model parallelism's own check
            partition.check(dataclasses.replace(settings, save=None, resume=None), ps.replica_size,
                            ps_replica.SPLIT)
        if ps.hierarchical:                        # the root's view: the G group servers are its workers
            workers = size - ps.servers - ps.groups
            if workers < ps.groups or workers % ps.groups:
                raise SettingError(f"--groups {ps.groups} must divide the {max(workers, 0)} workers "
                                   f"({size} ranks - {ps.servers} server(s) - {ps.groups} group servers) into "
                                   f"groups of at least one")
            if objective.n < workers:
                raise SettingError(f"{objective.n} training examples cannot feed {workers} workers")
            layout = wire.Layout.make(ps.servers + ps.groups, ps.servers, objective.params.size)
        else:
            layout = wire.Layout.make(size, ps.servers, objective.params.size, ps.replica_size)
        optimizer = parameter_server.server_optimizer(ps.server_optimizer, objective.flat.as_parameter(),
                                                      settings.lr, settings.momentum)
        resumed = checkpoint.resume(settings, objective, optimizer, rank, size, meta) if settings.resume else {}
        first_epoch = int(resumed.get("epoch", 0))
        ps.check_layout(layout, objective.n, settings.batch_size, settings.epochs - first_epoch)
        logger = Log(settings.log, rank=rank, quiet=settings.quiet)
        job = Job(comm, settings, ps, layout, objective, optimizer, first_epoch, logger, meta)
    return job


# ---- serve: ranks 0 .. S-1 --------------------------------------------------------------------------

def serve(job):
    """This rank's server, with the epoch log beside it; returns its part of the result."""
    s, ps, layout = job.settings, job.ps, job.layout
    start, stop = layout.ranges[job.comm.Get_rank()]
    state = job.optimizer.state_dict() if s.resume else None
    if state is not None:                        # the whole vector's state, cut to this server's range
        state = {key: (value if key == "steps" else value[start:stop]) for key, value in state.items()}
    epoch_log = EpochLog(job, epoch_ends(job))
    if ps.hierarchical:                            # the epoch reports come from the workers, not the group servers
        epoch_log.reporters = range(job.comm.Get_size() - ps.servers - ps.groups)
    replica_indices = None
    if ps.replica_size > 1:                        # who owns what in every replica (ps.replica)
        replica_indices = [ps_replica.owned_indices(job.objective, ps.replica_size, j) for j in range(ps.replica_size)]
    warm_start_steps = ps.warm_start_steps if job.first_epoch == 0 else 0     # the run's start, not a resumed one's
    server = parameter_server.ShardServer(
        job.comm, layout, job.objective.params, ps.server_optimizer, s.lr, s.momentum, ps.staleness,
        warm_start_steps, schedule_seed=s.seed if ps.deterministic else None,
        timeout=None if ps.deterministic or ps.hierarchical else ps.timeout, optimizer_state=state,
        watch=epoch_log.watch, replica_indices=replica_indices, epoch_ends=epoch_log.ends)
    server.serve()
    epoch_log.finish(server)
    error = None
    if server.failure is not None:               # the algorithm raised: every rank raises it (end)
        error = server.failure
    elif server.stopping is not None:
        error = divergence.Diverged(server.stopping)
    elif server.index == 0 and not server.finished:
        silent = ", ".join(f"rank {layout.rank_of(w)} after {steps} steps" for w, (steps, _) in server.dropped.items())
        error = JobFailed(f"every worker was lost ({silent}, each silent for more than --timeout {ps.timeout} s); "
                          "no worker finished, so there is no result")
    return {"shard": backend.to_numpy(server.param.data), "state": server.optimizer.state_dict(),
            "log": server.log, "dropped": server.dropped, "error": error}


# ---- end: every rank -----------------------------------------------------------------------------

def end(job, mine, name, report=None):
    """The end on every rank (``ps.loop``): the same error everywhere, or (final parameters, per-epoch
    history), after rank 0's summary of the updates and the lost workers."""
    comm, layout, s = job.comm, job.layout, job.settings
    gathered, params = loop.collect(job, mine, range(layout.servers))
    servers = gathered[:layout.servers]
    lost = sorted((layout.rank_of(w), steps, silent) for w, (steps, silent) in servers[0]["dropped"].items())
    if comm.Get_rank() == 0 and not s.quiet:
        staleness = numpy.array([e[1].staleness for e in servers[0]["log"] if e[0] == "push"], dtype=numpy.int64)
        print(f"{name}: {staleness.size} updates applied per server; staleness mean "
              f"{staleness.mean() if staleness.size else 0:.2f}, max {staleness.max() if staleness.size else 0}",
              flush=True)
        for rank, steps, silent in lost:
            print(f"lost worker: rank {rank} after {steps} applied steps "
                  f"(silent for {silent} s > timeout {job.ps.timeout} s)", flush=True)
        if lost:
            print(f"{layout.workers - len(lost)} of {layout.workers} workers finished the training", flush=True)
    if report is not None:
        report.update(logs=[part["log"] for part in servers], lost=lost, layout=layout,
                      endings={rank: part["ending"] for rank, part in enumerate(gathered) if "ending" in part},
                      values={rank: part["values"] for rank, part in enumerate(gathered) if "values" in part},
                      replica_bytes={rank: part["replica_bytes"] for rank, part in enumerate(gathered)
                                     if "replica_bytes" in part})
    return loop.finish(job, params, [part["state"] for part in servers])


def run_job(comm, worker_step, settings, ps, name, writer, report=None, replica_gradient=None):
    """One parameter-server job on ``comm``; returns (final flat parameters, per-epoch history) on every rank.

    ``report``, if a dict, is filled on every rank with the servers' logs (``logs[k]``: server k's
    events in the order it handled them, see ``ShardServer``), the lost workers, the layout, what
    each worker rank ended as, and per worker rank the values it pushed and fetched (``values``) and
    the bytes it sent inside its model-parallel replica (``replica_bytes``). ``writer``: the
    algorithm's ``checkpoint.Writer``. ``replica_gradient``: with ``ps.replica_size`` > 1, the
    forward and backward pass of a model-parallel replica, ``(comm, pieces, x, labels, split) -> mean
    loss`` (Downpour hands in ``model_parallel.model_parallel_gradient``: the machinery here imports
    no algorithm module).
    """
    if ps.replica_size > 1 and replica_gradient is None:
        raise ValueError("a job of model-parallel replicas (replica_size > 1) needs their replica_gradient")
    comm = comm if comm is not None else MPI.COMM_WORLD
    job = start(comm, settings, ps, writer)
    replica_comm = None
    if ps.replica_size > 1:                        # every rank splits; the workers into replicas of k
        rank, layout = comm.Get_rank(), job.layout
        worker = layout.worker_of(rank) if not layout.is_server(rank) else None
        replica_comm = comm.Split(color=MPI.UNDEFINED if worker is None else worker,
                                  key=0 if worker is None else rank - layout.rank_of(worker))
    rank = comm.Get_rank()
    if job.layout.is_server(rank):
        mine = loop.play(comm, "server", serve, job)
    elif ps.hierarchical and rank < job.layout.size:
        mine = loop.play(comm, "group server", relay, job)
    else:
        mine = loop.play(comm, "worker", work, job, worker_step, replica_comm, replica_gradient)
    if replica_comm is not None and replica_comm != MPI.COMM_NULL:
        replica_comm.Free()
    return end(job, mine, name, report)
