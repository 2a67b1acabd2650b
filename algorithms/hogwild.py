"""Hogwild!: lock-free SGD by several processes on one parameter vector in shared memory.

    mpiexec -n 4 python -m algorithms.hogwild                       # sparse logistic regression
    mpiexec -n 4 python -m algorithms.hogwild --problem dense       # the small CNN on the digits

Paper: Niu, Recht, Re & Wright 2011 (HOGWILD!: A Lock-Free Approach to Parallelizing Stochastic
Gradient Descent), Algorithm 1; the asynchronous end of Ben-Nun & Hoefler 2019's spectrum.
The vector w lives once, in an MPI-3 shared-memory window (``MPI.Win.Allocate_shared``) that every
process of the machine maps; each process, without any lock (``hogwild_step``):

    pick a sample e (its own share of this epoch's permutation)
    read   w_e                        the coordinates e touches (others may be writing them)
    g_e  = gradient of f_e at w_e     nonzero only on e
    write  w_v <- w_v - lr * g_v  for v in e

The paper's argument: when each f_e touches few coordinates, two processes rarely write the same
coordinate at the same time, so skipping the locks costs almost nothing. Its measures: Delta = the
largest fraction of samples sharing one coordinate, rho = the largest fraction of samples whose
support meets a given sample's. ``--problem sparse`` (default) is such a case: logistic regression,
each sample with ``--nnz`` nonzeros among ``--features``, the L2 term split over the samples as in
the paper's sparse SVM (``minidl.data.SparseLogistic``). ``--problem dense`` runs the CNN: every
gradient touches every weight (Delta = rho = 1), so every pair of concurrent updates collides.

Not quite the paper: it assumes each w_v -= lr g_v is atomic; NumPy's ``w[e] -= lr * g`` reads
then writes, so a concurrent write in between can be lost (for sparse e, rarely). An update's
staleness is how many updates by the others landed between its read and its write (each process
counts its own in a shared slot: one writer, no lock). The rate decays by ``--lr-decay`` per
epoch, as in the paper's experiments; there is no momentum (a nonzero ``--momentum`` is refused).

Restrictions: every rank on one machine (shared memory); p <= the number of samples.
Communication: none per step (loads and stores); per epoch one small allgather of the counts
(which also waits for every rank's last write) and a barrier. A diverged run stops every rank at
the end of the epoch (``divergence.check_divergence`` on numbers every rank holds).

Defaults (5000 samples, 500 features, 10 nonzeros each, lr 0.5 decaying by 0.8, 15 epochs, one
sample per update), measured on 2 shared cores at -n 4: F(w) - F(w*) = 3.3e-4 to 3.7e-4 and
||w - w*|| / ||w*|| = 0.035 to 0.037 (one process: 3.2e-4, 0.034), in about 4 s with the Newton
solve for w*. ``--problem dense`` (lr 0.05, batch 32, 10 epochs): 84% to 96% test accuracy at -n 4
(the interleavings vary from run to run) against 96.1% with one process (serial SGD exactly).
"""
import types

import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli, divergence
from algorithms.core.cli import SettingError
from algorithms.core.log import Log
from algorithms.core.objective import build as build_objective, evaluate_at
from algorithms.core.run import Settings, agreed, wait_together
from minidl import backend
from minidl.data import batches, epoch_order, shard, sparse_logistic_regression

DEFAULTS = {"sparse": {"epochs": 15, "lr": 0.5, "batch_size": 1, "model": None},
            "dense": {"epochs": 10, "lr": 0.05, "batch_size": 32, "model": "cnn"}}
SPARSE = {"n_samples": 5000, "features": 500, "nnz": 10}      # the sparse problem's size, by default
LR_DECAY = {"sparse": 0.8, "dense": 1.0}


# ---- the update: the heart of Hogwild! ----------------------------------------------------------

def hogwild_step(w, problem, e, lr):
    """One lock-free update by one process on the shared vector w (Niu et al. 2011, Algorithm 1)."""
    # BEGIN SOLUTION
    support = problem.index[e]
    # read: w_e, only the coordinates sample e touches; no lock, others may be writing them
    w_e = w[support]
    # gradient: of f_e at w_e, nonzero only on e
    g_e = problem.sample_grad(w_e, e)
    # write: w_v <- w_v - lr g_v for v in e (a read-modify-write, not the paper's atomic update)
    w[support] -= lr * g_e
    # END SOLUTION


def hogwild_dense_step(w, objective, index, lr):
    """The same on a dense model: read all of w, compute the batch gradient, write all of w."""
    objective.params[...] = backend.asarray(w)        # read w (a copy; other processes keep writing)
    loss = objective.loss_and_grad(index)
    w -= lr * backend.to_numpy(objective.grad)         # write every coordinate: every update collides
    return loss


# ---- shared memory --------------------------------------------------------------------------------

def shared_array(node, initial):
    """(window, array): a copy of ``initial`` in an MPI-3 shared-memory window that every rank of
    ``node`` maps (rank 0 allocates and fills it), locked for the whole run, so that
    ``window.Sync()`` is the memory fence between this rank's stores and the others'."""
    itemsize = initial.dtype.itemsize
    window = MPI.Win.Allocate_shared(initial.size * itemsize if node.Get_rank() == 0 else 0, itemsize, comm=node)
    window.Lock_all()
    array = numpy.ndarray(buffer=window.Shared_query(0)[0], dtype=initial.dtype, shape=initial.shape)
    if node.Get_rank() == 0:
        array[...] = initial
    return window, array


# ---- the run: set-up and epochs, shared by the two problems ---------------------------------------

class Run:
    """One Hogwild! run: the agreed set-up (every check on every rank inside ``run.agreed``,
    so that any error stops every rank before training; ``build()`` -> (the problem or objective,
    with ``.n`` samples; w's starting value) runs inside it), then the epochs (``loop``)."""

    def __init__(self, comm, settings, lr_decay, build, writer):
        self.comm, self.settings, self.lr_decay = comm, settings, lr_decay
        self.first_epoch, self.steps = 0, 0            # steps: updates by all ranks, over all runs
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)   # collective: before anything that can fail
        rank, size = comm.Get_rank(), comm.Get_size()
        try:
            with agreed(comm):
                if settings.momentum != 0:
                    raise SettingError(f"--momentum {settings.momentum}: Hogwild!'s update w_v <- w_v - lr g_v "
                                       "has no momentum; leave it at 0")
                settings.check()
                cli.require("--lr-decay", lr_decay, low=0, low_open=True, high=1)
                if node.Get_size() != size:
                    raise SettingError(f"Hogwild! shares memory: every rank must run on one machine, but only "
                                       f"{node.Get_size()} of {size} share this one")
                if rank == 0:
                    checkpoint.check_save(settings.save)
                self.meta = writer.meta(settings, size)
                self.model, self.initial = build()
                if size > self.model.n:
                    raise SettingError(f"{size} ranks but only {self.model.n} samples: every rank needs one")
                if settings.resume:
                    arrays = checkpoint.read_for(settings, len(self.initial), self.meta)
                    self.first_epoch, self.steps = int(arrays["epoch"]), int(arrays["optimizer.steps"])
                    self.initial = arrays["params"].astype(self.initial.dtype)
                self.logger = Log(settings.log, rank=rank, quiet=settings.quiet)
        except SettingError:
            node.Free()
            raise
        w_window, self.w = shared_array(node, self.initial)
        count_window, self.updates = shared_array(node, numpy.zeros(size, numpy.int64))   # rank r's, in slot r
        self.node, self.windows = node, (w_window, count_window)
        self.sync()
        wait_together(node)
        self.sync()

    def sync(self):
        """Make this rank's stores to w and updates visible to the others, and theirs to it."""
        for window in self.windows:
            window.Sync()

    def others(self, rank):
        """How many updates the ranks other than ``rank`` have written so far."""
        return int(self.updates.sum() - self.updates[rank])

    def loop(self, step, evaluate):
        """The epochs; returns (the final shared w as a NumPy copy, the history) on every rank.

        step(index, rate) -> loss or None   this rank's lock-free update(s) on its samples ``index``
        evaluate(epoch, w) -> dict           the epoch's metrics, on every rank, while nobody writes
        """
        comm, s = self.comm, self.settings
        rank, size, n = comm.Get_rank(), comm.Get_size(), self.model.n
        reference = None                      # the first steps' mean loss (over ranks): the start's
        try:
            for epoch in range(self.first_epoch, s.epochs):
                rate = s.lr * self.lr_decay ** epoch
                mine = epoch_order(n, s.seed, epoch)[shard(n, rank, size)]    # this rank's samples
                staleness, losses = [], []
                for batch in batches(len(mine), s.batch_size):
                    seen = self.others(rank)                 # the others' updates before this read
                    loss = step(mine[batch], rate)
                    staleness.append(self.others(rank) - seen)   # ... and before this write
                    self.updates[rank] += 1
                    if loss is not None:
                        losses.append(loss)
                # every rank's counts (one row each); the allgather also waits for every last write
                self.sync()
                rows = comm.allgather([len(staleness), sum(staleness), max(staleness), sum(losses), len(losses),
                                       losses[0] if losses else numpy.nan])
                self.sync()
                updates, stale_sum, stale_max, loss_sum, loss_count, first = numpy.array(rows).T
                self.steps += int(updates.sum())
                record = {"epoch": epoch + 1}
                if loss_count.sum():          # the same numbers on every rank: all raise together
                    record["train_loss"] = float(loss_sum.sum() / loss_count.sum())
                    reference = float(first.mean()) if reference is None else reference
                    divergence.check_divergence(record["train_loss"], reference, f"epoch {epoch + 1}'s mean training")
                record.update(evaluate(epoch + 1, self.w))
                record.update(updates=int(updates.sum()), staleness_mean=float(stale_sum.sum() / updates.sum()),
                              staleness_max=int(stale_max.max()))
                self.logger.epoch(**record)
                wait_together(comm)       # nobody writes w while another rank still reads it
        except Exception as error:
            if getattr(error, "every_rank", False):      # every rank is here: free the windows together
                self.close()
            raise                             # otherwise run_main aborts the job
        result = self.w.copy()
        self.close()
        if s.save:                          # the update keeps no state but its count (no momentum)
            counter = types.SimpleNamespace(state_dict=lambda: {"steps": numpy.asarray(self.steps)})
            checkpoint.write(comm, s.save, result, counter, s.epochs, meta=self.meta)
        return result, comm.bcast(self.logger.history, root=0)

    def close(self):
        """Collective: every rank frees the windows together."""
        self.logger.close()
        for window in self.windows:
            window.Unlock_all()
            window.Free()
        self.node.Free()


def train_sparse(comm, settings, lr_decay, problem=None, n_samples=None, features=None, nnz=None, l2=1e-3):
    """Hogwild! on sparse logistic regression: ``problem`` (a ``SparseLogistic``), or one drawn
    from Generator(seed) on every rank (the same bits everywhere, so nothing is sent)."""
    def build():
        if settings.model is not None or settings.dataset != "digits" or settings.data_dir is not None:
            raise SettingError("--model, --dataset and --data-dir choose the network of --problem dense; the "
                               "sparse problem is drawn from --n-samples, --features and --nnz")
        if problem is not None:
            return problem, numpy.zeros(problem.features)
        cli.require("--n-samples", n_samples, integer=True, low=1)
        cli.require("--features", features, integer=True, low=1)
        cli.require("--nnz", nnz, integer=True, low=1, high=features)
        drawn = sparse_logistic_regression(n_samples, features, nnz, numpy.random.default_rng(settings.seed), l2)
        return drawn, numpy.zeros(features)

    shape = {"--n-samples": n_samples, "--features": features, "--nnz": nnz} if problem is None else {"sparse": "given"}
    writer = checkpoint.Writer("hogwild", state={"--problem": "sparse", **shape}, model="sparse-logistic")
    run = Run(comm, settings, lr_decay, build, writer)
    problem = run.model
    first, best = problem.loss(run.initial), problem.loss(problem.w_star)

    def step(index, rate):
        for e in index:
            hogwild_step(run.w, problem, e, rate)

    def evaluate(epoch, w):              # F(w) on every rank, from the shared w: all agree on divergence
        loss = problem.loss(w)
        divergence.check_divergence(loss, first, f"epoch {epoch}'s full-data")
        return {"loss": loss, "loss_gap": loss - best,
                "distance": float(numpy.linalg.norm(w - problem.w_star) / numpy.linalg.norm(problem.w_star))}
    return run.loop(step, evaluate)


def train_dense(comm, settings, lr_decay, given=()):
    """Hogwild! on a network (``--model`` on ``--dataset``): every step reads and writes all of w.
    ``given``: the sparse problem's flags set anyway (refused)."""
    def build():
        if given:
            raise SettingError(f"{' and '.join(given)} shape{'s' if len(given) == 1 else ''} the sparse problem; "
                               f"this run has --problem dense")
        objective = build_objective(settings.model, settings.dataset, settings.seed, settings.data, settings.data_dir)
        return objective, backend.to_numpy(objective.params).copy()

    run = Run(comm, settings, lr_decay, build, checkpoint.Writer("hogwild", state={"--problem": "dense"}))
    objective = run.model                     # the test metrics: on rank 0 only, the others wait
    return run.loop(lambda index, rate: hogwild_dense_step(run.w, objective, index, rate),
                    lambda epoch, w: evaluate_at(objective, w) if comm.Get_rank() == 0 else {})


def train(comm=None, problem="sparse", lr_decay=None, n_samples=None, features=None, nnz=None, l2=1e-3,
          sparse=None, **settings):
    """Hogwild! on ``comm``; returns (final shared w as NumPy, per-epoch history) on every rank.

    ``problem``: "sparse" (``sparse``: a ready ``SparseLogistic``, else one is drawn from ``seed``)
    or "dense". ``settings``: ``run.Settings``; unset ones take the problem's DEFAULTS and LR_DECAY
    (``n_samples``, ``features``, ``nnz``: SPARSE's; refused with "dense", as ``model`` with "sparse").
    """
    comm = comm or MPI.COMM_WORLD
    if problem not in DEFAULTS:          # the same on every rank: every rank raises it
        raise SettingError(f"--problem must be 'sparse' or 'dense', got {problem!r}", every_rank=True)
    given = {name: value for name, value in settings.items() if value is not None}
    settings = Settings.of(given, momentum=0.0, **DEFAULTS[problem])
    lr_decay = LR_DECAY[problem] if lr_decay is None else lr_decay
    if problem == "dense":
        sparse_flags = [flag for flag, value in (("--n-samples", n_samples), ("--features", features),
                                                 ("--nnz", nnz)) if value is not None]
        return train_dense(comm, settings, lr_decay, sparse_flags)
    shape = {name: SPARSE[name] if value is None else value
             for name, value in (("n_samples", n_samples), ("features", features), ("nnz", nnz))}
    return train_sparse(comm, settings, lr_decay, sparse, l2=l2, **shape)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], epochs=None, lr=None, batch_size=None, momentum=None, model=None)
    parser.epilog = "defaults (None above) by problem: " + "; ".join(
        "{0}: --epochs {epochs} --lr {lr} --batch-size {batch_size} --lr-decay {1}{2}".format(
            name, LR_DECAY[name], f" --model {DEFAULTS[name]['model']}" if DEFAULTS[name]["model"] else "",
            **DEFAULTS[name]) for name in DEFAULTS)
    parser.add_argument("--problem", default="sparse", choices=sorted(DEFAULTS),
                        help="sparse: logistic regression with --nnz nonzeros per sample; dense: --model on --dataset")
    # its own dest: the shared settings (cli.SHARED) have an lr_decay of their own, the synchronous
    # family's list of step epochs (algorithms.core.schedule); Hogwild's is a factor per epoch
    parser.add_argument("--lr-decay", dest="decay_per_epoch", type=float, default=None,
                        help="lr <- lr * decay after each epoch")
    parser.add_argument("--n-samples", type=int, default=None, help=f"samples (sparse problem; {SPARSE['n_samples']})")
    parser.add_argument("--features", type=int, default=None, help=f"features (sparse problem; {SPARSE['features']})")
    parser.add_argument("--nnz", type=int, default=None, help=f"nonzeros per sample (sparse problem; {SPARSE['nnz']})")
    args = parser.parse_args(argv)
    cli.run_main(train, args, problem=args.problem, lr_decay=args.decay_per_epoch, n_samples=args.n_samples,
                 features=args.features, nnz=args.nnz)


if __name__ == "__main__":
    main()
