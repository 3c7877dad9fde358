"""Stand-in for defuser: splits transformers 5's fused MoE experts (one module holding
`gate_up_proj` (experts, 2 * intermediate, hidden) and `down_proj` (experts, hidden,
intermediate) as 3-D parameters, with an `act_fn`: Qwen3-MoE, Qwen2-MoE, Mixtral) into a
ModuleList of per-expert `gate_proj`, `up_proj`, `down_proj` nn.Linear, the tree GPTQModel's
MoE definitions name (`mlp.experts.{i}.gate_proj`). Each weight is a copy of its slice of
the fused tensor (same dtype and device, meta stays meta). The MoE block around the experts
is kept, so routing (router, softmax, top-k, norm_topk_prob) is its own code; the new
experts' forward is defuser's run_routed_experts (modeling/unfused_moe/common.py:
transformers' eager experts loop), calling the linears as modules so forward hooks see
each expert's routed rows. Anything else (biases, transposed or
interleaved experts, a gate other than transformers' `_default_apply_gate`, which its
`use_experts_implementation` gives every experts class) is left fused. Nothing is patched
before load: replace_fused_blocks does nothing, convert_model does the work on the loaded
(or meta) model."""
import torch
from torch import nn

from . import modeling  # noqa: F401
from .modeling.unfused_moe.common import run_routed_experts


class DefusedExpert(nn.Module):
    """One expert: down_proj(act_fn(gate_proj(x)) * up_proj(x))."""

    def __init__(self, gate, up, down, act_fn):
        super().__init__()
        self.gate_proj = _linear(gate)
        self.up_proj = _linear(up)
        self.down_proj = _linear(down)
        self.act_fn = act_fn

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DefusedExperts(nn.ModuleList):
    """The experts as a list; called as the fused module is: (hidden_states (tokens,
    hidden), top_k_index (tokens, k), top_k_weights (tokens, k)) -> (tokens, hidden)."""

    def __init__(self, experts):
        super().__init__(experts)
        self.num_experts = len(experts)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return run_routed_experts(self, hidden_states, top_k_weights, top_k_index, self.num_experts)


def _linear(weight):
    out_features, in_features = weight.shape
    linear = nn.Linear(in_features, out_features, bias=False, device="meta", dtype=weight.dtype)
    linear.weight = nn.Parameter(weight.detach().clone(), requires_grad=weight.requires_grad)
    return linear


def fused_experts(module):
    """Whether module is fused experts this stand-in splits."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
        return False
    if gate_up.dim() != 3 or down.dim() != 3 or not callable(getattr(module, "act_fn", None)):
        return False
    if getattr(module, "is_transposed", False) or getattr(module, "experts_are_transposed", False):
        return False
    if not getattr(module, "is_concatenated", True) or not getattr(module, "has_gate", True):
        return False  # gate and up interleaved, or no gate at all
    if getattr(module, "has_bias", False) or getattr(module, "gate_up_proj_bias", None) is not None \
            or getattr(module, "down_proj_bias", None) is not None:
        return False
    gate = getattr(module, "_apply_gate", None)
    if gate is not None and getattr(gate, "__name__", "") != "_default_apply_gate":
        return False  # transformers' use_experts_implementation gives every class the default
    experts, two_inter, hidden = gate_up.shape
    return two_inter % 2 == 0 and tuple(down.shape) == (experts, hidden, two_inter // 2)


def defuse(module):
    """A DefusedExperts holding copies of module's fused weights."""
    inter = module.gate_up_proj.shape[1] // 2
    experts = []
    with torch.no_grad():
        for e in range(module.gate_up_proj.shape[0]):
            gate_up = module.gate_up_proj[e]
            experts.append(DefusedExpert(gate_up[:inter], gate_up[inter:], module.down_proj[e], module.act_fn))
    return DefusedExperts(experts)


def convert_model(model, cleanup_original=True, max_layers=None, filter=None, **kwargs):
    """Replaces every fused experts module under model (model itself excepted) with its
    DefusedExperts; True if any was. The fused module is dropped from the tree either way
    (cleanup_original: its tensors are freed once nothing else holds them)."""
    found = [(name, m) for name, m in model.named_modules() if name and fused_experts(m)]
    for name, module in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, defuse(module))
        if cleanup_original:
            for key in ("gate_up_proj", "down_proj"):
                module._parameters.pop(key, None)
    return bool(found)


def replace_fused_blocks(model_type, **kwargs):
    return None
