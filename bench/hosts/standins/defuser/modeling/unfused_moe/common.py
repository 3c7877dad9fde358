"""The routed experts' loop of a split MoE block, where defuser keeps it
(defuser.modeling.unfused_moe.common.run_routed_experts, imported by name by the blocks that
call it): transformers' eager experts loop over per-expert modules. Experts in ascending
order, each called on its routed rows (the top-k slots' order first, then the tokens'),
its output weighted and index_add_-ed into zeros; one host read (torch.where) per expert."""
import torch
from torch import nn


def run_routed_experts(experts, hidden_states, routing_weights, selected_experts, num_experts):
    """experts: num_experts modules; hidden_states (tokens, hidden); routing_weights and
    selected_experts (tokens, top_k). Returns (tokens, hidden) in hidden_states' dtype."""
    final = torch.zeros_like(hidden_states)
    with torch.no_grad():
        mask = nn.functional.one_hot(selected_experts, num_classes=num_experts).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for index in hit:
        index = int(index[0])
        top_k_pos, token_idx = torch.where(mask[index])
        out = experts[index](hidden_states[token_idx]) * routing_weights[token_idx, top_k_pos, None]
        final.index_add_(0, token_idx, out.to(final.dtype))
    return final
