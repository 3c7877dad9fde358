"""Stand-in for auto_round.modeling.unfused_moe.qwen3_moe: the unfused Qwen3-MoE block
(router, softmax, top-k renormalised, an nn.Linear per expert projection) whose experts run
through sequential_moe_forward, imported by name as AutoRound's blocks import it."""
import torch
from torch import nn
from torch.nn import functional as F

from ..fused_moe.moe_experts_interface import ExpertContainer
from ..fused_moe.utils import sequential_moe_forward


class Expert(ExpertContainer):
    """An expert's three projections, as the experts interface's container holds them, with
    its own activation and forward."""

    def __init__(self, hidden, inter):
        super().__init__(hidden, inter)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LinearQwen3MoeSparseMoeBlock(nn.Module):
    def __init__(self, hidden, inter, num_experts, top_k):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList([Expert(hidden, inter) for _ in range(num_experts)])

    def forward(self, hidden_states):
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, shape[-1])
        weights, chosen = torch.topk(F.softmax(self.gate(flat), dim=1, dtype=torch.float), self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(flat.dtype)
        return sequential_moe_forward(flat, chosen, weights, self.experts, self.num_experts).reshape(shape)
