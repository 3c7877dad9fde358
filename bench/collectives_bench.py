"""qlink's in-process collectives on the GPUs of one host, next to torch.cuda.comm, in
one run (NCCL through torch.distributed is measured by the baseline nccl_bench.py in the
same run). Usage:
    python3 bench/collectives_bench.py --library DIST/libqlink.so [--markdown OUT.md]

all-reduce and broadcast: mean of 20 back-to-back calls after warm-up, as nccl_bench.py;
busbw = algbw * 2(n-1)/n for all-reduce, algbw for broadcast; "prepared" replays one
qlink.PreparedAllReduce. reduce: best of 10, each synchronizing the output's device (GPU0),
as torch_bench.py does for reduce_add."""
import argparse
import os
import sys

import torch
import torch.cuda.comm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import qlink  # noqa: E402
from timing import best_us, mean_us  # noqa: E402

SIZES = [1 << 16, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]


def all_reduce_broadcast_row(size, devs):
    """One row of the all-reduce and broadcast table; its buffers are freed when it returns."""
    n = len(devs)
    bufs = [torch.randn(size // 4, device=d) for d in devs]
    bus = lambda us: size / us / 1e3 * 2 * (n - 1) / n  # noqa: E731
    cells = []
    for op, tr in [("sum", "fp32"), ("sum", "bf16"), ("sign", "bf16")]:
        once = mean_us(lambda: qlink.all_reduce(bufs, op=op, transport=tr))
        plan = qlink.PreparedAllReduce(bufs, op=op, transport=tr)
        prepared = mean_us(plan.run)
        cells += ["%.1f (%.0f)" % (once, bus(once)), "%.1f (%.0f)" % (prepared, bus(prepared))]
        if tr == "fp32" and n & (n - 1) == 0:
            hd = mean_us(lambda: qlink.all_reduce(bufs, algorithm="halving_doubling"))
            cells.append("%.1f (%.0f)" % (hd, bus(hd)))
        elif tr == "fp32":
            cells.append("n/a")
        del plan
    src = bufs[0]
    replicas = [[b] for b in bufs[1:]]
    bc = mean_us(lambda: qlink.broadcast([src], replicas))
    held = mean_us(lambda: qlink.broadcast([src], replicas, sources_held=True))
    tb = mean_us(lambda: torch.cuda.comm.broadcast_coalesced([src], devs))
    cells += ["%.1f (%.0f)" % (us, size / us / 1e3) for us in (bc, held, tb)]
    return "| %d | " % size + " | ".join(cells) + " |"


def reduce_row(size, devs):
    """One row of the reduce table; its buffers are freed when it returns."""
    n = len(devs)
    parts = [torch.randn(size // 4, device=d) for d in devs]
    out = torch.empty_like(parts[0])
    on_gpu0 = lambda: torch.cuda.synchronize(0)  # noqa: E731
    q = best_us(lambda: qlink.reduce(parts, out, scale=1.0), reps=10, sync=on_gpu0)
    ra = best_us(lambda: torch.cuda.comm.reduce_add(parts, destination=0), reps=10, sync=on_gpu0)
    ta = best_us(lambda: parts[0].add(parts[1].to("cuda:0", non_blocking=True)), reps=10, sync=on_gpu0)
    return "| %d MiB | %.1f (%.0f) | %.1f | %.1f |" % (size >> 20, q, size * (n - 1) / q / 1e3, ra, ta)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--markdown")
    a = ap.parse_args()
    qlink.configure({"backend": "cuda", "log_level": "warn"}, library=a.library).enable_peer_access()
    n = torch.cuda.device_count()
    devs = list(range(n))
    lines = ["| bytes | all-reduce fp32 us (busbw GB/s) | prepared fp32 | halving-doubling fp32 | "
             "all-reduce bf16 transport | prepared bf16 | all-reduce sign-cast | prepared sign-cast | "
             "broadcast us (GB/s) | broadcast, sources held | torch broadcast_coalesced |", "|---" * 11 + "|"]
    print("world", n, torch.cuda.get_device_name(0))
    for size in SIZES:
        line = all_reduce_broadcast_row(size, devs)
        print(line)
        lines.append(line)
        torch.cuda.empty_cache()
    lines += ["", "| reduce fp32, one partial per GPU into GPU0 | qlink reduce us (GB/s read over the link) | "
              "torch.cuda.comm.reduce_add | b.add(a.to(dev)) |", "|---|---|---|---|"]
    for size in (4 << 20, 64 << 20, 256 << 20):
        line = reduce_row(size, devs)
        print(line)
        lines.append(line)
        torch.cuda.empty_cache()
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
