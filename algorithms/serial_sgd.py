"""Serial SGD: the baseline every distributed algorithm is tested against.

    python -m algorithms.serial_sgd [--model cnn] [--epochs 10] [--lr 0.05] [--batch-size 32]

The update (Ben-Nun & Hoefler 2019; with momentum as in ``minidl.optim.SGD``):

    for each epoch: order = epoch_order(n, seed, epoch)   (a permutation from Generator((seed, epoch)))
        for each batch B of batch_size examples:
            grad = (1/|B|) sum_{i in B} d loss(w; x_i, y_i) / dw
            w    <- w - lr * grad

Default run (the defaults ``--help`` shows: the small CNN on the embedded 8x8 digits, 1438 training / 359 test
images), measured on 2 cores: 98.9% test accuracy in about 1 second (the test suite checks >= 95% with this
seed). ``--recompute`` runs the model in about sqrt(layers) checkpointed segments (``minidl.recompute``):
bitwise the same parameters, fewer activations kept.
"""
from mpi4py import MPI

from algorithms.core import checkpoint, cli
from algorithms.core.run import Run, Settings

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=10, momentum=0.9)


def sgd_step(objective, optimizer, batch):
    """One serial SGD step (the heart): the mean gradient over the batch, then w <- w - lr * grad."""
    # BEGIN SOLUTION
    loss = objective.loss_and_grad(batch.index)     # grad = (1/|B|) sum_{i in B} d loss_i / dw
    optimizer.step()                                # w <- w - lr * grad (with momentum: through v)
    # END SOLUTION
    return loss


def train(comm=None, **settings):
    """Train serially; returns (final flat parameters as a NumPy array, per-epoch history).

    ``comm`` is accepted for a uniform interface and ignored: serial SGD is one process
    (``MPI.COMM_SELF``). ``settings`` are ``run.Settings``; the batches are
    ``minidl.data.rank_batches`` with one rank, i.e. epoch_order(n, seed, epoch) cut into batches.
    """
    settings = Settings.of(settings, **DEFAULTS)
    run = Run.start(MPI.COMM_SELF, settings, writer=checkpoint.Writer("serial_sgd", checkpoint.SGD_FAMILY))
    return run.loop(lambda batch: sgd_step(run.objective, run.optimizer, batch))


def main(argv=None):
    args = cli.parser(__doc__.splitlines()[0], recompute=True, **DEFAULTS).parse_args(argv)
    cli.run_main(train, args)


if __name__ == "__main__":
    main()
