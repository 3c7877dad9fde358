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
    """Whether x (the routed rows) can take the grouped GEMMs."""
    return (GROUPED_MM and x.is_cuda and x.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(x.device)[0] >= 9)


def offsets(counts, device):
    """The grouped GEMM's offsets (each expert's end row, int32) on `device` from host counts."""
    return torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32).to(device, non_blocking=True)


def linears(x, ends, gate_up, down, act):
    """(output, intermediates) of x's rows sorted by expert (expert e's end at ends[e], an
    int32 device tensor: offsets()): act(gate) * up and down, each over every expert in one
    grouped GEMM (autograd through both). gate_up (experts, 2 * inter, hidden), down
    (experts, hidden, inter)."""
    both = torch._grouped_mm(x, gate_up.transpose(1, 2), offs=ends)
    inter = gate_up.shape[1] // 2
    h = act(both[:, :inter]) * both[:, inter:]
    return torch._grouped_mm(h, down.transpose(1, 2), offs=ends), h


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
