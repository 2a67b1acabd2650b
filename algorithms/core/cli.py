"""The command line every algorithm shares: flags, their checks, and the error contract.

    parser = cli.parser("Allreduce SGD", allreduce="ring", **DEFAULTS)   # the algorithm's DEFAULTS
    parser.add_argument("--period", ...)                  # the algorithm's own flags
    cli.run_main(train, parser.parse_args(argv), period=args.period)

Shared flags: --dataset digits|mnist [--data-dir D] --model cnn|mlp|lenet5 --epochs N --lr X
--momentum M --batch-size B (per rank) --seed S --log run.jsonl --save params.npz
--resume params.npz --quiet; the data-parallel ones add --partition and --check-every, and
--allreduce where the algorithm uses one, --recompute where the whole model runs through the
objective (a flag an algorithm cannot honour is not offered).

The error contract (``run_main``): any bad input or failure stops every rank with one line
``error: <what, where>`` and exit status 2, never a traceback for something a user can cause and
never a hang. Settings are checked on every rank before the first message (``Run.start`` agrees
on the outcome of the set-up, so a file that only one rank cannot read still stops all of them);
a non-finite loss is agreed on by every rank (``divergence.FiniteCheck``). Anything else that escapes
on some rank aborts the whole job (``MPI.Abort(2)``), so the other ranks cannot wait forever.
"""
import argparse
import math
import os
import sys

from minidl import models
from minidl.data import PARTITIONS

ALLREDUCE_NAMES = ("ring", "tree", "butterfly", "rabenseifner", "naive", "auto", "hierarchical", "hierarchical_tree",
                   "mpi")
DECAY_FACTOR = 10.0                     # the default --decay-factor (algorithms.core.schedule)


class SettingError(ValueError):
    """A setting no run can use. ``every_rank`` is True when every rank raised it together."""

    def __init__(self, message, every_rank=False):
        super().__init__(message)
        self.every_rank = every_rank


RECOMPUTE_HELP = {
    True: "keep no activations inside about sqrt(layers) segments; recompute them in the backward",
    "stage": "each stage one checkpointed segment: a micro-batch in flight keeps only the stage's output, and "
             "its backward runs the stage again",
    "block": "each split block's f, column Linear, ReLU and row product one checkpointed segment, run again in "
             "the backward (no message: g's allreduce is not repeated)",
    "tile": "each conv stage's tile keeps only its output; the backward runs the stage again, its halo "
            "exchanged again (the same gradients, less memory)",
}


def parser(description, epochs=20, lr=0.05, batch_size=32, model="cnn", momentum=0.9,
           partition=None, check_every=1, allreduce=None, files=True, recompute=False):
    """An ArgumentParser with the flags every algorithm shares; modules add their own.

    The defaults are the algorithm's: its ``DEFAULTS``, the dict its ``train`` hands ``Settings.of``
    (``cli.parser(doc, **DEFAULTS)``), over the family's own (``run.Settings``'s, which these keyword
    defaults equal: tests/test_defaults.py). ``partition`` (a default) adds --partition and
    --check-every (the data-parallel family);
    ``allreduce`` (a default) adds --allreduce; ``momentum`` None leaves --momentum out (an update
    without momentum, such as Hogwild's, does not offer the flag); ``files`` False leaves out --log,
    --save and --resume (a command that runs several algorithms in turn); ``recompute`` True adds
    --recompute (an algorithm whose whole model runs through the objective: serial, allreduce SGD,
    ZeRO); "stage" adds it for the pipelines, which recompute each stage whole; "block" for tensor
    parallelism (each split block), "tile" for the spatial split (each conv stage, halo again).
    """
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default="digits", choices=["digits", "mnist"],
                   help="digits: the embedded 8x8 UCI digits; mnist: IDX files in --data-dir")
    p.add_argument("--data-dir", default=None, help="folder with the MNIST/Fashion-MNIST IDX files")
    p.add_argument("--model", default=model, choices=sorted(models.MODELS))
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--lr", type=float, default=lr)
    if momentum is not None:
        p.add_argument("--momentum", type=float, default=momentum)
    p.add_argument("--batch-size", type=int, default=batch_size, help="examples per step on each rank")
    p.add_argument("--seed", type=int, default=0)
    if files:
        p.add_argument("--log", default=None, help="write one JSON object per epoch to this file")
        p.add_argument("--save", default=None, help="write final parameters and optimizer state (a .npz "
                       "file at exactly this path; see algorithms.core.checkpoint)")
        p.add_argument("--resume", default=None, help="start from a file written by --save")
    p.add_argument("--quiet", action="store_true", help="no per-epoch output")
    if partition is not None:
        p.add_argument("--partition", default=partition, choices=PARTITIONS,
                       help="which rows each rank sees (see minidl.data.rank_batches)")
        p.add_argument("--check-every", type=int, default=check_every,
                       help="agree on a non-finite loss every this many steps (0: at epoch ends only)")
        add_schedule_flags(p)
    if recompute:
        p.add_argument("--recompute", action="store_true", help=RECOMPUTE_HELP[recompute]
                       + ("" if recompute == "tile" else " (minidl.recompute: the same gradients, less memory)"))
    if allreduce is not None:
        p.add_argument("--allreduce", default=allreduce, choices=ALLREDUCE_NAMES,
                       help="allreduce algorithm (mpi: MPI's own Allreduce)")
    p.error = fail                              # a bad flag: one error line (no usage text), exit 2
    return p


def add_schedule_flags(p):
    """The large-batch schedule's flags (algorithms.core.schedule); their defaults change nothing."""
    p.add_argument("--lr-scaling", default="none", choices=["none", "linear", "sqrt"],
                   help="scale --lr by the global batch over --reference-batch (Goyal et al. 2017)")
    p.add_argument("--reference-batch", type=int, default=None,
                   help="the batch --lr is meant for (default: --batch-size, one rank's batch)")
    p.add_argument("--warmup-epochs", type=float, default=0.0,
                   help="climb linearly from --lr to the scaled lr over this many epochs")
    p.add_argument("--lr-decay", type=parse_epochs, default=(), metavar="E1,E2,...",
                   help="divide the lr by --decay-factor at these epochs")
    p.add_argument("--decay-factor", type=float, default=DECAY_FACTOR)
    p.add_argument("--batch-schedule", action="store_true",
                   help="at the --lr-decay epochs multiply the batch by --decay-factor instead (Smith et al. 2018)")


def parse_epochs(text):
    """--lr-decay 10,15 -> (10, 15); '' -> ()."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be epochs separated by commas, e.g. 10,15, got {text!r}") from None


def require(flag, value, integer=False, low=None, high=None, low_open=False, high_open=False):
    """The one validation helper: a SettingError naming ``flag`` unless ``value`` is a finite number
    (an integer if ``integer``) in the interval given by ``low``/``high`` (open ends if asked)."""
    kind = "an integer" if integer else "a finite number"
    ok = (isinstance(value, int) if integer else isinstance(value, (int, float))) and not isinstance(value, bool)
    ok = ok and (integer or math.isfinite(value))
    ok = ok and (low is None or (value > low if low_open else value >= low))
    ok = ok and (high is None or (value < high if high_open else value <= high))
    if not ok:
        bounds = []
        if low is not None:
            bounds.append(f"{'>' if low_open else '>='} {low}")
        if high is not None:
            bounds.append(f"{'<' if high_open else '<='} {high}")
        raise SettingError(f"{flag} must be {kind}{' ' + ' and '.join(bounds) if bounds else ''}, got {value!r}")
    return value


def check_output(flag, path):
    """A SettingError unless ``path`` can be written: its folder exists and a file can be created.

    Tried for real (open for append, removed again if it did not exist), because permission bits
    do not tell root or a read-only file system. Call it on the rank that will write the file.
    """
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SettingError(f"{flag} {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise SettingError(f"{flag} {path}: is a folder, not a file")
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as error:
        raise SettingError(f"{flag} {path}: cannot be written ({error.strerror})") from None
    if not existed:
        os.remove(path)


def check_input(flag, path):
    """A SettingError unless ``path`` is a readable file."""
    if path is None:
        return
    if not os.path.isfile(path):
        raise SettingError(f"{flag} {path}: no such file")
    if not os.access(path, os.R_OK):
        raise SettingError(f"{flag} {path}: cannot be read")


def parse_period(text):
    """--period H: a positive integer, or 'end' (average once, after the last step)."""
    if text == "end":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 or 'end', got {text!r}") from None


SHARED = ("dataset", "data_dir", "model", "epochs", "lr", "momentum", "batch_size", "seed", "log", "save",
          "resume", "quiet", "partition", "check_every", "lr_scaling", "reference_batch", "warmup_epochs", "lr_decay",
          "decay_factor", "batch_schedule", "recompute")


def shared_settings(args):
    """The shared flags of ``args`` (those the parser has) as keyword arguments for ``train``."""
    return {name: getattr(args, name) for name in SHARED if hasattr(args, name)}


def fail(message, status=2):
    """Print ``error: message`` on this rank and exit with ``status``."""
    sys.stderr.write(f"error: {message}\n")         # one write: ranks' lines do not interleave
    sys.stderr.flush()
    sys.exit(status)


def run_main(train, args, **algorithm_kwargs):
    """Command-line entry: ``train(MPI.COMM_WORLD, <shared flags>, **algorithm_kwargs)``, under the
    error contract.

    An error every rank raised together (a setting, a diverged run) prints ``error: ...`` on every
    rank and exits 2 on every rank. Any other exception on any rank prints ``error: ...`` there
    (with the place it came from, not a traceback) and aborts the whole job with status 2: the
    other ranks may be waiting for a message from this one and would otherwise wait forever.
    """
    import numpy
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    try:
        with numpy.errstate(over="ignore", invalid="ignore", divide="ignore"):   # a nan is reported once, below
            train(comm, **shared_settings(args), **algorithm_kwargs)
    except Exception as error:                           # noqa: BLE001 - the contract's backstop
        if getattr(error, "every_rank", False):
            fail(str(error))
        abort_job(comm, f"{error} ({type(error).__name__} on rank {comm.Get_rank()}{_origin(error)})")


ABORT_GRACE_S = 1.0


def abort_job(comm, message):
    """Print ``error: message`` on this rank, then abort the whole job with status 2.

    The line is flushed, then the rank waits ``ABORT_GRACE_S`` before ``Abort``: the launcher
    forwards a rank's stderr from a pipe, and an abort that kills the job at once can kill the
    forwarding before it has read the line (seen under MPICH's hydra on a loaded machine: exit
    status 2 and an empty stderr). The other ranks are blocked waiting for this one meanwhile.
    """
    import time
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)
    comm.Abort(2)


def _origin(error):
    """', at file:line' of the innermost frame of ``error``'s traceback (for the one-line message)."""
    tb = error.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f", at {os.path.relpath(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
