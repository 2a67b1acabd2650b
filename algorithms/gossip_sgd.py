"""Gossip SGD: local SGD, and every H steps each rank averages its parameters with one peer.

    mpiexec -n 4 python -m algorithms.gossip_sgd [--pairing ring|random] [--period H]

Papers: Ben-Nun & Hoefler 2019 ("limited/slower distribution - gossip", citing
Jin, Yuan, Iandola & Keutzer, "How to scale distributed deep learning?", NIPS MLSys workshop
2016); Boyd, Ghosh, Prabhakar & Shah, "Randomized gossip algorithms", IEEE Trans. Inf. Theory
2006 (pairwise averaging and its convergence to the mean).

Averaging without a centre. In the code's names (``gossip_round``), in gossip round k:

    partner = pairing(k)[rank]                    (None: this rank sits this round out)
    w_r    <- (w_r + w_partner) / 2               (one Sendrecv of n parameters with the partner)

Both partners compute (a + b) * 0.5 from the same two vectors, and IEEE addition is commutative,
so they hold the same bits afterwards; the pair's sum is unchanged up to one rounding, so the
mean over all ranks is unchanged by a round (tests/test_sync_sgd.py checks both). Repeated rounds
contract the spread around that mean: on a ring by the spectral gap of the ring's averaging
matrix (slowly, ~ 1/p^2 per round), with random pairings faster.

Pairings (every rank computes the same matching, so no coordination is needed):

    ring    round k even: (0,1) (2,3) (4,5) ...;  odd: (1,2) (3,4) ... (p-1,0)
            (odd p: the one rank without a neighbour sits out)
    random  Generator((seed, k)).permutation(p), paired off two by two (odd p: the last sits out)

Each step: a local SGD step (local momentum), then a gossip round when (step + 1) % H == 0.

Communication per round: one message of n parameters each way per rank, 1 alpha + n beta,
whatever p: less latency than any allreduce (>= lg p alpha), but information spreads over the
ranks only gradually. Plus the 8-byte non-finite check. The per-epoch evaluation is of the mean
of the ranks' parameters (an evaluation-only allreduce, not counted in ``bytes``), and the log's
``spread`` is max_r |w_r - mean| / |mean|: how far from consensus the ranks are.

Restrictions: H >= 1; p <= number of training examples.

Default run (the defaults ``--help`` shows), measured on 2 shared cores: p = 4 reaches 98.3% test accuracy
(the mean model's; spread 0.4%) in 3-5.5 s.
"""
import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli, tags
from algorithms.core.objective import evaluate_at
from algorithms.core.run import Run, Settings, mean_over_ranks
from minidl import backend

COMPARE = True       # python -m algorithms.compare runs it beside the other data-parallel algorithms
# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, momentum=0.9, partition="shards")

PAIRINGS = ("ring", "random")
GOSSIP_TAG = tags.GOSSIP


def partner_of(rank, size, round_number, pairing, seed=0):
    """This rank's partner in gossip round ``round_number``, or None (sits out). The same on every rank."""
    if pairing == "ring":
        position = (rank - round_number % 2) % size         # even rounds pair (0,1)(2,3)..., odd (1,2)...
        if position % 2 == 0:
            return None if position == size - 1 else (rank + 1) % size
        return (rank - 1) % size
    if pairing == "random":
        order = numpy.random.default_rng([seed, round_number]).permutation(size)
        where = int(numpy.flatnonzero(order == rank)[0])
        mate = where + 1 if where % 2 == 0 else where - 1
        return int(order[mate]) if mate < size else None
    raise ValueError(f"unknown --pairing {pairing!r}; choose one of {', '.join(PAIRINGS)}")


def gossip_round(comm, params, round_number, pairing, seed=0):
    """One gossip round (the heart): swap parameters with this round's partner and keep the average."""
    # BEGIN SOLUTION
    # this round's partner, the same matching on every rank
    partner = partner_of(comm.Get_rank(), comm.Get_size(), round_number, pairing, seed)
    if partner is None or partner == comm.Get_rank():
        return
    # swap: one Sendrecv of n parameters each way
    host = backend.to_numpy(params)                        # MPI gets host memory
    theirs = numpy.empty_like(host)
    comm.Sendrecv(host, partner, GOSSIP_TAG, theirs, partner, GOSSIP_TAG)
    # average: a + b (the same bits on both sides), halved exactly
    params += backend.asarray(theirs)
    params *= 0.5
    # END SOLUTION


def gossip_sgd_step(comm, objective, optimizer, batch, step, period, pairing, seed):
    """A local SGD step, then a gossip round every ``period`` steps. Returns the loss."""
    loss = objective.loss_and_grad(batch.index) if len(batch.index) else 0.0
    if len(batch.index):                                   # an empty piece: no local step
        optimizer.step()
    if (step + 1) % period == 0:
        gossip_round(comm, objective.params, (step + 1) // period - 1, pairing, seed)
    return loss


def spread(comm, params, mean):
    """max over ranks of |params - mean| / |mean| (evaluation only)."""
    mine = float(numpy.linalg.norm(backend.to_numpy(params) - mean) / max(numpy.linalg.norm(mean), 1e-300))
    return comm.allreduce(mine, op=MPI.MAX) if comm.Get_size() > 1 else mine


def check_gossip(period, pairing):
    cli.require("--period H", period, integer=True, low=1)
    if pairing not in PAIRINGS:
        raise cli.SettingError(f"unknown --pairing {pairing!r}; choose one of {', '.join(PAIRINGS)}")


def train(comm=None, period=1, pairing="ring", **settings):
    """Gossip SGD; returns (the mean of the ranks' final parameters as NumPy, per-epoch history).

    The ranks' own parameters differ (gossip never forces consensus); the log evaluates their mean,
    and the mean is what is returned and saved (--save also keeps each rank's own, for --resume).
    """
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)
    run = Run.start(comm, settings, check=lambda _: check_gossip(period, pairing), replicated=False,
                    writer=checkpoint.Writer("gossip_sgd"))

    def step(batch):
        return gossip_sgd_step(run.counting, run.objective, run.optimizer, batch, run.step, period, pairing,
                               settings.seed)

    def evaluate():
        mean = mean_over_ranks(comm, run.objective.params)
        return {**evaluate_at(run.objective, mean), "spread": spread(comm, run.objective.params, mean)}

    return run.loop(step, evaluate=evaluate, result=lambda: mean_over_ranks(comm, run.objective.params))


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], **DEFAULTS)
    parser.add_argument("--period", type=int, default=1, help="a gossip round every H steps")
    parser.add_argument("--pairing", default="ring", choices=PAIRINGS)
    args = parser.parse_args(argv)
    cli.run_main(train, args, period=args.period, pairing=args.pairing)


if __name__ == "__main__":
    main()
