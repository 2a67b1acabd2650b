"""The convolution's choices, each timed on this machine: block size, layouts, column budget, auto's thresholds.

Every choice is a race between candidates on the layer shapes that decide it, run in interleaved
rounds (``minidl.bench.timing.interleaved``: A B C, B C A, ...), each candidate's time taken
relative to the shipped default's in the same round, and the median over rounds kept. A candidate
replaces the default only where it is at least MARGIN faster by that median and the gain beats the
noise: faster in so many rounds that a fair coin would do it with probability under LEVEL (a
one-sided sign test; with 5 rounds, all 5). A tie, one lucky round, or too few rounds to tell (fewer
than 5) keep what ships: on a shared machine one round can be 10% off either way.

    block_size      im2col's block of images, from half the L2 cache to eight times it: LeNet-5's two
                    layers at batch 64 and 256 and the 64-channel layer at batch 16, the geometric mean
                    of the median ratios over those five; one size serves every layer, each with a target
                    of its own, so a size that is slower on one of them beyond MARGIN and the noise is
                    not taken, however much it gains on the others
    layouts         per LeNet-5 layer and batch 16 .. 256 where the batch is several blocks: columns
                    kept batch innermost, kept per image, kept in im2col's order (where backward
                    uses them), or rebuilt per block ("blocks")
    column_budget   keep or rebuild at batch 512 and 1024 (beyond the sweep); the budget is the
                    smallest power of two that holds the largest columns that won by keeping
    thresholds      auto's: Winograd against im2col at 32, 64, 128 channels (batch 16, 32x32, 3x3),
                    FFT against im2col at 5x5, 7x7, 9x9 (batch 8, 16 channels, 64x64, "same" padding,
                    and LeNet-5's conv2 shape, batch 64, 6 -> 16 channels, 14x14); the threshold is
                    the smallest size from which the other algorithm stays faster (by MARGIN) on
                    every shape raced
"""
import math
import statistics
from contextlib import contextmanager

import numpy

from minidl import tuning
from minidl.bench.steps import minidl_step
from minidl.bench.timing import interleaved, relative
from minidl.conv import auto, budget, im2col_blocked as blocked

MARGIN = 0.03                # a candidate must beat the default by 3% (median over rounds) to replace it,
LEVEL = 0.05                 # and in so many rounds that chance would do it less often than this
# LeNet-5's layers and the 64-channel layer: (in channels, out channels, side, kernel, stride, padding)
LENET = {"conv1": (1, 6, 28, 5, 1, 2), "conv2": (6, 16, 14, 5, 1, 0)}
WIDE = (64, 64, 32, 3, 1, 1)
BATCHES = (16, 32, 64, 128, 256)
LARGE_BATCHES = (512, 1024)


@contextmanager
def restored():
    """Leave the kernel's settings as they were, whatever the races set."""
    saved = blocked.BLOCK_BYTES, blocked.LAYOUTS, budget.COLUMN_BUDGET
    try:
        yield
    finally:
        blocked.BLOCK_BYTES, blocked.LAYOUTS, budget.COLUMN_BUDGET = saved


def setting(block_bytes, column_bytes, layouts):
    """A candidate's ``enter``: the kernel's block size, column budget and layouts table set to these."""
    def enter():
        blocked.BLOCK_BYTES, blocked.LAYOUTS, budget.COLUMN_BUDGET = block_bytes, layouts, column_bytes
    return enter


def conv_step(batch, layer, algorithm="im2col"):
    """One forward + backward of the layer (in, out, side, kernel, stride, padding) at this batch, as LeNet-5
    runs it: conv1 is the model's first layer, whose input (the images) needs no gradient, and the
    layouts differ most in the input gradient (per image, col2im adds rows of 28 pixels)."""
    c, f, side, k, stride, padding = layer
    return minidl_step({"kind": "conv", "shape": (batch, c, f, side, k, stride, padding), "algorithm": algorithm,
                        "input_grad": layer != LENET["conv1"]}, numpy.random.default_rng(0))


def per_round(times, reference):
    """{name: [its time over ``reference``'s, round by round]}."""
    return {name: [mine / theirs for mine, theirs in zip(values, times[reference])] for name, values in times.items()}


def beats_noise(ratios, faster=True):
    """True where the per-round ratios are below 1 (``faster=False``: above 1) in so many rounds that a
    fair coin would be so often with probability under LEVEL: a one-sided sign test, which asks nothing
    of the noise's shape. Fewer than 5 rounds never are (1/16 > LEVEL)."""
    rounds = len(ratios)
    won = sum(ratio < 1 if faster else ratio > 1 for ratio in ratios)
    return sum(math.comb(rounds, k) for k in range(won, rounds + 1)) / 2 ** rounds < LEVEL


def fastest(times, default):
    """(the candidate to take, {name: (median, [min, max]) relative to default}): the lowest median if it
    beats the default by MARGIN and beats the noise, else the default."""
    ratios, each = relative(times, default), per_round(times, default)
    best = min(ratios, key=lambda name: ratios[name][0])
    return (best if ratios[best][0] < 1 - MARGIN and beats_noise(each[best]) else default), ratios


def block_size(rounds, calls, report, quick=False):
    """(block bytes, measurements): the candidate with the lowest geometric mean of median ratios, where it
    beats the default by MARGIN and the noise (its rounds of every case together), and loses on no case
    (a median over 1 + MARGIN, slower in rounds beyond the noise); else the default."""
    l2 = tuning.l2_bytes() or 1 << 20
    default = tuning.SHIPPED.block_bytes
    candidates = sorted({l2 // 2, l2, 2 * l2, 4 * l2, 8 * l2, default})
    cases = ([(4, LENET["conv2"])] if quick else
             [(64, LENET["conv1"]), (256, LENET["conv1"]), (64, LENET["conv2"]), (256, LENET["conv2"]), (16, WIDE)])
    logs = {size: [] for size in candidates}
    rounds_of = {size: [] for size in candidates}             # per case, the per-round ratios
    measured = []
    for batch, layer in cases:
        step = conv_step(batch, layer)
        times = interleaved({size: (setting(size, tuning.SHIPPED.column_bytes, {}), step) for size in candidates},
                            rounds, calls)
        ratios, each = relative(times, default), per_round(times, default)
        for size in candidates:
            logs[size].append(math.log(ratios[size][0]))
            rounds_of[size].append(each[size])
        measured.append({"batch": batch, "layer": list(layer), "ratios": {str(s): r for s, r in ratios.items()}})
    score = {size: math.exp(sum(values) / len(values)) for size, values in logs.items()}
    taken = [size for size in candidates if score[size] < 1 - MARGIN
             and beats_noise([ratio for case in rounds_of[size] for ratio in case])
             and not any(statistics.median(case) > 1 + MARGIN and beats_noise(case, faster=False)
                         for case in rounds_of[size])]
    chosen = min(taken, key=score.get) if taken else default
    report(f"block size: {', '.join(f'{s >> 10} KiB {score[s]:.3f}' for s in candidates)} (geometric mean of "
           f"median ratios to the shipped {default >> 10} KiB) -> {chosen >> 10} KiB")
    return chosen, {"candidates": candidates, "score": {str(s): v for s, v in score.items()}, "cases": measured}


def layout_candidates(batch, layer, block_bytes, column_bytes):
    """(the rule's choice, [candidates]) for this layer and batch, or (None, []) where nothing is kept
    whatever the layout (one block, or columns over the budget)."""
    c, f, side, k, stride, padding = layer
    x_shape, weight_shape = (batch, c, side, side), (f, c, k, k)
    blocks = blocked.image_blocks(x_shape, weight_shape, stride, padding, 4, block_bytes)
    with restored():
        setting(block_bytes, column_bytes, {})()
        rule = blocked.kept_layout(x_shape, weight_shape, stride, padding, 4, len(blocks))
        setting(block_bytes, column_bytes, {tuning.shape_key(x_shape, weight_shape, stride, padding, 4):
                                            [[1, "batch inner"]]})()
        if blocked.kept_layout(x_shape, weight_shape, stride, padding, 4, len(blocks)) is None:
            return None, []
    names = ["batch inner", "per image", "blocks"]
    if not blocked.input_gradient_as_convolution(weight_shape, stride, padding):
        names.insert(1, "im2col order")
    return rule or "blocks", names


def race_layouts(batch, layer, block_bytes, column_bytes, rounds, calls):
    """(winner, ratios, column bytes) of the layouts for this layer and batch; None where no choice."""
    rule, names = layout_candidates(batch, layer, block_bytes, column_bytes)
    if not names:
        return None
    c, f, side, k, stride, padding = layer
    key = tuning.shape_key((batch, c, side, side), (f, c, k, k), stride, padding, 4)
    step = conv_step(batch, layer)
    times = interleaved({name: (setting(block_bytes, column_bytes, {key: [[1, name]]}), step) for name in names},
                        rounds, calls)
    winner, ratios = fastest(times, rule)
    return winner, ratios, batch * budget.column_bytes((batch, c, side, side), (f, c, k, k), stride, padding, 4)


def layouts(block_bytes, rounds, calls, report, quick=False):
    """({shape key: [[from_batch, layout], ...]}, column budget, measurements)."""
    table, won, measured = {}, [], []
    roomy = 1 << 40                          # while racing: the budget never decides
    for name, layer in LENET.items():
        c, f, side, k, stride, padding = layer
        key = tuning.shape_key((1, c, side, side), (f, c, k, k), stride, padding, 4)
        rows = []
        for batch in ((8, 16) if quick else BATCHES + LARGE_BATCHES):
            raced = race_layouts(batch, layer, block_bytes, roomy, rounds, calls)
            if raced is None:
                continue
            winner, ratios, nbytes = raced
            measured.append({"layer": name, "batch": batch, "winner": winner, "ratios": ratios})
            report(f"layout {name} batch {batch}: " + ", ".join(f"{n} {r[0]:.3f}" for n, r in ratios.items())
                   + f" -> {winner}")
            if winner != "blocks":
                won.append(nbytes)
            if batch in LARGE_BATCHES:
                continue                     # beyond the sweep: they decide the budget, not the table
            if not rows or rows[-1][1] != winner:
                rows.append([batch, winner])
        if rows:
            table[key] = rows
    column_bytes = 1 << math.ceil(math.log2(max(won))) if won else 0
    report(f"column budget: the largest columns kept faster {max(won, default=0) / 2**20:.1f} MiB -> "
           f"{column_bytes / 2**20:g} MiB")
    return table, column_bytes, measured


def threshold(sizes, faster, shipped):
    """The smallest size from which the other algorithm was faster at every larger size measured; above
    the sizes measured (the shipped one, or twice the largest) where it was faster at none."""
    start = None
    for size in reversed(sizes):
        if not faster[size]:
            break
        start = size
    return start if start is not None else max(shipped, 2 * sizes[-1])


def thresholds(block_bytes, column_bytes, layouts_table, rounds, calls, report, quick=False):
    """(winograd_min_channels, fft_min_kernel, measurements): auto's two crossovers, measured. The rule
    looks only at the channels or the kernel, so a size counts as the other algorithm's only where it
    won on every shape raced at that size: FFT's on the kernel sweep's wide images and on LeNet-5's
    small ones (conv2's 6 -> 16 channels on 14x14, batch 64), where the transforms cost the most."""
    measured = {}
    enter = setting(block_bytes, column_bytes, layouts_table)
    channels = (4, 8) if quick else (32, 64, 128)
    kernels = (3, 5) if quick else (5, 7, 9)
    width, side = (4, 12) if quick else (16, 64)
    winograd_shapes = [(2 if quick else 16, lambda w: (w, w, 8 if quick else 32, 3, 1, 1))]
    fft_shapes = [(2 if quick else 8, lambda k: (width, width, side, k, 1, k // 2))] + (
        [] if quick else [(64, lambda k: (6, 16, 14, k, 1, 0))])
    for other, sizes, shapes, shipped in (("winograd", channels, winograd_shapes, tuning.SHIPPED.winograd_min_channels),
                                          ("fft", kernels, fft_shapes, tuning.SHIPPED.fft_min_kernel)):
        faster, ratios, by_round = {}, {}, {}
        for size in sizes:
            ratios[size], by_round[size] = [], []
            for batch, layer_of in shapes:
                times = interleaved({name: (enter, conv_step(batch, layer_of(size), name))
                                     for name in ("im2col", other)}, rounds, calls)
                ratios[size].append(relative(times, "im2col")[other])
                by_round[size].append(per_round(times, "im2col")[other])
            faster[size] = all(ratio[0] < 1 - MARGIN and beats_noise(each)              # a tie keeps im2col
                               for ratio, each in zip(ratios[size], by_round[size]))
        measured[other] = {str(size): ratio for size, ratio in ratios.items()}
        measured[other + "_threshold"] = threshold(list(sizes), faster, shipped)
        report(f"auto, {other} against im2col: " + ", ".join(f"{s} " + "/".join(f"{r[0]:.3f}" for r in each)
                                                               for s, each in ratios.items())
               + f" -> from {measured[other + '_threshold']}")
    return measured["winograd_threshold"], measured["fft_threshold"], measured


def tune(rounds, calls, report, quick=False):
    """The minidl section of the tuning file: {"settings": ..., "measurements": ...}."""
    with restored():
        block_bytes, block_measured = block_size(rounds, calls, report, quick)
        # --quick: blocks of a few of its tiny batch's images, so that there is a layout to choose
        table, column_bytes, layout_measured = layouts(128 << 10 if quick else block_bytes, rounds, calls, report,
                                                       quick)
        winograd, fft, auto_measured = thresholds(block_bytes, column_bytes, table, rounds, calls, report, quick)
    return {"settings": {"block_bytes": block_bytes, "column_bytes": column_bytes, "layouts": table,
                         "winograd_min_channels": winograd, "fft_min_kernel": fft},
            "measurements": {"block_size": block_measured, "layouts": layout_measured, "auto": auto_measured,
                             "rounds": rounds, "calls": calls, "shipped_auto": [auto.WINOGRAD_MIN_CHANNELS,
                                                                                 auto.FFT_MIN_KERNEL]}}
