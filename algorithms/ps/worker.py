"""A parameter-server worker: its share of the data, its steps, and a simulated failure.

    replica = Replica(objective, servers, lr, n_fetch, n_push)      # what the algorithm's step works on
    mine = work(job, worker_step)                                    # this rank's epochs; how it ended

The job (``ps.job``) runs ``work`` on ranks S .. p-1; the algorithm's heart is ``worker_step``
(Downpour's ``downpour_step``, SSP's ``ssp_step``, asynchronous EASGD's ``async_easgd_step``), which
pushes and fetches through ``replica.servers`` (``ps.wire.ServerShards``).

Data: in each epoch the permutation ``minidl.data.epoch_order(n, seed, epoch)`` is cut into W
contiguous blocks (``minidl.data.shard``) and worker w trains on block w in batches of
``batch_size``. With one worker this is exactly serial SGD's order.

A simulated worker failure (``fail_worker`` rank R, ``fail_step`` K): at the start of its step K
worker R completes what it has already sent and then goes silent: no more pushes, no fetch,
no goodbye. The servers notice nothing but silence; after ``timeout`` seconds server 0 drops it
and the others train on. Why the process does not really die: MPICH (like MPI without the ULFM
fault-tolerance extension) aborts the whole job when one rank exits early, so a real crash would
take every rank down, not test the server. The "crashed" rank therefore sits silent until the
others finish and only then joins the final barrier, so that MPI can shut down and every rank
exits 0. From the servers' side it is indistinguishable from a hung or cut-off machine.
"""
import dataclasses
import math

from algorithms.core import divergence, run
from algorithms.ps import replica as ps_replica, wire
from minidl import backend, data as datasets
from minidl.data import epoch_order


def worker_batches(n, seed, epoch, worker, workers, batch_size):
    """Worker ``worker``'s batches in ``epoch``: block ``worker`` of the epoch's permutation."""
    mine = epoch_order(n, seed, epoch)[datasets.shard(n, worker, workers)]
    return [mine[batch] for batch in datasets.batches(len(mine), batch_size)]


def steps_per_epoch(n, batch_size, worker, workers):
    return math.ceil(len(datasets.shard(n, worker, workers)) / batch_size)


@dataclasses.dataclass
class Replica:
    """What a worker's step works on: its model copy, its handle on the servers, its accrued gradient."""
    objective: object                  # params, grad, loss_and_grad(rows)
    servers: wire.ServerShards
    lr: float
    n_fetch: int
    n_push: int
    accrued: object = None             # gradient summed since the last push
    accrued_steps: int = 0

    def __post_init__(self):
        self.accrued = backend.xp().zeros_like(self.objective.grad)


def work(job, worker_step, replica_comm=None, replica_gradient=None):
    """This rank's worker: train its share, then wait for every rank; returns how it ended.

    ``replica_comm``: the communicator of this rank's model-parallel replica (``ps.replica``), or None;
    ``replica_gradient``: the replica's forward and backward pass (see ``run_job``)."""
    dtype = backend.to_numpy(job.objective.params).dtype
    objective = job.objective
    if replica_comm is not None:                   # my pieces of the replica; my indices, to their shards
        objective = ps_replica.ReplicaPart(job.objective, replica_comm, replica_gradient)
        servers = wire.ServerShards(job.comm, job.layout, dtype, slices=ps_replica.slices(objective.owned,
                                                                                          job.layout.ranges))
    elif job.ps.hierarchical:                        # talk to the group server; index and count among the workers
        size, first = job.comm.Get_size(), job.ps.servers + job.ps.groups
        group = (job.comm.Get_rank() - first) // ((size - first) // job.ps.groups)
        whole = wire.Layout(size, 1, ((0, job.objective.params.size),))
        servers = wire.ServerShards(job.comm, whole, dtype, server_ranks=[job.ps.servers + group])
        job = dataclasses.replace(job, layout=wire.Layout(size, first, job.layout.ranges))
    else:
        servers = wire.ServerShards(job.comm, job.layout, dtype)
    replica = Replica(objective, servers, job.settings.lr, job.ps.n_fetch, job.ps.n_push)
    try:
        ending, error = train_share(job, replica, worker_step)
    except wire.WorkerDropped:
        ending, error = "dropped", None
    except wire.Stopped:
        ending, error = "stopped", None
    except Exception as failure:                 # noqa: BLE001 - the step raised: stop the job, raise everywhere
        ending, error = "stopped", failure
    if ending != "crashed":
        servers.goodbye(stop=None if error is None else str(error))
    run.wait_together(job.comm)
    return {"ending": ending, "error": error, "values": (servers.values_pushed, servers.values_fetched),
            "replica_bytes": objective.group.bytes_sent if replica_comm is not None else 0}


def train_share(job, replica, worker_step):
    """The worker's epochs; returns (ending, error): 'finished', 'crashed' (simulated) or 'stopped'."""
    s, rank, layout = job.settings, job.comm.Get_rank(), job.layout
    worker, n = layout.worker_of(rank), job.objective.n
    plan = [(epoch, worker_batches(n, s.seed, epoch, worker, layout.workers, s.batch_size))
            for epoch in range(job.first_epoch, s.epochs)]
    total = sum(len(batches) for _, batches in plan)
    step, first_loss = 0, None
    for epoch, batches in plan:
        loss_sum = 0.0
        for i, rows in enumerate(batches):
            if rank == job.ps.fail_worker and step == job.ps.fail_step:
                replica.servers.wait()           # what was sent arrives; then silence, no goodbye
                return "crashed", None
            if step == 0:
                replica.servers.fetch(replica.objective.params)       # w <- the servers' w_0
            loss = worker_step(replica, rows, i, end_of_epoch=i == len(batches) - 1, last_step=step == total - 1)
            if divergence.nonfinite(loss):       # the goodbye tells every server: the job stops
                return "stopped", divergence.loss_became(divergence.nonfinite(loss), f"step {step} on rank {rank}")
            first_loss = loss if first_loss is None else first_loss
            loss_sum += loss
            step += 1
        if rank == layout.rank_of(worker):     # one report per replica
            replica.servers.report_epoch(worker=worker, epoch=epoch, loss_sum=loss_sum, batches=len(batches),
                                         first_loss=first_loss)
    return "finished", None
