"""What AutoRound's calibration mask costs its block tuning (issue 22), on the issue's shapes
(batch 8 x 2048 tokens, 32 heads of 128, bf16): AutoRound masks every sample's last token
out so its attention mask is never all ones, so transformers hands the block a 4-D mask and
SDPA computes every score of the square, where causal attention skips half. Times, per
SDPA backend, one forward + backward with that mask, with the 0/1 bias AutoRound's tuning
passes (below) gathered per sample as its batches are and as one row expanded over the
batch (a stride-0 view, where every sample's mask is the same: no faster on an H200, and
in AutoRound's compiled block it added copies), and with is_causal (the
rows a loss reads equal), and the loss AutoRound computes per batch (_get_loss: masked bf16 outputs cast
to fp32, MSE) eager and compiled.

(What AutoRound's tuning actually runs is neither: its input cache casts each sample's
boolean mask to the amp dtype (calibration/inputs.py, to_dtype), so SDPA receives 1.0 where a
key is visible and 0.0 where it is hidden, added to the scores as a bias: every query reads
every key. The masked case here costs what that bias costs; causal attention would change
AutoRound's results, so qlink's loop keeps AutoRound's mask.)

    python3 bench/attention_mask_cost.py [--reps 20]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from timing import mean_us


def attention_case(backend, mask, q, k, v, grad):
    def step():
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        out.backward(grad)
    return step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    batch, heads, seq, dim, hidden = 8, 32, 2048, 128, 4096
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
               .requires_grad_() for _ in range(3))
    grad = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    # transformers' sdpa mask for AutoRound's padding mask (last token 0): causal and the
    # last key hidden from every query
    keys = torch.ones(batch, seq, dtype=torch.bool, device="cuda")
    keys[:, -1] = False
    mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device="cuda"))[None, None] & keys[:, None, None, :]
    flops = 4 * batch * heads * seq * seq * dim * 3.5  # forward 2 GEMMs, backward 5, over the square
    result = {"shape": [batch, heads, seq, dim], "attention": {}}
    bias = mask.to(torch.bfloat16)  # AutoRound's to_dtype of the cached mask: 1.0 visible, 0.0 hidden
    expanded = bias[:1].clone().expand_as(bias)
    cases = (("autoround_mask", mask), ("autoround_bias", bias), ("autoround_bias_expanded", expanded),
             ("causal", None))
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        for name, m in cases:
            try:
                us = mean_us(attention_case(backend, m, q, k, v, grad), reps=args.reps)
            except RuntimeError as error:
                result["attention"]["%s/%s" % (backend.name, name)] = "refused: %s" % str(error).splitlines()[0]
                continue
            result["attention"]["%s/%s" % (backend.name, name)] = {
                "fwd_bwd_ms": round(us / 1e3, 3), "square_tflops": round(flops / us / 1e6, 1)}
        q.grad = k.grad = v.grad = None
    # the causal rows equal the masked ones where the loss reads (every token but the last)
    with torch.no_grad():
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        result["max_abs_diff_rows_read"] = float((a[:, :, :-1] - b[:, :, :-1]).abs().max())
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):  # gathered vs expanded bias
        outs, grads = [], []
        for m in (bias, expanded):
            q.grad = k.grad = v.grad = None
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            out.backward(grad)
            outs.append(out.detach())
            grads.append(torch.cat([q.grad, k.grad, v.grad]))
        result["bias_expanded_vs_gathered/%s" % backend.name] = {
            "out_equal": bool(torch.equal(*outs)), "grads_equal": bool(torch.equal(*grads)),
            "out_max_abs_diff": float((outs[0] - outs[1]).abs().max()),
            "grads_max_abs_diff": float((grads[0] - grads[1]).abs().max())}
    q.grad = k.grad = v.grad = None

    pred = torch.randn(batch, seq, hidden, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    ref = torch.randn(batch, seq, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    valid = keys.long().unsqueeze(-1)
    mse = torch.nn.MSELoss()

    def autoround_loss(p, r, m):
        return mse((p * m).to(torch.float32), (r * m).to(torch.float32))

    compiled = torch.compile(autoround_loss, fullgraph=True, dynamic=False)
    result["loss"] = {}
    for name, fn in (("eager", autoround_loss), ("compiled", compiled)):
        def step(fn=fn):
            fn(pred, ref, valid).backward()
        result["loss"][name + "_fwd_bwd_us"] = round(mean_us(step, reps=args.reps), 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
