"""Population-based training: members train side by side; the worst copy the best and explore.

    mpiexec -n 4 python -m algorithms.pbt [--population 4] [--ready 40] [--ready-batch 32]
        [--rounds 12] [--fraction 0.25] [--search pbt|random|evolution] [--lineage lineage.json]

Paper: Jaderberg et al. 2017, "Population Based Training of Neural Networks", section 3 (the
ready / exploit / explore steps; "truncation selection" and "perturb" are its section 4.1
choices). Random search (Bergstra & Bengio 2012) is the same population trained with its
initial hyperparameters and no exploit: the same compute, the baseline of the paper's figures.
--search evolution is truncation-selection evolution without weight inheritance: at each ranking
the losers become offspring, a winner's hyperparameters perturbed, trained from the initial
weights (the exploit step without the copy of w and v; what the copy adds is PBT minus this).
The budget is counted in examples read: every member reads the same number per round (below),
whatever its batch size, in every search.
Full references: tutorials/references.md.

The population: M = --population members; member m is the group of R = p / M consecutive ranks
m R .. m R + R - 1, which trains it by synchronous data-parallel SGD on its own communicator
(``core.step.data_parallel_step``, allreduce SGD's step). Every member starts from the same weights and draws its
hyperparameters h_m = (lr, momentum, batch) from the prior (``sample``). Then, for each round:

    train     every member reads B = ready x ready_batch x R examples with its own h_m: steps of
              its own batch, the last one cut to what is left of B        (R ranks per member)
    eval      score_m = minus the loss on held-out rows (the last --validation of the training
              split; NaN if it is not finite)                         one allgather of p floats
    ready     pairs = truncation_selection(scores): each of the bottom q = max(1, floor(fraction M))
              members, and every NaN member, is paired with a member drawn from the top q
    exploit   loser <- winner's weights w and SGD momentum buffer v: rank j of the winner sends
              one flat buffer [w, v] to rank j of the loser            (point to point, 2 n floats)
    explore   h_loser <- perturb(h_winner): lr, momentum and batch each times 0.8 or 1.2

Every rank keeps the same table of all members' hyperparameters and draws the same random
numbers (``Generator([seed, round])``), so the selection and the perturbations need no message
beyond the scores, and a run is reproducible bit for bit from --seed. A NaN member is replaced
and never chosen as a winner. The lineage (who copied whom, with which h, scoring what) is
logged per round and written as JSON with --lineage; tutorials/figures/make_09_figures.py plots it.

Cost per round, beyond training: one allgather of p scores, and per loser R messages of 2 n
floats (n = 6090 for the CNN: 49 KB each). The rounds are not an epoch loop: members read the
same examples per round (the budget: --rounds x B each, 12 x 1280 for the defaults), but a member
with a bigger batch takes fewer steps; each member reads an endless stream of its own shuffled
epochs (``minidl.data.Stream``), so a round need not end at an epoch's end.

Restrictions: 2 <= M <= p with M dividing p; 0 < fraction <= 0.5. The result is the best member
at the last ranking; its test accuracy is in the last record. --save keeps every rank's member
(w, v), its place in its data stream, the hyperparameter table and the lineage, so --resume with
more --rounds on as many ranks continues bit for bit; its ``params`` is the best member's.

Default run (4 members of one rank, 12 rounds of 40 x 32 examples each, digits CNN): about two
seconds on 2 cores. How PBT compares with random search of the same budget (paired by seed, under
rules fixed before the runs, and where the difference is inside the noise) is chapter 9's
subject: tutorials/09_large_batch_and_search.md, section 3.
"""
import dataclasses
import json
import math

import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli, divergence, tags
from algorithms.core.cli import SettingError
from algorithms.core.log import Log
from algorithms.core.objective import evaluate, load_data, split_validation
from algorithms.core.run import Run, Settings, agreed, mpi_allreduce
from algorithms.core.step import data_parallel_step
from collectives.trace import CountingComm
from minidl import backend
from minidl.data import Stream

SEARCHES = ("pbt", "random", "evolution")
HYPERPARAMETERS = ("lr", "momentum", "batch_size")
PERTURB = (0.8, 1.2)                    # Jaderberg et al., section 4.1: "perturb"


# ---- the hyperparameters: the prior, and the explore step -----------------------------------------

def sample(rng):
    """One member's (lr, momentum, batch) from the prior: lr log-uniform in [1e-3, 1], momentum
    uniform in [0, 0.99], batch log-uniform in [8, 128] (rounded)."""
    return numpy.array([10 ** rng.uniform(-3, 0), rng.uniform(0, 0.99), round(2 ** rng.uniform(3, 7))])


def perturb(hyper, rng):
    """Each hyperparameter times 0.8 or 1.2 (the momentum's 1 - m, so it stays below 1; the batch
    rounded and kept in [2, 512])."""
    lr, momentum, batch = hyper
    factors = rng.choice(PERTURB, size=3)
    return numpy.array([lr * factors[0], min(max(1 - (1 - momentum) * factors[1], 0.0), 0.999),
                        min(max(round(batch * factors[2]), 2), 512)])


# ---- ready: who copies whom ---------------------------------------------------------------------

def truncation_selection(scores, fraction, rng):
    """[(loser, winner)]: the bottom q = max(1, floor(fraction M)) members by score, and every
    member whose score is NaN, each paired with a member drawn uniformly from the top q finite ones.

    Higher scores are better; ties rank the lower member index higher. No NaN member is a winner.
    Empty if no member has a finite score (the caller stops the run).
    """
    # BEGIN SOLUTION
    members = len(scores)
    q = max(1, int(fraction * members))
    finite = [m for m in range(members) if math.isfinite(scores[m])]
    ranked = sorted(finite, key=lambda m: (-scores[m], m))             # best first
    top = ranked[:q]
    if not top:
        return []
    bottom = [m for m in range(members) if m not in finite] + ranked[len(ranked) - q:]
    losers = sorted(set(bottom) - set(top))
    return [(loser, top[rng.integers(len(top))]) for loser in losers]
    # END SOLUTION


# ---- exploit and explore ------------------------------------------------------------------------

def flat_state(objective, optimizer):
    """One flat buffer [w, v]: the weights and SGD's momentum buffer (zeros before the first step
    with momentum, which is what SGD's first step would make of it)."""
    velocity = optimizer.state[0].get("momentum")
    velocity = backend.xp().zeros_like(objective.params) if velocity is None else velocity
    return backend.to_numpy(backend.xp().concatenate([objective.params, velocity]))


def load_flat_state(objective, optimizer, buffer):
    """The inverse of ``flat_state``: weights and momentum buffer from one received buffer."""
    n = objective.params.size
    objective.params[...] = backend.asarray(buffer[:n])
    optimizer.state[0]["momentum"] = backend.asarray(buffer[n:].copy())


def exploit_and_explore(comm, ranks_per_member, pairs, objective, optimizer, hyper, rng):
    """The ready step's exploit and explore (the heart) on ``comm``, the whole population.

    ``pairs``: [(loser, winner)] from ``truncation_selection``; ``hyper``: the (M, 3) table of every
    member's (lr, momentum, batch), the same on every rank, updated in place. Rank j of a winner
    sends [w, v] to rank j of each of its losers, which load it; then every rank sets each loser's
    row to the winner's, perturbed, drawing from ``rng`` in the order of ``pairs``.
    """
    # BEGIN SOLUTION
    member, piece = divmod(comm.Get_rank(), ranks_per_member)
    # exploit: the winner's ranks send their flat [w, v] (the same on all of them) to the loser's
    outgoing = [loser for loser, winner in pairs if winner == member]
    if outgoing:
        buffer = flat_state(objective, optimizer)
        requests = [comm.Isend(buffer, dest=loser * ranks_per_member + piece, tag=tags.PBT_EXPLOIT + loser)
                    for loser in outgoing]
    for loser, winner in pairs:
        if loser == member:
            received = numpy.empty(2 * objective.params.size, dtype=backend.to_numpy(objective.params).dtype)
            comm.Recv(received, source=winner * ranks_per_member + piece, tag=tags.PBT_EXPLOIT + loser)
            load_flat_state(objective, optimizer, received)
    if outgoing:
        MPI.Request.Waitall(requests)
    # explore: the loser continues with the winner's hyperparameters, perturbed (every rank alike)
    for loser, winner in pairs:
        hyper[loser] = perturb(hyper[winner], rng)
    # END SOLUTION


def check(size, population, ready, rounds, fraction, search, validation, ready_batch=32):
    cli.require("--population", population, integer=True, low=2, high=tags.PBT_MEMBERS)
    if population > size or size % population:
        raise SettingError(f"--population {population} on {size} ranks: each member is a group of ranks, so the "
                           f"member count must divide the rank count (e.g. --population {size})")
    cli.require("--ready", ready, integer=True, low=1)
    cli.require("--rounds", rounds, integer=True, low=1)
    cli.require("--ready-batch", ready_batch, integer=True, low=1)
    cli.require("--fraction", fraction, low=0, high=0.5, low_open=True)
    cli.require("--validation", validation, low=0, high=0.5, low_open=True)
    if search not in SEARCHES:
        raise SettingError(f"--search must be one of {', '.join(SEARCHES)}, got {search!r}")


def train(comm=None, population=None, ready=40, rounds=12, fraction=0.25, search="pbt", lineage=None,
          validation=0.2, ready_batch=32, **settings):
    """Population-based training (or random search) on ``comm``; returns (the best member's flat
    parameters as NumPy, the per-round history) on every rank. ``settings`` are ``run.Settings``;
    --lr, --momentum and --batch-size are not used (each member samples its own), nor --epochs
    (the budget is ``rounds`` x ``ready`` x ``ready_batch`` examples per rank of a member)."""
    comm = comm or MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    population = size if population is None else population
    with agreed(comm, catch=SettingError):  # the same checks on every rank, before any message
        if settings.pop("epochs", None) is not None:
            raise SettingError("--epochs: pbt's budget is --rounds x --ready steps per member")
        for name in HYPERPARAMETERS:
            if settings.pop(name, None) is not None:
                raise SettingError(f"--{name.replace('_', '-')}: each pbt member samples its own (see pbt.sample)")
        check(size, population, ready, rounds, fraction, search, validation, ready_batch)
        if rank == 0:
            cli.check_output("--lineage", lineage)
            cli.check_output("--log", settings.get("log"))
            checkpoint.check_save(settings.get("save"))
    per_member = size // population
    member, piece = divmod(rank, per_member)
    team = comm.Split(member, rank)             # the member's own ranks, for its synchronous SGD

    # every member: the same weights, its own data stream and optimizer (Run.start, on the team)
    settings = Settings.of(settings, epochs=rounds, partition="global")   # a checkpoint's "epoch": rounds done
    log, settings.log = settings.log, None
    state = {"--population": population, "--search": search, "--ready": ready, "--ready-batch": ready_batch,
             "--fraction": fraction, "--validation": validation}
    writer = checkpoint.Writer("pbt", state=state, layout={"ranks_per_member": size // population})
    run, held_out, resumed = None, None, None
    with agreed(comm):                      # a member that failed to start stops the whole population
        data, *held_out = split_validation(settings.data or load_data(settings.dataset, settings.seed,
                                                                       settings.data_dir), validation)
        run = Run.start(team, dataclasses.replace(settings, data=data, quiet=True, save=None, resume=None),
                        reader=(piece, per_member), writer=writer)
        initial = flat_state(run.objective, run.optimizer)  # every member's start: evolution restarts from it
        if settings.resume:                     # this rank's own member state, the shared table, the lineage
            resumed = checkpoint.resume(settings, run.objective, run.optimizer, rank, size, writer.meta(settings, size))
        logger = Log(log, rank=rank, quiet=settings.quiet)
    objective, optimizer = run.objective, run.optimizer
    stream = Stream(objective.n, settings.seed, member, piece, per_member)
    world = CountingComm(comm)
    hyper = numpy.array([sample(numpy.random.default_rng([settings.seed, 10 ** 6 + m])) for m in range(population)])
    records, first, best = [], 0, None

    def ready_step(round_, scores):
        """Ranking ``round_``'s selection, exploit and explore; returns {loser: winner}."""
        rng = numpy.random.default_rng([settings.seed, round_])
        pairs = truncation_selection(scores, fraction, rng)
        if search == "pbt":                     # ready -> exploit -> explore
            exploit_and_explore(world, per_member, pairs, objective, optimizer, hyper, rng)
        elif search == "evolution":             # offspring: a winner's h, perturbed, from scratch
            for loser, winner in pairs:
                hyper[loser] = perturb(hyper[winner], rng)
                if loser == member:
                    load_flat_state(objective, optimizer, initial.copy())
        return dict(pairs) if search != "random" else {}

    if resumed is not None:                     # the saved run's last ranking had no ready step: do it now
        (stream.epoch, stream.position), hyper = resumed["stream"].tolist(), resumed["hyper"].copy()
        stream.order, records = stream.shuffle(), json.loads(str(resumed["lineage"]))
        first, best = int(resumed["epoch"]), int(resumed["best"])
        if first < rounds:
            parents = ready_step(first - 1, [member_record["score"] for member_record in records[-1]])
            for member_record in records[-1]:
                member_record["parent"] = parents.get(member_record["member"], member_record["member"])
    budget = ready * ready_batch * per_member  # examples per member and round, whatever its batch

    for round_ in range(first, rounds):
        # train: synchronous SGD with this member's hyperparameters until it has read this round's
        # budget of examples (a bigger batch takes fewer steps; the last step may be smaller)
        optimizer.lr, optimizer.momentum = float(hyper[member, 0]), float(hyper[member, 1])
        examples = 0
        with numpy.errstate(over="ignore", invalid="ignore", divide="ignore"):    # a NaN member is replaced
            while examples < budget:
                batch = stream.next(int(hyper[member, 2]), limit=budget - examples)
                data_parallel_step(run.counting, objective, optimizer, batch, mpi_allreduce)
                examples += batch.total
            loss, accuracy = evaluate(objective.net, *held_out)
        # eval: every rank learns every member's held-out score (minus the loss: accuracy ties on
        # the few held-out rows once members are good)
        score = -loss if math.isfinite(loss) else math.nan
        scores, accuracies, read = zip(*comm.allgather((score, accuracy, examples))[::per_member])
        if not any(math.isfinite(value) for value in scores):
            raise divergence.Diverged(f"every member diverged by round {round_ + 1}; lower the prior's lr")
        before = hyper.copy()
        parents = ready_step(round_, scores) if round_ < rounds - 1 else {}     # none after the last ranking
        records.append([{"round": round_ + 1, "member": m, "score": scores[m], "accuracy": accuracies[m],
                         "parent": parents.get(m, m), "examples": read[m],
                         **dict(zip(HYPERPARAMETERS, before[m].tolist()))} for m in range(population)])
        best = max((m for m in range(population) if math.isfinite(scores[m])), key=lambda m: (scores[m], -m))
        logger.epoch(round=round_ + 1, examples=(round_ + 1) * budget, best_member=best,
                     best_held_out_loss=-scores[best],
                     held_out_accuracy=[round(value, 4) for value in accuracies], copied=len(parents),
                     bytes=int(comm.allreduce(world.bytes_sent + run.counting.bytes_sent)))

    # the result: the best member at the last ranking, sent to every rank, scored on the test set
    own = backend.to_numpy(objective.params).copy()   # this member's: --save keeps it for --resume
    params = own.copy()
    comm.Bcast(params, root=best * per_member)
    objective.params[...] = backend.asarray(params)
    test_loss, test_accuracy = evaluate(objective.net, objective.data.x_test, objective.data.y_test)
    logger.epoch(best_member=best, test_loss=test_loss, test_accuracy=test_accuracy, search=search)
    logger.close()
    if settings.save:                           # each rank's member and stream, the table and the lineage
        objective.params[...] = backend.asarray(own)
        checkpoint.write(comm, settings.save, params, optimizer, rounds, meta=writer.meta(settings, size),
                         own={"params": objective.params, "stream": numpy.array([stream.epoch, stream.position])},
                         shared={"hyper": hyper, "best": numpy.array(best),
                                 "lineage": numpy.array(json.dumps(records))})
    if rank == 0 and lineage:
        with open(lineage, "w") as file:
            json.dump({"search": search, "population": population, "ready": ready, "ready_batch": ready_batch,
                       "rounds": rounds,
                       "fraction": fraction, "seed": settings.seed, "members": records}, file)
    team.Free()
    return params, logger.history


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], epochs=None, lr=None, batch_size=None, momentum=None)
    parser.add_argument("--population", type=int, default=None, help="members (default: one per rank)")
    parser.add_argument("--ready", type=int, default=40,
                        help="a round (between rankings) is the examples of this many steps at --ready-batch")
    parser.add_argument("--ready-batch", type=int, default=32,
                        help="batch per rank that defines a round's examples (members' own batches vary)")
    parser.add_argument("--rounds", type=int, default=12,
                        help="rankings; the budget is rounds x ready x ready-batch examples per member rank")
    parser.add_argument("--fraction", type=float, default=0.25, help="bottom and top fraction of truncation selection")
    parser.add_argument("--search", default="pbt", choices=SEARCHES,
                        help="random: the same population and budget, no exploit or explore; evolution: "
                             "the losers restart from the initial weights with a winner's perturbed h")
    parser.add_argument("--validation", type=float, default=0.2, help="fraction of the training rows held out")
    parser.add_argument("--lineage", default=None, help="write every member's history as JSON")
    args = parser.parse_args(argv)
    cli.run_main(train, args, population=args.population, ready=args.ready, rounds=args.rounds,
                 fraction=args.fraction, search=args.search, validation=args.validation, lineage=args.lineage,
                 ready_batch=args.ready_batch)


if __name__ == "__main__":
    main()
