"""Hogwild!: lock-free SGD by several processes on one parameter vector in shared memory.

    mpiexec -n 4 python -m algorithms.hogwild                       # sparse logistic regression
    mpiexec -n 4 python -m algorithms.hogwild --problem dense       # the small CNN on the digits

F. Niu, B. Recht, C. Re, S. Wright, *HOGWILD!: A Lock-Free Approach to Parallelizing Stochastic
Gradient Descent*, NIPS 2011, Algorithm 1; the asynchronous end of Ben-Nun & Hoefler's spectrum.
The vector w lives once, in an MPI-3 shared-memory window (``MPI.Win.Allocate_shared``) that every
process of the machine maps; each process, without any lock (``hogwild_step``):

    pick a sample e (its own share of this epoch's permutation)
    read   w_e                        the coordinates e touches (others may be writing them)
    g_e  = gradient of f_e at w_e     nonzero only on e
    write  w_v <- w_v - lr * g_v  for v in e

The paper's argument: when each f_e touches few coordinates (sparse e), two processes rarely
write the same coordinate at the same time, so skipping the locks costs almost nothing and the
run converges nearly like serial SGD. Its measures of sparsity: Delta = the largest fraction of
samples that share one coordinate, rho = the largest fraction of samples whose support meets a
given sample's. ``--problem sparse`` (the default) is such a case: L2-regularised logistic
regression where each of n samples has ``--nnz`` nonzeros among ``--features`` coordinates.
``--problem dense`` runs the CNN instead: every gradient touches every weight (Delta = rho = 1),
so every pair of concurrent updates collides; the run shows what that costs.

Not quite the paper: the paper assumes each component-wise update w_v -= lr g_v is atomic;
NumPy's ``w[e] -= lr * g`` reads then writes, so a concurrent write in between can be lost.
That is the honest lock-free version available from Python; for sparse e it is rare.

Staleness: each process counts its updates in a shared slot of its own (single writer, no lock);
an update's staleness is how many updates by the others landed between its read and its write.
The regulariser is split over the samples as in the paper's sparse SVM, so each step stays on e:
f_e(w) = log(1 + exp(x_e.w)) - y_e x_e.w + sum_{v in e} (n l2 / (2 deg_v)) w_v^2, with deg_v the
number of samples touching v, so that (1/n) sum_e f_e(w) = the mean logistic loss + l2/2 ||w||^2.
The learning rate decays by ``--lr-decay`` each epoch (as in the paper's experiments).

Restrictions: every rank on one machine (the window is shared memory); any number of ranks.
Communication: none per step (loads and stores to shared memory); a barrier per epoch for the log.

Defaults (n 5000 samples, 500 features, 10 nonzeros each, lr 0.5 decaying by 0.8 per epoch, 15
epochs, one sample per update): measured on 2 shared cores at -n 4, F(w) - F(w*) = 3.2e-4 to 3.6e-4
and ||w - w*|| / ||w*|| = 0.034 to 0.036 (one process: 3.2e-4 and 0.034), in about 4 seconds with
the Newton solve for w*. ``--problem dense`` (CNN, lr 0.05, batch 32, 10 epochs): 87% to 90% test
accuracy at -n 4 against 96.1% with one process (which is serial SGD exactly).
"""
import dataclasses
import time

import numpy
from mpi4py import MPI

from algorithms import common
from minidl.data import epoch_order
from minidl import backend, data as datasets
from minidl.flat import flatten


# ---- the sparse problem ---------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class SparseLogistic:
    """n samples with ``nnz`` nonzeros each: columns ``index`` (n, nnz), values ``value`` (n, nnz)."""
    index: numpy.ndarray
    value: numpy.ndarray
    y: numpy.ndarray
    features: int
    l2: float
    w_star: numpy.ndarray = None

    def __post_init__(self):
        self.degree = numpy.bincount(self.index.ravel(), minlength=self.features)
        # per-coordinate weight of the split regulariser: n l2 / deg_v (0 where no sample touches v)
        self.reg = numpy.where(self.degree > 0, len(self.y) * self.l2 / numpy.maximum(self.degree, 1), 0.0)

    @property
    def n(self):
        return len(self.y)

    def dense(self):
        x = numpy.zeros((self.n, self.features))
        numpy.add.at(x, (numpy.arange(self.n)[:, None], self.index), self.value)
        return x

    def loss(self, w):
        """F(w) = mean_e [log(1 + exp(z_e)) - y_e z_e] + l2/2 ||w||^2, z_e = x_e . w."""
        z = (self.value * w[self.index]).sum(axis=1)
        return float(numpy.mean(numpy.logaddexp(0.0, z) - self.y * z)) + 0.5 * self.l2 * float(w @ w)

    def sample_grad(self, w_e, e):
        """grad of f_e on its support, given w_e = w[index[e]]."""
        z = float(self.value[e] @ w_e)
        sigma = 1.0 / (1.0 + numpy.exp(-z)) if z >= 0 else numpy.exp(z) / (1.0 + numpy.exp(z))
        return (sigma - self.y[e]) * self.value[e] + self.reg[self.index[e]] * w_e

    def conflicts(self):
        """(Delta, an upper bound on rho) of Niu et al.: how often two samples share a coordinate."""
        delta = self.degree.max() / self.n
        rho = (self.degree[self.index].sum(axis=1).max()) / self.n
        return float(delta), float(min(rho, 1.0))


def sparse_logistic_regression(n, features, nnz, rng, l2=1e-3):
    """A random sparse problem, and its optimum w_star by Newton's method on the dense form."""
    if not (1 <= nnz <= features):
        raise ValueError(f"--nnz must lie in [1, --features], got {nnz}")
    index = numpy.stack([rng.choice(features, nnz, replace=False) for _ in range(n)])
    value = rng.standard_normal((n, nnz))
    w_true = rng.standard_normal(features)
    z = (value * w_true[index]).sum(axis=1)
    y = (rng.random(n) < 1.0 / (1.0 + numpy.exp(-z))).astype(numpy.float64)
    problem = SparseLogistic(index, value, y, features, l2)
    x = problem.dense()
    w = numpy.zeros(features)
    for _ in range(50):                                     # Newton: the loss is strongly convex
        p = 1.0 / (1.0 + numpy.exp(-(x @ w)))
        grad = x.T @ (p - y) / n + l2 * w
        if numpy.linalg.norm(grad) < 1e-12:
            break
        hess = (x.T * (p * (1 - p))) @ x / n + l2 * numpy.eye(features)
        step = numpy.linalg.solve(hess, grad)
        t = 1.0
        while problem.loss(w - t * step) > problem.loss(w) and t > 1e-8:
            t *= 0.5
        w = w - t * step
    problem.w_star = w
    return problem


# ---- the update: the heart of Hogwild! ----------------------------------------------------------

def hogwild_step(w, problem, e, lr):
    """One lock-free update by one process on the shared vector w (Niu et al., Algorithm 1)."""
    support = problem.index[e]
    w_e = w[support]                                # read w_e: no lock, others may be writing
    g_e = problem.sample_grad(w_e, e)               # gradient of f_e, nonzero only on e
    w[support] -= lr * g_e                          # write w_v -= lr g_v for v in e (read-modify-write)


def hogwild_dense_step(w, net, flat, x, y, lr):
    """The same on a dense model: read all of w, compute the batch gradient, write all of w."""
    flat.data[...] = backend.asarray(w)             # read w (a copy; other processes keep writing)
    flat.zero_grad()
    loss = common.loss_and_grad(net, x, y)
    w -= lr * backend.to_numpy(flat.grad)           # write every coordinate: every update collides
    return loss


# ---- shared memory --------------------------------------------------------------------------------

def shared_array(node, n, dtype):
    """An n-element array in a window that every rank of ``node`` maps (rank 0 allocates it)."""
    itemsize = numpy.dtype(dtype).itemsize
    window = MPI.Win.Allocate_shared(n * itemsize if node.rank == 0 else 0, itemsize, comm=node)
    buffer, _ = window.Shared_query(0)
    return window, numpy.ndarray(buffer=buffer, dtype=dtype, shape=(n,))


def wait_for_all(comm):
    """A barrier that sleeps instead of spinning (ranks share cores)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.001)


def train(comm=None, problem="sparse", dataset="digits", model="cnn", epochs=None, lr=None, batch_size=None,
          seed=0, lr_decay=None, n_samples=5000, features=500, nnz=10, l2=1e-3, log=None, save=None, resume=None,
          quiet=False, data=None, data_dir=None, sparse=None):
    """Hogwild! on ``comm``; returns (final shared w as NumPy, per-epoch history) on every rank.

    ``sparse`` may pass a ready ``SparseLogistic`` problem (tests); otherwise one is drawn from ``seed``.
    Unset epochs / lr / batch_size / lr_decay take the defaults of ``problem``.
    """
    comm = comm if comm is not None else MPI.COMM_WORLD
    if problem not in ("sparse", "dense"):
        raise ValueError(f"--problem must be 'sparse' or 'dense', got {problem!r}")
    defaults = {"sparse": (15, 0.5, 1, 0.8), "dense": (10, 0.05, 32, 1.0)}[problem]
    epochs, lr, batch_size, lr_decay = [given if given is not None else default for given, default in
                                        zip((epochs, lr, batch_size, lr_decay), defaults)]
    common.check_common(epochs, lr, batch_size)
    if not 0 < lr_decay <= 1:
        raise ValueError(f"--lr-decay must lie in (0, 1], got {lr_decay!r}")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    on_one_machine = node.size == comm.size
    if not on_one_machine:
        node.Free()
        raise ValueError("Hogwild! shares memory: every rank must run on one machine")

    if problem == "sparse":
        if sparse is None:     # drawn (and solved by Newton) once, on rank 0
            sparse = comm.bcast(sparse_logistic_regression(n_samples, features, nnz, numpy.random.default_rng(seed), l2)
                                if comm.rank == 0 else None, root=0)
        n, dtype, initial = sparse.n, numpy.float64, numpy.zeros(sparse.features)
        best = sparse.loss(sparse.w_star)
    else:
        net = common.build_model(model, seed, dataset)
        flat = flatten(net)
        data = data or common.load_data(dataset, seed, data_dir)
        n, dtype, initial = len(data.x_train), backend.to_numpy(flat.data).dtype, backend.to_numpy(flat.data)
    if n < comm.size:
        raise ValueError(f"{n} samples cannot feed {comm.size} processes")
    first_epoch = 0
    if resume:
        with numpy.load(resume, allow_pickle=False) as archive:
            initial, first_epoch = archive["params"], int(archive["epoch"])
            if initial.shape != (len(initial),) or len(initial) != (sparse.features if problem == "sparse" else flat.size):
                raise ValueError(f"--resume {resume}: has {initial.size} parameters, the problem has another count")

    w_window, w = shared_array(node, len(initial), dtype)
    count_window, updates = shared_array(node, comm.size, numpy.int64)   # updates[r]: rank r's writes so far
    w_window.Lock_all()
    count_window.Lock_all()
    if comm.rank == 0:
        w[...] = initial
        updates[...] = 0
    w_window.Sync()
    wait_for_all(comm)
    w_window.Sync()

    logger = common.Log(log, rank=comm.rank, quiet=quiet, name="hogwild")
    for epoch in range(first_epoch, epochs):
        rate = lr * lr_decay ** epoch
        mine = epoch_order(n, seed, epoch)[datasets.shard(n, comm.rank, comm.size)]
        staleness, loss_sum, batches = [], 0.0, 0
        for batch in datasets.batches(len(mine), batch_size):
            others_seen = int(updates.sum() - updates[comm.rank])   # the others' updates before this read
            if problem == "sparse":
                for e in mine[batch]:
                    hogwild_step(w, sparse, e, rate)
            else:
                index = mine[batch]
                loss = hogwild_dense_step(w, net, flat, data.x_train[index], data.y_train[index], rate)
                common.check_finite(loss, batches, comm.rank)
                loss_sum += loss
            staleness.append(int(updates.sum() - updates[comm.rank]) - others_seen)   # ... and before the write
            updates[comm.rank] += 1
            batches += 1
        w_window.Sync()
        gathered = comm.gather((staleness, loss_sum, batches), root=0)
        w_window.Sync()
        if comm.rank == 0:
            stale = numpy.concatenate([numpy.asarray(s, dtype=numpy.int64) for s, _, _ in gathered])
            record = {"epoch": epoch + 1}
            if problem == "sparse":
                current = w.copy()
                record.update(loss=sparse.loss(current), loss_gap=sparse.loss(current) - best,
                              distance=float(numpy.linalg.norm(current - sparse.w_star) / numpy.linalg.norm(sparse.w_star)))
            else:
                flat.data[...] = backend.asarray(w)
                test_loss, accuracy = common.evaluate(net, data.x_test, data.y_test)
                record.update(train_loss=sum(l for _, l, _ in gathered) / max(sum(b for _, _, b in gathered), 1),
                              test_loss=test_loss, test_accuracy=accuracy)
            record.update(updates=int(stale.size), staleness_mean=float(stale.mean()), staleness_max=int(stale.max()))
            logger.epoch(**record)
        wait_for_all(comm)                                     # nobody writes while rank 0 evaluates
    logger.close()
    w_window.Sync()
    result = w.copy()
    wait_for_all(comm)
    if save and comm.rank == 0:
        numpy.savez(save, params=result, epoch=numpy.asarray(epochs))
    history = comm.bcast(logger.history, root=0)
    count_window.Unlock_all()
    w_window.Unlock_all()
    count_window.Free()
    w_window.Free()
    node.Free()
    return result, history


def main(argv=None):
    parser = common.parser(__doc__.splitlines()[0], epochs=None, lr=None, batch_size=None)
    parser.add_argument("--problem", default="sparse", choices=["sparse", "dense"],
                        help="sparse: logistic regression with --nnz nonzeros per sample; dense: --model on --dataset")
    parser.add_argument("--lr-decay", type=float, default=None, help="lr <- lr * decay after each epoch")
    parser.add_argument("--n-samples", type=int, default=5000)
    parser.add_argument("--features", type=int, default=500)
    parser.add_argument("--nnz", type=int, default=10, help="nonzeros per sample (sparse problem)")
    args = parser.parse_args(argv)
    try:
        train(problem=args.problem, dataset=args.dataset, data_dir=args.data_dir, model=args.model,
              epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, seed=args.seed, lr_decay=args.lr_decay,
              n_samples=args.n_samples, features=args.features, nnz=args.nnz, log=args.log, save=args.save,
              resume=args.resume, quiet=args.quiet)
    except (ValueError, FloatingPointError) as error:
        common.fail(error)


if __name__ == "__main__":
    main()
