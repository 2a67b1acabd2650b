"""Running a parameter-server job: roles, the workers' epoch loop, a simulated failure, the end.

Downpour SGD (``downpour_sgd``) and stale-synchronous SGD (``ssp_sgd``) share everything here and
differ only in the worker's step (passed in as ``worker_step``) and the server's staleness bound:

    rank 0 .. S-1   ShardServer(...).serve()            (rank 0 also evaluates and logs each epoch)
    rank S .. p-1   for each step: worker_step(replica, x, y, ...)    pushes and fetches inside
    every rank      Ibarrier, then one allgather of the final shards (and the servers' logs)

Data: in each epoch the permutation ``serial_sgd.epoch_order(n, seed, epoch)`` is cut into W
contiguous blocks (``minidl.data.shard``) and worker w trains on block w in batches of
``batch_size``. With one worker this is exactly serial SGD's order.

Epochs: each worker pushes at the end of each of its epochs (a flush); a server snapshots its
shard once every live worker has pushed the end of epoch e, and rank 0 evaluates the assembled
snapshot. Asynchronous workers drift apart, so "epoch e" is the state after every worker's
epoch e, while the faster ones may already be into epoch e + 1.

A simulated worker failure (``fail_worker`` rank R, ``fail_step`` K): at the start of its step K
worker R completes what it has already sent and then goes silent: no more pushes, no fetch,
no goodbye. The servers notice nothing but silence; after ``timeout`` seconds each drops it and
the others train on. Why the process does not really die: MPICH (like MPI without the ULFM
fault-tolerance extension) aborts the whole job when one rank exits early, so a real crash would
take every rank down, not test the server. The "crashed" rank therefore sits silent until the
others finish and only then joins the final barrier, so that MPI can shut down and every rank
exits 0. From the servers' side it is indistinguishable from a hung or cut-off machine.
"""
import dataclasses
import math

import numpy
from mpi4py import MPI

from algorithms import common, parameter_server
from algorithms.parameter_server import ServerShards, ShardServer, WorkerDropped
from minidl.data import epoch_order
from minidl import backend, data as datasets
from minidl.flat import flatten
from minidl.optim import SGD, Adagrad


@dataclasses.dataclass
class Settings:
    """The parameter-server flags (the common ones are checked by ``common.check_common``)."""
    servers: int = 1
    n_fetch: int = 1
    n_push: int = 1
    staleness: int = None              # None: no bound (asynchronous)
    warm_start_steps: int = 0
    server_optimizer: str = "sgd"
    deterministic: bool = False
    fail_worker: int = None            # a rank
    fail_step: int = None
    timeout: float = 10.0              # seconds of silence before a server drops a worker


def check_settings(size, n_params, n_train, batch_size, first_epoch, epochs, settings):
    """The Layout, or a ValueError: deterministic from the arguments, so every rank raises alike."""
    s = settings
    layout = parameter_server.Layout.make(size, s.servers, n_params)
    for name, value in (("--n-fetch", s.n_fetch), ("--n-push", s.n_push)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if s.staleness is not None and (not isinstance(s.staleness, int) or s.staleness < 0):
        raise ValueError(f"--staleness must be an integer >= 0 (or 'inf'), got {s.staleness!r}")
    if not isinstance(s.warm_start_steps, int) or s.warm_start_steps < 0:
        raise ValueError(f"--warm-start-steps must be an integer >= 0, got {s.warm_start_steps!r}")
    if s.server_optimizer not in ("sgd", "adagrad"):
        raise ValueError(f"--server-optimizer must be 'sgd' or 'adagrad', got {s.server_optimizer!r}")
    if s.timeout is not None and not (isinstance(s.timeout, (int, float)) and math.isfinite(s.timeout)
                                      and s.timeout > 0):
        raise ValueError(f"--timeout must be a number of seconds > 0, got {s.timeout!r}")
    if n_train < layout.workers:
        raise ValueError(f"{n_train} training examples cannot feed {layout.workers} workers")
    if (s.fail_worker is None) != (s.fail_step is None):
        raise ValueError("--fail-worker and --fail-step go together")
    if s.fail_worker is not None:
        if s.fail_worker not in layout.worker_ranks:
            raise ValueError(f"--fail-worker must be a worker rank ({layout.servers}..{size - 1}), "
                             f"got {s.fail_worker}")
        steps = worker_steps(n_train, batch_size, s.fail_worker - layout.servers, layout.workers,
                             epochs - first_epoch)
        if not isinstance(s.fail_step, int) or not 0 <= s.fail_step < steps:
            raise ValueError(f"--fail-step must lie in [0, {steps}) (rank {s.fail_worker}'s steps), "
                             f"got {s.fail_step!r}")
        if s.deterministic:
            raise ValueError("--deterministic cannot be combined with --fail-worker: "
                             "a failure is detected by a timeout, which no schedule can fix")
        if s.timeout is None:
            raise ValueError("--fail-worker needs a --timeout: without one the servers wait forever")
    return layout


def worker_batches(n, seed, epoch, worker, workers, batch_size):
    """Worker ``worker``'s batches in ``epoch``: block ``worker`` of the epoch's permutation."""
    mine = epoch_order(n, seed, epoch)[datasets.shard(n, worker, workers)]
    return [mine[batch] for batch in datasets.batches(len(mine), batch_size)]


def worker_steps(n, batch_size, worker, workers, epochs):
    """How many steps worker ``worker`` takes in ``epochs`` epochs."""
    return epochs * math.ceil(len(datasets.shard(n, worker, workers)) / batch_size)


@dataclasses.dataclass
class Replica:
    """What a worker's step works on: its model copy, its server handle and its accrued gradient."""
    net: object
    flat: object
    servers: ServerShards
    lr: float
    n_fetch: int
    n_push: int
    accrued: object = None             # gradient summed since the last push
    accrued_steps: int = 0
    loss_sum: float = 0.0              # training loss since the last push (for the log)
    batches: int = 0

    def __post_init__(self):
        self.accrued = backend.xp().zeros_like(self.flat.grad)


def run_worker(comm, layout, replica, data, seed, batch_size, first_epoch, epochs, settings, worker_step):
    """Train this worker's share; returns 'finished', 'crashed' (simulated) or 'dropped'."""
    worker = comm.rank - layout.servers
    plan = [(epoch, worker_batches(len(data.x_train), seed, epoch, worker, layout.workers, batch_size))
            for epoch in range(first_epoch, epochs)]
    total = sum(len(batches) for _, batches in plan)
    step = 0
    try:
        for epoch, batches in plan:
            for i, index in enumerate(batches):
                if comm.rank == settings.fail_worker and step == settings.fail_step:
                    replica.servers.wait()       # what was sent arrives; then silence, no goodbye
                    return "crashed"
                if step == 0:
                    replica.servers.fetch(replica.flat.data)        # w <- the servers' initial w
                loss = worker_step(replica, data.x_train[index], data.y_train[index], step, epoch,
                                   end_of_epoch=i == len(batches) - 1, last_step=step == total - 1)
                common.check_finite(loss, step, comm.rank)
                step += 1
        replica.servers.goodbye()
        return "finished"
    except WorkerDropped:
        replica.servers.goodbye()
        return "dropped"


def whole_optimizer(name, flat, lr, momentum):
    """The server optimizer over the whole vector: for --save / --resume files."""
    if name == "adagrad":
        return Adagrad([flat.as_parameter()], lr=lr)
    return SGD([flat.as_parameter()], lr=lr, momentum=momentum)


def shard_state(state, start, stop):
    """An optimizer state_dict for the whole vector, cut down to one server's range."""
    return {key: (value if key == "steps" else value[start:stop]) for key, value in state.items()}


def run(comm, worker_step, settings, name="parameter server", dataset="digits", model="cnn", epochs=10,
        lr=0.05, momentum=0.0, batch_size=32, seed=0, log=None, save=None, resume=None, quiet=False,
        data=None, data_dir=None, report=None):
    """Run one parameter-server job on ``comm``; returns (final flat parameters, per-epoch history).

    ``report``, if a dict, is filled on every rank with the servers' logs (``logs[k]``: server k's
    list of ("push", Update) / ("fetch", worker, version) events in the order it handled them),
    the lost workers, the layout, and what each worker rank ended as.
    """
    comm = comm if comm is not None else MPI.COMM_WORLD
    common.check_common(epochs, lr, batch_size, momentum)
    if settings.server_optimizer == "adagrad" and momentum:
        raise ValueError("--momentum applies to --server-optimizer sgd only")
    net = common.build_model(model, seed, dataset)
    flat = flatten(net)
    data = data or common.load_data(dataset, seed, data_dir)
    optimizer = whole_optimizer(settings.server_optimizer, flat, lr, momentum)
    first_epoch = common.load_checkpoint(resume, flat, optimizer) if resume else 0
    layout = check_settings(comm.size, flat.size, len(data.x_train), batch_size, first_epoch, epochs, settings)
    logger = common.Log(log, rank=comm.rank, quiet=quiet, name=name)

    parameter_server.wait_together(comm)            # start together: the silence timers start now
    if layout.is_server(comm.rank):
        def on_epoch(epoch, params, train_loss, staleness, clock_staleness):     # rank 0 only
            flat.data[...] = backend.asarray(params)
            test_loss, accuracy = common.evaluate(net, data.x_test, data.y_test)
            logger.epoch(epoch=epoch + 1, train_loss=train_loss, test_loss=test_loss, test_accuracy=accuracy,
                         updates=int(staleness.size),
                         staleness_mean=float(staleness.mean()) if staleness.size else 0.0,
                         staleness_max=int(staleness.max()) if staleness.size else 0,
                         clock_staleness_max=int(clock_staleness.max()) if clock_staleness.size else 0)

        start, stop = layout.ranges[comm.rank]
        state = shard_state(optimizer.state_dict(), start, stop) if resume else None
        server = ShardServer(comm, layout, flat.data, settings.server_optimizer, lr, momentum,
                             settings.staleness, settings.warm_start_steps,
                             schedule_seed=seed if settings.deterministic else None,
                             timeout=None if settings.deterministic else settings.timeout,
                             first_epoch=first_epoch, epochs=epochs, optimizer_state=state,
                             on_epoch=on_epoch if comm.rank == 0 else None)
        server.serve()
        mine = {"shard": backend.to_numpy(server.param.data), "state": server.optimizer.state_dict(),
                "log": server.log, "dropped": server.dropped}
        ending = "server"
    else:
        replica = Replica(net, flat, ServerShards(comm, layout, backend.to_numpy(flat.data).dtype), lr,
                          settings.n_fetch, settings.n_push)
        ending = run_worker(comm, layout, replica, data, seed, batch_size, first_epoch, epochs, settings,
                            worker_step)
        parameter_server.wait_together(comm)
        mine = None

    # the end: every rank gets the final parameters, the logs and the history
    gathered = comm.allgather(mine)
    endings = comm.allgather(ending)
    servers = gathered[:layout.servers]
    params = numpy.concatenate([part["shard"] for part in servers])
    history = comm.bcast(logger.history, root=0)
    lost = sorted((worker + layout.servers, steps, silent) for worker, (steps, silent) in servers[0]["dropped"].items())
    if comm.rank == 0:
        updates = [event[1] for event in servers[0]["log"] if event[0] == "push"]
        staleness = numpy.array([update.staleness for update in updates], dtype=numpy.int64)
        if not quiet:
            print(f"{name}: {len(updates)} updates applied per server; staleness mean "
                  f"{staleness.mean() if staleness.size else 0:.2f}, max {staleness.max() if staleness.size else 0}",
                  flush=True)
            for rank, steps, silent in lost:
                print(f"lost worker: rank {rank} after {steps} applied steps "
                      f"(silent for {silent} s > timeout {settings.timeout} s)", flush=True)
            if lost:
                print(f"{layout.workers - len(lost)} of {layout.workers} workers finished the training", flush=True)
        if save:
            state = {"steps": servers[0]["state"]["steps"]}
            for key in servers[0]["state"]:
                if key != "steps":
                    state[key] = numpy.concatenate([part["state"][key] for part in servers])
            flat.data[...] = backend.asarray(params)
            whole = whole_optimizer(settings.server_optimizer, flat, lr, momentum)
            whole.load_state_dict(state)
            common.save_checkpoint(save, flat.data, whole, epochs)
    logger.close()
    if report is not None:
        report.update(logs=[part["log"] for part in servers], lost=lost, layout=layout,
                      endings={rank: ending for rank, ending in enumerate(endings) if ending != "server"})
    return params, history
