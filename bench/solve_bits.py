"""Whether the native engine's GPTQ solve gives GPTQModel's own bytes: GPTQ.quantize and the
engine on the same bf16 weight and fp32 Hessian (4-bit g128 sym in GPTQModel's group-aware
order, its inverse, IEEE fp32 updates), at the shapes of a Qwen3-30B-A3B layer's linears,
each Hessian as made and again with two entries of one group of its diagonal made equal.
Which shapes part, and whether a tie does (GPTQModel's order takes torch.topk on the GPU) or
a damp scale PyTorch's fp32 mean rounds otherwise than the engine's exact one (mean_off).
First, by shape, whether the cross-block update made as GPTQModel makes it and as the engine
does (one GEMM into W) give the same bits on this GPU.

    python3 bench/solve_bits.py --library DIST/libqlink.so --gptqmodel DIRS [--seeds 8] [--out FILE.json]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosts"))
import qlink  # noqa: E402
from digests import hessian_traits  # noqa: E402
from gptq_bench import codes_of, gptqmodel_solver, hessian_of  # noqa: E402
from qlink.quant import gptq_quantize  # noqa: E402

SHAPES = (("q_proj", 4096, 2048), ("k_proj", 512, 2048), ("o_proj", 2048, 4096), ("expert gate/up", 768, 2048),
          ("expert down", 2048, 768))
GROUP, SAMPLES = 128, 16384


def tied(h, gen):
    """A copy of h whose diagonal holds one more equal pair: two columns of one group (GAR's
    groups are consecutive columns) both given the larger of their entries, which keeps h
    positive definite. Returns (copy, (i, j))."""
    groups = h.shape[0] // GROUP
    g = int(torch.randint(groups, (1,), generator=gen))
    i, j = (g * GROUP + int(c) for c in torch.randperm(GROUP, generator=gen)[:2])
    out = h.clone()
    out[i, i] = out[j, j] = torch.maximum(h[i, i], h[j, j])
    return out, (i, j)


def block_updates_apart(rows, cols, gen):
    """Of a solve's cross-block updates W[:, i2:] -= E @ U[i1:i2, i2:] (E rows x 128, fp32),
    how many give other bits made GPTQModel's way (the product in a new matrix, then
    subtracted) than made the engine's way (one GEMM accumulating into W in place, alpha -1,
    beta 1, W's row stride as its leading dimension), by PyTorch's GEMM on this GPU; and
    how many updates there are."""
    u = torch.linalg.cholesky(hessian_of(cols, gen, SAMPLES).double()).float().t().contiguous()
    apart = 0
    blocks = range(0, cols - GROUP, GROUP)
    for i1 in blocks:
        i2 = i1 + GROUP
        w = torch.randn(rows, cols, device="cuda", generator=gen)
        e = torch.randn(rows, GROUP, device="cuda", generator=gen) * 1e-3
        theirs = w[:, i2:] - e.matmul(u[i1:i2, i2:])
        mine = w.clone()
        mine[:, i2:].addmm_(e, u[i1:i2, i2:], beta=1, alpha=-1)
        apart += not torch.equal(theirs, mine[:, i2:])
    return apart, len(blocks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--library", required=True)
    ap.add_argument("--gptqmodel", required=True, help="folders holding the gptqmodel package and its stand-ins")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--out")
    a = ap.parse_args()
    ctx = qlink.configure({"backend": "cuda", "log_level": "warn"}, library=a.library)
    solve_gm, why = gptqmodel_solver(a.gptqmodel)
    if solve_gm is None:
        sys.exit("GPTQModel unavailable: %s" % why)
    print("| linear | rows x columns | cross-block updates whose bits part (GPTQModel's way against the engine's) |")
    print("|---|---|---|")
    updates = []
    for name, rows, cols in SHAPES:
        apart, total = block_updates_apart(rows, cols, torch.Generator(device="cuda").manual_seed(0))
        updates.append({"linear": name, "rows": rows, "columns": cols, "apart": apart, "updates": total})
        print("| %s | %d x %d | %d of %d |" % (name, rows, cols, apart, total), flush=True)
    rows_out = []
    print("| linear | rows x columns | seed | diagonal | mean_off | output bytes equal | codes equal | "
          "loss qlink / GPTQModel |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows, cols in SHAPES:
        for seed in range(a.seeds):
            gen = torch.Generator(device="cuda").manual_seed(seed)
            cpu_gen = torch.Generator().manual_seed(seed)
            h = hessian_of(cols, gen, SAMPLES)
            w = (torch.randn(rows, cols, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
            for diagonal, hessian in (("as made", h), ("one tie", tied(h, cpu_gen)[0])):
                ours = gptq_quantize(w, hessian, bits=4, group_size=GROUP, sym=True, act_group_aware=True,
                                     nsamples=SAMPLES, inverse="cholesky_inverse", tf32=False, ctx=ctx)
                gq, gs, gz, gg, gloss, _ = solve_gm(w, hessian, False, True, SAMPLES)
                row = {"linear": name, "rows": rows, "columns": cols, "seed": seed, "diagonal": diagonal,
                       "mean_off": int(hessian_traits(hessian, GROUP)["mean_off"]),
                       "bytes_equal": 100 * (ours.weight.cpu().view(torch.int16) ==
                                             gq.cpu().view(torch.int16)).float().mean().item(),
                       "codes_equal": 100 * (ours.codes.cpu() == codes_of(gq, gs, gz, gg).cpu()).float().mean().item(),
                       "loss_ratio": ours.loss / gloss}
                rows_out.append(row)
                print("| %(linear)s | %(rows)d x %(columns)d | %(seed)d | %(diagonal)s | %(mean_off)d | "
                      "%(bytes_equal).4f %% | "
                      "%(codes_equal).4f %% | %(loss_ratio).7f |" % row, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "updates": updates,
                       "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
