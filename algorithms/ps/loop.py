"""The asynchronous family's job loop, written once: every rank plays its role, then all end together.

Downpour SGD, stale-synchronous SGD and asynchronous EASGD (through ``ps.job.run_job``), the
hierarchical server, and Sandblaster L-BFGS each run as one MPI job of roles (shards, workers,
group servers, a coordinator) that talk by point-to-point messages until a stop, with no
collective in between. How such a job ends is the same for all of them, and is written here:

    mine = play(comm, role, action, *args)        # this rank's role; what it returns is its part
    gathered, params = collect(job, mine, shards)  # one allgather: the same error on every rank, or
                                                  # every part, the shards' slices joined, the log's
                                                  # history on every rank
    ...                                           # the algorithm's own words (a summary, a report)
    return finish(job, params, states)            # --save (rank 0 writes), the log closed

Failure handling, in two layers:
- An error the algorithm knows how to announce (a worker's non-finite loss, a diverged epoch,
  every worker lost, an exception inside the server's update rule) stops the job by the
  algorithm's own messages, and the role puts it in its part as ``"error"``. ``collect`` raises
  it on every rank, a raised exception before a ``Diverged`` or a lost job (the lowest rank's
  first: server 0 heard the first reason), so ``cli.run_main`` prints the same ``error: ...``
  everywhere and exits 2.
- An exception that escapes a role (a bug, a course task's stub) cannot be announced: the other
  ranks wait for messages this rank will never send. ``play`` prints ``error: ...`` naming the
  role and the rank, and aborts the whole job (exit status 2). With one rank it just raises.
"""
import numpy

from algorithms.core import checkpoint, cli, divergence


class JobFailed(RuntimeError):
    """The job ended without a result (every worker was lost); every rank raises it together."""
    every_rank = True


def play(comm, role, action, *args):
    """``action(*args)``, this rank's ``role`` ("worker", "server", ...); an exception that escapes
    it stops the whole job (``cli.abort_job``) instead of leaving the others waiting."""
    try:
        return action(*args)
    except Exception as error:                   # noqa: BLE001 - the other roles wait for this rank
        if comm.Get_size() == 1:
            raise
        cli.abort_job(comm, f"{error} ({type(error).__name__} in the {role} on rank {comm.Get_rank()})")


def collect(job, mine, shards):
    """The end on every rank: (every rank's part, the joined parameters), or the same error everywhere.

    ``mine``: this rank's part, a dict with ``"error"`` (None or the exception to raise) and, on the
    ranks in ``shards`` (in the order of the vector), ``"shard"``: that slice of the parameters.
    """
    gathered = job.comm.allgather(mine)
    errors = [part["error"] for part in gathered if part.get("error") is not None]
    errors.sort(key=lambda error: isinstance(error, (divergence.Diverged, JobFailed)))   # a raised exception first
    if errors:
        job.logger.close()
        raise errors[0]
    params = numpy.concatenate([gathered[rank]["shard"] for rank in shards])
    job.logger.history = job.comm.bcast(job.logger.history, root=0)
    return gathered, params


def finish(job, params, states=None):
    """--save (rank 0 writes; ``states``: the shards' optimizer states, joined into the whole
    vector's first), the log closed; returns (params, per-epoch history) on every rank."""
    if job.settings.save:
        if states:
            state = {"steps": states[0]["steps"]}
            for key in states[0]:
                if key != "steps":
                    state[key] = numpy.concatenate([part[key] for part in states])
            job.optimizer.load_state_dict(state)
        checkpoint.write(job.comm, job.settings.save, params, job.optimizer, job.settings.epochs, meta=job.meta)
    job.logger.close()
    return params, job.logger.history
