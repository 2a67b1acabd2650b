"""One training run of a synchronous or decentralized algorithm: set-up, the one epoch loop, the end.

    run = Run.start(comm, settings, check=check_my_flags)   # agreed set-up: every rank or none
    def step(batch):                                         # the algorithm: one step on this rank
        return data_parallel_step(run.counting, run.objective, run.optimizer, batch, allreduce)
    return run.loop(step)                                    # epochs, log, --save; (params, history)

``Run.start`` checks the settings, builds the objective and the optimizer, reads ``--resume`` and opens
``--log`` on every rank, then agrees on the outcome in one small message, so a bad setting, a file
only one rank cannot read, or an unwritable output stops every rank before any training (the
error contract, ``algorithms.core.cli``). ``loop`` is the only epoch loop of the family:

    for each epoch:
        for each of this rank's batches (minidl.data.rank_batches):
            loss = step(batch)                     # the algorithm's heart
            finite(loss)                           # every rank stops together on nan/inf
        end_of_epoch(epoch)                        # e.g. model averaging's final average
        log {epoch, train_loss, evaluate(), bytes}
    --save

Checkpoints are ``core.checkpoint``'s; ``Run.keep`` registers an algorithm's own per-rank state
(EASGD's centre, ADMM's z and u): it resumes bit for bit too.
"""
import contextlib
import dataclasses
import time

import numpy
from mpi4py import MPI

import collectives
from algorithms.core import checkpoint, cli
from algorithms.core.cli import SettingError
from algorithms.core.divergence import FiniteCheck, check_divergence
from algorithms.core.log import Log
from algorithms.core.objective import build as build_objective
from algorithms.core.schedule import Schedule
from collectives.model import tuned
from collectives.nodes import environment_ranks_per_node
from collectives.trace import CountingComm
from minidl import backend
from minidl.conv import budget
from minidl.data import rank_batches
from minidl.optim import SGD


@dataclasses.dataclass
class Settings:
    """The settings every synchronous or decentralized algorithm shares (the shared flags)."""
    dataset: str = "digits"
    data_dir: str = None
    model: object = "cnn"            # a name in minidl.models, or a function returning a Module
    epochs: int = 20
    lr: float = 0.05
    momentum: float = 0.9
    batch_size: int = 32             # per rank
    seed: int = 0
    partition: str = "global"        # minidl.data.rank_batches
    log: str = None
    save: str = None
    resume: str = None
    quiet: bool = False
    check_every: int = 1             # steps between non-finite agreements; 0: at epoch ends only
    data: object = None              # a ready objective.Data (tests, compare)
    problem: object = None           # a synthetic convex problem instead of model and data
    lr_scaling: str = "none"         # large-batch schedule (algorithms.core.schedule); the defaults change nothing
    reference_batch: int = None
    warmup_epochs: float = 0.0
    lr_decay: tuple = ()
    decay_factor: float = cli.DECAY_FACTOR
    batch_schedule: bool = False
    recompute: bool = False          # activations recomputed in the backward (minidl.recompute)

    @classmethod
    def of(cls, given, **defaults):
        """Settings from the keyword arguments ``given`` to ``train``, over the algorithm's ``defaults``."""
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(given) - names)
        if unknown:
            raise TypeError(f"train() got unknown setting(s) {', '.join(unknown)}")
        return cls(**{**defaults, **given})

    def check(self):
        cli.require("--epochs", self.epochs, integer=True, low=1)
        cli.require("--lr", self.lr, low=0, low_open=True)
        cli.require("--momentum", self.momentum, low=0, high=1, high_open=True)
        cli.require("--batch-size", self.batch_size, integer=True, low=1)
        cli.require("--seed", self.seed, integer=True, low=0)
        cli.require("--check-every", self.check_every, integer=True, low=0)
        Schedule.of(self, 1).check(self.epochs)
        try:                                      # read at the first convolution otherwise: mid-run
            budget.current()
            tuned.current()                       # collectives' section: a bad one stops the run, not a note
        except ValueError as error:
            raise SettingError(str(error)) from None


def allreduce_function(name):
    """In-place sum over ranks, ``f(comm, buffer)``, by ``collectives.<name>``, or MPI's own for 'mpi'.

    The collectives run with ``check=False``: the training loop passes the same flat buffer on every
    rank, so the per-call agreement on lengths and dtypes would buy nothing.
    """
    if name not in cli.ALLREDUCE_NAMES:
        raise SettingError(f"unknown --allreduce {name!r}; choose one of {', '.join(cli.ALLREDUCE_NAMES)}")
    if name == "mpi":
        return mpi_allreduce
    if name in ("hierarchical", "hierarchical_tree"):   # the node size may come from the environment: check it now
        try:
            environment_ranks_per_node()
        except ValueError as error:
            raise SettingError(f"--allreduce {name}: {error}") from None

    def allreduce(comm, buffer):
        return collectives.allreduce(comm, MPI.IN_PLACE, buffer, op="sum", algorithm=name, check=False)
    return allreduce


def mpi_allreduce(comm, buffer):
    """MPI's own Allreduce (for comparison), on host memory."""
    host = backend.to_numpy(buffer)
    comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
    if host is not buffer:
        buffer[...] = backend.asarray(host)
    return buffer


@contextlib.contextmanager
def agreed(comm, catch=(Exception,)):
    """The agreed set-up, the one way every algorithm starts: the checks inside the ``with`` run on
    every rank, and an error of a type in ``catch`` on any rank stops every rank together after it,
    with the same ``SettingError`` (``agree_on_errors``), before the first message of the run.

        with run.agreed(comm):
            settings.check()
            objective = build(...)
    """
    error = None
    try:
        yield
    except catch as caught:                      # noqa: BLE001 - agreed below, on every rank
        error = caught
    agree_on_errors(comm, error)


def agree_on_errors(comm, error):
    """Raise a SettingError on every rank if ``error`` (an exception or None) is set on any rank.

    One allgather of a short message per rank: the set-up's only message before training.
    """
    message = None if error is None else str(error) or type(error).__name__
    messages = comm.allgather(message) if comm.Get_size() > 1 else [message]
    failed = [(rank, text) for rank, text in enumerate(messages) if text is not None]
    if not failed:
        return
    rank, text = failed[0]
    if len({text for _, text in failed}) > 1 or len(failed) < len(messages):
        text = f"{text} (on rank {rank}{' and others' if len(failed) > 1 else ''})"
    raise SettingError(text, every_rank=True)


# ---- the run --------------------------------------------------------------------------------------

class Run:
    """What ``Run.start`` set up: the objective and optimizer of this rank, the communicators, the log.

    ``counting`` is the communicator an algorithm sends on (it counts this rank's bytes); ``comm``
    is the plain one, for evaluation-only reductions that are not part of the algorithm.
    """

    def __init__(self, comm, settings, objective, optimizer, checkpoint, replicated, reader=None, meta=None):
        self.comm, self.settings, self.meta = comm, settings, meta
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.reader = reader or (self.rank, self.size)   # (piece, pieces) of each global batch this rank reads
        self.objective, self.optimizer = objective, optimizer
        self.counting = CountingComm(comm)
        self.finite = FiniteCheck(self.counting, settings.check_every)
        self.replicated = replicated
        # what Run keeps of --resume's arrays: the epoch and this rank's rows of an algorithm's own state
        # (``keep``); the whole params and optimizer state were loaded into the objective and the optimizer
        self.checkpoint = {key: value for key, value in (checkpoint or {}).items()
                           if key not in ("params", "meta") and not key.startswith(("optimizer.", "rank."))}
        self.first_epoch = int(self.checkpoint.get("epoch", 0))
        self.schedule = Schedule.of(settings, self.reader[1])
        self.schedule = None if self.schedule.constant else self.schedule   # None: lr and batch never change
        self.steps_per_epoch = len(self.batches(0))
        self.step = self.first_epoch * self.steps_per_epoch
        if self.schedule:                          # epochs of different lengths when the batch grows
            self.step = sum(len(self.batches(epoch)) for epoch in range(self.first_epoch))
        self.kept = {}
        self.logger = None

    def batches(self, epoch):
        s = self.settings
        batch_size = self.schedule.batch_at(epoch) if self.schedule else s.batch_size
        return rank_batches(self.objective.n, batch_size, *self.reader, s.seed, epoch, s.partition,
                            self.objective.labels)

    def keep(self, name, initial):
        """Register per-rank algorithm state (EASGD's centre, ADMM's z and u) for --save / --resume:
        returns ``initial``, overwritten with this rank's row of the checkpoint when resuming."""
        row = self.checkpoint.pop(name, None)      # taken over: not kept twice
        if row is not None:
            initial[...] = backend.asarray(row, dtype=initial.dtype)
        self.kept[name] = initial
        return initial

    def loop(self, step, evaluate=None, group=None, end_of_epoch=None, result=None):
        """The one epoch loop; returns (the result as a NumPy copy, the per-epoch history).

        step(batch) -> loss        one step on this rank (with ``group`` K: a list of up to K
                                   batches -> a list of losses, e.g. ADMM's K local steps)
        evaluate() -> dict         the epoch's test metrics (default: the objective's own)
        end_of_epoch(epoch)        anything the algorithm does after an epoch's last step
        result() -> vector         what is logged, saved and returned (default: objective.params)
        """
        evaluate = evaluate or self.objective.evaluate
        result = result or (lambda: self.objective.params)
        reference = None                          # the loss at the start: the first step's, over ranks
        for epoch in range(self.first_epoch, self.settings.epochs):
            batches = self.batches(epoch)
            loss_sum, rows = 0.0, 0
            for start in range(0, len(batches), group or 1):
                if self.schedule:                  # --lr-scaling, --warmup-epochs, --lr-decay
                    self.optimizer.lr = self.schedule.lr_at(epoch + start / len(batches))
                chunk = batches[start:start + (group or 1)]
                losses = step(chunk) if group else [step(chunk[0])]
                for batch, loss in zip(chunk, losses):
                    self.finite(loss, self.step)
                    if reference is None:
                        reference = (loss * len(batch.index), len(batch.index))
                    loss_sum += loss * len(batch.index)
                    rows += len(batch.index)
                    self.step += 1
            self.finite.agree()
            if end_of_epoch is not None:
                end_of_epoch(epoch)
            if isinstance(reference, tuple):
                reference = epoch_mean(self.comm, *reference)
            record = {"epoch": epoch + 1, "train_loss": epoch_mean(self.comm, loss_sum, rows)}
            if self.schedule:                      # the schedule's last lr and this epoch's global batch
                record.update(lr=self.optimizer.lr, global_batch=self.schedule.global_batch_at(epoch))
            check_divergence(record["train_loss"], reference, f"epoch {epoch + 1}'s mean training")
            record.update(evaluate())
            record["bytes"] = self.counting.total_bytes()
            self.logger.epoch(**record)
        return self.finish(result())

    def finish(self, params):
        """Close the log, write --save (rank 0), return (``params`` as a NumPy copy, history)."""
        self.logger.close()
        if self.settings.save:
            own = None if self.replicated else {"params": self.objective.params, **self.kept}
            checkpoint.write(self.comm, self.settings.save, params, self.optimizer, self.settings.epochs, own,
                             meta=self.meta)
        return backend.to_numpy(params).copy(), self.logger.history

    @classmethod
    def start(cls, comm, settings, check=None, model_seed=None, replicated=True, reader=None, *, writer,
              optimizer=None):
        """The agreed set-up of a run (see the module docstring); returns the ``Run``.

        ``settings``: a ``Settings``. ``writer``: a ``checkpoint.Writer``, what --save records and
        --resume compares (the algorithm, its family, its state-shaping flags, its layout).
        ``check(settings)``: the algorithm's own checks (raise SettingError). ``model_seed``: the initial weights'
        seed if not ``settings.seed`` (ensembles). ``replicated``: every rank holds the same parameters and
        optimizer state at the end (so a checkpoint needs one copy); otherwise each rank's own are saved too.
        ``reader``: (piece, pieces), which piece of each global batch this rank reads (default (rank, size)); the
        ranks of one pipeline- or model-parallel replica all read their replica's piece. ``optimizer(parameters,
        settings)``: the optimizer of the flat vector (default: SGD with --lr and --momentum; ZeRO's Adam).
        """
        rank, size = comm.Get_rank(), comm.Get_size()
        run = None
        with agreed(comm):
            settings.check()
            if check is not None:
                check(settings)
            if rank == 0:
                checkpoint.check_save(settings.save)
            meta = writer.meta(settings, size)
            objective = build_objective(settings.model, settings.dataset, settings.seed, settings.data,
                                        settings.data_dir, settings.problem, model_seed=model_seed,
                                        recompute=settings.recompute)
            if size > objective.n:
                raise SettingError(f"{size} ranks but only {objective.n} training examples: every rank needs at "
                                   f"least one (use fewer ranks)")
            optimizer = (optimizer or sgd)([objective.flat.as_parameter()], settings)
            resumed = checkpoint.resume(settings, objective, optimizer, rank, size, meta) if settings.resume else None
            run = cls(comm, settings, objective, optimizer, resumed, replicated, reader, meta)
            run.logger = Log(settings.log, rank=rank, quiet=settings.quiet)
        return run


def sgd(parameters, settings):                               # the family's optimizer: --lr, --momentum
    return SGD(parameters, lr=settings.lr, momentum=settings.momentum)


def wait_together(comm, poll_seconds=0.002, while_waiting=None):
    """A barrier that sleeps between polls instead of spinning (``Ibarrier`` + ``Test``).

    Ranks that wait here leave their core to the ranks still working: with several ranks per
    core (4 ranks on 2 cores in our runs) a spinning ``Barrier`` would slow the others down.
    ``while_waiting()``, if given, runs at each poll (a parameter server answers late requests).
    """
    barrier = comm.Ibarrier()
    while not barrier.Test():
        if while_waiting is not None:
            while_waiting()
        time.sleep(poll_seconds)


# ---- small reductions for the log (evaluation only: not part of any algorithm, not counted) -------

def epoch_mean(comm, total, count):
    """sum(total) / sum(count) over ranks (one small allreduce): e.g. the epoch's training loss."""
    pair = numpy.array([total, count], dtype=numpy.float64)
    if comm.Get_size() > 1:
        comm.Allreduce(MPI.IN_PLACE, pair, op=MPI.SUM)
    return float(pair[0] / max(pair[1], 1))


def mean_over_ranks(comm, vector):
    """A copy of the element-wise mean of ``vector`` over ranks (MPI's Allreduce, in float64)."""
    host = numpy.array(backend.to_numpy(vector), dtype=numpy.float64)
    if comm.Get_size() > 1:
        comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
    host /= comm.Get_size()
    return host.astype(backend.to_numpy(vector).dtype)
