"""GPTQ, data-parallel: each replica accumulates the Hessian of its calibration shard,
qlink sums the partials in device-index order (bit-identical whatever order they arrive
in), and every replica quantizes its share of the output rows with the merged Hessian
(rows are independent given H)."""
import dataclasses
import inspect

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


def _quantize_block(W1, Hinv1, S, Z, maxq, Q1, Err1):
    """GPTQ's column loop over one block: column i quantized with its group's scale S[:, i]
    and zero Z[:, i], its error spread over the block's later columns (W1 in place); the
    quantized columns into Q1, the scaled errors into Err1."""
    for i in range(W1.shape[1]):
        q = _quantize(W1[:, i:i + 1], S[:, i:i + 1], Z[:, i:i + 1], maxq)[:, 0]
        Q1[:, i] = q
        err = (W1[:, i] - q) / Hinv1[i, i]
        W1[:, i:] -= err.unsqueeze(1) @ Hinv1[i, i:].unsqueeze(0)
        Err1[:, i] = err


class _GraphedBlock:
    """_quantize_block over full blocks of a CUDA matrix, captured once as a CUDA graph and
    replayed per block: the loop is a few small kernels per column, so launching them one
    by one from Python, not the GPU, would set the pace. Replays run the captured kernels
    on the same values, so the results are those of the eager loop, bit for bit."""

    def __init__(self, rows, block, maxq, device):
        self.W1, self.Q1, self.Err1, self.S, self.Z = (torch.zeros(rows, block, device=device) for _ in range(5))
        self.Hinv1 = torch.eye(block, device=device)
        self.S.fill_(1)
        args = (self.W1, self.Hinv1, self.S, self.Z, maxq, self.Q1, self.Err1)
        # A capture stream of this device's own (torch.cuda.graph's default is one stream for
        # every device), warmed up first: cuBLAS sets up its handle outside the capture.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            _quantize_block(*args)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: other threads' work on other devices does not void the capture.
        with torch.cuda.graph(self.graph, stream=side, capture_error_mode="thread_local"):
            _quantize_block(*args)

    def run(self, W1, Hinv1, S, Z, Q1, Err1):
        self.W1.copy_(W1)
        self.Hinv1.copy_(Hinv1)
        self.S.copy_(S)
        self.Z.copy_(Z)
        self.graph.replay()
        Q1.copy_(self.Q1)
        Err1.copy_(self.Err1)


def _graphs_usable(device):
    return device.type == "cuda" and "capture_error_mode" in inspect.signature(torch.cuda.graph).parameters


def _block_loop(rows, cols, bits, block_size, device):
    """The _GraphedBlock gptq_quantize replays for these shapes, or None (eager loop)."""
    if cols < block_size or not _graphs_usable(device):
        return None
    with torch.cuda.device(device):
        return _GraphedBlock(rows, block_size, 2 ** bits - 1, device)


@dataclasses.dataclass
class GPTQResult:
    weight: torch.Tensor  # dequantized, the layer's dtype
    scales: torch.Tensor  # (rows, groups)
    zeros: torch.Tensor   # (rows, groups)


def gptq_quantize(w, h, bits=4, group_size=128, damp=0.01, block_size=128, block_loop=None):
    """The GPTQ reference algorithm (lazy batch updates over blocks of columns, Cholesky of
    the damped inverse Hessian) on one device. w: (rows, cols); h: (cols, cols) fp32.
    block_loop: the CUDA graph of the column loop made by _block_loop for these shapes
    (parallel_gptq captures its replicas' graphs one by one before they start: captures
    running at once in several threads interfere); made here when not given."""
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
    graphed = block_loop or _block_loop(rows, cols, bits, block_size, W.device)
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        # The groups starting in this block take their ranges from W as the block starts, as
        # the reference does (the block's own updates go to a copy of its columns).
        for g in range(-(-i1 // group_size), (i2 - 1) // group_size + 1):
            scale, zero = _group_params(W[:, g * group_size:(g + 1) * group_size], maxq)
            scales[:, g], zeros[:, g] = scale[:, 0], zero[:, 0]
        group_of = torch.arange(i1, i2, device=W.device) // group_size  # each column's group
        Err1 = torch.empty(rows, i2 - i1, device=W.device)
        if graphed is not None and i2 - i1 == block_size:
            graphed.run(W[:, i1:i2], Hinv[i1:i2, i1:i2], scales[:, group_of], zeros[:, group_of], Q[:, i1:i2], Err1)
        else:
            _quantize_block(W[:, i1:i2].clone(), Hinv[i1:i2, i1:i2], scales[:, group_of], zeros[:, group_of], maxq,
                            Q[:, i1:i2], Err1)
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    return GPTQResult(Q.to(w.dtype), scales, zeros)


def parallel_gptq(w, h, placement, **options):
    """gptq_quantize with the rows of w (on home) split over the replicas: H is broadcast
    from home, each replica quantizes its contiguous share of rows, the shares come back
    to home. Returns the GPTQResult on home."""
    call = inspect.signature(gptq_quantize).bind(w, h, **options)  # refuses unknown options up front
    call.apply_defaults()
    bits, block_size = call.arguments["bits"], call.arguments["block_size"]
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
    loops = [_block_loop(ws[r].shape[0], w.shape[1], bits, block_size, dev[r]) for r in range(world)]
    parts = placement.run(lambda r: gptq_quantize(ws[r], hs[r], block_loop=loops[r], **options))
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
