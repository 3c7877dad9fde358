"""The GPTQ engine's two inverses (qlink_gptq_options.inverse, ABI 1.11) on one GPU, LLaMA-7B
and LLaMA-70B layer shapes, same weight and Hessian: the whole gptq_quantize call with
"cholesky_inverse" (GPTQModel's potrf, cholesky_inverse, potrf upper) and with "triangular"
(the reversed potrf and one trtri), median of --reps after a warm-up; the codes the two give
alike and their losses. Then, in PyTorch on the same Hessians, how far each route's fp32
factor U is from the float64 one (the triangular route as PyTorch can write it:
solve_triangular against the identity, the engine's trtri being cuSOLVER's). Last, on the
GPU test's ill-conditioned problem (tests/python/gptq_reference.py) over --seeds seeds, with
and without desc_act: how many of each route's codes equal float64 GPTQ's, the engine's and
the same route's in PyTorch fp32.

    python3 bench/gptq_inverse_bench.py --library DIST/libqlink.so [--device cpu]
        [--shapes ROWSxCOLUMNS,...] [--reps 3] [--seeds 2] [--problem ROWSxCOLUMNS]
        [--markdown OUT.md]

--device cpu: the CPU backend's engine (one virtual device) and PyTorch's CPU LAPACK, on
--shapes (default: the GPU's, too slow there).
"""
import argparse
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import qlink  # noqa: E402
from gptq_bench import hessian_of  # noqa: E402
from gptq_reference import ill_conditioned_problem, inverse_factor, reference_gptq  # noqa: E402
from qlink.quant import gptq_quantize  # noqa: E402
from timing import median_s  # noqa: E402

# (name, rows, columns): a layer's weight is rows x columns, its Hessian columns x columns.
SHAPES = [("7B gate_proj", 11008, 4096), ("7B down_proj", 4096, 11008), ("70B q_proj", 8192, 8192),
          ("70B gate_proj", 28672, 8192), ("70B down_proj", 8192, 28672)]
INVERSES = ("cholesky_inverse", "triangular")


def damped(h, damp=0.01):
    out = h.clone()
    out.diagonal().add_(damp * torch.diag(h).double().mean().to(h.dtype))
    return out


def factors(h):
    """U (H^-1 = U^T U) of the damped fp32 h by both routes in PyTorch, and in float64."""
    hd = damped(h)
    return {inverse: inverse_factor(hd, inverse) for inverse in INVERSES}, inverse_factor(damped(h.double()))


def agreement(ctx, device, rows, cols, seeds):
    """Per desc_act and route: the share of codes equal to float64 GPTQ's, the engine's and
    PyTorch fp32's, over the seeds' problems (a dead column each, as the GPU test's)."""
    lines = ["| desc_act | route | engine: codes as float64's | PyTorch fp32, same route |", "|---|---|---|---|"]
    for desc_act in (False, True):
        shares = {inverse: ([], []) for inverse in INVERSES}  # engine's, PyTorch fp32's
        for seed in range(seeds):
            w, h = ill_conditioned_problem(rows, cols, seed, device=device)
            w = w.bfloat16()
            h[9, :], h[:, 9] = 0, 0
            truth = reference_gptq(w.double(), h.double(), desc_act=desc_act)[0]
            for inverse, (engine, torch_fp32) in shares.items():
                mine = gptq_quantize(w, h, ctx=ctx, desc_act=desc_act, inverse=inverse).codes
                theirs = reference_gptq(w, h, desc_act=desc_act, inverse=inverse)[0]
                engine.append((mine == truth).float().mean().item() * 100)
                torch_fp32.append((theirs == truth).float().mean().item() * 100)
        for inverse, values in shares.items():
            cells = [" / ".join("%.3f %%" % v for v in column) for column in values]
            lines.append("| %s | %s | %s | %s |" % (desc_act, inverse, *cells))
            print(lines[-1], flush=True)
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--shapes", help="ROWSxCOLUMNS,... instead of the LLaMA layers")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=2, help="the agreement table's problems (0: none)")
    ap.add_argument("--problem", default="1024x4096", help="the agreement problem's ROWSxCOLUMNS")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    shapes = SHAPES if not args.shapes else [
        ("layer", *map(int, s.split("x"))) for s in args.shapes.split(",")]
    config = {"backend": args.device, "log_level": "warn"}
    if args.device == "cpu":
        config["cpu_devices"] = 1
    ctx = qlink.load(config, library=args.library)
    gen = torch.Generator(device=args.device).manual_seed(0)
    lines = ["| layer | cholesky_inverse | triangular | speedup | codes alike | loss triangular / cholesky_inverse |",
             "|---|---|---|---|---|---|"]
    errors = ["| Hessian | PyTorch fp32 chain: U's error | PyTorch fp32 triangular: U's error |", "|---|---|---|"]
    seen = set()
    for name, rows, cols in shapes:
        h = hessian_of(cols, gen, tokens=2 * cols, device=args.device)
        w = (0.02 * torch.randn(rows, cols, device=args.device, generator=gen)).bfloat16()
        times, results = {}, {}
        for inverse in INVERSES:  # median_s warms up first: the engine's scratch pool, the libraries' handles
            results[inverse], times[inverse] = median_s(
                functools.partial(gptq_quantize, w, h, ctx=ctx, inverse=inverse), args.reps)
        a, b = results["cholesky_inverse"], results["triangular"]
        alike = (a.codes == b.codes).float().mean().item() * 100
        lines.append("| %s (%d x %d) | %.1f ms | %.1f ms | %.2fx | %.3f %% | %.6f |" % (
            name, rows, cols, times["cholesky_inverse"] * 1e3, times["triangular"] * 1e3,
            times["cholesky_inverse"] / times["triangular"], alike, b.loss / a.loss))
        print(lines[-1], flush=True)
        del results, a, b
        if cols not in seen:
            seen.add(cols)
            routes, truth = factors(h)
            err = {k: ((u.double() - truth).norm() / truth.norm()).item() for k, u in routes.items()}
            errors.append("| %d columns | %.3g | %.3g |" % (cols, err["cholesky_inverse"], err["triangular"]))
            print(errors[-1], flush=True)
            del routes, truth
        del h, w
        if args.device == "cuda":
            torch.cuda.empty_cache()
    tables = lines + [""] + errors
    if args.seeds:
        tables += [""] + agreement(ctx, args.device, *map(int, args.problem.split("x")), args.seeds)
    text = "\n".join(tables) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
