"""Module moves GPU0 -> GPU1: qlink against the paths hosts use today, in one run.

Host wall time per move including enqueue and a final synchronize, best of 30 (the
method of ../shared/baselines/torch_bench.py): synchronizing the current device (GPU0)
covers every path timed here, since PyTorch's copy_ makes the source stream wait for a
cross-device copy and so does qlink's backward join; the ctypes per-leaf path has no such
join and synchronizes GPU1. Usage:
    python3 bench/copy_bench.py --library DIST/libqlink.so [--markdown OUT.md]
"""
import argparse
import ctypes
import functools
import glob
import os
import sys

import torch
import torch.cuda.comm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import qlink  # noqa: E402
import timing  # noqa: E402

# Timed as the baseline scripts are: synchronizing GPU0 (see the module docstring).
best_us = functools.partial(timing.best_us, sync=torch.cuda.synchronize)

SHAPES = [(8, 32768), (64, 32768), (8, 262144), (64, 262144), (256, 65536), (8, 2 << 20), (64, 2 << 20),
          (16, 16 << 20), (4, 64 << 20)]


def cudart():
    """The CUDA runtime PyTorch ships, for the upstream per-leaf cudaMemcpyPeerAsync path."""
    roots = [os.path.dirname(torch.__file__)] + [os.path.join(p, "nvidia") for p in sys.path if os.path.isdir(p)]
    for root in roots:
        for path in glob.glob(os.path.join(root, "**", "libcudart.so*"), recursive=True):
            return ctypes.CDLL(path)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--markdown")
    a = ap.parse_args()
    ctx = qlink.configure({"backend": "cuda", "log_level": "warn"}, library=a.library)
    ctx.enable_peer_access([0, 1])
    rt = cudart()
    rows = []
    print("torch", torch.__version__, torch.cuda.get_device_name(0), "x", torch.cuda.device_count())
    head = ("N", "S", "Tensor.to", "copy_", "bcast_coal", "peer/leaf", "qlink fresh", "qlink prepared",
            "module.to", "qlink move_module", "move speedup")
    print(("%5s %9s" + " %12s" * 9) % head)
    for n, s in SHAPES:
        src = [torch.empty(s // 2, dtype=torch.bfloat16, device="cuda:0").normal_() for _ in range(n)]
        dst = [torch.empty_like(t, device="cuda:1") for t in src]
        r = {"N": n, "S": s}
        r["to"] = best_us(lambda: [t.to("cuda:1", non_blocking=True) for t in src])
        r["copy_"] = best_us(lambda: [d.copy_(t, non_blocking=True) for d, t in zip(dst, src)])
        r["bcast"] = best_us(lambda: torch.cuda.comm.broadcast_coalesced(src, [0, 1]))
        if rt is not None:
            stream = torch.cuda.current_stream(1).cuda_stream

            def per_leaf():
                for d, t in zip(dst, src):
                    rt.cudaMemcpyPeerAsync(ctypes.c_void_p(d.data_ptr()), 1, ctypes.c_void_p(t.data_ptr()), 0,
                                           ctypes.c_size_t(s), ctypes.c_void_p(stream))
            r["peer"] = best_us(per_leaf, sync=lambda: torch.cuda.synchronize(1))
        else:
            r["peer"] = float("nan")
        r["fresh"] = best_us(lambda: qlink.peer_copy_batch(src, dst))
        assert all(torch.equal(d, t.to("cuda:1")) for d, t in zip(dst, src))
        prepared = qlink.PreparedCopy(src, dst)
        r["prepared"] = best_us(prepared.run)
        module = torch.nn.Module()
        for i, t in enumerate(src):
            module.register_parameter("p%d" % i, torch.nn.Parameter(t.clone(), requires_grad=False))
        back = lambda: module.to("cuda:0")  # noqa: E731
        r["module_to"] = best_us(lambda: module.to("cuda:1"), reset=back)
        r["move"] = best_us(lambda: qlink.move_module_to_device(module, "cuda:1"), reset=back)
        r["speedup"] = r["module_to"] / r["move"]
        rows.append(r)
        print(("%5d %9d" + " %12.1f" * 9) % (n, s, r["to"], r["copy_"], r["bcast"], r["peer"], r["fresh"],
                                             r["prepared"], r["module_to"], r["move"], r["speedup"]))
        del src, dst, module, prepared
        torch.cuda.empty_cache()
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("| N x S | Tensor.to | copy_ | broadcast_coalesced | cudaMemcpyPeerAsync/leaf (ctypes) | "
                    "qlink fresh lists | qlink prepared | module.to | qlink move_module_to_device | move speedup |\n")
            f.write("|---|---|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                f.write("| %d x %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1fx |\n" % (
                    r["N"], ("%d KiB" % (r["S"] >> 10)) if r["S"] < (1 << 20) else "%d MiB" % (r["S"] >> 20),
                    r["to"], r["copy_"], r["bcast"], r["peer"], r["fresh"], r["prepared"], r["module_to"],
                    r["move"], r["speedup"]))


if __name__ == "__main__":
    main()
