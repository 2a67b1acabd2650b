"""Benchmarks (numbers, not tests): minidl beside PyTorch CPU and beside the machine's GEMM rate.

    python -m minidl.bench                 conv / pooling / linear layers and two training steps
    python -m minidl.bench conv            the four convolution algorithms, their cost table, the
                                           Winograd channel sweep and the FFT kernel-size crossover
    python -m minidl.bench sweep           the LeNet-5 and MLP training steps and the 64-channel conv layer
                                           at batch 16..256, PyTorch beside them, the conv layer's floor
                                           (its GEMMs and copies timed alone); CuPy rows if a GPU
    python -m minidl.bench layers          Hegde & Usmani 2016, section 4: a conv layer and a fully
                                           connected layer over sizes, NumPy vs CuPy (if a GPU) vs PyTorch
    options: --json PATH  --plot PATH (conv, layers)  --threads N (default 1)  --rounds R  --repeats K
             --launches N  --clock cpu|wall  --quick  --no-torch  --blas native

Run ``python -m minidl.tune`` first: the conv kernel's block size, column budget, layouts and
``auto``'s thresholds are then this machine's (``minidl/tuning.py``); the table's first line says
which settings ran, and the JSON records them.

Every case is timed as forward + backward (and, for a training step, the optimizer update), in
``--rounds`` interleaved rounds (``rounds.py``): minidl, PyTorch and (sweep) the conv layer's floor
each take one turn a round, the order rotated from round to round, and a turn is the minimum of
``--repeats`` runs. A row's time is the median over rounds; its ratio (minidl / PyTorch, minidl /
floor) is the median of the per-round ratios, printed with the smallest and largest round's as
[min, max], and the target is judged on that median. On a shared machine a neighbour's burst of
work lasts seconds: timed one side after the other, a whole burst lands on one side; in rounds it
reaches both alike, and a ratio taken within a round cancels what both sides shared.
``--launches N`` runs the whole benchmark N times, each with fresh worker processes, and counts per
target the launches whose median met it: one launch's ratio is no evidence.

With one thread (the default) the clock is the process's CPU time (``--clock cpu``): on an idle
machine it equals wall time, on a shared one
it leaves out the time other jobs held the core (cache and memory-bandwidth contention remain);
with more threads, and on the GPU, it is wall time. minidl and PyTorch each run in their own
process (``--worker``), started with the same thread count in OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS and MKL_NUM_THREADS (and ``torch.set_num_threads``), so neither library's
thread pool or allocator disturbs the other. Both workers import minidl (this package is part of
it), so both run with the malloc thresholds ``minidl.backend.keep_freed_memory`` sets at import:
the allocator is the same on both sides (with glibc's defaults PyTorch's 64-channel layer page-faults
and takes 42-46 ms instead of 39 on the machine of chapter 2). The training steps zero gradients
with ``set_to_none=True`` on both sides. PyTorch is only a yardstick: it is imported in yardstick.py
and nowhere else in minidl, and the PyTorch columns are empty when it is not installed.

``gflops`` counts the direct method's 2 * N * F * C * kh * kw * Ho * Wo floating-point operations
per pass (three passes for forward + backward) whatever the algorithm, so a faster algorithm shows
as a higher "effective" rate; ``gemm_gflops`` is float32 NumPy matmul of two n x n matrices.

The package, one concern a file:

    cases.py      the four suites' cases and their flop counts
    timing.py     the clock: minimum of repeated runs, interleaved rounds and their spread, the GEMM rate
    rounds.py     the workers' protocol: a process per side, asked case after case, round after round
    steps.py      the minidl side: a layer's forward + backward or a training step; the minidl worker
    breakdown.py  where the time goes: each layer's stages timed alone (the main suite; the sweep's floor)
    yardstick.py  the PyTorch side (the only place PyTorch is imported)
    measure.py    the workers in their own processes, their answers as rows; the conv suite's summary
    table.py      printing and plotting
    cli.py        the command line (``__main__.py`` runs it)
"""
from minidl.bench.cases import SUITES, conv_cases, layers_cases, main_cases, sweep_cases
from minidl.bench.cli import main
from minidl.bench.steps import minidl_step
from minidl.bench.timing import best_ms
from minidl.bench.yardstick import torch_step

__all__ = ["SUITES", "main_cases", "conv_cases", "layers_cases", "sweep_cases", "main", "minidl_step", "best_ms",
           "torch_step"]
