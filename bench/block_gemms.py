"""The GEMMs of one LLaMA-7B decoder layer's training step at AutoRound's tuning batch (8 x 2048 tokens, bf16), one
GPU: each linear's forward (x @ W^T), its input's gradient (dy @ W) and its weight's gradient (dy^T @ x, as autograd
computes it; and as (x^T @ dy)^T), alone and with the linears that read the same input fused (q/k/v, gate/up), the
device time of each as a CUDA graph replayed (median), and its rate. Which of the block's 11.6 s of GEMMs in
AutoRound's tuning (issue 22) run below the tensor cores' rate, and whether fusing or another layout would help.
--layouts: a 4096 x 4096 linear's three products (forward and input gradient: 16384 x 4096 x 4096; weight
gradient: 4096 x 4096 x 16384) with each operand and the result stored row- or column-major, under cuBLAS and
cuBLASLt (torch.backends.cuda.preferred_blas_library), each with the kernel it ran.
    python3 bench/block_gemms.py [--tokens 16384] [--reps 20] [--layouts]
"""
import argparse
import json
import statistics

import torch

SHAPES = {"q/k/v/o": (4096, 4096), "gate/up": (11008, 4096), "down": (4096, 11008),
          "qkv fused": (3 * 4096, 4096), "gate+up fused": (2 * 11008, 4096)}


def device_ms(fn, reps):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def linear_products(tokens, rows, cols):
    """A (rows x cols) linear's products at `tokens` tokens, by name, on fresh random operands."""
    w = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(tokens, cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, rows, device="cuda", dtype=torch.bfloat16)
    return {"forward x @ W^T": lambda: torch.nn.functional.linear(x, w),
            "grad_x dy @ W": lambda: dy.mm(w),
            "grad_W dy^T @ x": lambda: dy.t().mm(x),
            "grad_W (x^T @ dy)^T": lambda: x.t().mm(dy).t()}


def stored(t, column_major):
    """t's values, stored column-major where asked (a transposed view of the transpose's copy)."""
    return t.t().contiguous().t() if column_major else t.contiguous()


def kernel_of(fn):
    """The name of the longest device kernel one fn() call runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return max(kernels, key=lambda e: e.self_device_time_total).key if kernels else "?"


def layouts(args, out):
    tokens, d = args.tokens, 4096
    products = {"forward/grad_x": (tokens, d, d), "grad_W": (d, d, tokens)}
    for library in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(library)
        for product, (m, n, k) in products.items():
            flops = 2.0 * m * n * k
            for a_col in (False, True):
                for b_col in (False, True):
                    for c_col in (False, True):
                        a = stored(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), a_col)
                        b = stored(torch.randn(k, n, device="cuda", dtype=torch.bfloat16), b_col)
                        c = torch.empty(n, m, device="cuda", dtype=torch.bfloat16).t() if c_col else \
                            torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                        fn = (lambda a=a, b=b, c=c: torch.mm(a, b, out=c))
                        ms = device_ms(fn, args.reps)
                        name = "%s %s A%s B%s C%s" % (library, product, "cr"[a_col], "cr"[b_col], "cr"[c_col])
                        kernel = kernel_of(fn)
                        out["layouts"][name] = {
                            "ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1), "kernel": kernel}
                        print("%-36s %8.3f ms  %6.1f TFLOP/s  %s" % (name, ms, flops / ms / 1e9, kernel), flush=True)
    torch.backends.cuda.preferred_blas_library("cublas")


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--tokens", type=int, default=8 * 2048)
    a.add_argument("--reps", type=int, default=20)
    a.add_argument("--layouts", action="store_true")
    args = a.parse_args()
    torch.manual_seed(0)
    out = {"tokens": args.tokens, "device": torch.cuda.get_device_name(), "gemms": {}, "layouts": {}}
    if args.layouts:
        layouts(args, out)
        print(json.dumps(out, indent=1))
        return
    for name, (rows, cols) in SHAPES.items():
        flops = 2.0 * args.tokens * rows * cols
        for case, fn in linear_products(args.tokens, rows, cols).items():
            ms, kernel = device_ms(fn, args.reps), kernel_of(fn)
            out["gemms"]["%s %s" % (name, case)] = {
                "ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1), "kernel": kernel}
            print("%-16s %-22s %8.3f ms  %6.1f TFLOP/s  %s" % (name, case, ms, flops / ms / 1e9, kernel), flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
