"""AutoRound's unfused MoE blocks' experts loops as two grouped GEMMs (qlink's
grouped_experts) with install(grouped_moe=True): sequential_moe_forward (DeepSeek, GLM,
Ernie, Qwen3.5's blocks: each expert's module called on its rows, one after another) and
linear_loop_experts_forward (transformers 5's experts interface, Qwen3-MoE's: each expert's
container's linears called in turn, the activation the experts module's own or transformers'
default gate, act_fn(gate) * up). In qlink's
native loop a block's 128 experts then take one product for gate/up and one for down,
forward and backward, instead of 128 small ones each.

Invariant: the rows, the weighting and the sum over each token's top-k slots are AutoRound's
(token-major rows, a sum over the slots in order); only the GEMMs round apart from the
per-expert linears' (within bf16 rounding). Nothing syncs with the host (the experts' row
counts stay on the device), so the native loop's CUDA graph can hold it, and no gradient is
summed by atomics (deterministic backward). AutoRound's imatrix hooks (its optimized RTN's,
on every quantized linear in a block's reference forward at iters=0) are kept: each hooked
projection's imatrix and row count grow as the hook would grow them, the fp32 sums of
squares of each expert's rows summed in one segmented reduction (within fp32 rounding of the
hook's; one host read a forward for the counts). Where an expert is not plain nn.Linear
projections without bias (AutoRound's wrapped layers during its own tuning), another hook
watches one, the activations differ or no grouped GEMM runs on the rows, AutoRound's loop
runs, the reason counted ("grouped_moe"); a grouped forward that fails, before any imatrix
is written, runs AutoRound's loop instead (a fallback; FallbackRefused under strict). Inside
AutoRound's compiled block forward each seam runs as plain Python (patches.eager)."""
import inspect

import torch

from .. import grouped_experts
from ..patches import eager, like
from .contract import add_imatrices, imatrix_hook

PATCH = "grouped_moe"
_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def refusal(hidden_states, experts, own_act=True):
    """Why these experts take AutoRound's loop, or None. own_act: each expert has its act_fn
    (else the experts module's one activation is applied)."""
    why = grouped_experts.refusal(hidden_states)
    if why:
        return why
    for index, expert in enumerate(experts):
        for name in _PROJECTIONS:
            linear = getattr(expert, name, None)
            # nn.Linear's own forward (functional_call's parameter swap may subclass it), no bias
            if not isinstance(linear, torch.nn.Linear) or type(linear).forward is not torch.nn.Linear.forward \
                    or linear.bias is not None:
                return "expert %d's %s is not a plain Linear without bias (%s)" % (index, name, type(linear).__name__)
    return grouped_experts.unwatched_refusal(experts, hidden_states.device, own_act, kept_hooks=_only_imatrix)


def _only_imatrix(part):
    """Whether every hook on `part` is AutoRound's imatrix collector, a plain forward hook."""
    hooks = part._forward_hooks
    return bool(hooks) and not part._forward_pre_hooks and not getattr(part, "forward_hook", None) \
        and not getattr(part, "_forward_hooks_with_kwargs", None) \
        and not getattr(part, "_forward_hooks_always_called", None) \
        and all(imatrix_hook(hook)[0] for hook in hooks.values())


def _imatrix_additions(experts, rows, h, counts):
    """What the projections' imatrix hooks would add had each expert been called on its rows
    (`rows` and `h`, the gate/up and the down inputs, sorted by expert, `counts` each):
    [(projection, fp32 sum of its input rows squared, rows, with_count)], nothing written."""
    hooked = [(e, name, part) for e, expert in enumerate(experts) for name in _PROJECTIONS
              for part in (getattr(expert, name),) if part._forward_hooks]
    if not hooked:
        return []
    rows_of = counts.tolist()  # the hook counts rows as an int: the one host read of the forward
    lengths = counts.long()
    squares = {"inputs": torch.segment_reduce(rows.float().pow(2), "sum", lengths=lengths, axis=0).unbind(0),
               "intermediates": torch.segment_reduce(h.float().pow(2), "sum", lengths=lengths, axis=0).unbind(0)}
    out = []
    for e, name, part in hooked:
        if rows_of[e]:  # AutoRound's loop calls no expert without rows
            squared = squares["intermediates" if name == "down_proj" else "inputs"][e]
            out += [(part, squared, rows_of[e], imatrix_hook(hook)[1]) for hook in part._forward_hooks.values()]
    return out


def _added(result):
    """The grouped forward's output, its imatrix additions made (add_imatrices)."""
    out, additions = result
    add_imatrices(additions)
    return out


def grouped_forward(hidden_states, top_k_index, top_k_weights, experts, num_experts, act=None):
    """(sequential_moe_forward's result (see the module's docstring) from two grouped GEMMs,
    the imatrix additions of the hooks it stands in for: _imatrix_additions); act: the
    activation (default the first expert's act_fn)."""
    tokens, top_k = top_k_index.shape
    # Routed rows grouped by expert, each expert's in AutoRound's order.
    order, ends = grouped_experts.by_expert(top_k_index.reshape(-1), num_experts)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    gate_up, down = grouped_experts.stacked(experts)
    # Each token's rows by expand and a permutation: their gradients sum without atomics.
    rows = hidden_states.unsqueeze(1).expand(-1, top_k, -1).reshape(tokens * top_k, -1)[order]
    out, h = grouped_experts.linears(rows, ends, gate_up, down, act or experts[0].act_fn)
    additions = _imatrix_additions(experts, rows, h, counts)
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    out = out[back] * top_k_weights.reshape(-1).to(hidden_states.dtype).unsqueeze(-1)
    return out.view(tokens, top_k, -1).sum(dim=1), additions


def make_sequential_moe_forward(installation, original):
    counters, guard = installation.counters, installation.guard

    @eager  # AutoRound compiles its block forward (torch.compile)
    @like(original)
    def sequential_moe_forward(hidden_states, top_k_index, top_k_weights, experts, num_experts):
        why = "grouped_moe=False" if not installation.grouped_moe else (
            refusal(hidden_states, experts) if len(experts) == num_experts else "a partial expert list")
        if why:
            counters.host(PATCH, why)
            return original(hidden_states, top_k_index, top_k_weights, experts, num_experts)
        return guard.attempt(PATCH, lambda: grouped_forward(hidden_states, top_k_index, top_k_weights, experts,
                                                            num_experts),
                             lambda: original(hidden_states, top_k_index, top_k_weights, experts, num_experts), _added)
    return sequential_moe_forward


def make_linear_loop_experts_forward(installation, original):
    """The experts interface's linear_loop forward. transformers keeps the first function
    registered in its experts mapping (by AutoRound's prepare): registered while installed,
    this one, which is AutoRound's own again once uninstalled; registered before (AutoRound's,
    or an earlier installation's), the mapping holds this one instead until uninstalled."""
    counters, guard = installation.counters, installation.guard
    forced = installation.host.force_all_experts_routing_enabled

    @eager
    @like(original)
    def linear_loop_experts_forward(experts_module, hidden_states, top_k_index, top_k_weights):
        if installation.closed:
            return original(experts_module, hidden_states, top_k_index, top_k_weights)
        experts = [getattr(experts_module, str(i)) for i in range(experts_module.num_experts)]
        gate = grouped_experts.custom_gate(experts_module) if installation.grouped_moe else None
        why = "grouped_moe=False" if not installation.grouped_moe else (
            "the experts' own gate (%s)" % gate if gate else
            "every expert's forced routing (AutoRound's coverage pass)" if forced() else
            refusal(hidden_states, experts, own_act=False))
        if why:
            counters.host(PATCH, why)
            return original(experts_module, hidden_states, top_k_index, top_k_weights)
        hidden = hidden_states.shape[-1]

        def grouped():
            out, additions = grouped_forward(
                hidden_states.reshape(-1, hidden), top_k_index.reshape(-1, top_k_index.shape[-1]),
                top_k_weights.reshape(-1, top_k_weights.shape[-1]), experts, len(experts), act=experts_module.act_fn)
            return out.view(hidden_states.shape), additions
        return guard.attempt(PATCH, grouped,
                             lambda: original(experts_module, hidden_states, top_k_index, top_k_weights), _added)
    host = installation.host
    mapping = getattr(host.ALL_EXPERTS_FUNCTIONS, "_global_mapping", None)  # None: transformers < 5
    held = mapping.get(host.LINEAR_LOOP_IMPL) if mapping is not None else None
    if held is not None and inspect.unwrap(held, stop=lambda f: f is original) is original:
        installation.rebindings.entry(mapping, host.LINEAR_LOOP_IMPL, linear_loop_experts_forward,
                                      "transformers' experts functions[%r]" % host.LINEAR_LOOP_IMPL)
    return linear_loop_experts_forward
