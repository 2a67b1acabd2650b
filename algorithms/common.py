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
