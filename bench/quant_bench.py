"""The data-parallel engines on the GPUs of one host against the same engine on one GPU,
on LLaMA-7B's MLP dimensions (hidden 4096, intermediate 11008): GPTQ (Hessian of the
calibration activations, then the gate projection quantized) and SignRound (the gated MLP
tuned end to end). Speedup = serial time / parallel time; quality = agreement with serial.
    python3 bench/quant_bench.py --library DIST/libqlink.so [--world N] [--markdown OUT.md]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import qlink  # noqa: E402
from qlink.quant import Placement, parallel_gptq, parallel_hessian, shard_sizes, sign_round  # noqa: E402

HIDDEN, INTERMEDIATE = 4096, 11008


class LlamaMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = torch.nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up_proj = torch.nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down_proj = torch.nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def timed(fn, placement):
    placement.synchronize()
    t0 = time.perf_counter()
    out = fn()
    placement.synchronize()
    return out, time.perf_counter() - t0


def gptq_table_rows(a, serial, parallel):
    """The GPTQ rows of the table; its tensors are freed when it returns."""
    table = []
    # GPTQ: H of the MLP input over samples x seqlen tokens (bf16 activations), then gate_proj.
    rows = a.samples * a.seqlen
    basis = torch.randn(256, HIDDEN, device="cuda:0")
    x = (torch.randn(rows, 256, device="cuda:0") @ basis + 0.1 * torch.randn(rows, HIDDEN, device="cuda:0")).bfloat16()
    counts = shard_sizes(rows, a.world)
    shards = [t.to("cuda:%d" % r) for r, t in enumerate(torch.split(x, counts))]
    parallel_hessian([x], serial)  # warm-up
    h1, t_h1 = timed(lambda: parallel_hessian([x], serial), serial)
    hw, t_hw = timed(lambda: parallel_hessian(shards, parallel), parallel)
    h_err = ((hw - h1).abs().max() / h1.abs().max()).item()
    table.append("| GPTQ Hessian, %d x %d tokens | %.3f | %.3f | %.2fx | max diff / max entry %.1e |" % (
        a.samples, a.seqlen, t_h1, t_hw, t_h1 / t_hw, h_err))
    w = torch.randn(INTERMEDIATE, HIDDEN, device="cuda:0").bfloat16() * 0.02
    q1, t_q1 = timed(lambda: parallel_gptq(w, h1, serial), serial)
    qw, t_qw = timed(lambda: parallel_gptq(w, h1, parallel), parallel)
    same = (q1.weight == qw.weight).float().mean().item()
    table.append("| GPTQ quantize gate_proj %dx%d, 4-bit g128 | %.3f | %.3f | %.2fx | %.4f%% of weights equal |" % (
        INTERMEDIATE, HIDDEN, t_q1, t_qw, t_q1 / t_qw, 100 * same))
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--world", type=int, default=torch.cuda.device_count())
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--tune-samples", type=int, default=32)
    ap.add_argument("--tune-seqlen", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--markdown")
    a = ap.parse_args()
    ctx = qlink.configure({"backend": "cuda", "log_level": "warn"}, library=a.library)
    ctx.enable_peer_access()
    serial, parallel = Placement([0], ctx=ctx), Placement(list(range(a.world)), ctx=ctx)
    torch.manual_seed(0)
    lines = ["| engine (LLaMA-7B MLP) | serial s | world %d s | speedup | agreement with serial |" % a.world,
             "|---|---|---|---|---|"]
    lines += gptq_table_rows(a, serial, parallel)
    torch.cuda.empty_cache()

    # SignRound on the whole MLP block, bf16.
    block = LlamaMlp().cuda(0).bfloat16()
    for p in block.parameters():
        p.requires_grad_(False)
    inputs = torch.randn(a.tune_samples, a.tune_seqlen, HIDDEN, device="cuda:0").bfloat16()
    rtn = sign_round(block, inputs, serial, iters=0)
    # AutoRound's step size for its default 200 iterations, of which a.iters are timed.
    tune = lambda place, iters: sign_round(block, inputs, place, iters=iters, lr=1.0 / 200)  # noqa: E731
    tune(serial, 2), tune(parallel, 2)  # warm-up: the first backward on each device picks its kernels
    s1, t_s1 = timed(lambda: tune(serial, a.iters), serial)
    sw, t_sw = timed(lambda: tune(parallel, a.iters), parallel)
    same = sum((s1.weights[k] == sw.weights[k]).sum().item() for k in s1.weights) / sum(
        v.numel() for v in s1.weights.values())
    lines.append("| SignRound %d iters, %d x %d tokens, batch 8 | %.3f | %.3f | %.2fx | loss %.3e vs serial %.3e "
                 "(RTN %.3e); %.2f%% of weights equal |" %
                 (a.iters, a.tune_samples, a.tune_seqlen, t_s1, t_sw, t_s1 / t_sw, sw.loss, s1.loss, rtn.loss,
                  100 * same))
    print("\n".join(lines))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
