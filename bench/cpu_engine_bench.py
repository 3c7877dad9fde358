"""The CPU backend's GPTQ engine on one layer over each BLAS/LAPACK it can load: its
default (OpenBLAS) and Debian's reference implementation, in the same process, alternated.
    python3 bench/cpu_engine_bench.py --library bazel-bin/libqlink.so [--rows 1024 --cols 4096] [--reps 3]
Prints one markdown row per library: median and min seconds of gptq_quantize (Hessian
inverse + column loop) and of hessian_accumulate (2048 tokens), and the speedup over the
reference."""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import qlink  # noqa: E402
from qlink.quant import gptq_quantize  # noqa: E402

LIBRARIES = {
    "default (OpenBLAS)": {},
    "reference BLAS/LAPACK": {"blas_library": "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3",
                              "solver_library": "/usr/lib/x86_64-linux-gnu/lapack/liblapack.so.3"},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(args.tokens, 64, generator=gen) @ torch.randn(64, args.cols, generator=gen)
         + 0.1 * torch.randn(args.tokens, args.cols, generator=gen)).to(torch.bfloat16)
    w = torch.randn(args.rows, args.cols, generator=gen).to(torch.bfloat16)
    contexts = {name: qlink.load(dict({"backend": "cpu", "cpu_devices": 1, "log_level": "info"}, **extra),
                                 library=args.library) for name, extra in LIBRARIES.items()}
    times = {name: {"solve": [], "hessian": []} for name in LIBRARIES}
    results = {}
    for _ in range(args.reps):
        for name, ctx in contexts.items():
            h = torch.zeros(args.cols, args.cols)
            t0 = time.perf_counter()
            ctx.hessian_accumulate([x], [h])
            times[name]["hessian"].append(time.perf_counter() - t0)
            h *= 2.0 / args.tokens
            t0 = time.perf_counter()
            results[name] = gptq_quantize(w, h, bits=4, group_size=128, ctx=ctx)
            times[name]["solve"].append(time.perf_counter() - t0)
    ref = statistics.median(times["reference BLAS/LAPACK"]["solve"])
    print("| %d x %d, 4-bit g128, %d tokens | solve median (min) | Hessian median (min) | solve speedup |" % (
        args.rows, args.cols, args.tokens))
    print("|---|---|---|---|")
    for name in LIBRARIES:
        s, hh = times[name]["solve"], times[name]["hessian"]
        print("| %s | %.2f s (%.2f) | %.2f s (%.2f) | %.2fx |" %
              (name, statistics.median(s), min(s), statistics.median(hh), min(hh), ref / statistics.median(s)))
    a, b = results.values()
    print("codes equal across the two libraries: %.4f %%" % (100 * (a.codes == b.codes).float().mean()))


if __name__ == "__main__":
    main()
