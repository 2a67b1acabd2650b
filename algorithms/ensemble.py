"""Ensemble: p independent models, one per rank; their predictions are averaged at evaluation.

    mpiexec -n 4 python -m algorithms.ensemble

Papers: Ben-Nun & Hoefler 2019 (the inconsistent end of the consistency spectrum:
"ensemble learning", the members' outputs averaged); Hegde & Usmani 2016, section 3.2 (train a
model per node and keep the average or the best).

Member r is serial SGD with seed + r: its own initial weights and its own epoch order
(``common.rank_batches`` partition "replicated": every member sees all rows), the same data
split. Member 0 is therefore exactly ``algorithms.serial_sgd``. In the code's names
(``ensemble_predict``):

    train:    no communication at all                       (independent serial SGD runs)
    predict:  probabilities_r = softmax(member_r(x))         (len(x), classes) on each rank
              probabilities   = (1/p) sum_r probabilities_r  (one allreduce)

Averaging predictions, unlike averaging parameters (model_averaging.py), needs no agreement
between the members' weights: networks from different initialisations are far apart in weight
space and their parameter average is useless, but their averaged outputs are usually better than
any one of them.

Communication: none while training; one allreduce of len(x) * classes floats per evaluation
(the 360 test images x 10 classes: 14 KB in float32), counted in ``bytes``. The log reports the
ensemble's test accuracy and ``member_accuracy``, the mean of the members' own accuracies.

Restrictions: p <= number of training examples (checked like the others, though every member
sees all rows). Costs p times the computation of one model for (ideally) one model's wall time.

Default run (small CNN, embedded digits, 10 epochs, batch 32, lr 0.05, momentum 0.9), measured on
2 shared cores: p = 4 members reach 99.4% test accuracy together (98.8% each on average) in 4-8 s.
"""
from mpi4py import MPI

from algorithms import common
from minidl import backend


def ensemble_predict(comm, objective, x, allreduce):
    """The members' mean prediction on ``x`` (the heart), the same on every rank."""
    probabilities = objective.predict(x)                  # this member's, (len(x), classes)
    total = probabilities.reshape(-1).copy()              # one contiguous buffer for the allreduce
    allreduce(comm, total)
    return total.reshape(probabilities.shape) / comm.Get_size()


def train(comm=None, dataset="digits", model="cnn", epochs=10, lr=0.05, momentum=0.9, batch_size=32,
          seed=0, allreduce="ring", partition="replicated", log=None, save=None, resume=None, quiet=False,
          data=None, data_dir=None, problem=None, check_every=1):
    """Train one member per rank; returns (this rank's member's parameters as NumPy, per-epoch history)."""
    comm = comm or MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    common.check_common(epochs, lr, batch_size, momentum)
    average = common.allreduce_function(allreduce)
    run = common.start_run(comm, model=model, dataset=dataset, seed=seed, data=data, data_dir=data_dir,
                           problem=problem, lr=lr, momentum=momentum, batch_size=batch_size, resume=resume,
                           log=log, quiet=quiet, check_every=check_every,
                           model_seed=seed + rank)                 # member r: its own initial weights
    objective, optimizer = run.objective, run.optimizer
    step = 0
    for epoch in range(run.first_epoch, epochs):
        loss_sum, rows = 0.0, 0
        for batch in common.rank_batches(objective.n, batch_size, rank, size, seed, epoch, partition,
                                         objective.labels):
            loss = objective.loss_and_grad(batch.index)   # member r: plain serial SGD
            optimizer.step()
            run.finite(loss, step)
            loss_sum += loss * len(batch.index)
            rows += len(batch.index)
            step += 1
        run.finite.agree()
        record = {"epoch": epoch + 1, "train_loss": common.epoch_mean(comm, loss_sum, rows)}
        record.update(evaluate_ensemble(comm, run.counting, objective, average))
        record["bytes"] = run.counting.total_bytes()
        run.logger.epoch(**record)
    return run.finish(save, epochs, each_rank=True)              # every member saves its own file


def evaluate_ensemble(comm, counting, objective, allreduce):
    """Test metrics of the averaged prediction (its allreduce counted on ``counting``), and the
    members' mean accuracy (an evaluation-only reduction on ``comm``, not counted)."""
    own = objective.evaluate()
    if not hasattr(objective, "data"):                   # a convex problem: no classes to vote on
        return own
    probabilities = ensemble_predict(counting, objective, objective.data.x_test, allreduce)
    labels = backend.asarray(objective.data.y_test)
    picked = probabilities[backend.xp().arange(len(labels)), labels]
    member = common.epoch_mean(comm, own["test_accuracy"], 1)      # sum over ranks / p
    return {"test_loss": float(-backend.xp().log(backend.xp().maximum(picked, 1e-300)).mean()),
            "test_accuracy": objective.score(probabilities), "member_accuracy": member}


def main(argv=None):
    parser = common.parallel_parser(__doc__.splitlines()[0], partition="replicated", epochs=10, lr=0.05,
                                    momentum=0.9)
    args = parser.parse_args(argv)
    common.run_main(train, args, allreduce=args.allreduce)


if __name__ == "__main__":
    main()
