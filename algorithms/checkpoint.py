"""Checkpoints: ``--save`` writes one .npz (plain arrays, no pickle), ``--resume`` continues from it.

    params              the model the log evaluated (the centre, the consensus, the mean ...)
    epoch               epochs done (one integer)
    ranks               how many ranks wrote it
    optimizer.<key>     rank 0's optimizer state (``minidl.optim`` state_dict)
    rank.<name>         (decentralized algorithms) every rank's own value, one row per rank:
                        rank.params, rank.optimizer.<key>, and the algorithm's kept state

With ``rank.*`` rows, ``--resume`` on as many ranks gives each rank its own row back, so the run
continues bit for bit; the step counter is not stored because every epoch has the same number of
steps. A file that is missing, truncated, not an .npz, or holds the wrong entries is refused with
a message that names it (SettingError), before any training.
"""
import numpy

from algorithms import cli
from algorithms.cli import SettingError
from minidl import backend
from minidl.nn import read_npz


def save_checkpoint(path, params, optimizer, epoch, **extra):
    """params (flat vector), optimizer state, epoch and ``extra`` arrays in one .npz (no pickle)."""
    arrays = {"params": backend.to_numpy(params), "epoch": numpy.asarray(epoch, dtype=numpy.int64)}
    arrays.update({"optimizer." + key: value for key, value in optimizer.state_dict().items()})
    arrays.update({key: backend.to_numpy(value) for key, value in extra.items()})
    try:
        numpy.savez(path, **arrays)
    except OSError as error:
        raise SettingError(f"--save {path}: cannot be written ({error.strerror})") from None


def read_checkpoint(path, n_params):
    """The arrays of a --save file, checked: ``params`` of ``n_params`` values and an integer ``epoch``."""
    cli.check_input("--resume", path)
    try:
        arrays = read_npz(path)                 # truncated, random bytes, pickled: one message
    except ValueError as error:
        raise SettingError(f"--resume {error}") from None
    for key in ("params", "epoch", "optimizer.steps"):
        if key not in arrays:
            raise SettingError(f"--resume {path}: has no '{key}' (was it written by --save?)")
    epoch = arrays["epoch"]
    if epoch.shape != () or not numpy.issubdtype(epoch.dtype, numpy.integer) or epoch < 0:
        raise SettingError(f"--resume {path}: 'epoch' must be one integer >= 0, got shape {epoch.shape} "
                           f"dtype {epoch.dtype}")
    if arrays["params"].shape != (n_params,):
        raise SettingError(f"--resume {path}: 'params' has shape {arrays['params'].shape}, the model has "
                           f"{n_params} parameters (another --model?)")
    return arrays


def load_optimizer(path, optimizer, arrays, prefix="optimizer."):
    state = {key[len(prefix):]: value for key, value in arrays.items() if key.startswith(prefix)}
    try:
        optimizer.load_state_dict(state)
    except ValueError as error:
        raise SettingError(f"--resume {path}: optimizer state does not fit this optimizer ({error})") from None


def write(comm, path, params, optimizer, epoch, own=None):
    """--save on rank 0 (a collective): ``params``, rank 0's optimizer state, and with ``own`` (this
    rank's {name: vector}) every rank's own values and optimizer state as ``rank.<name>`` rows.
    Returns once the file is written, on every rank."""
    rank, extra = comm.Get_rank(), {}
    if own is not None:
        own = {**own, **{"optimizer." + key: value for key, value in optimizer.state_dict().items()}}
        for key, value in own.items():
            rows = comm.gather(backend.to_numpy(value), root=0)
            if rank == 0:
                extra["rank." + key] = numpy.stack(rows)
    if rank == 0:
        save_checkpoint(path, params, optimizer, epoch, ranks=comm.Get_size(), **extra)
    comm.Barrier()


def resume(settings, objective, optimizer, rank, size):
    """Load --resume into this rank's objective and optimizer; returns the checkpoint's arrays."""
    path = settings.resume
    arrays = read_checkpoint(path, objective.params.size)
    if int(arrays["epoch"]) > settings.epochs:
        raise SettingError(f"--resume {path}: has already trained {int(arrays['epoch'])} epochs, more than "
                           f"--epochs {settings.epochs}; ask for more epochs")
    per_rank = any(key.startswith("rank.") for key in arrays)
    if per_rank:
        ranks = int(arrays.get("ranks", len(arrays["rank.params"])))
        if ranks != size:
            raise SettingError(f"--resume {path}: was written by {ranks} ranks, each with its own state; "
                               f"resume it with mpiexec -n {ranks}")
        # this rank's row replaces the shared entries: its own params, optimizer state, kept state
        arrays = {**arrays, **{key[len("rank."):]: value[rank] for key, value in arrays.items()
                               if key.startswith("rank.")}}
    objective.params[...] = backend.asarray(arrays["params"], dtype=objective.params.dtype)
    load_optimizer(path, optimizer, arrays)
    return arrays
