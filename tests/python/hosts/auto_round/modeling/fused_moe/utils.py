"""Stand-in for auto_round.modeling.fused_moe.utils: sequential_moe_forward, the unfused MoE
blocks' experts loop as AutoRound's runs it: the routed rows (token-major, top-k slots in
order) grouped by expert once, each expert called on its rows in ascending order and its
output put back in place, then weighted and summed over each token's slots."""
import torch


def sequential_moe_forward(hidden_states, top_k_index, top_k_weights, experts, num_experts):
    tokens, top_k = top_k_index.shape
    rows = hidden_states[torch.arange(tokens, device=hidden_states.device).repeat_interleave(top_k)]
    chosen = top_k_index.reshape(-1)
    out = torch.zeros_like(rows)
    for expert in range(num_experts):
        at = torch.nonzero(chosen == expert, as_tuple=False).squeeze(-1)
        if at.numel():
            out.index_copy_(0, at, experts[expert](rows.index_select(0, at)).to(out.dtype))
    out = out * top_k_weights.reshape(-1).to(hidden_states.dtype).unsqueeze(-1)
    return out.view(tokens, top_k, -1).sum(dim=1)


FORCE_ALL_EXPERTS = False  # AutoRound's coverage pass (its environment switch)


def force_all_experts_routing_enabled():
    return FORCE_ALL_EXPERTS
