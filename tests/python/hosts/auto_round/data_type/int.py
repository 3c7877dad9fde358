"""Stand-in for auto_round.data_type.int: AutoRound's int quant-dequant of a weight, group by
group (the tests' reference of its arithmetic, signround_reference.py), returning (the
quant-dequantized weight, each group's scale, its zero point; maxq symmetric)."""
import torch

from auto_round import envs
from signround_reference import reference_qdq_parts


def get_reciprocal(tensor):
    """1 / tensor, 0 where |tensor| is below a dtype's small bound."""
    eps = 1e-5 if tensor.dtype == torch.float16 else 1e-30
    safe = tensor.abs() >= eps
    return torch.where(safe, 1.0 / torch.where(safe, tensor, torch.ones_like(tensor)), torch.zeros_like(tensor))


def search_scales(data, bits, qw=None):
    """Each group's (row's) symmetric scale: the one of the largest-magnitude value's range
    and of 2 x search_min ranges around it whose squared error (weighted by qw) is
    lowest, the earlier kept on a tie; a better candidate's scales written through a
    boolean mask, only where one is better."""
    nmax = int(2.0 ** (bits - 1))
    group_max = torch.take_along_dim(data, torch.abs(data).argmax(dim=-1, keepdim=True), dim=-1)

    def candidate(factor):
        iscales = -factor * get_reciprocal(group_max)
        scales = get_reciprocal(iscales)
        levels = torch.round(iscales * data).clamp_(-nmax, nmax - 1)
        error = ((scales * levels - data).to(torch.float32)) ** 2
        if isinstance(qw, torch.Tensor):
            error.mul_(qw)
        return scales, torch.sum(error, dim=-1)

    scales, best = candidate(nmax)
    if bits == 2:
        steps, step = 18 * 5, 0.01
    else:
        span = nmax * (envs.AR_SEARCH_SCALE_RATIO or 0.75)
        step = span / 200 * 2
        steps = int(span / step)
    for i in range(-steps, steps + 1):
        if i == 0:
            continue
        tried, loss = candidate(nmax - step * i)
        better = loss < best
        if better.any():
            scales[better] = tried[better]
            best[better] = loss[better]
    return scales


def quant_tensor_sym(tensor, bits=4, group_size=-1, v=0, min_scale=1.0, max_scale=1.0, scale_dtype=torch.float16,
                     q_scale_thresh=1e-5, **kwargs):
    return reference_qdq_parts(tensor, v, min_scale, max_scale, bits, group_size, True, scale_dtype, q_scale_thresh)


def quant_tensor_asym(tensor, bits=4, group_size=-1, v=0, min_scale=1.0, max_scale=1.0, scale_dtype=torch.float16,
                      q_scale_thresh=1e-5, **kwargs):
    return reference_qdq_parts(tensor, v, min_scale, max_scale, bits, group_size, False, scale_dtype, q_scale_thresh)


def quant_tensor_rtn_sym(tensor, bits=4, group_size=-1, q_scale_thresh=1e-5, scale_dtype=torch.float16, **kwargs):
    groups = tensor.numel() // (tensor.shape[-1] if group_size == -1 else group_size)
    ones = tensor.new_ones(groups, dtype=torch.float32)
    return quant_tensor_sym(tensor, bits, group_size, 0.0, ones, ones.clone(), scale_dtype, q_scale_thresh)
