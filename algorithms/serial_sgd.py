"""Serial SGD: the baseline every distributed algorithm is tested against.

    python -m algorithms.serial_sgd [--model cnn] [--epochs 10] [--lr 0.05] [--batch-size 32]

The update (Ben-Nun & Hoefler 2018; with momentum as in ``minidl.optim.SGD``):

    for each epoch: shuffle the training set with Generator(seed + epoch)
        for each batch B of batch_size examples:
            grad = (1/|B|) sum_{i in B} d loss(w; x_i, y_i) / dw
            w    <- w - lr * grad

Defaults: the small CNN on the embedded 8x8 digits (1437 training / 360 test images), 10 epochs,
lr 0.05, momentum 0.9, batch 32. Measured on 2 cores: 98.9% test accuracy in about 1 second
(the test suite checks >= 95% with this seed).
"""
import numpy

from algorithms import common
from minidl import backend, data as datasets
from minidl.flat import flatten
from minidl.optim import SGD


def epoch_order(n, seed, epoch):
    """The order of the n training examples in ``epoch``: a permutation from Generator((seed, epoch))."""
    return numpy.random.default_rng([seed, epoch]).permutation(n)


def train(comm=None, dataset="digits", model="cnn", epochs=10, lr=0.05, momentum=0.9, batch_size=32,
          seed=0, log=None, save=None, resume=None, quiet=False, data=None, data_dir=None):
    """Train serially; returns (final flat parameters as a NumPy array, per-epoch history).

    ``comm`` is accepted for a uniform interface and ignored (one process).
    """
    common.check_common(epochs, lr, batch_size, momentum)
    data = data or common.load_data(dataset, seed, data_dir)
    net = common.build_model(model, seed, dataset)
    flat = flatten(net)
    optimizer = SGD([flat.as_parameter()], lr=lr, momentum=momentum)
    first_epoch = common.load_checkpoint(resume, flat, optimizer) if resume else 0
    logger = common.Log(log, quiet=quiet)
    step = 0
    for epoch in range(first_epoch, epochs):
        order = epoch_order(len(data.x_train), seed, epoch)
        train_loss = 0.0
        batches = 0
        for batch in datasets.batches(len(order), batch_size):
            index = order[batch]
            flat.zero_grad()
            loss = common.loss_and_grad(net, data.x_train[index], data.y_train[index])
            common.check_finite(loss, step, rank=0)
            optimizer.step()
            train_loss += loss
            batches += 1
            step += 1
        test_loss, accuracy = common.evaluate(net, data.x_test, data.y_test)
        logger.epoch(epoch=epoch + 1, train_loss=train_loss / max(batches, 1), test_loss=test_loss,
                     test_accuracy=accuracy)
    logger.close()
    if save:
        common.save_checkpoint(save, flat.data, optimizer, epochs)
    return backend.to_numpy(flat.data).copy(), logger.history


def main(argv=None):
    args = common.parser(__doc__.splitlines()[0], epochs=10, lr=0.05, momentum=0.9).parse_args(argv)
    try:
        train(dataset=args.dataset, data_dir=args.data_dir, model=args.model, epochs=args.epochs,
              lr=args.lr, momentum=args.momentum, batch_size=args.batch_size, seed=args.seed,
              log=args.log, save=args.save, resume=args.resume, quiet=args.quiet)
    except (ValueError, FloatingPointError) as error:
        common.fail(error)


if __name__ == "__main__":
    main()
