"""Large-batch schedules: the learning rate and the global batch at every step of a run.

    python -m algorithms.allreduce_sgd --lr-scaling linear --warmup-epochs 2      # Goyal et al.
    mpiexec -n 4 python -m algorithms.allreduce_sgd --lr-decay 10,15              # step decay
    mpiexec -n 4 python -m algorithms.allreduce_sgd --lr-decay 10,15 --batch-schedule   # Smith et al.

Papers: Goyal et al. 2017, "Accurate, Large Minibatch SGD", sections 2.1 (linear scaling rule)
and 2.2 (gradual warm-up); Smith, Kindermans, Ying & Le 2018, "Don't Decay the Learning Rate,
Increase the Batch Size", section 3 (the noise scale g = lr N / B of SGD, and increasing B
instead of decaying lr). Full references: tutorials/references.md.

In the code's names, with B = ranks * batch_size the global batch at the start, B_ref =
reference_batch (default: batch_size, one rank's batch, so "linear" multiplies lr by the rank
count), k = B / B_ref, and e = epoch + step / steps_in_epoch (epochs done, fractional):

    peak     = lr * k            (linear)      lr * sqrt(k)   (sqrt)      lr   (none)
    ramp(e)  = lr + (peak - lr) * e / warmup_epochs    while e < warmup_epochs, else peak
    d(e)     = number of milestones m in lr_decay with m <= e
    decaying lr:      lr(e) = ramp(e) / decay_factor ** d(e),   batch(e) = B
    batch schedule:   lr(e) = ramp(e),                          batch(e) = B * decay_factor ** d(e)

Goyal's warm-up starts at the reference lr and climbs by the same amount every step to the
scaled one, so with --lr-scaling none it changes nothing. The batch schedule grows each rank's
batch (more examples per rank, same ranks), so lr(e) / batch(e) -- the part of Smith's noise
scale that the schedule sets -- is the decaying run's at every e, by construction. The batch
run takes fewer steps per epoch, which is Smith's point: the same curve per epoch, fewer updates.

With no scaling, no warm-up and no decay the schedule is ``constant`` and ``run.Run.loop`` never
touches the optimizer's lr: every existing run keeps its bits (tests/test_shape.py pins two).
Restrictions: decay_factor > 1; with the batch schedule an integer, so batches stay whole;
the batch is not capped (once B * decay_factor ** d exceeds the training set an epoch is one step).
"""
import dataclasses
import math

from algorithms.core.cli import DECAY_FACTOR, SettingError, require

SCALINGS = ("none", "linear", "sqrt")


@dataclasses.dataclass(frozen=True)
class Schedule:
    lr: float                      # the lr at the reference batch (--lr)
    batch_size: int                # per rank, at the start (--batch-size)
    ranks: int = 1
    scaling: str = "none"          # --lr-scaling
    reference_batch: int = None    # --reference-batch; None: batch_size
    warmup_epochs: float = 0.0     # --warmup-epochs
    lr_decay: tuple = ()           # --lr-decay: epochs at which lr is divided (or the batch multiplied)
    decay_factor: float = DECAY_FACTOR     # --decay-factor
    batch_schedule: bool = False   # --batch-schedule

    @classmethod
    def of(cls, settings, ranks):
        """The schedule of ``run.Settings`` on ``ranks`` ranks (each reading ``batch_size`` rows)."""
        return cls(settings.lr, settings.batch_size, ranks, settings.lr_scaling, settings.reference_batch,
                   settings.warmup_epochs, tuple(settings.lr_decay), settings.decay_factor,
                   settings.batch_schedule)

    def check(self, epochs):
        """SettingError naming the flag unless every part of the schedule is usable for ``epochs``."""
        if self.scaling not in SCALINGS:
            raise SettingError(f"--lr-scaling must be one of {', '.join(SCALINGS)}, got {self.scaling!r}")
        if self.reference_batch is not None:
            require("--reference-batch", self.reference_batch, integer=True, low=1)
        require("--warmup-epochs", self.warmup_epochs, low=0)
        require("--decay-factor", self.decay_factor, low=1, low_open=True)
        for milestone in self.lr_decay:
            require("--lr-decay (each epoch)", milestone, integer=True, low=1, high=epochs - 1)
        if list(self.lr_decay) != sorted(set(self.lr_decay)):
            raise SettingError(f"--lr-decay epochs must increase, got {','.join(map(str, self.lr_decay))}")
        if self.reference_batch is not None and self.scaling == "none":
            raise SettingError("--reference-batch is the batch --lr-scaling scales from; "
                               "this run has --lr-scaling none")
        if self.warmup_epochs and self.scaling == "none":
            raise SettingError("--warmup-epochs climbs from --lr to the scaled lr; with --lr-scaling none the two "
                               "are the same")
        if self.batch_schedule and not self.lr_decay:
            raise SettingError("--batch-schedule grows the batch at the --lr-decay epochs; give them")
        if self.decay_factor != DECAY_FACTOR and not self.lr_decay:
            raise SettingError(f"--decay-factor {self.decay_factor} acts at the --lr-decay epochs; give them")
        if self.batch_schedule and self.decay_factor != int(self.decay_factor):
            raise SettingError(f"--batch-schedule multiplies the batch by --decay-factor, which must then be "
                               f"an integer, got {self.decay_factor!r}")

    @property
    def constant(self):
        """True when lr and batch never change: the run is exactly the unscheduled one."""
        return self.peak == self.lr and not self.lr_decay

    @property
    def peak(self):
        """The lr after warm-up and before any decay: lr scaled from the reference batch to B."""
        k = self.ranks * self.batch_size / (self.reference_batch or self.batch_size)
        return {"none": self.lr, "linear": self.lr * k, "sqrt": self.lr * math.sqrt(k)}[self.scaling]

    def decays(self, epoch):
        """d(e): how many milestones of --lr-decay lie at or before (fractional) epoch ``epoch``."""
        return sum(1 for milestone in self.lr_decay if milestone <= epoch)

    def lr_at(self, epoch):
        """The learning rate at fractional epoch ``epoch`` = epoch + step / steps_in_epoch."""
        # BEGIN SOLUTION
        # warm-up: from the reference lr up to the scaled one, by the same amount every step
        if epoch < self.warmup_epochs:
            rate = self.lr + (self.peak - self.lr) * epoch / self.warmup_epochs
        else:
            rate = self.peak
        # decay: divide by decay_factor at each milestone, unless the batch grows instead
        if self.batch_schedule:
            return rate
        return rate / self.decay_factor ** self.decays(epoch)
        # END SOLUTION

    def batch_at(self, epoch):
        """Each rank's batch in (whole) epoch ``epoch``: batch_size, times decay_factor per
        milestone passed when the batch grows instead of the lr decaying."""
        if not self.batch_schedule:
            return self.batch_size
        return self.batch_size * int(self.decay_factor) ** self.decays(epoch)

    def global_batch_at(self, epoch):
        return self.ranks * self.batch_at(epoch)

