"""Synchronous data-parallel SGD that sends compressed gradients: quantized, sparsified, or with error feedback.

    mpiexec -n 4 python -m algorithms.compressed_sgd --compressor topk --density 0.01
    mpiexec -n 4 python -m algorithms.compressed_sgd --compressor onebit --no-error-feedback
    mpiexec -n 4 python -m algorithms.compressed_sgd --compressor qsgd --levels 127

Papers: Ben-Nun & Hoefler 2019 ("Communication optimizations": quantization, sparsification,
"use lossy compression when sending, accumulate error locally"); Seide et al. 2014 (1-bit SGD
with error feedback); Wen et al. 2017 (TernGrad); Alistarh et al. 2017 (QSGD); Strom 2015 and
Lin et al. 2018 (top-k with residuals); Renggli et al. 2019 (SparCML's sparse allreduce).
Full references: tutorials/references.md. The compressors are collectives/compression/compress.py's, the
exchanges collectives/compression/sparse.py's.

The update, in the code's names (``compressed_step``), at step k on rank r:

    grad_r    = (|index| / total) * mean gradient on this rank's piece     (as allreduce_sgd)
    message_r = compress(grad_r + residual_r)       with error feedback, residual_r keeps the rest
              = compress(grad_r)                    without
    grad      = sum_r decompress(message_r)         (the exchange, below; the same bits everywhere)
    w        <- optimizer.step()                    (SGD, the same on every rank)

The exchange depends on what the messages are:

    none                 the dense allreduce of --allreduce (so --compressor none *is* allreduce_sgd,
                         bit for bit): ring 2 (p-1)/p n s bytes per rank
    qsgd, rounding,      messages of one fixed size m (compress.py's wire_bytes) cannot be added
    terngrad, onebit     without decoding: every rank gathers every message (sparse.allgather,
                         (p-1) m bytes per rank) and decodes and adds them in rank order
    topk, randomk        (index, value) pairs: the sparse allreduce (sparse.py), lg p rounds of
                         min(k_j (4 + s), n s) bytes, k_j the merged support. random-k draws its
                         indices from a generator seeded alike on every rank, so k_j = k

Error feedback is on by default for the biased compressors (onebit, topk, randomk), off for the
unbiased ones (qsgd, rounding, terngrad); --error-feedback / --no-error-feedback choose.

Each flag belongs to the compressors it changes, and any other is refused (before the first
message, on every rank) rather than ignored: --levels to qsgd (its s, default 127), --bits to
rounding (default 8), --density or --k (one of them; default --density 0.01) to topk and
randomk, --bucket to the quantizers qsgd, rounding, terngrad and onebit (default 512, at most
2^31 - 1; a bucket of n or more entries is one bucket), --allreduce to none (the only
compressor whose exchange is a dense allreduce), --error-feedback / --no-error-feedback to every
compressor but none (which leaves nothing out to feed back).

The bytes in the log are counted on the wire (collectives.trace.CountingComm), not estimated, plus
the 8-byte non-finite check per step that every algorithm of the family sends.

Restrictions: host (NumPy) arrays; p <= number of training examples. Random draws (QSGD,
stochastic rounding, TernGrad, random-k) come from Generator([seed, step, rank]) (random-k: [seed, step]),
so the same seed gives the same bits. --save / --resume keep each rank's residual.

Defaults: plain SGD, lr 0.2, no momentum (chapter 4's allreduce_sgd: momentum 0.9, lr 0.05). Error
feedback releases an entry's held-back gradient in one burst, and momentum 0.9 repeats that burst
for about ten steps: with chapter 4's settings, 1-bit with error feedback ended at 98.6, 76.3,
93.6, 96.9 and 95.0% test accuracy on seeds 0-4 and random-k at 10% did not learn. Lin et al.'s
momentum correction (compress the velocity, not the gradient) is not built (an exercise of chapter 8).

Measured (digits CNN, p = 4, 20 epochs, seeds 0-4, mean +- 95% t interval; defaults;
tutorials/08_communicating_less.md, section 6): none 96.6% +- 3.1 test accuracy at 36,553 bytes per
step and rank; QSGD s = 127 96.8% +- 3.1 and stochastic rounding 8 bits 96.5% +- 3.1 at 18,427; QSGD
s = 1 96.7% +- 0.9 at 4,726; top-k 1% with residuals 97.7% +- 0.7 at 1,454, without 86.3% +- 7.9;
1-bit with error feedback 97.5% +- 0.8 at 2,587, without 94.9% +- 0.9; random-k 10% 97.7% +- 1.2 at
9,757; random-k 1% learns on 3 seeds of 5 (53.4% +- 39.8).
"""
import argparse

import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli
from algorithms.core.cli import SettingError
from algorithms.core.run import Run, Settings, allreduce_function
from collectives.compression import compress, sparse
from minidl import backend

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, lr=0.2, momentum=0.0, partition="global")

BIASED = ("onebit", "topk", "randomk")


def compressed_step(comm, objective, optimizer, batch, codec, exchange, rng):
    """One synchronous step (the heart): local gradient, compressed (with or without error feedback),
    exchanged and summed, the same update everywhere. Returns this rank's mean loss on its piece."""
    # BEGIN SOLUTION
    # local gradient on this rank's piece, weighted by its share of the global batch
    if len(batch.index):
        loss = objective.loss_and_grad(batch.index)
        objective.grad *= len(batch.index) / batch.total
    else:
        loss = 0.0
        objective.grad[...] = 0
    # compress what this rank sends (with error feedback: grad + residual; the rest stays here)
    message, _ = codec.step(objective.grad, rng)
    # every rank's message, decoded and summed: the same vector on every rank
    objective.grad[...] = exchange(comm, message)
    # the same update on every rank
    optimizer.step()
    # END SOLUTION
    return loss


def exchange_for(compressor, allreduce):
    """exchange(comm, message) -> the sum over ranks of the decoded messages (see the docstring)."""
    if isinstance(compressor, compress.NoCompression):
        return lambda comm, message: allreduce(comm, message)
    if compressor.sparse:
        # check=False, as run.allreduce_function: the same n and dtype every step, on every rank
        return lambda comm, message: sparse.sparse_allreduce(comm, message.index, message.values, message.n,
                                                             check=False)

    def gather_and_add(comm, message):
        total = numpy.zeros(message.n, dtype=compressor.dtype)
        for block in sparse.allgather(comm, compressor.pack(message), check=False):
            total += compressor.decompress(compressor.unpack(block, message.n))
        return total
    return gather_and_add


def host_only():
    """The compressors and exchanges are NumPy code: refuse the CuPy backend before any message."""
    if backend.get_backend() != "numpy":
        raise SettingError(f"compressed_sgd runs on host (NumPy) arrays only; the backend is {backend.get_backend()!r}")


# which compressors each flag changes; any other compressor refuses it (a flag is never ignored)
FLAGS = {"--levels": ("qsgd",), "--bits": ("rounding",), "--density": ("topk", "randomk"),
         "--k": ("topk", "randomk"), "--bucket": ("qsgd", "rounding", "terngrad", "onebit"),
         "--allreduce": ("none",), "--error-feedback": tuple(n for n in compress.NAMES if n != "none")}
COMPRESSOR_DEFAULTS = {"--levels": 127, "--bits": 8, "--bucket": compress.BUCKET, "--allreduce": "ring"}


def settings_for(name, given):
    """{flag: value} for compressor ``name`` from the flags ``given`` (None: not given), the defaults
    filled in; a SettingError naming the flag for one that ``name`` would ignore, or a bad value."""
    if name not in compress.NAMES:
        raise SettingError(f"unknown --compressor {name!r}; choose one of {', '.join(compress.NAMES)}")
    for flag, value in given.items():
        if value is not None and name not in FLAGS[flag]:
            shown = ("--error-feedback" if value else "--no-error-feedback") if flag == "--error-feedback" else flag
            raise SettingError(f"{shown} has no effect with --compressor {name} (it is for "
                               f"{', '.join(FLAGS[flag])} only); leave it out")
    if given["--k"] is not None and given["--density"] is not None:
        raise SettingError(f"--k {given['--k']} and --density {given['--density']} both given with --compressor "
                           f"{name}: give one (--k entries, or a fraction --density of them)")
    chosen = {flag: COMPRESSOR_DEFAULTS.get(flag) if value is None and name in FLAGS[flag] else value
              for flag, value in given.items()}
    if name in FLAGS["--density"] and chosen["--k"] is None and chosen["--density"] is None:
        chosen["--density"] = 0.01
    for flag, low, high in (("--levels", 1, 2 ** 15 - 1), ("--bits", 1, 16), ("--k", 1, None),
                            ("--bucket", 1, compress.MAX_BUCKET)):
        if chosen[flag] is not None:
            cli.require(flag, chosen[flag], integer=True, low=low, high=high)
    if chosen["--density"] is not None:
        cli.require("--density", chosen["--density"], low=0, high=1, low_open=True)
    return chosen


def build(name, chosen, dtype):
    """The compressor for ``settings_for``'s flags, with bad settings as SettingErrors naming the flag."""
    try:
        return compress.make(name, bits=chosen["--bits"], levels=chosen["--levels"], density=chosen["--density"],
                             k=chosen["--k"], bucket=chosen["--bucket"] or compress.BUCKET, dtype=dtype)
    except ValueError as error:
        raise SettingError(str(error)) from None


def train(comm=None, compressor="none", levels=None, bits=None, density=None, k=None, error_feedback=None,
          bucket=None, allreduce=None, **settings):
    """Compressed synchronous SGD on ``comm``; returns (final flat parameters as NumPy, history).

    ``compressor``: one of collectives.compression.compress.NAMES; ``levels`` for qsgd (its s, default 127), ``bits``
    for rounding (1..16, default 8); ``density`` or ``k`` for topk/randomk (default density 0.01);
    ``bucket`` for the quantizers (default 512); ``allreduce`` for none (default ring);
    ``error_feedback`` None: on for onebit, topk, randomk. A setting the compressor would ignore is
    refused (SettingError). ``settings``: run.Settings.
    """
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)
    feedback = compressor in BIASED if error_feedback is None else bool(error_feedback)
    given = {"--levels": levels, "--bits": bits, "--density": density, "--k": k, "--bucket": bucket,
             "--allreduce": allreduce, "--error-feedback": error_feedback}
    chosen = {}

    def check(_):
        chosen.update(settings_for(compressor, given))
        allreduce_function(chosen["--allreduce"] or "ring")
        host_only()
        build(compressor, chosen, numpy.float64)
    run = Run.start(comm, settings, check=check, replicated=not feedback,
                    writer=checkpoint.Writer("compressed_sgd", state={"--compressor": compressor,
                                                                      "--error-feedback": feedback}))
    codec_of = build(compressor, chosen, run.objective.grad.dtype)
    codec = (compress.ErrorFeedback if feedback else compress.NoFeedback)(codec_of, len(run.objective.grad))
    if feedback:
        run.keep("residual", codec.residual)
    exchange = exchange_for(codec_of, allreduce_function(chosen["--allreduce"] or "ring"))

    def step(batch):
        key = [settings.seed, run.step] + ([] if codec_of.same_on_every_rank else [run.rank])
        return compressed_step(run.counting, run.objective, run.optimizer, batch, codec, exchange,
                               numpy.random.default_rng(key))
    return run.loop(step)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], allreduce="ring", **DEFAULTS)
    # a flag left out is absent (SUPPRESS), so train() can tell it from one given, and refuse it where ignored
    unset = argparse.SUPPRESS
    parser.set_defaults(allreduce=unset)                 # only --compressor none uses it (default ring)
    parser.add_argument("--compressor", default="none", choices=compress.NAMES)
    parser.add_argument("--levels", type=int, default=unset, help="qsgd: levels s of the norm (1..32767; default 127)")
    parser.add_argument("--bits", type=int, default=unset, help="rounding: bits per entry (1..16; default 8)")
    parser.add_argument("--density", type=float, default=unset,
                        help="topk, randomk: fraction of entries sent (default 0.01)")
    parser.add_argument("--k", type=int, default=unset, help="topk, randomk: entries sent (instead of --density)")
    parser.add_argument("--bucket", type=int, default=unset,
                        help="qsgd, rounding, terngrad, onebit: entries per scale (default 512)")
    parser.add_argument("--error-feedback", action=argparse.BooleanOptionalAction, default=unset,
                        help="keep what was not sent for the next step (default: on for onebit, topk, randomk)")
    args = parser.parse_args(argv)
    given = {name: getattr(args, name, unset) for name in ("levels", "bits", "density", "k", "bucket", "error_feedback",
                                                            "allreduce")}
    given = {name: None if value == unset else value for name, value in given.items()}   # set_defaults keeps the marker
    cli.run_main(train, args, compressor=args.compressor, **given)


if __name__ == "__main__":
    main()
