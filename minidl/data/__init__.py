"""Data for minidl: the embedded digits, an IDX (MNIST) reader, synthetic convex problems,
rank sharding and mini-batching.

Everything here is plain NumPy on the host; training code moves each batch to the backend.

    load_digits()                        embedded UCI digits: float32 (1797, 1, 8, 8), int64 (1797,)
    train_test_split(x, y, 0.2, rng)     seeded random split -> x_train, y_train, x_test, y_test
    digits_split(seed=0)                 the two above together
    read_idx(path), load_mnist(dir)      MNIST / Fashion-MNIST files the user already has
    least_squares(n, d, rng)             convex problems with a known optimum w_star
    logistic_regression(n, d, rng)
    sparse_logistic_regression(n, d, nnz, rng)   Hogwild's sparse problem (nnz nonzeros per row)
    shard(n, rank, size)                 the contiguous block of rows this rank owns
    shard_sizes(n, size)
    batches(n, batch_size, rng)          one epoch of (shuffled) mini-batch index arrays
    epoch_order(n, seed, epoch)          serial SGD's permutation of the rows in an epoch
    rank_batches(n, b, rank, size, ...)  this rank's Batch(index, total) for each step of an epoch
    Stream(n, seed, member, piece, pieces)  endless batches of changing size (population-based training)

The modules: digits.py (the embedded set and the split), idx.py (the IDX reader), synthetic.py (the
convex problems), sharding.py (shards, batches, the stream), _checks.py (argument checks they share).
"""
from minidl.data.digits import digits_split, load_digits, train_test_split
from minidl.data.idx import load_mnist, read_idx
from minidl.data.sharding import PARTITIONS, Batch, Stream, batches, epoch_order, rank_batches, shard, shard_sizes
from minidl.data.synthetic import (
    LeastSquares,
    LogisticRegression,
    SparseLogistic,
    least_squares,
    logistic_regression,
    sparse_logistic_regression,
)

__all__ = [
    "load_digits", "train_test_split", "digits_split",
    "read_idx", "load_mnist",
    "least_squares", "logistic_regression", "LeastSquares", "LogisticRegression",
    "sparse_logistic_regression", "SparseLogistic",
    "shard", "shard_sizes", "batches", "epoch_order", "Batch", "rank_batches", "PARTITIONS", "Stream",
]
