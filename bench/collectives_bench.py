"""qlink's in-process collectives on the GPUs of one host, next to torch.cuda.comm, in
one run (NCCL through torch.distributed is measured by the baseline nccl_bench.py in the
same run). Usage:
    python3 bench/collectives_bench.py --library DIST/libqlink.so [--markdown OUT.md]

all-reduce and broadcast: mean of 20 back-to-back calls after warm-up, as nccl_bench.py;
busbw = algbw * 2(n-1)/n for all-reduce, algbw for broadcast. reduce: best of 10, each
synchronized, as torch_bench.py."""
import argparse
import os
import sys

import torch
import torch.cuda.comm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import qlink  # noqa: E402
from timing import best_us, mean_us  # noqa: E402

SIZES = [1 << 16, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--markdown")
    a = ap.parse_args()
    qlink.configure({"backend": "cuda", "log_level": "warn"}, library=a.library).enable_peer_access()
    n = torch.cuda.device_count()
    devs = list(range(n))
    lines = ["| bytes | all-reduce fp32 us (busbw GB/s) | all-reduce bf16 transport | all-reduce sign-cast | "
             "broadcast us (GB/s) | torch broadcast_coalesced |", "|---|---|---|---|---|---|"]
    print("world", n, torch.cuda.get_device_name(0))
    for size in SIZES:
        bufs = [torch.randn(size // 4, device=d) for d in devs]
        ar = {}
        for op, tr in [("sum", "fp32"), ("sum", "bf16"), ("sign", "bf16")]:
            ar[(op, tr)] = mean_us(lambda: qlink.all_reduce(bufs, op=op, transport=tr))
        src = bufs[0]
        replicas = [[b] for b in bufs[1:]]
        bc = mean_us(lambda: qlink.broadcast([src], replicas))
        tb = mean_us(lambda: torch.cuda.comm.broadcast_coalesced([src], devs))
        bus = lambda us: size / us / 1e3 * 2 * (n - 1) / n  # noqa: E731
        line = "| %d | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) | %.1f (%.0f) |" % (
            size, ar[("sum", "fp32")], bus(ar[("sum", "fp32")]), ar[("sum", "bf16")], bus(ar[("sum", "bf16")]),
            ar[("sign", "bf16")], bus(ar[("sign", "bf16")]), bc, size / bc / 1e3, tb, size / tb / 1e3)
        print(line)
        lines.append(line)
        del bufs, replicas, src
        torch.cuda.empty_cache()
    lines += ["", "| reduce fp32, one partial per GPU into GPU0 | qlink reduce us (GB/s read over the link) | "
              "torch.cuda.comm.reduce_add | b.add(a.to(dev)) |", "|---|---|---|---|"]
    for size in (4 << 20, 64 << 20, 256 << 20):
        parts = [torch.randn(size // 4, device=d) for d in devs]
        out = torch.empty_like(parts[0])
        q = best_us(lambda: qlink.reduce(parts, out, scale=1.0), reps=10)
        ra = best_us(lambda: torch.cuda.comm.reduce_add(parts, destination=0), reps=10)
        ta = best_us(lambda: parts[0].add(parts[1].to("cuda:0", non_blocking=True)), reps=10)
        line = "| %d MiB | %.1f (%.0f) | %.1f | %.1f |" % (size >> 20, q, size * (n - 1) / q / 1e3, ra, ta)
        print(line)
        lines.append(line)
        del parts, out
        torch.cuda.empty_cache()
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
