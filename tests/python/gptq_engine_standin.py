"""A stand-in for qlink's native GPTQ engine (the quant/ issue) with its agreed Python call,
for the GPTQModel integration's CPU tests: GPTQ with lazy block updates, min-max groups
taken as each group starts, sym/asym grids; desc_act, static_groups and act_group_aware
refused (ValueError),
as an engine refuses options it does not cover. Records every call."""
import dataclasses

import torch

CALLS = []


@dataclasses.dataclass
class Result:
    codes: torch.Tensor    # uint8 (rows, cols)
    scales: torch.Tensor   # fp32 (rows, groups)
    zeros: torch.Tensor    # fp32 (rows, groups), integer values
    g_idx: torch.Tensor    # int32 (cols,)
    weight: torch.Tensor   # dequantized, the weight's dtype
    loss: float
    damp: float


def _grid(w, bits, sym):
    maxq = 2 ** bits - 1
    lo, hi = torch.clamp(w.min(1).values, max=0), torch.clamp(w.max(1).values, min=0)
    if sym:
        hi = torch.maximum(lo.abs(), hi)
        lo = torch.where(lo < 0, -hi, lo)
    flat = (lo == 0) & (hi == 0)
    lo, hi = torch.where(flat, -torch.ones_like(lo), lo), torch.where(flat, torch.ones_like(hi), hi)
    scale = (hi - lo) / maxq
    zero = torch.full_like(scale, (maxq + 1) / 2) if sym else torch.round(-lo / scale)
    return scale, zero


def gptq_quantize(weight, hessian, bits=4, group_size=128, sym=True, desc_act=False, static_groups=False, damp=0.01,
                  damp_auto_increment=0.01, nsamples=0, act_group_aware=False, ctx=None):
    CALLS.append(dict(shape=tuple(weight.shape), dtype=weight.dtype, bits=bits, group_size=group_size, sym=sym,
                      desc_act=desc_act, static_groups=static_groups, damp=damp,
                      damp_auto_increment=damp_auto_increment, nsamples=nsamples, act_group_aware=act_group_aware,
                      ctx=ctx))
    if desc_act or static_groups or act_group_aware:
        raise ValueError("the stand-in engine covers neither desc_act nor static_groups nor act_group_aware")
    rows, cols = weight.shape
    maxq, block = 2 ** bits - 1, 128
    W, H = weight.float().clone(), hessian.clone()
    dead = torch.diag(H) == 0
    H[dead, dead], W[:, dead] = 1, 0
    while True:
        try:
            damped = H + damp * torch.mean(torch.diag(H)) * torch.eye(cols)
            U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(damped)), upper=True)
            break
        except RuntimeError:
            damp += damp_auto_increment
    groups = -(-cols // group_size)
    scales, zeros = torch.zeros(rows, groups), torch.zeros(rows, groups)
    codes, Q, loss = torch.zeros(rows, cols, dtype=torch.uint8), torch.zeros(rows, cols), 0.0
    for b0 in range(0, cols, block):
        b1 = min(b0 + block, cols)
        Wb, Err = W[:, b0:b1].clone(), torch.zeros(rows, b1 - b0)
        for j in range(b1 - b0):
            c = b0 + j
            if c % group_size == 0:
                scales[:, c // group_size], zeros[:, c // group_size] = _grid(W[:, c:c + group_size], bits, sym)
            s, z = scales[:, c // group_size], zeros[:, c // group_size]
            code = torch.clamp(torch.round(Wb[:, j] / s) + z, 0, maxq)
            codes[:, c], Q[:, c] = code.to(torch.uint8), s * (code - z)
            err = (Wb[:, j] - Q[:, c]) / U[c, c]
            loss += float((err ** 2).sum()) / 2
            Wb[:, j:] -= err.unsqueeze(1) @ U[c, c:b1].unsqueeze(0)
            Err[:, j] = err
        W[:, b1:] -= Err @ U[b0:b1, b1:]
    g_idx = (torch.arange(cols) // group_size).to(torch.int32)
    return Result(codes, scales, zeros, g_idx, Q.to(weight.dtype), loss / nsamples if nsamples > 0 else loss, damp)
