"""Where a qlink copy's time goes, GPU0 -> GPU1: host enqueue time per call (no sync,
mean over many calls) and GPU time between events on the destination stream.
    python3 bench/copy_breakdown.py --library DIST/libqlink.so
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import qlink  # noqa: E402

SHAPES = [(8, 32768), (64, 32768), (64, 262144), (256, 65536), (8, 2 << 20), (64, 2 << 20), (16, 16 << 20)]


def enqueue_us(fn, calls):
    fn()
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    return (t1 - t0) / calls * 1e6


def gpu_us(fn, reps=20):
    stream = torch.cuda.current_stream(1)
    best = 1e30
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3)
    return best


def profile_python():
    """Where the Python side of a fresh copy and of a module move spends its time."""
    import cProfile
    import pstats
    from qlink._dlpack import pack
    src = [torch.randn(16384, device="cuda:0") for _ in range(256)]
    dst = [torch.empty_like(t, device="cuda:1") for t in src]
    print("pack(256 leaves): %.1f us" % (enqueue_us(lambda: pack(src), 200)))
    for leaves, floats in [(8, 8192), (4, 16 << 20), (64, 65536)]:
        module = torch.nn.Module()
        for i in range(leaves):
            module.register_parameter("p%d" % i, torch.nn.Parameter(torch.randn(floats, device="cuda:0")))
        for label, fn in [("module.to", lambda: module.to("cuda:1")),
                          ("move_module_to_device", lambda: qlink.move_module_to_device(module, "cuda:1"))]:
            host = sync = 1e30
            for _ in range(20):
                module.to("cuda:0")
                torch.cuda.synchronize(0)
                torch.cuda.synchronize(1)
                t0 = time.perf_counter()
                fn()
                t1 = time.perf_counter()
                torch.cuda.synchronize(0)
                torch.cuda.synchronize(1)
                host, sync = min(host, t1 - t0), min(sync, time.perf_counter() - t1)
            print("%s of %d x %d KiB: host %.1f us, then synchronize %.1f us" % (
                label, leaves, floats * 4 >> 10, host * 1e6, sync * 1e6))

    def moves():
        for _ in range(50):
            qlink.move_module_to_device(module, "cuda:1")
            qlink.move_module_to_device(module, "cuda:0")
            qlink.peer_copy_batch(src, dst)
    prof = cProfile.Profile()
    prof.runcall(moves)
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


def breakdown_row(n, s):
    """One row: n leaves of s bytes; its tensors are freed when it returns."""
    src = [torch.randn(s // 4, device="cuda:0") for _ in range(n)]
    dst = [torch.empty_like(t, device="cuda:1") for t in src]
    prepared = qlink.PreparedCopy(src, dst)
    calls = 200 if n * s < (64 << 20) else 20
    host_p = enqueue_us(prepared.run, calls)
    host_f = enqueue_us(lambda: qlink.peer_copy_batch(src, dst), calls)
    g = gpu_us(prepared.run)
    return "%5d %9d %14.1f %14.1f %14.1f %12.1f" % (n, s, host_p, host_f, g, n * s / g / 1e3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    a = ap.parse_args()
    qlink.configure({"backend": "cuda", "log_level": "warn"}, library=a.library).enable_peer_access([0, 1])
    print("%5s %9s %14s %14s %14s %12s" % ("N", "S", "prepared_host", "fresh_host", "gpu_us", "GB/s"))
    for n, s in SHAPES:
        print(breakdown_row(n, s))
        torch.cuda.empty_cache()
    profile_python()
    for label, fn in [("current_stream(d).cuda_stream", lambda: torch.cuda.current_stream(1).cuda_stream),
                      ("_cuda_getCurrentRawStream", lambda: torch._C._cuda_getCurrentRawStream(1))]:
        t0 = time.perf_counter()
        for _ in range(10000):
            fn()
        print("%s: %.2f us" % (label, (time.perf_counter() - t0) / 10000 * 1e6))


if __name__ == "__main__":
    main()
