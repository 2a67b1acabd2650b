"""Ensemble: p independent models, one per rank; their predictions are averaged at evaluation.

    mpiexec -n 4 python -m algorithms.ensemble

Papers: Ben-Nun & Hoefler 2019 (the inconsistent end of the consistency spectrum:
"ensemble learning", the members' outputs averaged); Hegde & Usmani 2016, section 3.2 (train a
model per node and keep the average or the best).

Member r is serial SGD with seed + r: its own initial weights and its own epoch order
(``minidl.data.rank_batches`` partition "replicated": every member sees all rows), the same data
split. Member 0 is therefore exactly ``algorithms.serial_sgd``. In the code's names
(``ensemble_predict``):

    train:    no communication at all                       (independent serial SGD runs)
    predict:  probabilities_r = softmax(member_r(x))         (len(x), classes) on each rank
              probabilities   = (1/p) sum_r probabilities_r  (one allreduce)

Averaging predictions, unlike averaging parameters (model_averaging.py), needs no agreement
between the members' weights: networks from different initialisations are far apart in weight
space and their parameter average is useless, but their averaged outputs are usually better than
any one of them.

Communication: none between epoch ends (the non-finite-loss agreement, divergence.FiniteCheck, runs
once per epoch here: --check-every 0); at each epoch's end one 8-byte agreement and one allreduce
of len(x) * classes floats for the evaluation (the 359 test images x 10 classes: 14 KB in
float32), both counted in ``bytes``. The log reports the
ensemble's test accuracy and ``member_accuracy``, the mean of the members' own accuracies.

Restrictions: p <= number of training examples (checked like the others, though every member
sees all rows). Costs p times the computation of one model for (ideally) one model's wall time.

Default run (the defaults ``--help`` shows), measured on 2 shared cores: p = 4 members reach 99.4% test
accuracy together (98.8% each on average) in 4-8 s.
"""
from mpi4py import MPI

from algorithms.core import checkpoint, cli
from algorithms.core.run import Run, Settings, allreduce_function, epoch_mean
from algorithms.serial_sgd import sgd_step
from minidl import backend

COMPARE = True       # python -m algorithms.compare runs it beside the other data-parallel algorithms
# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=10, momentum=0.9, partition="replicated", check_every=0)


def ensemble_predict(comm, objective, x, allreduce):
    """The members' mean prediction on ``x`` (the heart), the same on every rank."""
    # BEGIN SOLUTION
    probabilities = objective.predict(x)                  # this member's, (len(x), classes)
    total = probabilities.reshape(-1).copy()              # one contiguous buffer for the allreduce
    allreduce(comm, total)                                # sum over members
    mean = total.reshape(probabilities.shape) / comm.Get_size()
    # END SOLUTION
    return mean


def evaluate_ensemble(comm, counting, objective, allreduce):
    """Test metrics of the averaged prediction (its allreduce counted on ``counting``), and the
    members' mean accuracy (an evaluation-only reduction on ``comm``, not counted)."""
    own = objective.evaluate()
    if not hasattr(objective, "predict"):                 # a convex problem: no classes to vote on
        return own
    probabilities = ensemble_predict(counting, objective, objective.data.x_test, allreduce)
    xp = backend.xp()
    labels = backend.asarray(objective.data.y_test)
    picked = probabilities[xp.arange(len(labels)), labels]
    return {"test_loss": float(-xp.log(xp.maximum(picked, 1e-300)).mean()),
            "test_accuracy": float((probabilities.argmax(axis=1) == labels).mean()),
            "member_accuracy": epoch_mean(comm, own["test_accuracy"], 1)}     # sum over ranks / p


def train(comm=None, allreduce="ring", **settings):
    """Train one member per rank; returns (this rank's member's parameters as NumPy, per-epoch history).

    --save writes one file: ``params`` is member 0's, ``rank.params`` holds every member (row r).
    """
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)
    run = Run.start(comm, settings, check=lambda _: allreduce_function(allreduce),
                    model_seed=settings.seed + comm.Get_rank(), replicated=False,
                    writer=checkpoint.Writer("ensemble"))   # member r: its own weights
    summed = allreduce_function(allreduce)
    return run.loop(lambda batch: sgd_step(run.objective, run.optimizer, batch),     # member r: serial SGD
                    evaluate=lambda: evaluate_ensemble(comm, run.counting, run.objective, summed))


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], allreduce="ring", **DEFAULTS)
    args = parser.parse_args(argv)
    cli.run_main(train, args, allreduce=args.allreduce)


if __name__ == "__main__":
    main()
