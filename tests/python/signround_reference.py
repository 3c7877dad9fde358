"""SignRound's arithmetic as AutoRound b9f3d00 performs it, written for these tests from its
functions (auto_round/data_type/int.py quant_tensor_sym / quant_tensor_asym, utils.py
round_ste and the group reshape, wrapper.py WrapperLinear._qdq_weight, sign_round/sign_sgd.py
SignSGD and the quantizer's LinearLR schedule), in plain PyTorch so autograd differentiates
it: the reference the native engine must match."""
import torch


def _straight_through_round(x):
    """round_ste: the rounded value forward, the identity backward."""
    return (x.round() - x).detach() + x


def _clamp(x, min=None, max=None):
    """torch.clamp as ATen computes it for x's dtype: a Python bound converted to that dtype,
    then compared (in float for fp16 / bf16, which this PyTorch cannot clamp on the CPU)."""
    if x.dtype == torch.float32:
        return torch.clamp(x, min=min, max=max)
    bound = lambda b: None if b is None else float(torch.tensor(b, dtype=x.dtype))  # noqa: E731
    return torch.clamp(x.float(), min=bound(min), max=bound(max)).to(x.dtype)


def reference_qdq_parts(weight, v, min_scale, max_scale, bits, group_size, sym, scale_dtype=torch.float16,
                        q_scale_thresh=1e-5):
    """WrapperLinear's _qdq_weight of weight (rows, columns) with v (groups, group_len) and
    min_scale / max_scale (groups,), the range factors clamped to [0, 1] in place first:
    (the quant-dequantized weight, each group's scale (groups, 1), its zero point: (groups,
    1) asymmetric, the int maxq symmetric, as AutoRound's int functions return it)."""
    with torch.no_grad():
        min_scale.clamp_(0.0, 1.0)
        max_scale.clamp_(0.0, 1.0)
    rows, cols = weight.shape
    grouped = weight if group_size == -1 else weight.reshape(-1, group_size)
    # The wrapper's tensor_min / tensor_max: each group's extremes, clamped through zero,
    # in the weight's dtype.
    low = _clamp(grouped.min(-1)[0], max=0)
    high = _clamp(grouped.max(-1)[0], min=0)
    if sym:
        maxq = int(2.0 ** (bits - 1))
        neg_range = -(low * min_scale)
        pos_range = high * max_scale
        direction = 2 * (pos_range < neg_range).int() - 1
        scale = ((direction * torch.max(pos_range, neg_range)) / maxq).to(scale_dtype)
        scale = torch.where(scale < 0, _clamp(scale, max=-q_scale_thresh), _clamp(scale, min=q_scale_thresh))
        scale = scale.unsqueeze(dim=-1)
        levels = torch.clamp(_straight_through_round(grouped / scale + v), -maxq, maxq - 1)
        out, zero = (scale * levels).to(grouped.dtype), maxq
    else:
        maxq = int(2.0 ** bits) - 1
        lo = low * min_scale
        hi = high * max_scale
        scale = _clamp(((hi - lo) / maxq).to(scale_dtype), min=q_scale_thresh)
        zero = _straight_through_round(-lo / scale).unsqueeze(dim=-1)
        scale = scale.unsqueeze(dim=-1)
        levels = torch.clamp(_straight_through_round(grouped / scale + v) + zero, 0, maxq)
        out = (scale * (levels - zero)).to(grouped.dtype)
    return out.reshape(rows, cols).to(weight.dtype), scale, zero


def reference_qdq(weight, v, min_scale, max_scale, bits, group_size, sym, scale_dtype=torch.float16,
                  q_scale_thresh=1e-5):
    """The quant-dequantized weight of reference_qdq_parts."""
    return reference_qdq_parts(weight, v, min_scale, max_scale, bits, group_size, sym, scale_dtype,
                               q_scale_thresh)[0]


class ReferenceSignSGD(torch.optim.Optimizer):
    """SignSGD with AutoRound's settings (no momentum, no weight decay) over parameter groups
    whose learning rates are 0-dim fp32 tensors, as the quantizer builds them; step() is
    param.add_(sign(grad), alpha=-lr)."""

    def __init__(self, groups):
        super().__init__([{"params": list(ps), "lr": torch.tensor(lr)} for ps, lr in groups], {})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(torch.sign(p.grad), alpha=-group["lr"])


def reference_schedule(optimizer, total_iters):
    """The quantizer's default schedule, stepped after each optimizer step: the learning
    rates stay 0-dim fp32 tensors multiplied by LinearLR's factor (a Python float)."""
    return torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.0, total_iters=total_iters)
