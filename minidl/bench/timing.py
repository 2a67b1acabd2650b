"""The clock: the minimum of a few runs, interleaved rounds and their spread, the GEMM rate."""
import statistics
import time

CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}


def best_ms(step, repeats, sync=lambda: None, warmup=2, clock="wall"):
    """Minimum time of ``step()`` over ``repeats`` runs, in milliseconds, after ``warmup`` runs.

    ``clock="cpu"`` measures this process's CPU time instead of wall time: on one thread the two
    agree on an idle machine, but CPU time does not count the time other jobs held the core.
    """
    now = CLOCK[clock]
    for _ in range(warmup):
        step()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = now()
        step()
        sync()
        best = min(best, now() - start)
    return best * 1e3


def spread(values):
    """(median, [min, max]) of a list of numbers: a figure and how far one round of it was off."""
    return statistics.median(values), [min(values), max(values)]


def rotated(names, turn):
    """``names`` starting at position ``turn`` (mod its length): the order of round ``turn``, so that no
    candidate always runs first, right after another's caches or allocations."""
    turn %= len(names)
    return list(names[turn:]) + list(names[:turn])


def interleaved(candidates, rounds, calls, clock="cpu"):
    """{name: [ms of each round]}: ``candidates`` {name: (enter, step)} timed in rounds, every candidate
    once a round, the order rotated (A B C, B C A, ...); in each, ``enter()`` (the candidate's settings)
    and then the minimum of ``calls`` runs of ``step()`` after one warm-up run.

    Why rounds: on a shared machine a neighbour's burst of work lasts seconds, and timing one candidate
    after the other hands the whole burst to one of them; in rounds it reaches every candidate alike,
    and the median over rounds of each candidate's time relative to another's (``relative``) is what
    one round's luck moves least."""
    times = {name: [] for name in candidates}
    for turn in range(rounds):
        for name in rotated(list(candidates), turn):
            enter, step = candidates[name]
            enter()
            times[name].append(best_ms(step, calls, warmup=1, clock=clock))
    return times


def relative(times, reference):
    """{name: (median, [min, max]) of its per-round time over ``reference``'s in the same round}."""
    return {name: spread([mine / theirs for mine, theirs in zip(values, times[reference])])
            for name, values in times.items()}


def gemm_gflops(matmul_of, size, repeats, clock, sync=lambda: None):
    """GFLOP/s of one size x size float32 matrix product."""
    seconds = best_ms(matmul_of(size), repeats, sync, clock=clock) / 1e3
    return 2 * size ** 3 / seconds / 1e9
