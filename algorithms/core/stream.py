"""A member's data in population-based training: an endless stream of batches, and held-out rows.

    train, x_held, y_held = split_validation(data, fraction)      # the ranking's rows, kept apart
    stream = Stream(n, seed, member, piece, pieces)               # this rank's piece of its member's batches
    batch = stream.next(batch_size, limit=rows_left)              # any batch size, changing as it goes

PBT's rounds are not epochs: every member reads the same number of examples per round whatever
its batch size, so it reads an endless stream of its own shuffled epochs (a round need not end at
an epoch's end), where ``run.Run.loop`` reads whole epochs (``minidl.data.rank_batches``).
"""
import math

import numpy

from algorithms.core.objective import Data
from minidl.data import Batch, shard


class Stream:
    """A member's endless global batches: its own shuffled epochs (Generator([seed, member, epoch]))
    cut into batches of whatever size the member has now; this rank reads piece ``piece`` of
    ``pieces`` of each, as in synchronous SGD (minidl.data.rank_batches, partition "global")."""

    def __init__(self, n, seed, member, piece, pieces):
        self.n, self.seed, self.member, self.piece, self.pieces = n, seed, member, piece, pieces
        self.epoch, self.position = 0, 0
        self.order = self.shuffle()

    def shuffle(self):
        return numpy.random.default_rng([self.seed, self.member, self.epoch]).permutation(self.n)

    def next(self, batch_size, limit=None):
        """The next global batch of ``pieces`` x ``batch_size`` rows (fewer at an epoch's end, and at
        most ``limit`` rows)."""
        if self.position >= self.n:
            self.epoch, self.position = self.epoch + 1, 0
            self.order = self.shuffle()
        rows = self.order[self.position:self.position + min(self.pieces * batch_size, limit or math.inf)]
        self.position += len(rows)
        return Batch(rows[shard(len(rows), self.piece, self.pieces)], len(rows))


def split_validation(data, fraction):
    """(training Data, held-out x, held-out y): the last ``fraction`` of the training rows are held
    out for the ranking; the test set stays untouched for the final report."""
    keep = len(data.x_train) - max(1, int(round(fraction * len(data.x_train))))
    train = Data(data.x_train[:keep], data.y_train[:keep], data.x_test, data.y_test)
    return train, data.x_train[keep:], data.y_train[keep:]
