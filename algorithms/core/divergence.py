"""A run that diverges stops on every rank together, with one message naming where.

    finite = FiniteCheck(comm, every)          # each step: finite(loss, step); agrees every ``every`` steps
    check_divergence(loss, reference, where)   # on numbers every rank holds: a hundredfold loss stops the run
    kind = nonfinite(loss)                     # "nan", "inf" or None: the one test of a loss ...
    raise loss_became(kind, where)             # ... and the one message, whichever loop meets it

Two ways a run fails numerically, both raised as ``Diverged`` on every rank at once (a rank that
raised alone would leave the others waiting in their next message; ``cli.run_main`` prints
``error: ...`` and exits 2 everywhere): a loss that is not finite (nan or inf), and a finite loss
more than ``DIVERGED_FACTOR`` times the loss at the start. Every loop that meets a non-finite loss
(the epoch loop's ``FiniteCheck``, a parameter-server worker, Sandblaster's coordinator) tests it
with ``nonfinite`` and reports it with ``loss_became``, so the message reads the same everywhere.
"""
import math

import numpy
from mpi4py import MPI


def nonfinite(loss):
    """The kind of a non-finite ``loss``, "nan" or "inf"; None if it is a finite number."""
    if math.isfinite(loss):
        return None
    return "nan" if math.isnan(loss) else "inf"


def loss_became(kind, where):
    """The error of a loss that became ``kind`` ("nan" or "inf") at ``where`` ("step 7 on rank 2")."""
    return Diverged(f"loss became {kind} at {where}; lower --lr or check the data")


class FiniteCheck:
    """A non-finite loss stops *every* rank, naming the step and rank where it first appeared.

    Each rank remembers its own first non-finite loss; every ``every`` steps (and at each epoch's
    end) the ranks agree on the earliest (step, rank) with one 8-byte ``Allreduce(MIN)`` on the
    algorithm's counting communicator, so its bytes are in the log. Without the agreement a rank
    that raised alone would leave the others waiting forever in their next collective. ``every``
    > 1 makes it cheaper (the run then stops up to ``every - 1`` steps late, still naming the first
    step); 0 agrees at epoch ends only.
    """

    NONE = numpy.iinfo(numpy.int64).max

    def __init__(self, comm, every=1):
        self.comm, self.every = comm, every
        self.first = None                       # (step, 'nan' or 'inf') on this rank

    def __call__(self, loss, step):
        if self.first is None and nonfinite(loss):
            self.first = (step, nonfinite(loss))
        if self.every and (step + 1) % self.every == 0:
            self.agree()

    def agree(self):
        size, rank = self.comm.Get_size(), self.comm.Get_rank()
        code = numpy.array([self.NONE], dtype=numpy.int64)
        if self.first is not None:              # (step, rank, kind) as one orderable integer
            code[0] = (self.first[0] * size + rank) * 2 + (self.first[1] == "inf")
        if size > 1:
            self.comm.Allreduce(MPI.IN_PLACE, code, op=MPI.MIN)
        if code[0] != self.NONE:
            step_rank, is_inf = divmod(int(code[0]), 2)
            step, bad_rank = divmod(step_rank, size)
            raise loss_became("inf" if is_inf else "nan", f"step {step} on rank {bad_rank}")


class Diverged(FloatingPointError):
    """The run diverged; every rank raises it together."""
    every_rank = True


DIVERGED_FACTOR = 100


def check_divergence(loss, reference, where):
    """Diverged unless ``loss`` is finite and at most DIVERGED_FACTOR x max(``reference``, 1).

    ``reference`` is the loss at the start of the run (the mean loss of the first steps, taken
    at the initial weights). A run whose loss grew a hundredfold has not learned: its numbers
    would be a result only in name (e.g. Adagrad with --lr 1e6 ends at loss 1e24, 10% accuracy).
    Call it with numbers every rank agrees on, so every rank raises together.
    """
    if not math.isfinite(loss) or loss > DIVERGED_FACTOR * max(reference, 1.0):
        raise Diverged(f"the run diverged: {where} loss {loss:.4g}, against {reference:.4g} at the start "
                       f"(more than {DIVERGED_FACTOR}x); lower --lr")
