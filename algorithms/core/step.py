"""One synchronous data-parallel step: the step of allreduce SGD, of each member team of
population-based training and of the bench against PyTorch DDP.

    loss = data_parallel_step(comm, objective, optimizer, batch, allreduce)

Every rank computes the gradient of its piece of the global batch, weighted by the piece's share
of the batch's rows, the allreduce sums the weighted gradients in place, and every rank applies the
same update: the gradient of the whole global batch, so the replicas never drift apart. The paper,
the picture and the cost are in algorithms/allreduce_sgd.py's header.
"""


def data_parallel_step(comm, objective, optimizer, batch, allreduce):
    """One synchronous step (the heart): local gradient, weighted, summed over ranks, same update everywhere.

    Returns this rank's mean loss on its piece (0.0 for an empty piece).
    """
    # BEGIN SOLUTION
    # local gradient on this rank's piece of the global batch
    if len(batch.index):
        loss = objective.loss_and_grad(batch.index)
        objective.grad *= len(batch.index) / batch.total   # this rank's share of the global mean
    else:                                                  # a rank with no rows in the last batch
        loss = 0.0
        objective.grad[...] = 0
    # sum over ranks: grad <- (1/total) sum over the whole global batch, on every rank
    allreduce(comm, objective.grad)
    # the same update on every rank: w <- w - lr * grad (with momentum: through v)
    optimizer.step()
    # END SOLUTION
    return loss
