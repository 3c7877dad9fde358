"""Module moves GPU0 -> GPU1: qlink against the paths hosts use today, in one run.

Host wall time per move including enqueue and a final synchronize, best of 30 (the
method of bench/baselines/torch_bench.py), synchronizing the device whose stream
carries the copy, as the baselines do: GPU0 for PyTorch's paths (its cross-device copy_
runs on the source's stream), GPU1 for the ctypes per-leaf peer copies, the raw C++ paths
of p2p_bench.cu and qlink's copies (the pull kernel runs on the destination). qlink's
backward join makes GPU0's stream wait for the copy too; "both synced" also waits for
GPU0, so it includes that join's cross-device latency; "host-ordered" is a plan made with
sources_ready and sources_held (no joins: the host orders the work, as the raw paths
assume); "wait" plans return once the targets hold the data, so nothing follows them.
Module moves synchronize every device for both paths. "raw pull kernel from Python" is
docs/BASELINES.md's fastest raw path for small leaves (bench/raw_pull.cu) launched through
ctypes and timed as qlink is: what any native path pays for being called from Python.
--plain-python measures the package without its torch bridge (libqlink_torch.so), as on a
PyTorch without the stable C shim. Usage:
    python3 bench/copy_bench.py --library DIST/libqlink.so [--raw-pull raw_pull.so] [--plain-python]
                                [--reps N] [--markdown OUT.md]
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
    ap.add_argument("--raw-pull", help="bench/raw_pull.cu built as a shared library")
    ap.add_argument("--plain-python", action="store_true", help="without the torch bridge")
    ap.add_argument("--reps", type=int, default=30, help="best of this many runs (the baselines take 30)")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    # Timed as the baseline scripts are: synchronizing the copying device (see the module docstring).
    on_both = functools.partial(timing.best_us, reps=a.reps)
    on_gpu0 = functools.partial(on_both, sync=lambda: torch.cuda.synchronize(0))
    on_gpu1 = functools.partial(on_both, sync=lambda: torch.cuda.synchronize(1))
    unsynced = functools.partial(on_both, sync=lambda: None)
    ctx = qlink.configure({"backend": "cuda", "log_level": "warn"}, library=a.library)
    if a.plain_python:
        qlink._bridge._module = None
    print("torch bridge:", qlink._bridge.gpu() is not None)
    ctx.enable_peer_access([0, 1])
    rt = cudart()
    raw = ctypes.CDLL(a.raw_pull) if a.raw_pull else None
    if raw is not None:
        raw.raw_pull_table.restype = ctypes.c_void_p
        raw.raw_pull_table.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 2 + [ctypes.c_uint64, ctypes.c_int]
        raw.raw_pull_launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p]
        raw.raw_pull_free.argtypes = [ctypes.c_void_p]
    rows = []
    print("torch", torch.__version__, torch.cuda.get_device_name(0), "x", torch.cuda.device_count())
    cols = [("to", "Tensor.to"), ("copy_", "copy_"), ("bcast", "broadcast_coalesced"),
            ("peer", "cudaMemcpyPeerAsync/leaf (ctypes)"), ("raw_pull", "raw pull kernel from Python (ctypes)"),
            ("fresh", "qlink fresh lists"),
            ("prepared", "qlink prepared"), ("prepared_both", "qlink prepared, both synced"),
            ("held", "qlink prepared, host-ordered"), ("wait", "qlink prepared, wait"),
            ("held_wait", "qlink prepared, host-ordered, wait"), ("module_to", "module.to"),
            ("move", "qlink move_module_to_device"), ("speedup", "move speedup")]
    print(("%5s %9s" + " %12s" * len(cols)) % (("N", "S") + tuple(k[:12] for k, _ in cols)))

    def measure(n, s):
        """One row: every way of moving n leaves of s bytes GPU0 -> GPU1. Its tensors are freed on return."""
        src = [torch.empty(s // 2, dtype=torch.bfloat16, device="cuda:0").normal_() for _ in range(n)]
        dst = [torch.empty_like(t, device="cuda:1") for t in src]
        r = {"N": n, "S": s}
        r["to"] = on_gpu0(lambda: [t.to("cuda:1", non_blocking=True) for t in src])
        r["copy_"] = on_gpu0(lambda: [d.copy_(t, non_blocking=True) for d, t in zip(dst, src)])
        r["bcast"] = on_gpu0(lambda: torch.cuda.comm.broadcast_coalesced(src, [0, 1]))
        if rt is not None:
            stream = torch.cuda.current_stream(1).cuda_stream

            def per_leaf():
                for d, t in zip(dst, src):
                    rt.cudaMemcpyPeerAsync(ctypes.c_void_p(d.data_ptr()), 1, ctypes.c_void_p(t.data_ptr()), 0,
                                           ctypes.c_size_t(s), ctypes.c_void_p(stream))
            r["peer"] = on_gpu1(per_leaf)
        else:
            r["peer"] = float("nan")
        r["raw_pull"] = float("nan")
        if raw is not None:
            with torch.cuda.device(1):
                words = ctypes.c_uint64 * n
                table = raw.raw_pull_table(words(*[t.data_ptr() for t in src]), words(*[t.data_ptr() for t in dst]),
                                           s, n)
                launch, stream = raw.raw_pull_launch, torch.cuda.current_stream(1).cuda_stream
                r["raw_pull"] = on_gpu1(lambda: launch(table, n, s, stream))
                assert all(torch.equal(d, t.to("cuda:1")) for d, t in zip(dst, src))
                raw.raw_pull_free(table)
        r["fresh"] = on_gpu1(lambda: qlink.peer_copy_batch(src, dst))
        assert all(torch.equal(d, t.to("cuda:1")) for d, t in zip(dst, src))
        prepared = qlink.PreparedCopy(src, dst)
        r["prepared"] = on_gpu1(prepared.run)
        r["prepared_both"] = on_both(prepared.run)
        held = qlink.PreparedCopy(src, dst, sources_ready=True, sources_held=True)  # timing syncs before each run
        r["held"] = on_gpu1(held.run)
        # A plan made with wait=True returns once the targets hold the data: nothing to synchronize.
        waiting = qlink.PreparedCopy(src, dst, wait=True)
        r["wait"] = unsynced(waiting.run)
        held_waiting = qlink.PreparedCopy(src, dst, sources_ready=True, sources_held=True, wait=True)
        r["held_wait"] = unsynced(held_waiting.run)
        module = torch.nn.Module()
        for i, t in enumerate(src):
            module.register_parameter("p%d" % i, torch.nn.Parameter(t.clone(), requires_grad=False))
        back = lambda: module.to("cuda:0")  # noqa: E731
        r["module_to"] = on_both(lambda: module.to("cuda:1"), reset=back)
        r["move"] = on_both(lambda: qlink.move_module_to_device(module, "cuda:1"), reset=back)
        r["speedup"] = r["module_to"] / r["move"]
        return r

    for n, s in SHAPES:
        r = measure(n, s)
        rows.append(r)
        print(("%5d %9d" + " %12.1f" * len(cols)) % ((n, s) + tuple(r[k] for k, _ in cols)))
        torch.cuda.empty_cache()
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("| N x S | " + " | ".join(title for _, title in cols) + " |\n")
            f.write("|---" * (len(cols) + 1) + "|\n")
            for r in rows:
                size = ("%d KiB" % (r["S"] >> 10)) if r["S"] < (1 << 20) else "%d MiB" % (r["S"] >> 20)
                f.write("| %d x %s | " % (r["N"], size) + " | ".join("%.1f" % r[k] for k, _ in cols[:-1]) +
                        " | %.1fx |\n" % r["speedup"])


if __name__ == "__main__":
    main()
