"""Whether the summation order of a layer's Hessian alone flips its GPTQ codes: one
layer's Hessian from the same bf16 rows summed as GPTQModel sums it (fp32 products of
--chunk rows, in order), in reverse, in one product (qlink's expert stage) and in float64;
each solved by qlink's engine with GPTQModel's options (4-bit, g128, sym, damp 0.05,
act_group_aware); codes and losses against the in-order sum's. Gaussian rows with spread
channel scales, seed 0. CPU or GPU (the context's backend).

    python3 bench/hessian_order.py [--rows 16384] [--columns 2048] [--out-features 768]
        [--chunk 128] [--library PATH] [--backend cpu]
"""
import argparse

import torch

import qlink
from qlink.quant import GPTQLayer
from qlink.quant.gptq import parallel_gptq


def hessians(x, chunk):
    """{name: fp32 X^T X} of the bf16 rows x, each way the module's docstring names."""
    xf = x.float()
    n = x.shape[0] // chunk

    def summed(order):
        h = torch.zeros(x.shape[1], x.shape[1], device=x.device)
        for i in order:
            part = xf[i * chunk:(i + 1) * chunk]
            h += part.T @ part
        return h
    return {"in order": summed(range(n)), "reversed": summed(reversed(range(n))), "one product": xf.T @ xf,
            "float64": (x.double().T @ x.double()).float()}


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--rows", type=int, default=16384)
    a.add_argument("--columns", type=int, default=2048)
    a.add_argument("--out-features", type=int, default=768)
    a.add_argument("--chunk", type=int, default=128)
    a.add_argument("--library")
    a.add_argument("--backend", default="cpu")
    args = a.parse_args()
    ctx = qlink.load({"backend": args.backend, "log_level": "off"}, library=args.library)
    device = "cuda" if args.backend != "cpu" else "cpu"
    gen = torch.Generator().manual_seed(0)
    scale = torch.exp(0.5 * torch.randn(args.columns, generator=gen))
    x = (torch.randn(args.rows, args.columns, generator=gen) * scale).bfloat16().to(device)
    w = (0.02 * torch.randn(args.out_features, args.columns, generator=gen)).bfloat16().to(device)
    made = hessians(x, args.chunk)
    exact = x.double().T @ x.double()
    results = {}
    for name, h in made.items():
        (results[name],) = parallel_gptq([GPTQLayer(w, h * (2.0 / args.rows))], None, ctx=ctx, bits=4,
                                         group_size=128, sym=True, damp=0.05, act_group_aware=True)
    base = results["in order"]
    print("| Hessian | error against float64 | codes equal to in-order's | loss difference |")
    print("|---|---|---|---|")
    for name, r in results.items():
        error = ((made[name].double() - exact).norm() / exact.norm()).item()
        equal = (r.codes == base.codes).double().mean().item()
        print("| %s | %.2e | %.3f %% | %.4f %% |" % (name, error, 100 * equal, 100 * abs(r.loss / base.loss - 1)))


if __name__ == "__main__":
    main()
