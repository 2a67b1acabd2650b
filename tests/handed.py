"""What tests hand to the course's graded functions besides the project's own objects: a sum to
call back, a stand-in objective, shards in this process. Here, not in a test file, so that the grader can hand them to a
function that runs in its sandbox (tutorials/assignments/codec.py's ``HELPERS``): the student tree
has this file, and each side builds them from its own copy.
"""
from algorithms.core import run
from algorithms.sandblaster.coordinator import Shards


class ParamsOnly:
    """An objective that is only its flat parameter vector ``params`` (what exploit_and_explore reads)."""

    def __init__(self, params):
        self.params = params


class HandProblem:
    """Samples with hand-picked supports, and f_e's gradient 2 w_e - target_e (a quadratic): what a
    test hands Hogwild!'s step in place of a sparse problem."""

    def __init__(self, index, targets):
        self.index, self.targets = index, targets

    def sample_grad(self, w_e, e):
        return 2.0 * w_e - self.targets[e]


class Summing:
    """total(array) for f and g: the sum over 3 ranks that hold the same array (3 x), counting its calls."""
    calls = 0

    def __call__(self, array):
        self.calls += 1
        return 3 * array


def in_place_total(comm):
    """The sum over ranks as tensor_parallel makes it: the ring allreduce, in place on its argument."""
    summing = run.allreduce_function("ring")

    def total(array):
        summing(comm, array.reshape(-1))
        return array
    return total


class InProcessShards(Shards):
    """The coordinator's handle on real ``Shard`` objects in this process (no messages)."""

    def __init__(self, shards):
        self.shards = shards

    def order(self, op, **args):
        for shard in self.shards:
            shard.command(op, args)

    def ask(self, op, **args):
        return [shard.command(op, args) for shard in self.shards]
