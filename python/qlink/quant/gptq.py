"""GPTQ, data-parallel: each replica accumulates the Hessian of its calibration shard,
qlink sums the partials in device-index order (bit-identical whatever order they arrive
in), and every replica quantizes its share of the output rows with the merged Hessian
(rows are independent given H)."""
import dataclasses

import torch

from .. import collectives
from .placement import shard_sizes


def hessian(x):
    """Σ xᵀx over the rows of x (fp32): one replica's partial, before the 2/N scale."""
    x = x.reshape(-1, x.shape[-1]).float()
    return x.t() @ x


def parallel_hessian(shards, placement):
    """H = (2/N) Σ_d H_d on the home rank (rank 0), N the total calibration rows, the
    partials summed in device-index order by qlink.reduce. shards[r]: rank r's activations
    (..., in_features), on rank r's device."""
    rows = sum(s.reshape(-1, s.shape[-1]).shape[0] for s in shards)
    partials = placement.run(lambda r: hessian(shards[r]))
    out = torch.empty_like(partials[0])
    collectives.reduce(partials, out, scale=2.0 / rows, ctx=placement.ctx, input_devices=placement.device_ids(),
                       output_device=None if not placement.cpu else placement.ids[0])
    return out


def _quantize(x, scale, zero, maxq):
    q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)
    return scale * (q - zero)


def _group_params(w, maxq):
    """Asymmetric min-max scale and zero point per row of w (the group's columns)."""
    xmin = torch.clamp(w.min(dim=1).values, max=0)
    xmax = torch.clamp(w.max(dim=1).values, min=0)
    flat = (xmin == 0) & (xmax == 0)
    xmin[flat], xmax[flat] = -1, 1
    scale = (xmax - xmin) / maxq
    zero = torch.round(-xmin / scale)
    return scale.unsqueeze(1), zero.unsqueeze(1)


@dataclasses.dataclass
class GPTQResult:
    weight: torch.Tensor  # dequantized, the layer's dtype
    scales: torch.Tensor  # (rows, groups)
    zeros: torch.Tensor   # (rows, groups)


def gptq_quantize(w, h, bits=4, group_size=128, damp=0.01, block_size=128):
    """The GPTQ reference algorithm (lazy batch updates over blocks of columns, Cholesky of
    the damped inverse Hessian) on one device. w: (rows, cols); h: (cols, cols) fp32."""
    maxq = 2 ** bits - 1
    rows, cols = w.shape
    group_size = group_size if group_size > 0 else cols
    W = w.float().clone()
    H = h.clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H += damp * torch.mean(torch.diag(H)) * torch.eye(cols, device=H.device)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    groups = (cols + group_size - 1) // group_size
    scales = torch.zeros(rows, groups, device=W.device)
    zeros = torch.zeros(rows, groups, device=W.device)
    scale = zero = None
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        W1 = W[:, i1:i2].clone()
        Err1 = torch.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % group_size == 0:
                scale, zero = _group_params(W[:, col:col + group_size], maxq)  # as the reference does
                scales[:, col // group_size], zeros[:, col // group_size] = scale[:, 0], zero[:, 0]
            q = _quantize(W1[:, i:i + 1], scale, zero, maxq)[:, 0]
            Q[:, col] = q
            err = (W1[:, i] - q) / Hinv1[i, i]
            W1[:, i:] -= err.unsqueeze(1) @ Hinv1[i, i:].unsqueeze(0)
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    return GPTQResult(Q.to(w.dtype), scales, zeros)


def parallel_gptq(w, h, placement, **options):
    """gptq_quantize with the rows of w (on home) split over the replicas: H is broadcast
    from home, each replica quantizes its contiguous share of rows, the shares come back
    to home. Returns the GPTQResult on home."""
    world = placement.world
    counts = shard_sizes(w.shape[0], world)
    starts = [sum(counts[:r]) for r in range(world)]
    dev = placement.torch_devices
    hs = [h] + [torch.empty_like(h, device=dev[r]) for r in range(1, world)]
    ws = [w[starts[0]:starts[0] + counts[0]]]
    ws += [torch.empty((counts[r], w.shape[1]), dtype=w.dtype, device=dev[r]) for r in range(1, world)]
    if world > 1:
        collectives.broadcast([h], [[x] for x in hs[1:]], ctx=placement.ctx,
                              source_device=placement.ids[0] if placement.cpu else None,
                              replica_devices=placement.ids[1:] if placement.cpu else None)
        placement.copy([w[starts[r]:starts[r] + counts[r]] for r in range(1, world)], ws[1:],
                       [0] * (world - 1), list(range(1, world)))
        placement.synchronize()
    parts = placement.run(lambda r: gptq_quantize(ws[r], hs[r], **options))
    placement.synchronize()
    out = GPTQResult(torch.empty_like(w), torch.empty(w.shape[0], parts[0].scales.shape[1], device=w.device),
                     torch.empty(w.shape[0], parts[0].zeros.shape[1], device=w.device))
    for field in ("weight", "scales", "zeros"):
        whole = getattr(out, field)
        whole[:counts[0]].copy_(getattr(parts[0], field))
        if world > 1:
            placement.copy([getattr(parts[r], field) for r in range(1, world)],
                           [whole[starts[r]:starts[r] + counts[r]] for r in range(1, world)],
                           list(range(1, world)), [0] * (world - 1))
    placement.synchronize()
    return out
