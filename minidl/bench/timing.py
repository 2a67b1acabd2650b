"""The clock: the minimum of repeated runs after a warm-up, and the machine's GEMM rate."""
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


def gemm_gflops(matmul_of, size, repeats, clock, sync=lambda: None):
    """GFLOP/s of one size x size float32 matrix product."""
    seconds = best_ms(matmul_of(size), repeats, sync, clock=clock) / 1e3
    return 2 * size ** 3 / seconds / 1e9
