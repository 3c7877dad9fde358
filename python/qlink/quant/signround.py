"""SignRound (AutoRound) on qlink.

signround_qdq and signsgd_step are AutoRound's own arithmetic on qlink's native engine
(ABI 1.7): the quant-dequant of its WrapperLinear (differentiable in the rounding offsets
and range factors, through an autograd Function over the engine's fused forward and
backward) and its SignSGD step with LinearLR's schedule, every value on the device.

sign_round is the data-parallel prototype: every replica holds a mirror of the block and
draws the same batch each iteration, forwarding and backwarding its contiguous share of
it (sum-reduced loss). The tuning state (rounding offsets V, range factors alpha, beta)
is sharded by output rows: each replica owns a contiguous share of every layer's rows,
fake-quantizes only those, and the fake-quantized rows are gathered to every replica
over the peer links. The gradients of the gathered weights are summed into their rows'
owners (qlink.reduce, in device-index order, so the result is the same whatever order
they arrive in), and each owner backpropagates them through its own fake quantization
and takes the SignSGD step for its rows. Fake quantization, which a replicated state
would repeat on every replica, is thus divided among them, and every parameter exists
once, so replicas cannot drift apart."""
import copy
import dataclasses

import torch

from .. import collectives
from ..p2p import default_context, move_nested_to_device
from ..plan import power_of_two_at_most
from .gptq import _streams
from .placement import shard_sizes

try:
    from torch.func import functional_call
except ImportError:  # PyTorch < 2.0
    from torch.nn.utils.stateless import functional_call


def _grouped(t, groups, group_len, what):
    """t as the engine takes it, (groups, group_len), or (groups,) for group_len None."""
    shape = (groups,) if group_len is None else (groups, group_len)
    if t.numel() != groups * (1 if group_len is None else group_len):
        raise ValueError("%s has %d elements, expected %s" % (what, t.numel(), shape))
    return t.reshape(shape)


class _SignRoundQdq(torch.autograd.Function):
    """The engine's fused forward; its backward is the engine's fused backward."""

    @staticmethod
    def forward(ctx, weight, v, min_scale, max_scale, spec):
        layer, options, qctx, device = spec
        qdq = torch.empty_like(weight)
        layer = dict(layer, weight=weight.detach(), v=v.detach(), min_scale=min_scale.detach(),
                     max_scale=max_scale.detach(), qdq=qdq)
        qctx.signround_qdq([layer], options, streams=_streams(qctx, [weight]))
        # Not the output: a tensor held by its own grad_fn's ctx is a cycle no collector frees.
        ctx.spec, ctx.layer = spec, dict(layer, qdq=None)
        ctx.shapes = (v.shape, min_scale.shape, max_scale.shape)
        return qdq

    @staticmethod
    def backward(ctx, grad):
        _, options, qctx, _ = ctx.spec
        layer = dict(ctx.layer, qdq=None, grad_qdq=grad.contiguous().to(ctx.layer["weight"].dtype),
                     grad_v=torch.empty_like(ctx.layer["v"]),
                     grad_min_scale=torch.empty_like(ctx.layer["min_scale"]),
                     grad_max_scale=torch.empty_like(ctx.layer["max_scale"]))
        qctx.signround_qdq([layer], options, backward=True, streams=_streams(qctx, [grad]))
        v_shape, min_shape, max_shape = ctx.shapes
        return (None, layer["grad_v"].view(v_shape), layer["grad_min_scale"].view(min_shape),
                layer["grad_max_scale"].view(max_shape), None)


def signround_qdq(weight, v, min_scale, max_scale, bits=4, group_size=128, sym=True, scale_dtype=torch.float16,
                  q_scale_thresh=1e-5, ctx=None, device=None, name=""):
    """AutoRound's WrapperLinear quant-dequant of `weight` (rows, columns) on qlink's engine:
    quant_tensor_sym (sym) or quant_tensor_asym with rounding offsets v (groups, group_len)
    (or any shape of as many elements) and range factors min_scale, max_scale (groups,), fp32,
    clamped to [0, 1] in place first as the wrapper does. Returns the result in the weight's
    dtype, differentiable in v, min_scale and max_scale (round as a straight-through
    estimator). groups = rows * columns / group_len, group_len = group_size (columns for
    -1). device: the qlink device id on the CPU backend's virtual devices."""
    qctx = ctx or default_context()
    if weight.dim() != 2:
        raise ValueError("weight has shape %s, expected (rows, columns)" % (tuple(weight.shape),))
    rows, cols = weight.shape
    group_len = cols if group_size == -1 else group_size
    groups = rows * cols // group_len if group_len > 0 and cols % group_len == 0 else None
    if groups is not None:  # the engine refuses a group size that does not divide, naming it
        v = _grouped(v, groups, group_len, "v")
        min_scale, max_scale = (_grouped(t, groups, None, what) for t, what in ((min_scale, "min_scale"),
                                                                                (max_scale, "max_scale")))
    options = {"bits": bits, "group_size": group_size, "sym": sym, "scale_dtype": scale_dtype,
               "q_scale_thresh": q_scale_thresh}
    layer = {"name": name} if device is None else {"name": name, "device": device}
    return _SignRoundQdq.apply(weight, v, min_scale, max_scale, (layer, options, qctx, device))


@dataclasses.dataclass
class VStep:
    """SignSGD's step of the layers' rounding offsets taken inside their backward (ABI 1.9):
    each v -= lrs[lr_groups[i]] * sign(its gradient) as the gradient is made, never stored,
    v copied first to best[i] when loss < best_loss (read, not lowered). For a loop with one
    backward per step: the range factors' signsgd_step follows with the same loss and
    best_loss, lowering it and advancing the schedule."""
    lrs: torch.Tensor
    lr_groups: list
    loss: torch.Tensor = None
    best_loss: torch.Tensor = None
    best: list = None


class _SignRoundQdqLayers(torch.autograd.Function):
    """Several layers of one options set in one engine call forward and one backward; with
    experts ({"tokens": a tensor or None}) through the experts' calls (ABI 1.10)."""

    @staticmethod
    def forward(ctx, spec, *tuned):
        layers, options, qctx, _, experts = spec
        records = []
        for k, layer in enumerate(layers):
            v, lo, hi = (t.detach() for t in tuned[3 * k:3 * k + 3])
            records.append(dict(layer, v=v, min_scale=lo, max_scale=hi, qdq=torch.empty_like(layer["weight"])))
        streams = _streams(qctx, [r["weight"] for r in records])
        if experts is None:
            qctx.signround_qdq(records, options, streams=streams)
        else:
            qctx.signround_experts_qdq(records, options, tokens=experts["tokens"], streams=streams)
        # Not the outputs: a tensor held by its own grad_fn's ctx is a cycle no collector frees
        # (an MoE block's native loop kept every eager iteration's quant-dequantized weights).
        ctx.spec, ctx.records = spec, [dict(r, qdq=None) for r in records]
        return tuple(r["qdq"] for r in records)

    @staticmethod
    def backward(ctx, *grads):
        _, options, qctx, step, experts = ctx.spec
        # An expert without tokens gets no gradient written: zeros, which SignSGD steps by nothing.
        empty = torch.empty_like if experts is None or experts["tokens"] is None else torch.zeros_like
        # With a step each v steps in the engine's backward: no gradient is made for autograd to hand on.
        records = [dict(r, qdq=None, grad_qdq=g.contiguous().to(r["weight"].dtype),
                        grad_v=empty(r["v"]) if step is None else None,
                        grad_min_scale=empty(r["min_scale"]), grad_max_scale=empty(r["max_scale"]))
                   for r, g in zip(ctx.records, grads)]
        fields = None
        if step is not None:
            fields = {"step_lrs": step.lrs, "loss": step.loss, "best_loss": step.best_loss}
            for i, r in enumerate(records):
                r.update(lr_group=step.lr_groups[i], best_v=None if step.best is None else step.best[i])
        streams = _streams(qctx, [r["weight"] for r in records])
        if experts is None:
            qctx.signround_qdq(records, options, backward=True, streams=streams, step=fields)
        else:
            qctx.signround_experts_qdq(records, options, tokens=experts["tokens"], backward=True, streams=streams,
                                       step=fields)
        return (None,) + tuple(t for r in records for t in (r["grad_v"], r["grad_min_scale"], r["grad_max_scale"]))


def _layers_call(layers, bits, group_size, sym, scale_dtype, q_scale_thresh, ctx, device, step, experts):
    qctx = ctx or default_context()
    options = {"bits": bits, "group_size": group_size, "sym": sym, "scale_dtype": scale_dtype,
               "q_scale_thresh": q_scale_thresh}
    specs = [{"name": name, "weight": weight.detach(), **({} if device is None else {"device": device})}
             for name, weight, _, _, _ in layers]
    tuned = [t for _, _, v, lo, hi in layers for t in (v, lo, hi)]
    return list(_SignRoundQdqLayers.apply((specs, options, qctx, step, experts), *tuned))


def signround_qdq_layers(layers, bits=4, group_size=128, sym=True, scale_dtype=torch.float16, q_scale_thresh=1e-5,
                         ctx=None, device=None, step=None):
    """signround_qdq of several layers sharing one options set, in one engine call (and
    one for their backward): layers are (name, weight, v, min_scale, max_scale), v
    (groups, group_len) and the range factors (groups,) as the engine takes them. Returns
    the layers' quant-dequantized weights, differentiable in each v, min_scale, max_scale;
    with step (a VStep, its lists in the layers' order) each v instead takes SignSGD's step
    in the backward and gets no gradient."""
    return _layers_call(layers, bits, group_size, sym, scale_dtype, q_scale_thresh, ctx, device, step, None)


def signround_qdq_experts(experts, tokens=None, bits=4, group_size=128, sym=True, scale_dtype=torch.float16,
                          q_scale_thresh=1e-5, ctx=None, device=None, step=None):
    """signround_qdq_layers of a block's experts (one shape, dtype and device) through the
    experts' calls (ABI 1.10): one launch a pass on a GPU. tokens: None, or (experts,) int32
    / int64 on their device, each expert's routed tokens this iteration; an expert with 0 is
    skipped as AutoRound skips it: its returned weight is not written (its wrapper would
    not run), its gradients are zeros, its v takes no step (but is kept as best with step)."""
    return _layers_call(experts, bits, group_size, sym, scale_dtype, q_scale_thresh, ctx, device, step,
                        {"tokens": tokens})


def _signsgd_records(params, lr_groups, best):
    records = []
    for i, p in enumerate(params):
        if p.grad is None:
            raise ValueError("params[%d] has no gradient" % i)
        records.append({"param": p.detach(), "grad": p.grad, "best": None if best is None else best[i],
                        "lr_group": lr_groups[i]})
    return records


def signsgd_step(params, lrs, lr_groups=None, epoch=None, total_iters=0, loss=None, best_loss=None, best=None,
                 ctx=None, device=None):
    """AutoRound's SignSGD step (no momentum, no weight decay) of fp32 tensors on one device,
    on qlink's engine: each param -= lrs[lr_groups[i]] * sign(param.grad). With loss and
    best_loss ((1,) fp32 device tensors) the params are first copied into `best` (a tensor
    per param) when loss < best_loss, which then becomes loss; with epoch ((1,) int64) and
    total_iters, LinearLR(start_factor=1, end_factor=0, total_iters) then advances: epoch
    += 1, each lr multiplied by its factor. Nothing is read back to the host."""
    qctx = ctx or default_context()
    records = _signsgd_records(params, lr_groups or [0] * len(params), best)
    qctx.signsgd_step(records, lrs, epoch, total_iters, loss, best_loss, streams=_streams(qctx, [lrs]),
                      device=device)


def signsgd_experts_step(experts, lrs, tokens=None, lr_groups=None, epoch=None, total_iters=0, loss=None,
                         best_loss=None, best=None, ctx=None, device=None):
    """signsgd_step of a block's experts in one engine call (ABI 1.10, one launch on a GPU):
    experts is a list per expert of its params (the k-th of one size for every expert),
    lr_groups and best lists of the same shape. tokens as for signround_qdq_experts: an
    expert with 0 is not updated (AutoRound's SignSGD skips a parameter without a gradient:
    one here may have none), but kept as best with the rest; the schedule advances once."""
    qctx = ctx or default_context()
    flat = [p for ps in experts for p in ps]
    groups = [g for gs in lr_groups for g in gs] if lr_groups is not None else [0] * len(flat)
    bests = [b for bs in best for b in bs] if best is not None else None
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in flat]
    records = [{"param": p.detach(), "grad": g, "best": None if bests is None else bests[i], "lr_group": groups[i]}
               for i, (p, g) in enumerate(zip(flat, grads))]
    qctx.signsgd_experts_step(records, len(experts), lrs, tokens, epoch, total_iters, loss, best_loss,
                              streams=_streams(qctx, [lrs]), device=device)


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


@dataclasses.dataclass
class _Rows:
    """One replica's share of one layer: rows [lo, lo + count) of its weight, their frozen
    groups, and the tuning parameters of those rows."""
    key: str            # "<layer>.weight", as functional_call names it
    lo: int
    count: int
    weight: _Grouped
    v: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor

    def qdq(self, bits):
        return self.weight.qdq(self.v, self.alpha, self.beta, bits)


def _linears(block):
    return [(name, m) for name, m in block.named_modules() if isinstance(m, torch.nn.Linear)]


def _weight_key(name):
    """What functional_call calls a layer's weight ("weight" when the block is the layer)."""
    return name + ".weight" if name else "weight"


def sign_round(block, inputs, placement, iters=200, lr=None, bits=4, group_size=128, batch_size=8, seed=0):
    """Tunes V, alpha, beta of every Linear in `block` (on home) against its full-precision
    outputs on `inputs` (nsamples, ...), on placement.world replicas. Returns the best
    iterate's fake-quantized weights."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1, got %d" % batch_size)
    if batch_size < placement.world:  # every replica needs a sample: demote, as AutoRound does
        placement = placement.subset(power_of_two_at_most(batch_size))
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

    counts = {name: shard_sizes(m.out_features, world) for name, m in layers}

    def owned(r):
        rows = []
        for name, m in _linears(blocks[r]):
            lo, count = sum(counts[name][:r]), counts[name][r]
            if count:
                shape = (count, m.in_features // group_size)
                rows.append(_Rows(_weight_key(name), lo, count, _Grouped(m.weight[lo:lo + count], group_size),
                                  torch.zeros(count, m.in_features, device=dev[r], requires_grad=True),
                                  torch.ones(shape, device=dev[r], requires_grad=True),
                                  torch.ones(shape, device=dev[r], requires_grad=True)))
        return rows
    shards = [owned(r) for r in range(world)]
    params = [[p for rows in shard for p in (rows.v, rows.alpha, rows.beta)] for shard in shards]
    # Each replica's whole fake-quantized weights: filled by every owner each iteration, the
    # leaves its forward differentiates.
    weights = [{_weight_key(name): torch.empty_like(m.weight, requires_grad=True) for name, m in _linears(blocks[r])}
               for r in range(world)]
    # Weight gradients laid out owner by owner (each owner's rows of every layer, in layer
    # order), so one contiguous slice per owner goes to the reduction.
    spans = [sum(rows.count * rows.v.shape[1] for rows in shard) for shard in shards]
    starts = [sum(spans[:r]) for r in range(world)]
    grads = [torch.empty(sum(spans), device=dev[r]) for r in range(world)]
    summed = [grads[r][starts[r]:starts[r] + spans[r]] if world == 1 else torch.empty(spans[r], device=dev[r])
              for r in range(world)]
    # The gather: (owner, index of its rows, receiving replica) for every owned share.
    gather = [(o, j, d) for o in range(world) for j in range(len(shards[o])) for d in range(world)]
    gather_targets = [weights[d][shards[o][j].key].detach()[shards[o][j].lo:shards[o][j].lo + shards[o][j].count]
                      for o, j, d in gather]
    lr0 = lr if lr is not None else 1.0 / max(iters, 1)
    draws = torch.Generator().manual_seed(seed)
    nsamples = inputs.shape[0]
    elements = targets[0][:batch_size].numel()

    def fake_quantize(r, tape=True):
        """This replica's rows; tape: recorded by autograd for the owner's step (grad mode
        is per thread, so it is set here, in the replica's thread)."""
        with torch.set_grad_enabled(tape):
            return [rows.qdq(bits) for rows in shards[r]]

    def share_rows(quantized):  # every owner's rows into every replica's weights
        placement.copy([quantized[o][j].detach() for o, j, _ in gather], gather_targets, [o for o, _, _ in gather],
                       [d for _, _, d in gather])

    def forward_backward(r, batch):
        share = shard_sizes(len(batch), world)
        lo = sum(share[:r])
        idx = batch[lo:lo + share[r]].to(dev[r])
        for w in weights[r].values():
            w.grad = None
        out = functional_call(blocks[r], weights[r], (xs[r][idx],))
        loss = ((out.float() - targets[r][idx].float()) ** 2).sum()
        loss.backward()
        grad = {key: w.grad if w.grad is not None else torch.zeros_like(w) for key, w in weights[r].items()}
        grads[r].copy_(torch.cat([grad[rows.key][rows.lo:rows.lo + rows.count].reshape(-1)
                                  for o in range(world) for rows in shards[o]]))
        return loss.item()

    def owner_step(r, quantized, rate):
        offset, upstream = 0, []
        for q in quantized[r]:
            upstream.append(summed[r][offset:offset + q.numel()].view_as(q).to(q.dtype))
            offset += q.numel()
        for p in params[r]:
            p.grad = None
        if quantized[r]:
            torch.autograd.backward(quantized[r], upstream)
        with torch.no_grad():
            for p in params[r]:
                p -= rate * torch.sign(p.grad)
            for rows in shards[r]:
                rows.alpha.clamp_(0, 1)
                rows.beta.clamp_(0, 1)

    losses, best_loss, best = [], float("inf"), None  # the best iterate: strictly lower loss
    for t in range(iters):
        batch = torch.randperm(nsamples, generator=draws)[:batch_size]
        quantized = placement.run(fake_quantize)
        share_rows(quantized)
        loss = sum(placement.run(lambda r: forward_backward(r, batch))) / elements  # shard sums in rank order
        losses.append(loss)
        if loss < best_loss:  # the iterate just measured: before this step's update
            best_loss, best = loss, [[p.detach().clone() for p in ps] for ps in params]
        if world > 1:
            for o in range(world):  # each owner's rows, summed over every replica's share of the batch
                collectives.reduce([g[starts[o]:starts[o] + spans[o]] for g in grads], summed[o], ctx=placement.ctx,
                                   input_devices=placement.device_ids(),
                                   output_device=placement.ids[o] if placement.cpu else None)
        rate = lr0 * (1.0 - t / iters)
        placement.run(lambda r: owner_step(r, quantized, rate))
    with torch.no_grad():
        if best is not None:
            for ps, bs in zip(params, best):
                for p, b in zip(ps, bs):
                    p.copy_(b)
        share_rows(placement.run(lambda r: fake_quantize(r, tape=False)))
        placement.synchronize()
        final = {key: w.detach() for key, w in weights[0].items()}
        out = functional_call(block, final, (inputs,))
        loss = float(((out.float() - targets[0].float()) ** 2).mean())
    return SignRoundResult({name: final[_weight_key(name)] for name, _ in layers}, loss, losses)
