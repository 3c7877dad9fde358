"""SignRound (AutoRound), data-parallel as HOSTS.md describes: every replica holds a
mirror of the block and the same rounding offsets V and range factors alpha, beta per
linear layer; each iteration draws the same batch everywhere, each replica forwards and
backwards its contiguous share (sum-reduced loss), the gradients are flattened in a fixed
order and all-reduced with sign-cast (each element's sign computed once by its owner and
gathered), so every replica applies the same SignSGD step and they never drift apart."""
import copy
import dataclasses

import torch

from .. import collectives
from ..p2p import move_nested_to_device
from .placement import _power_of_two_at_most, shard_sizes

try:
    from torch.func import functional_call
except ImportError:  # PyTorch < 2.0
    from torch.nn.utils.stateless import functional_call


class _RoundSte(torch.autograd.Function):
    """Rounding whose gradient passes straight through: one kernel forward, none backward
    (x + (round(x) - x).detach() computes the same values with three)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


_round_ste = _RoundSte.apply


class _Grouped:
    """A frozen weight split into groups of `group_size` input columns, with what fake
    quantization needs of it computed once: fp32 values and each group's min and max."""

    def __init__(self, w, group_size):
        self.shape, self.dtype = w.shape, w.dtype
        self.g = w.detach().float().reshape(w.shape[0], w.shape[1] // group_size, group_size)
        self.wmin = torch.clamp(self.g.amin(dim=-1), max=0)
        self.wmax = torch.clamp(self.g.amax(dim=-1), min=0)

    def qdq(self, v, alpha, beta, bits):
        """Asymmetric min-max fake quantization, the range scaled by alpha (min) and beta
        (max), rounding shifted by v."""
        maxq = 2 ** bits - 1
        wmin = self.wmin * alpha
        scale = torch.clamp((self.wmax * beta - wmin) / maxq, min=1e-9).unsqueeze(-1)
        zero = _round_ste(-wmin.unsqueeze(-1) / scale)
        q = torch.clamp(_round_ste(self.g / scale + v.reshape_as(self.g)) + zero, 0, maxq)
        return ((q - zero) * scale).reshape(self.shape).to(self.dtype)


@dataclasses.dataclass
class SignRoundResult:
    weights: dict       # layer name -> fake-quantized weight (home device, the layer's dtype)
    loss: float         # mean squared error of those weights over every calibration sample
    losses: list        # per iteration, the mean over that iteration's batch


def _linears(block):
    return [(name, m) for name, m in block.named_modules() if isinstance(m, torch.nn.Linear)]


def sign_round(block, inputs, placement, iters=200, lr=None, bits=4, group_size=128, batch_size=8, seed=0,
               transport="fp32"):
    """Tunes V, alpha, beta of every Linear in `block` (on home) against its full-precision
    outputs on `inputs` (nsamples, ...), on placement.world replicas. Returns the best
    iterate's fake-quantized weights."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1, got %d" % batch_size)
    if batch_size < placement.world:  # every replica needs a sample: demote, as AutoRound does
        placement = placement.subset(_power_of_two_at_most(batch_size))
    world = placement.world
    dev = placement.torch_devices
    layers = _linears(block)
    if not layers:
        raise ValueError("block has no torch.nn.Linear to quantize")
    for name, m in layers:
        if m.in_features % group_size:
            raise ValueError("layer %s: in_features %d is not a multiple of group_size %d" % (
                name, m.in_features, group_size))
    if placement.cpu:
        blocks = [block] + [copy.deepcopy(block) for _ in range(1, world)]
        xs = [inputs] * world
    else:
        blocks = [block] + collectives.mirror_module(block, dev[1:], ctx=placement.ctx)
        xs = [inputs] + [move_nested_to_device(inputs, dev[r], ctx=placement.ctx) for r in range(1, world)]
    def reference(r):  # full-precision outputs, computed once (no_grad is per thread)
        with torch.no_grad():
            return blocks[r](xs[r])
    targets = placement.run(reference)

    def tuning_state(r):
        state = []
        for name, m in _linears(blocks[r]):
            groups = m.in_features // group_size
            state.append((name + ".weight", _Grouped(m.weight, group_size),
                          torch.zeros_like(m.weight, dtype=torch.float32, requires_grad=True),
                          torch.ones(m.out_features, groups, device=dev[r], requires_grad=True),
                          torch.ones(m.out_features, groups, device=dev[r], requires_grad=True)))
        return state
    states = [tuning_state(r) for r in range(world)]
    params = [[p for _, _, v, a, b in st for p in (v, a, b)] for st in states]  # the fixed flattening order
    sizes = [p.numel() for p in params[0]]
    grads = [torch.zeros(sum(sizes), device=dev[r]) for r in range(world)]
    reduce_signs = collectives.PreparedAllReduce(grads, op="sign", transport=transport, ctx=placement.ctx,
                                                 devices=placement.device_ids())
    lr0 = lr if lr is not None else 1.0 / max(iters, 1)
    draws = torch.Generator().manual_seed(seed)
    nsamples = inputs.shape[0]
    elements = targets[0][:batch_size].numel()

    def quantized(r):
        return {key: w.qdq(v, a, b, bits) for key, w, v, a, b in states[r]}

    def step(r, batch):
        share = shard_sizes(len(batch), world)
        lo = sum(share[:r])
        idx = batch[lo:lo + share[r]].to(dev[r])
        for p in params[r]:
            p.grad = None
        out = functional_call(blocks[r], quantized(r), (xs[r][idx],))
        loss = ((out.float() - targets[r][idx].float()) ** 2).sum()
        loss.backward()
        torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), device=dev[r])
                   for p in params[r]], out=grads[r])
        return loss.item()

    def update(r, rate):
        with torch.no_grad():
            offset = 0
            for p, n in zip(params[r], sizes):
                p -= rate * grads[r][offset:offset + n].view_as(p)
                offset += n
            for _, _, _, a, b in states[r]:
                a.clamp_(0, 1)
                b.clamp_(0, 1)

    losses, best_loss, best = [], float("inf"), None  # the best iterate: strictly lower loss
    for t in range(iters):
        batch = torch.randperm(nsamples, generator=draws)[:batch_size]
        loss = sum(placement.run(lambda r: step(r, batch))) / elements  # shard sums in rank order
        losses.append(loss)
        if loss < best_loss:  # the iterate just measured: before this step's update
            best_loss, best = loss, [p.detach().clone() for p in params[0]]
        reduce_signs.run()
        rate = lr0 * (1.0 - t / iters)
        placement.run(lambda r: update(r, rate))
    for r in range(1, world):  # the invariant sign-cast buys: replicas never drift apart
        if not all(torch.equal(p, q.to(p.device)) for p, q in zip(params[0], params[r])):
            raise RuntimeError("replica %d's tuning parameters differ from home's" % r)
    with torch.no_grad():
        if best is not None:
            for p, b in zip(params[0], best):
                p.copy_(b)
        final = quantized(0)
        out = functional_call(block, final, (inputs,))
        loss = float(((out.float() - targets[0].float()) ** 2).mean())
    return SignRoundResult({key[:-len(".weight")]: w for key, w in final.items()}, loss, losses)
