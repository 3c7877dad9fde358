"""Stand-in for auto_round.modeling.fused_moe.moe_experts_interface: linear_loop_experts_forward,
transformers 5's experts interface as AutoRound runs it (each expert's container called in
turn on its routed rows, token-major, the gate the experts module's _apply_gate, which
transformers' use_experts_implementation gives every experts class; the rows weighted and
summed over each token's slots; AutoRound's coverage pass, a forced routing whose output is
discarded, is not here), registered into a mapping that stands in for transformers'
ALL_EXPERTS_FUNCTIONS (its first registration kept), and an experts module that calls what
the mapping holds."""
import types

import torch
from torch import nn

ALL_EXPERTS_FUNCTIONS = types.SimpleNamespace(_global_mapping={})  # transformers' experts functions
LINEAR_LOOP_IMPL = "linear_loop"


def linear_loop_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    shape = hidden_states.shape
    hidden_states = hidden_states.reshape(-1, shape[-1])
    top_k_index = top_k_index.reshape(-1, top_k_index.shape[-1])
    top_k_weights = top_k_weights.reshape(-1, top_k_weights.shape[-1])
    tokens, top_k = top_k_index.shape
    token_idx = torch.arange(tokens, device=hidden_states.device).unsqueeze(1).expand(-1, top_k).reshape(-1)
    expert_ids = top_k_index.reshape(-1)
    rows = hidden_states[token_idx]
    out = torch.zeros_like(rows)
    for index in range(self.num_experts):
        at = torch.nonzero(expert_ids == index, as_tuple=False).squeeze(-1)
        if at.numel() == 0:
            continue
        expert = getattr(self, str(index))
        x = rows.index_select(0, at)
        gate, up = expert.gate_proj(x), expert.up_proj(x)
        gated = self._apply_gate(torch.cat([gate, up], dim=-1)) if hasattr(self, "_apply_gate") else \
            self.act_fn(gate) * up
        out.index_copy_(0, at, expert.down_proj(gated).to(out.dtype))
    out = out * top_k_weights.reshape(-1).to(hidden_states.dtype).unsqueeze(-1)
    return out.view(tokens, top_k, -1).sum(dim=1).view(shape)


def register_linear_loop_experts():
    if LINEAR_LOOP_IMPL not in ALL_EXPERTS_FUNCTIONS._global_mapping:
        ALL_EXPERTS_FUNCTIONS._global_mapping[LINEAR_LOOP_IMPL] = linear_loop_experts_forward
    return True


def _default_apply_gate(self, gate_up_out):
    """transformers.integrations.moe's default gate (use_experts_implementation's)."""
    gate, up = gate_up_out.chunk(2, dim=-1)
    return self.act_fn(gate) * up


class ExpertContainer(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)


class LinearLoopExperts(nn.Module):
    """Qwen3-MoE's experts once AutoRound unfused them: numbered containers, one act_fn,
    transformers' default gate."""

    _apply_gate = _default_apply_gate

    def __init__(self, hidden, inter, num_experts):
        super().__init__()
        self.num_experts, self.act_fn = num_experts, nn.SiLU()
        for index in range(num_experts):
            self.add_module(str(index), ExpertContainer(hidden, inter))

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return ALL_EXPERTS_FUNCTIONS._global_mapping[LINEAR_LOOP_IMPL](self, hidden_states, top_k_index, top_k_weights)
