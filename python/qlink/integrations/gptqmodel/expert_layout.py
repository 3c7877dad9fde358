"""An MoE block's routed experts as the weights qlink's expert stage reads: defuser's split
experts (a list of modules, each with gate_proj, up_proj and down_proj linears without bias,
nn.Linear or GPTQModel's HookedLinear subclass of it, and an act_fn) or transformers 5's
fused experts (gate_up_proj (experts, 2 * inter, hidden), down_proj (experts, hidden,
inter), act_fn and transformers' default gate).

Invariant: both layouts are read as per-expert views of the block's own tensors, gate and
up as two (inter, hidden) matrices, so a fused block goes through the very arithmetic its
defused copy does: equal results, no per-expert modules made (the grouped GEMM's stacked
weights are the one copy, of split experts, once a pass). refusal() names what the stage
does not cover; the caller leaves the whole block to the host then."""
import torch

from .. import grouped_experts

_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
_ONLINE_HADAMARD = ("online_full_had", "online_partial_had")  # GPTQModel's HookedLinear flags


def refusal(experts):
    """Why `experts` (a block's experts module) is not a layout ExpertWeights reads, or None."""
    if _fused(experts):
        if getattr(experts, "has_bias", False) or getattr(experts, "is_transposed", False):
            return "fused experts with a bias or a transposed layout"
        gate = grouped_experts.custom_gate(experts)
        if gate:
            return "fused experts with their own gate (%s)" % gate
        return None
    if not isinstance(experts, torch.nn.ModuleList) or len(experts) == 0:
        return "experts that are neither split per expert nor fused (%s)" % type(experts).__name__
    for index, expert in enumerate(experts):
        for name in _PROJECTIONS:
            linear = getattr(expert, name, None)
            if not isinstance(linear, torch.nn.Linear) or linear.bias is not None:
                return "expert %d's %s is not a Linear without bias" % (index, name)
            if any(getattr(linear, flag, False) for flag in _ONLINE_HADAMARD):
                return "expert %d's %s rotates its input (online Hadamard)" % (index, name)
        if not callable(getattr(expert, "act_fn", None)):
            return "expert %d has no act_fn" % index
    return None


def _fused(experts):
    return all(torch.is_tensor(getattr(experts, name, None)) and getattr(experts, name).dim() == 3
               for name in ("gate_up_proj", "down_proj")) and callable(getattr(experts, "act_fn", None))


class ExpertWeights:
    """Per-expert views of a block's experts (see the module's docstring); ValueError
    naming what refusal() gives where it does not read them."""

    def __init__(self, experts):
        reason = refusal(experts)
        if reason:
            raise ValueError("experts: %s" % reason)
        self.fused = _fused(experts)
        if self.fused:
            self.num_experts = experts.gate_up_proj.shape[0]
            self.inter = experts.gate_up_proj.shape[1] // 2
            self.act_fn = experts.act_fn
        else:
            self.num_experts = len(experts)
            self.inter = experts[0].gate_proj.weight.shape[0]
            self.act_fn = experts[0].act_fn
        self.experts = experts

    def gate_up(self, expert):
        """(gate, up): expert's (inter, hidden) weights."""
        if self.fused:
            both = self.experts.gate_up_proj[expert]
            return both[:self.inter], both[self.inter:]
        return self.experts[expert].gate_proj.weight, self.experts[expert].up_proj.weight

    def down(self, expert):
        """expert's (hidden, inter) weight."""
        return self.experts.down_proj[expert] if self.fused else self.experts[expert].down_proj.weight

    def act(self, expert, gate):
        return (self.experts[expert].act_fn if not self.fused else self.act_fn)(gate)

    def one_act(self):
        """The activation every expert applies, or None where split experts' differ."""
        return self.act_fn if self.fused else grouped_experts.activation(self.experts)

    def stacked(self):
        """(gate_up (experts, 2 * inter, hidden), down (experts, hidden, inter)): the fused
        block's own tensors, or split experts' weights stacked (a copy)."""
        if self.fused:
            return self.experts.gate_up_proj, self.experts.down_proj
        return grouped_experts.stacked(self.experts)
