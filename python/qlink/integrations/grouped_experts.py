"""An MoE block's routed experts as two grouped GEMMs (PyTorch's torch._grouped_mm, bf16 on
sm90 and later), and the block's output combined from the routed rows in the eager loop's
order: for GPTQModel's expert stage (gptqmodel.expert_pass) and its replay of split blocks
(gptqmodel.defuser_moe), and AutoRound's unfused MoE blocks (autoround.grouped_moe).

Invariant: combine() adds each token's weighted expert outputs in ascending expert order,
one bf16 add at a time, as the eager loop's per-expert index_add_ does: deterministic (no
atomics over a token's rows), and equal to the loop bit for bit on equal expert outputs.
The grouped GEMMs round apart from per-expert linears (another kernel): within bf16
rounding of the loop."""
import itertools

import torch

GROUPED_MM = hasattr(torch, "_grouped_mm")  # PyTorch 2.8+; its fast path is bf16 on sm90 and later


def fits(x):
    """Whether x (the routed rows) can take the grouped GEMMs: its linears compute in bf16
    (compute_dtype) on an sm90 or later GPU."""
    return (GROUPED_MM and x.is_cuda and compute_dtype(x) == torch.bfloat16
            and torch.cuda.get_device_capability(x.device)[0] >= 9)


def refusal(x):
    """Why x's rows cannot take the grouped GEMMs (fits), or None."""
    if fits(x):
        return None
    dtype = compute_dtype(x) if GROUPED_MM and x.is_cuda else x.dtype
    if dtype != x.dtype:
        return "no grouped GEMM for %s rows computed in %s on %s" % (x.dtype, dtype, x.device)
    return "no grouped GEMM for %s rows on %s" % (x.dtype, x.device)


def compute_dtype(x):
    """The dtype a linear computes x's rows in: autocast's where autocast is on for x's device
    (AutoRound's block forward with amp: fp32 rows, bf16 products), else x's own. PyTorch asks
    autocast per device from 2.4; before, with no grouped GEMM (2.8), x's own."""
    if not hasattr(torch, "get_autocast_dtype"):
        return x.dtype
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def stacked(experts):
    """(gate_up (experts, 2 * inter, hidden), down (experts, hidden, inter)) of split experts
    (each with gate_proj, up_proj and down_proj linears): their weights stacked, a copy that
    autograd goes through."""
    gate_up = torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in experts])
    return gate_up, torch.stack([e.down_proj.weight for e in experts])


def activation(experts):
    """The activation (act_fn) every split expert applies, or None where theirs differ."""
    kinds = {(type(e.act_fn), getattr(e.act_fn, "__name__", None)) for e in experts}
    return experts[0].act_fn if len(kinds) == 1 else None


def custom_gate(experts_module):
    """The name of the experts module's own gate (`_apply_gate`) where it is not transformers'
    default, act_fn(gate) * up, which the grouped GEMMs compute; else None."""
    gate = getattr(experts_module, "_apply_gate", None)
    if gate is None:
        return None
    name = getattr(getattr(gate, "__func__", gate), "__name__", None)
    return None if name == "_default_apply_gate" else (name or type(gate).__name__)


def unwatched_refusal(experts, device, own_act=True, kept_hooks=None):
    """Why split experts' module calls cannot give way to grouped GEMMs on `device`, or None:
    a global module hook, a hook on an expert or a projection (torch's, or GPTQModel's
    forward_hook) but a projection's whose effect the caller makes itself (kept_hooks(part)
    true), a projection's weight elsewhere, or (own_act: each expert applies its own act_fn)
    activations that differ."""
    from torch.nn.modules import module
    if module._global_forward_hooks or module._global_forward_pre_hooks:
        return "a global module hook"
    for index, expert in enumerate(experts):
        for name, part in (("", expert), (".gate_proj", expert.gate_proj), (".up_proj", expert.up_proj),
                           (".down_proj", expert.down_proj)):
            hooked = part._forward_hooks or part._forward_pre_hooks or getattr(part, "forward_hook", None)
            if hooked and not (name and kept_hooks is not None and kept_hooks(part)):
                return "expert %d%s is hooked" % (index, name)
            if name and part.weight.device != device:
                return "expert %d%s's weight is on %s" % (index, name, part.weight.device)
    if own_act and activation(experts) is None:
        return "the experts' activations differ"
    return None


def by_expert(choices, num_experts):
    """(order, ends) of the routed rows whose experts are `choices` (1-D): the rows sorted by
    expert, stably (each expert's rows in the order they come), and each expert's end row in
    that order (int32: linears' ends), both left on the device: nothing waits for the kernels
    queued before them (bincount would read the largest id to the host to size its output)."""
    chosen, order = torch.sort(choices, stable=True)
    experts = torch.arange(num_experts, dtype=chosen.dtype, device=chosen.device)
    return order, torch.searchsorted(chosen, experts, right=True).to(torch.int32)


def offsets(counts, device):
    """The grouped GEMM's offsets (each expert's end row, int32) on `device` from host counts."""
    return torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32).to(device, non_blocking=True)


def linears(x, ends, gate_up, down, act):
    """(output, intermediates) of x's rows sorted by expert (expert e's end at ends[e], an
    int32 device tensor: offsets()): act(gate) * up and down, each over every expert in one
    grouped GEMM (autograd through both). gate_up (experts, 2 * inter, hidden), down
    (experts, hidden, inter). Rows and weights are cast to compute_dtype(x), as autocast casts
    a linear's operands (a no-op without autocast, where fits() wants bf16 rows)."""
    dtype = compute_dtype(x)
    both = torch._grouped_mm(x.to(dtype), gate_up.to(dtype).transpose(1, 2), offs=ends)
    inter = gate_up.shape[1] // 2
    h = act(both[:, :inter]) * both[:, inter:]
    return torch._grouped_mm(h, down.to(dtype).transpose(1, 2), offs=ends), h


def combine(out, order, top_k_index, top_k_weights, like):
    """The block's output (like `like`, the block's input rows) from `out`, the expert output
    of each routed row, rows sorted as `order` (positions slot * tokens + token)."""
    tokens, k = top_k_index.shape
    token, slot = order % tokens, torch.div(order, tokens, rounding_mode="floor")
    weighted = out * top_k_weights[token, slot, None]
    by_position = torch.empty_like(weighted)
    by_position[order] = weighted
    by_position = by_position.view(k, tokens, -1)
    ascending = torch.argsort(top_k_index, dim=1)  # each token's slots by expert
    rows = torch.arange(tokens, device=out.device)
    final = torch.zeros_like(like)
    for s in range(k):
        final += by_position[ascending[:, s], rows].to(final.dtype)
    return final
