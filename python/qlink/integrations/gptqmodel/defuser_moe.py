"""The routed experts' loop of GPTQModel's split MoE blocks (defuser's run_routed_experts),
with one host read per forward instead of one per expert, and per-sample boundaries for
grouped calibration.

defuser's loop (transformers' eager experts loop) asks the device which rows each expert got
(torch.where on its mask: a host synchronization per routed expert, up to 128 a forward,
each waiting for the kernels queued before it). qlink's sorts the router's choices once,
by expert (and by sample, in a grouped forward), reads the counts once, and calls each
expert, in ascending order, on its rows taken from the sorted order. In a forward of one
sample the rows are the eager loop's, in its order (the top-k slots' first, then the
tokens'), so every expert, hook and index_add_ sees what it saw: the output is the same bit
for bit. In a grouped forward (input_cache.grouped: several one-sample batches in one
forward) each expert's rows come sample by sample, each sample's in the eager loop's order,
and while the expert runs, sample_blocks() tells add_batch how many rows each sample holds,
so each sample's rows are still a rank-k update of its own, as GPTQModel adds them one
sample per forward.

With the expert stage on (install()'s default), a forward that nothing watches (no hook on
an expert or its linears: GPTQModel's replay of the layer) runs the experts as two grouped
GEMMs instead (grouped_experts, on GPUs that have them), their offsets left on the device
(no host read: the next layer's kernels queue behind them): the output within bf16 rounding
of the loop's, deterministic."""
import threading

import torch

from ..patches import like
from .. import grouped_experts
from .expert_layout import ExpertWeights, refusal as layout_refusal

PATCH = "routed_experts"
GROUPED = "grouped_replay"  # the counter of forwards that ran the experts as grouped GEMMs, or why not
_running = threading.local()  # the per-sample row counts of the expert call on this thread


def sample_blocks(rows):
    """The row counts, sample by sample, of the routed expert running on this thread when
    they add up to `rows` (its input's or output's rows), else None."""
    blocks = getattr(_running, "blocks", None)
    return blocks if blocks is not None and sum(blocks) == rows else None


def make_run_routed_experts(installation, original):
    """defuser's run_routed_experts for `installation` (qlink.integrations.gptqmodel's): its
    original, guard, and the loop's samples per forward (installation.samples_in)."""
    guard = installation.guard

    @like(original)
    def run_routed_experts(experts, hidden_states, routing_weights, selected_experts, num_experts):
        tokens = hidden_states.shape[0]
        why = _grouped_refusal(experts, hidden_states) if installation.expert_stage else "expert_stage=False"
        if why is None:
            plan = guard.attempt(PATCH, lambda: _grouped_plan(selected_experts, num_experts), lambda: None)
        else:
            samples = installation.samples_in(tokens)
            plan = guard.attempt(PATCH, lambda: _plan(selected_experts, tokens, samples, num_experts), lambda: None)
        if plan is None:  # qlink's sort failed before any expert ran: the host's loop instead
            return original(experts, hidden_states, routing_weights, selected_experts, num_experts)
        installation.counters.record(GROUPED, why)
        if why is None:
            order, ends = plan
            gate_up, down = ExpertWeights(experts).stacked()
            out, _ = grouped_experts.linears(hidden_states[order % tokens], ends, gate_up, down, experts[0].act_fn)
            return grouped_experts.combine(out, order, selected_experts, routing_weights, hidden_states)
        order, counts = plan
        tokens_of, slots_of = order % tokens, torch.div(order, tokens, rounding_mode="floor")
        final = torch.zeros_like(hidden_states)
        at = 0
        for expert, sizes in enumerate(counts):
            rows = sum(sizes)
            if rows == 0:
                continue
            token, slot = tokens_of[at:at + rows], slots_of[at:at + rows]
            at += rows
            _running.blocks = [n for n in sizes if n]
            try:
                out = experts[expert](hidden_states[token]) * routing_weights[token, slot, None]
            finally:
                _running.blocks = None
            final.index_add_(0, token, out.to(final.dtype))
        return final
    return run_routed_experts


def _grouped_refusal(experts, hidden_states):
    """Why the split experts cannot run as grouped GEMMs (grouped_experts), or None: they
    need a GPU with them, a layout the expert stage reads, and nothing watching a call
    (grouped_experts.unwatched_refusal)."""
    return grouped_experts.refusal(hidden_states) or layout_refusal(experts) \
        or grouped_experts.unwatched_refusal(experts, hidden_states.device)


def _grouped_plan(selected_experts, num_experts):
    """(order, ends) for the grouped GEMMs (grouped_experts.by_expert): the router's choices
    sorted by expert as _plan sorts them for one sample (slots first, then tokens)."""
    return grouped_experts.by_expert(selected_experts.t().reshape(-1), num_experts)


def _plan(selected_experts, tokens, samples, num_experts):
    """(order, counts): the positions j = slot * tokens + token of the router's choices
    sorted by (expert, sample) and, within one, as they come (slots first, then tokens);
    counts[expert][sample], read to the host at once."""
    choices = selected_experts.t().reshape(-1).to(torch.int64)  # slot-major, as the eager mask reads them
    key = choices * samples
    if samples > 1:
        position = torch.arange(choices.numel(), device=choices.device)
        key += torch.div(position % tokens, tokens // samples, rounding_mode="floor")
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(key, minlength=num_experts * samples).view(num_experts, samples).tolist()
    return order, counts
