"""What every algorithm needs the same way: command line, data, model, evaluation, logging, checkpoints.

Each algorithm module keeps only its own idea; this module holds the rest once (DESIGN.md):

    args = common.parser("Serial SGD").parse_args()          # the same flags everywhere
    data = common.load_data(args.dataset, args.seed)           # train/test split, same on every rank
    model = common.build_model(args.model, args.seed)          # same initial weights on every rank
    log = common.Log(args.log, rank=comm.rank)                 # rank 0 prints, JSON lines on request
    loss, accuracy = common.evaluate(model, data.x_test, data.y_test)

Flags: --dataset digits|mnist [--data-dir D] --model cnn|mlp|lenet5 --epochs N --lr X
--batch-size B (per rank) --seed S --log run.jsonl --save params.npz --resume params.npz.
"""
import argparse
import dataclasses
import json
import math
import sys
import time

import numpy

from minidl import backend, data as datasets, models
from minidl import functional as F
from minidl.optim import SGD
from minidl.tensor import Tensor, no_grad


def parser(description, epochs=10, lr=0.05, batch_size=32, model="cnn", momentum=0.0):
    """An ArgumentParser with the flags every algorithm shares; modules add their own."""
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default="digits", choices=["digits", "mnist"],
                   help="digits: the embedded 8x8 UCI digits; mnist: IDX files in --data-dir")
    p.add_argument("--data-dir", default=None, help="folder with the MNIST/Fashion-MNIST IDX files")
    p.add_argument("--model", default=model, choices=sorted(models.MODELS))
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--momentum", type=float, default=momentum)
    p.add_argument("--batch-size", type=int, default=batch_size, help="examples per step on each rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default=None, help="write one JSON object per epoch to this file")
    p.add_argument("--save", default=None, help="write final parameters and optimizer state (.npz)")
    p.add_argument("--resume", default=None, help="start from a file written by --save")
    p.add_argument("--quiet", action="store_true", help="no per-epoch output")
    return p


def check_common(epochs, lr, batch_size, momentum=0.0):
    """ValueError naming the first impossible setting (called on every rank before training)."""
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"--epochs must be an integer >= 1, got {epochs!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"--lr must be a finite number > 0, got {lr!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"--batch-size must be an integer >= 1, got {batch_size!r}")
    if not (0 <= momentum < 1):
        raise ValueError(f"--momentum must be in [0, 1), got {momentum!r}")


@dataclasses.dataclass
class Data:
    x_train: numpy.ndarray
    y_train: numpy.ndarray
    x_test: numpy.ndarray
    y_test: numpy.ndarray


def load_data(dataset="digits", seed=0, data_dir=None):
    """Train/test arrays on the host; the split depends only on ``seed``, so every rank agrees."""
    if dataset == "digits":
        return Data(*datasets.digits_split(seed=seed))
    if dataset == "mnist":
        if data_dir is None:
            raise ValueError("--dataset mnist needs --data-dir pointing at the IDX files")
        x_train, y_train = datasets.load_mnist(data_dir, kind="train")
        x_test, y_test = datasets.load_mnist(data_dir, kind="test")
        return Data(x_train, y_train, x_test, y_test)
    raise ValueError(f"unknown dataset {dataset!r}; choose 'digits' or 'mnist'")


def build_model(name, seed, dataset="digits"):
    """The model, initialised from Generator(seed): the same weights on every rank."""
    if dataset == "mnist" and name == "cnn":
        raise ValueError("--model cnn is for the 8x8 digits; use --model lenet5 (or mlp) with mnist")
    if dataset == "digits" and name == "lenet5":
        raise ValueError("--model lenet5 expects 28x28 images; use --model cnn (or mlp) with digits")
    rng = numpy.random.default_rng(seed)
    if name == "mlp":
        return models.mlp(rng, in_features=784 if dataset == "mnist" else 64)
    model = models.build(name, rng)
    return model


def loss_and_grad(model, x, y):
    """Mean softmax cross-entropy on (x, y); gradients *accumulate* into the parameters' .grad."""
    logits = model(Tensor(backend.asarray(x)))
    loss = F.softmax_cross_entropy(logits, backend.asarray(y))
    loss.backward()
    return float(loss.item())


def evaluate(model, x, y, batch_size=512):
    """(mean loss, accuracy) over (x, y), in eval mode and without a graph."""
    model.eval()
    total_loss, correct = 0.0, 0
    with no_grad():
        for start in range(0, len(x), batch_size):
            logits = model(Tensor(backend.asarray(x[start:start + batch_size])))
            labels = backend.asarray(y[start:start + batch_size])
            total_loss += float(F.softmax_cross_entropy(logits, labels).item()) * len(labels)
            correct += int((logits.data.argmax(axis=1) == labels).sum())
    model.train()
    return total_loss / max(len(x), 1), correct / max(len(x), 1)


def check_finite(loss, step, rank):
    """Stop with the step and rank where the loss first stopped being a finite number."""
    if not math.isfinite(loss):
        raise FloatingPointError(f"loss became {loss} at step {step} on rank {rank}; "
                                 "lower --lr or check the data")


class Log:
    """Per-epoch records: printed on rank 0 and, with ``path``, written as JSON lines by rank 0."""

    def __init__(self, path=None, rank=0, quiet=False, name=""):
        self.rank, self.quiet, self.name = rank, quiet, name
        self.history = []
        self.started = time.perf_counter()
        self.file = open(path, "w") if path and rank == 0 else None

    def epoch(self, **record):
        record.setdefault("seconds", round(time.perf_counter() - self.started, 3))
        self.history.append(record)
        if self.rank == 0:
            if not self.quiet:
                print(self.format(record), flush=True)
            if self.file:
                self.file.write(json.dumps(record) + "\n")
                self.file.flush()

    @staticmethod
    def format(record):
        parts = []
        for key, value in record.items():
            if isinstance(value, float):
                value = f"{value:.4f}" if abs(value) < 1000 else f"{value:.3g}"
            parts.append(f"{key} {value}")
        return "  ".join(parts)

    def close(self):
        if self.file:
            self.file.close()


def save_checkpoint(path, params, optimizer, epoch):
    """params (flat vector), optimizer state and epoch in one .npz (plain arrays, no pickle)."""
    arrays = {"params": backend.to_numpy(params), "epoch": numpy.asarray(epoch)}
    arrays.update({"optimizer." + key: value for key, value in optimizer.state_dict().items()})
    numpy.savez(path, **arrays)


def load_checkpoint(path, flat, optimizer):
    """Load a --save file into the flat parameters and optimizer; returns the epoch it reached."""
    try:
        archive = numpy.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise ValueError(f"--resume {path}: not a readable .npz checkpoint ({error})") from None
    with archive:
        if "params" not in archive.files or "epoch" not in archive.files:
            raise ValueError(f"--resume {path}: missing 'params' or 'epoch' (was it written by --save?)")
        if archive["params"].shape != flat.data.shape:
            raise ValueError(f"--resume {path}: has {archive['params'].size} parameters, "
                             f"the model has {flat.data.size} (another --model?)")
        flat.data[...] = backend.asarray(archive["params"], dtype=flat.data.dtype)
        optimizer.load_state_dict({key[len("optimizer."):]: archive[key] for key in archive.files
                                   if key.startswith("optimizer.")})
        return int(archive["epoch"])


def fail(error):
    """Print a one-line error and exit 2 (for command-line use; imported use gets the exception)."""
    print(f"error: {error}", file=sys.stderr, flush=True)
    sys.exit(2)


# ---- shared by the distributed algorithms (data parallel, decentralized, parameter server) ------
#
#   objective = build_objective(model, dataset, seed, data=..., problem=...)   # what one rank trains
#   check_parallel(comm.size, objective.n, batch_size)                        # same error on every rank
#   for batch in rank_batches(objective.n, batch_size, rank, size, seed, epoch, partition, labels):
#       loss = objective.loss_and_grad(batch.index)                          # this rank's piece
#   counting = CountingComm(comm)          # bytes this rank sends, for the log
#   finite = FiniteCheck(comm)             # a non-finite loss stops every rank, naming step and rank
#
# The synchronous and decentralized algorithms get all of these from one call, and end alike:
#
#   run = start_run(comm, model=..., ...)   # objective, optimizer, --resume, counting, finite, logger
#   ... the algorithm's own epoch loop ...
#   return run.finish(save, epochs)        # close the log, --save, (params as NumPy, history)

PARTITIONS = ("global", "shards", "sorted", "replicated")
ALLREDUCE_NAMES = ("ring", "tree", "butterfly", "rabenseifner", "naive", "auto", "mpi")


def allreduce_function(name):
    """In-place sum over ranks, ``f(comm, buffer)``, by the named algorithm.

    ``mpi`` is MPI's own ``Allreduce`` (for comparison); the others are the point-to-point
    algorithms of ``collectives`` (imported on first use). They run with ``check=False``: the
    training loop passes the same flat buffer on every rank, so the per-call agreement on lengths
    and dtypes (lg p extra small messages) would buy nothing.
    """
    if name not in ALLREDUCE_NAMES:
        raise ValueError(f"unknown --allreduce {name!r}; choose one of {', '.join(ALLREDUCE_NAMES)}")
    if name == "mpi":
        def mpi_allreduce(comm, buffer):
            from mpi4py import MPI
            host = backend.to_numpy(buffer)          # MPI's own Allreduce gets host memory
            comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
            if host is not buffer:
                buffer[...] = backend.asarray(host)
            return buffer
        return mpi_allreduce
    import importlib
    module = importlib.import_module(f"collectives.{name}")

    def collective_allreduce(comm, buffer):
        from mpi4py import MPI
        return module.allreduce(comm, MPI.IN_PLACE, buffer, op="sum", check=False)
    return collective_allreduce


class CountingComm:
    """An mpi4py communicator that counts the bytes this rank sends; behaves like the one it wraps.

    Every point-to-point send (Send, Isend, Sendrecv) adds its buffer's size to ``bytes_sent``:
    that is exact for the algorithms of ``collectives`` and for gossip. MPI's own collectives send
    inside the library, where nothing can be counted; ``Allreduce`` is therefore counted as what a
    bandwidth-optimal allreduce sends per rank, 2 (p - 1) / p n bytes (an estimate; the log says so).
    """

    def __init__(self, comm):
        self.comm = comm
        self.bytes_sent = 0

    def __getattr__(self, name):
        return getattr(self.comm, name)

    @staticmethod
    def _nbytes(buffer):
        if isinstance(buffer, (list, tuple)):          # [array, count, datatype] style
            buffer = buffer[0]
        nbytes = getattr(buffer, "nbytes", None)
        return int(nbytes) if nbytes is not None else len(memoryview(buffer).cast("B"))

    def Send(self, buf, *args, **kwargs):
        self.bytes_sent += self._nbytes(buf)
        return self.comm.Send(buf, *args, **kwargs)

    def Isend(self, buf, *args, **kwargs):
        self.bytes_sent += self._nbytes(buf)
        return self.comm.Isend(buf, *args, **kwargs)

    def Sendrecv(self, sendbuf, *args, **kwargs):
        self.bytes_sent += self._nbytes(sendbuf)
        return self.comm.Sendrecv(sendbuf, *args, **kwargs)

    def Allreduce(self, sendbuf, recvbuf, op=None):
        from mpi4py import MPI
        size = self.comm.Get_size()
        self.bytes_sent += 2 * (size - 1) * self._nbytes(recvbuf) // size
        return self.comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM if op is None else op)

    def total_bytes(self):
        """Bytes sent by all ranks together so far (one small allreduce; call it on every rank)."""
        return int(self.comm.allreduce(self.bytes_sent))


class FiniteCheck:
    """A non-finite loss stops *every* rank, naming the step and rank where it first appeared.

    Each rank remembers its own first non-finite loss; every ``every`` steps the ranks agree on
    the earliest (step, rank) with one 8-byte ``Allreduce(MIN)``. Cost: lg p latencies per check
    (a few microseconds on one node; the gradient allreduce of a step costs far more). Without the
    agreement a rank that raised alone would leave the others waiting forever in their next
    collective. ``every`` > 1 makes it cheaper; the run then stops up to ``every - 1`` steps late,
    but still names the first step.
    """

    NONE = numpy.iinfo(numpy.int64).max

    def __init__(self, comm, every=1):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"--check-every must be an integer >= 1, got {every!r}")
        self.comm, self.every = comm, every
        self.first = None                       # (step, 'nan' or 'inf') on this rank

    def __call__(self, loss, step):
        if self.first is None and not math.isfinite(loss):
            self.first = (step, "nan" if math.isnan(loss) else "inf")
        if (step + 1) % self.every == 0:
            self.agree()

    def agree(self):
        size, rank = self.comm.Get_size(), self.comm.Get_rank()
        code = numpy.array([self.NONE], dtype=numpy.int64)
        if self.first is not None:              # (step, rank, kind) as one orderable integer
            code[0] = (self.first[0] * size + rank) * 2 + (self.first[1] == "inf")
        if size > 1:
            from mpi4py import MPI
            self.comm.Allreduce(MPI.IN_PLACE, code, op=MPI.MIN)
        if code[0] != self.NONE:
            step_rank, is_inf = divmod(int(code[0]), 2)
            step, bad_rank = divmod(step_rank, size)
            raise FloatingPointError(f"loss became {'inf' if is_inf else 'nan'} at step {step} on rank "
                                     f"{bad_rank}; lower --lr or check the data")


def check_parallel(size, n_train, batch_size):
    """ValueError for settings no rank count can train with; deterministic, so every rank raises it."""
    if size > n_train:
        raise ValueError(f"{size} ranks but only {n_train} training examples: every rank needs at least "
                         f"one (use fewer ranks)")


@dataclasses.dataclass
class Batch:
    index: numpy.ndarray     # rows of the training set this rank uses at this step (may be empty)
    total: int               # rows used by all ranks together at this step (the global batch)


def rank_batches(n, batch_size, rank, size, seed, epoch, partition="global", labels=None):
    """This rank's batches for one epoch; every rank gets the same number of them (some may be empty).

    global      epoch_order(n, seed, epoch) (serial SGD's permutation) is cut into global batches
                of size * batch_size rows, and global batch k into ``size`` consecutive pieces
                (``shard(m, rank, size)``): rank r's piece is rows [r b, (r+1) b) of it. So the
                union of the pieces at step k is exactly serial SGD's batch k at batch size p b,
                and p ranks x batch b is serial SGD at batch p b (the last, shorter batch too).
    shards      rank r owns ``shard(n, r, size)`` (a contiguous block of the already shuffled
                training set) for the whole run and visits it in the order
                epoch_order(len(block), seed, epoch): Zinkevich's "each machine its own data".
                With one rank this is serial SGD's order exactly.
    sorted      as shards, but the rows are first sorted by label (``labels``), so each rank
                sees a few classes only: the non-iid case where model averaging struggles.
    replicated  every rank visits all n rows, in the order epoch_order(n, seed + rank, epoch)
                (ensembles: independent members; rank 0's order is serial SGD's).
    """
    from minidl.data import epoch_order
    if partition not in PARTITIONS:
        raise ValueError(f"unknown --partition {partition!r}; choose one of {', '.join(PARTITIONS)}")
    if partition == "global":
        order, step_rows = epoch_order(n, seed, epoch), size * batch_size
        out = []
        for start in range(0, n, step_rows):
            global_batch = order[start:start + step_rows]
            out.append(Batch(global_batch[datasets.shard(len(global_batch), rank, size)], len(global_batch)))
        return out
    if partition == "replicated":
        order = epoch_order(n, seed + rank, epoch)
        return [Batch(order[start:start + batch_size], size * len(order[start:start + batch_size]))
                for start in range(0, n, batch_size)]
    rows = numpy.arange(n) if partition == "shards" else numpy.argsort(labels, kind="stable")
    sizes = datasets.shard_sizes(n, size)
    block = rows[datasets.shard(n, rank, size)]
    block = block[epoch_order(len(block), seed, epoch)]
    steps = -(-int(sizes.max()) // batch_size)         # the longest shard sets the step count
    out = []
    for step in range(steps):
        start = step * batch_size
        total = int(numpy.clip(sizes - start, 0, batch_size).sum())
        out.append(Batch(block[start:start + batch_size], total))
    return out


class NetworkObjective:
    """A network and its data as one flat parameter vector: what every algorithm trains.

    ``params`` and ``grad`` are the flat vectors (``minidl.flat``); ``loss_and_grad(index)`` sets
    ``grad`` to the mean gradient over training rows ``index`` and returns the mean loss.
    """

    def __init__(self, net, data):
        from minidl.flat import flatten
        self.net, self.data = net, data
        self.flat = flatten(net)
        self.params, self.grad = self.flat.data, self.flat.grad
        self.n, self.labels = len(data.x_train), data.y_train

    def as_parameter(self):
        return self.flat.as_parameter()

    def loss_and_grad(self, index):
        self.flat.zero_grad()
        return loss_and_grad(self.net, self.data.x_train[index], self.data.y_train[index])

    def evaluate(self):
        test_loss, accuracy = evaluate(self.net, self.data.x_test, self.data.y_test)
        return {"test_loss": test_loss, "test_accuracy": accuracy}

    def predict(self, x):
        """Class probabilities (softmax of the logits), (len(x), classes)."""
        self.net.eval()
        with no_grad():
            logits = self.net(Tensor(backend.asarray(x))).data
        self.net.train()
        xp = backend.get_array_module(logits)
        shifted = xp.exp(logits - logits.max(axis=1, keepdims=True))
        return shifted / shifted.sum(axis=1, keepdims=True)

    def score(self, prediction):
        """Test accuracy of class probabilities ``prediction`` for x_test."""
        labels = backend.asarray(self.data.y_test)
        return float((prediction.argmax(axis=1) == labels).mean())


class ConvexObjective:
    """A synthetic convex problem (``minidl.data.least_squares`` / ``logistic_regression``) as an
    objective: w (float64, starting at 0) is the flat parameter vector, ``problem.grad`` the gradient.
    Evaluation reports the full-data loss and the distance to the known optimum ``w_star``."""

    def __init__(self, problem):
        from minidl.tensor import Parameter
        self.problem = problem
        self.params = numpy.zeros(problem.d)
        self.grad = numpy.zeros(problem.d)
        self.parameter = Parameter(self.params)
        self.parameter.grad = self.grad
        self.flat = dataclasses.make_dataclass("Flat", ["data"])(self.params)   # for load_checkpoint
        self.n, self.labels = problem.n, problem.y

    def as_parameter(self):
        return self.parameter

    def loss_and_grad(self, index):
        self.grad[...] = self.problem.grad(self.params, index)
        return self.problem.loss(self.params, index)

    def evaluate(self):
        return {"loss": self.problem.loss(self.params),
                "distance_to_optimum": float(numpy.linalg.norm(self.params - self.problem.w_star))}

    def predict(self, x):
        return x @ self.params

    def score(self, prediction):
        return None


def build_objective(model="cnn", dataset="digits", seed=0, data=None, data_dir=None, problem=None,
                    model_seed=None):
    """The objective one rank trains: ``problem`` (a synthetic convex problem) if given, else a network.

    ``model`` is a name in ``minidl.models`` or a function returning a fresh ``Module`` (tests pass
    float64 models); it is built from ``model_seed`` (default ``seed``), so every rank starts from
    the same weights unless an algorithm (ensembles) asks otherwise.
    """
    if problem is not None:
        return ConvexObjective(problem)
    data = data or load_data(dataset, seed, data_dir)
    seed = seed if model_seed is None else model_seed
    net = model() if callable(model) else build_model(model, seed, dataset)
    return NetworkObjective(net, data)


@dataclasses.dataclass
class Run:
    """What a synchronous or decentralized ``train()`` sets up the same way (made by ``start_run``).

    The algorithm module keeps its own epoch loop and update; it sends on ``counting``, reports
    each step's loss to ``finite`` and each epoch to ``logger``, and ends with ``finish``.
    """
    objective: object            # NetworkObjective or ConvexObjective: this rank's flat parameters
    optimizer: SGD               # SGD (with momentum) on objective's flat parameter vector
    first_epoch: int             # 0, or the epoch a --resume checkpoint had reached
    counting: CountingComm       # the communicator the algorithm sends on; counts this rank's bytes
    finite: FiniteCheck          # a non-finite loss stops every rank
    logger: Log
    rank: int
    size: int

    def finish(self, save, epochs, params=None, each_rank=False):
        """Close the log, write ``save`` and return (``params`` as a NumPy copy, per-epoch history).

        ``params`` defaults to the rank's own ``objective.params`` (EASGD and ADMM pass their
        centre). Rank 0 writes the checkpoint; with ``each_rank`` every rank writes its own,
        ``save.rank<r>.npz`` when there is more than one rank (ensemble members all differ).
        """
        params = self.objective.params if params is None else params
        self.logger.close()
        if save and (each_rank or self.rank == 0):
            path = f"{save}.rank{self.rank}.npz" if each_rank and self.size > 1 else save
            save_checkpoint(path, params, self.optimizer, epochs)
        return backend.to_numpy(params).copy(), self.logger.history


def start_run(comm, *, model, dataset, seed, data, data_dir, problem, lr, momentum, batch_size, resume,
              log, quiet, check_every, model_seed=None):
    """The ``Run`` every synchronous or decentralized algorithm starts from, built in this order:

    objective (``build_objective``), ``check_parallel``, SGD optimizer, ``load_checkpoint`` if
    ``resume``, ``CountingComm``, ``FiniteCheck`` (checks ``check_every``), ``Log``.

    Call it after ``check_common`` and the module's own argument checks: its ValueErrors (data,
    model, rank count, checkpoint, --check-every) come before any communication, on every rank.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    objective = build_objective(model, dataset, seed, data, data_dir, problem, model_seed=model_seed)
    check_parallel(size, objective.n, batch_size)
    optimizer = SGD([objective.as_parameter()], lr=lr, momentum=momentum)
    first_epoch = load_checkpoint(resume, objective.flat, optimizer) if resume else 0
    counting = CountingComm(comm)
    finite = FiniteCheck(comm, check_every)
    logger = Log(log, rank=rank, quiet=quiet)
    return Run(objective, optimizer, first_epoch, counting, finite, logger, rank, size)


def run_main(train, args, **algorithm_kwargs):
    """Command-line entry: ``train(MPI.COMM_WORLD, ...)`` with the flags of ``parallel_parser``
    (all but --allreduce, which not every algorithm uses) and the algorithm's own ``algorithm_kwargs``.

    An impossible setting (ValueError) or a diverged run (FloatingPointError) ends in ``fail``:
    one ``error: ...`` line from every rank and exit status 2.
    """
    from mpi4py import MPI
    try:
        train(MPI.COMM_WORLD, dataset=args.dataset, data_dir=args.data_dir, model=args.model,
              epochs=args.epochs, lr=args.lr, momentum=args.momentum, batch_size=args.batch_size,
              seed=args.seed, partition=args.partition, log=args.log, save=args.save, resume=args.resume,
              quiet=args.quiet, check_every=args.check_every, **algorithm_kwargs)
    except (ValueError, FloatingPointError) as error:
        fail(error)


def epoch_mean(comm, total, count):
    """sum(total) / sum(count) over ranks (one small allreduce): e.g. the epoch's training loss."""
    pair = numpy.array([total, count], dtype=numpy.float64)
    if comm.Get_size() > 1:
        from mpi4py import MPI
        comm.Allreduce(MPI.IN_PLACE, pair, op=MPI.SUM)
    return float(pair[0] / max(pair[1], 1))


def mean_over_ranks(comm, vector):
    """A copy of the element-wise mean of ``vector`` over ranks (MPI's Allreduce).

    For evaluation only (the consensus model of a decentralized run): not part of any
    algorithm's update, and not counted in its bytes.
    """
    host = numpy.array(backend.to_numpy(vector), dtype=numpy.float64)
    if comm.Get_size() > 1:
        from mpi4py import MPI
        comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
    host /= comm.Get_size()
    return host.astype(backend.to_numpy(vector).dtype)


def parallel_parser(description, allreduce="ring", partition="global", **defaults):
    """``parser`` plus the flags the distributed algorithms share: --allreduce, --partition, --check-every."""
    p = parser(description, **defaults)
    p.add_argument("--allreduce", default=allreduce, choices=ALLREDUCE_NAMES,
                   help="allreduce algorithm for the averaging (mpi: MPI's own Allreduce)")
    p.add_argument("--partition", default=partition, choices=PARTITIONS,
                   help="which rows each rank sees (see common.rank_batches)")
    p.add_argument("--check-every", type=int, default=1,
                   help="agree on a non-finite loss every this many steps")
    return p


def evaluate_at(objective, params):
    """objective.evaluate() with ``params`` swapped in (the consensus of a decentralized run); the
    rank's own parameters are put back afterwards."""
    own = objective.params.copy()
    objective.params[...] = backend.asarray(params, dtype=objective.params.dtype)
    try:
        return objective.evaluate()
    finally:
        objective.params[...] = own


def parse_period(text):
    """--period H: a positive integer, or 'end' (average once, after the last step)."""
    if text == "end":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 or 'end', got {text!r}") from None
