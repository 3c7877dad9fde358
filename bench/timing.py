"""Host wall-time measurement shared by the benchmarks, in the manner of the baseline
scripts (bench/baselines): best of N synchronized runs, or the mean of back-to-back
runs as nccl_bench.py does."""
import statistics
import time

import torch


def sync_all():
    for d in range(torch.cuda.device_count()):
        torch.cuda.synchronize(d)


def best_us(fn, reps=30, reset=None, sync=sync_all):
    """Best of `reps` runs of fn() followed by sync(); reset() runs untimed before each."""
    fn()
    sync_all()
    best = 1e30
    for _ in range(reps):
        if reset:
            reset()
            sync_all()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def mean_us(fn, reps=20):
    """Mean of `reps` back-to-back runs after three warm-ups, synchronized once at the end."""
    for _ in range(3):
        fn()
    sync_all()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync_all()
    return (time.perf_counter() - t0) / reps * 1e6


def median_s(fn, reps=3):
    """Median wall time in s of fn() over reps runs after one warm-up, synchronizing around
    each (on a GPU); with the last run's result: (result, seconds)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    out = fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)
