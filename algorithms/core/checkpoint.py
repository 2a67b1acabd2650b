"""Checkpoints: ``--save`` writes one .npz (plain arrays, no pickle), ``--resume`` continues from it.

    meta                what wrote it, as JSON text: the algorithm, its family, the model, the dataset
                        and the seed of its train/test split, the layout (ranks, stages, shards ...)
                        and the flags that shape the saved state
    params              the serial model's flat parameters (the centre, the consensus, the mean ...)
    epoch               epochs done (one integer)
    ranks               how many ranks wrote it
    optimizer.<key>     the optimizer state in the serial model's flat order (``minidl.optim``)
    rank.<name>         (decentralized algorithms) every rank's own value, one row per rank:
                        rank.params, rank.optimizer.<key>, and the algorithm's kept state

A checkpoint is layout-free: whatever split of the model wrote it (pipeline stages, model pieces,
server shards), ``params`` and ``optimizer.*`` are in the order of the serial model, so a file of
one *family* resumes in any algorithm of that family on any number of ranks. The family
``sgd`` is one model and one SGD state, the same on every rank (serial, allreduce, pipeline,
model-parallel, hybrid and tensor-parallel SGD, and ZeRO's sharded state, gathered); every other algorithm is a
family of its own, because what it keeps
(a centre, residuals, a server's Adagrad sums) means nothing to another. ``python -m
algorithms.core.evaluate FILE`` evaluates any checkpoint serially.

``--resume`` refuses, naming both sides, a file of another family, model or dataset, or whose
state-shaping flags differ (``--compressor topk`` in the file, ``qsgd`` here); with ``rank.*`` rows
it needs as many ranks. A file that is missing, truncated, not an .npz, or holds the wrong entries
is refused with a message that names it (SettingError), before any training. ``--save`` writes
exactly the path given (no ``.npz`` added), beside it first and then renamed, so a run stopped while
writing leaves the old file whole.
"""
import dataclasses
import json
import os

import numpy

from algorithms.core import cli
from algorithms.core.cli import SettingError
from minidl import backend, tuning
from minidl.conv import auto, budget, im2col_blocked as blocked
from minidl.nn import read_npz

SGD_FAMILY = "sgd"                      # one model and one SGD state, replicated or gathered
SERVER_FAMILY = "parameter_server"      # the server's vector and its optimizer (Downpour, SSP)


@dataclasses.dataclass
class Writer:
    """What a checkpoint records about the run that wrote it (and what ``--resume`` compares).

    ``family``: who can continue the file (default: only ``algorithm`` itself; ``SGD_FAMILY`` for
    one replicated SGD model); ``state``: {flag: value} of the flags that shape the saved state,
    which must match;
    ``layout``: how the model was split (recorded, free to differ on resume); ``model``: what is
    trained, if not ``settings.model`` (Hogwild!'s sparse problem).
    """
    algorithm: str
    family: str = None
    state: dict = dataclasses.field(default_factory=dict)
    layout: dict = dataclasses.field(default_factory=dict)
    model: str = None

    def meta(self, settings, ranks):
        model = settings.model if isinstance(settings.model, str) else "custom"
        if settings.problem is not None:
            model = f"problem:{type(settings.problem).__name__}"
        model = self.model or model
        return {"algorithm": self.algorithm, "family": self.family or self.algorithm, "model": model,
                "dataset": settings.dataset, "seed": settings.seed, "ranks": ranks, "layout": self.layout,
                "state": self.state, "tuning": tuning.ACTIVE.source, "conv": conv_settings()}


def conv_settings():
    """The conv kernel's settings in force, which decide a run's last bits beside the seed (recorded, free to
    differ on resume): the tuning file's (``minidl/tuning.py``) or the shipped ones, the budget as set."""
    return {"block_bytes": blocked.BLOCK_BYTES, "column_bytes": budget.current(), "layouts": blocked.LAYOUTS,
            "winograd_min_channels": auto.WINOGRAD_MIN_CHANNELS, "fft_min_kernel": auto.FFT_MIN_KERNEL}


def save_checkpoint(path, params, optimizer, epoch, meta=None, **extra):
    """params (flat vector), optimizer state, epoch, ``meta`` and ``extra`` arrays in one .npz at
    exactly ``path`` (no pickle): written beside it, then renamed over it."""
    arrays = {"params": backend.to_numpy(params), "epoch": numpy.asarray(epoch, dtype=numpy.int64)}
    if meta is not None:
        arrays["meta"] = numpy.array(json.dumps(meta, sort_keys=True))
    arrays.update({"optimizer." + key: value for key, value in optimizer.state_dict().items()})
    arrays.update({key: backend.to_numpy(value) for key, value in extra.items()})
    temporary = partial(path)
    try:
        with open(temporary, "wb") as file:      # a file object: numpy adds no ".npz" to the name
            numpy.savez(file, **arrays)
        os.replace(temporary, path)
    except OSError as error:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise SettingError(f"--save {path}: cannot be written ({error.strerror})") from None


def partial(path):
    """The file beside ``path`` that --save writes first and then renames to ``path``."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.{os.getpid()}.partial")


def check_save(path):
    """--save's check before the first message: the file can be created, and so can the file beside
    it that is written first and renamed (``check_output`` on both)."""
    cli.check_output("--save", path)
    if path is not None:
        cli.check_output("--save", partial(path))


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


def read_meta(path, arrays):
    """The ``meta`` record of a checkpoint's arrays (a SettingError if it has none or it is not JSON)."""
    text = arrays.get("meta")
    if text is None or text.shape != () or text.dtype.kind != "U":
        raise SettingError(f"--resume {path}: records no 'meta' (which algorithm wrote it); write it again "
                           f"with --save")
    try:
        meta = json.loads(str(text))
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or not {"algorithm", "family", "model", "dataset", "seed", "state"} <= set(meta):
        raise SettingError(f"--resume {path}: its 'meta' record is not one this version writes")
    return meta


def check_match(path, written, mine):
    """A SettingError naming both sides unless the file's ``written`` meta can be continued by ``mine``."""
    here = mine["algorithm"]
    if written["family"] != mine["family"]:
        raise SettingError(f"--resume {path}: written by {written['algorithm']} (family {written['family']}), whose "
                           f"state {here} (family {mine['family']}) cannot "
                           f"continue (resume it with {written['algorithm']}, or evaluate it with "
                           f"python -m algorithms.core.evaluate {path})")
    for key, flag in (("model", "--model"), ("dataset", "--dataset")):
        if written[key] != mine[key]:
            raise SettingError(f"--resume {path}: written with {flag} {written[key]} by {written['algorithm']}, "
                               f"this run has {flag} {mine[key]}")
    differ = [f"{name} {written['state'].get(name)!r} in the file, {mine['state'].get(name)!r} here"
              for name in sorted(set(written["state"]) | set(mine["state"]))
              if written["state"].get(name) != mine["state"].get(name)]
    if differ:
        raise SettingError(f"--resume {path}: written by {written['algorithm']} with other state-shaping "
                           f"settings than this {here} run: {'; '.join(differ)}")


def load_optimizer(path, optimizer, arrays, prefix="optimizer."):
    state = {key[len(prefix):]: value for key, value in arrays.items() if key.startswith(prefix)}
    try:
        optimizer.load_state_dict(state)
    except ValueError as error:
        raise SettingError(f"--resume {path}: optimizer state does not fit this optimizer ({error}); was "
                           f"--momentum 0 in one run and not in the other?") from None


def write(comm, path, params, optimizer, epoch, own=None, meta=None, shared=None):
    """--save on rank 0 (a collective): ``params``, rank 0's optimizer state, ``meta``, ``shared``
    (rank 0's {name: array} of state every rank holds alike), and with ``own`` (this rank's
    {name: vector}) every rank's own values and optimizer state as ``rank.<name>`` rows. Returns once the file is
    written, on every rank (a failed write is a
    SettingError on every rank)."""
    rank, extra = comm.Get_rank(), {}
    if own is not None:
        own = {**own, **{"optimizer." + key: value for key, value in optimizer.state_dict().items()}}
        for key, value in own.items():
            rows = comm.gather(backend.to_numpy(value), root=0)
            if rank == 0:
                extra["rank." + key] = numpy.stack(rows)
    failed = None
    if rank == 0:
        try:
            save_checkpoint(path, params, optimizer, epoch, meta=meta, ranks=comm.Get_size(), **extra,
                            **(shared or {}))
        except SettingError as error:
            failed = str(error)
    failed = comm.bcast(failed, root=0) if comm.Get_size() > 1 else failed
    if failed:
        raise SettingError(failed, every_rank=True)


def read_for(settings, n_params, meta):
    """The arrays of ``settings.resume``, checked (``read_checkpoint``) and matched against this run's
    ``meta`` (``check_match``); a file that has trained more than ``settings.epochs`` is refused."""
    path = settings.resume
    arrays = read_checkpoint(path, n_params)
    check_match(path, read_meta(path, arrays), meta)
    if int(arrays["epoch"]) > settings.epochs:
        raise SettingError(f"--resume {path}: has already trained {int(arrays['epoch'])} epochs, more than "
                           f"--epochs {settings.epochs}; ask for more epochs")
    return arrays


def resume(settings, objective, optimizer, rank, size, meta):
    """Load --resume into this rank's objective and optimizer; returns the checkpoint's arrays.

    ``meta``: this run's ``Writer.meta`` (compared with the file's by ``check_match``)."""
    path = settings.resume
    arrays = read_for(settings, objective.params.size, meta)
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
