"""An MoE block's routed-expert subsets (GPTQModel's run_subset_stage for a subset of
`<block>.<i>.gate_proj`/`up_proj`, or of `<block>.<i>.down_proj`) owned by qlink as one
unit: qlink runs the layer's forwards of every calibration batch itself with the block's
experts as one grouped pass (expert_pass), each forward's rows added to their experts'
Hessians as it goes (expert_hessians: gate and up share one; a round's experts in one native
call a device a forward; no rows kept). Where GPTQModel quantizes on several GPUs, the
experts are placed over them (expert_placement): each expert's Hessian summed, and its
modules solved, on its GPU. Each round of experts whose Hessians fit their devices' memory
budgets lands in GPTQModel's tasks as its own add_batch leaves them (the partials and
counts; contract.count_batch) and GPTQModel's stage then runs over the round's modules
without its forward (execute_forward=False): its coverage policy (an expert no token reached
is pruned, or left to its fallback) and its solves (qlink's engine through the task class)
act on them, so experts with no or few rows are handled exactly as GPTQModel handles them
(qlink counts them: "experts" in counters()). A round is solved before the forwards run
again for the next round's Hessians, so a layer whose Hessians do not all fit
(DeepSeek-V3's 256 experts of width 7168: about 52 GB) holds one round's at a time, spread
over the GPUs.

What the stage does not cover goes to GPTQModel's stage for the whole subset, with the
reason counted (by design) or, where qlink's pass fails, as a fallback (FallbackRefused
under strict); a round after the first that fails leaves the rest to GPTQModel's own
forwards (its chunked MoE path). Linears of the subset that are no routed expert (DeepSeek's
shared expert) are fed by GPTQModel's own forward. The layer's replay after the subsets is
GPTQModel's own. On unless install(expert_stage=False) (docs/MOE.md has its measurements)."""
import dataclasses
import re
import threading
import time

import torch

from ...moves import has_meta
from ...streams import resolved_device
from .contract import count_batch
from .expert_hessians import ChunkHessians, expert_rounds, solve_bytes
from .expert_layout import ExpertWeights, refusal as layout_refusal
from .expert_placement import budget, placed_experts
from .expert_pass import ExpertPass
from .hessian_queue import unsupported

PATCH = "expert_stage"
_EXPERT = re.compile(r"^(?P<block>.+)\.(?P<index>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)$")
_RECORD = {"gate_proj": "inputs", "up_proj": "inputs", "down_proj": "intermediates"}


def expert_subset(names):
    """(experts module path, record, {expert: [names]}, [other names]) where `names` hold one
    block's gate/up or down expert linears, and perhaps linears that are no routed expert
    (DeepSeek's shared experts: GPTQModel's own forward feeds those), else (None, reason)."""
    found = {n: _EXPERT.match(n) for n in names}
    experts = [n for n in names if found[n]]
    if not experts:
        return None, "not an MoE expert subset"
    blocks = {found[n].group("block") for n in experts}
    records = {_RECORD[found[n].group("proj")] for n in experts}
    if len(blocks) > 1 or len(records) > 1:
        return None, "a subset mixing %d expert blocks and %d kinds of expert input" % (
            len(blocks), len(records))
    by_expert = {}
    for name in experts:
        by_expert.setdefault(int(found[name].group("index")), []).append(name)
    return (blocks.pop(), records.pop(), by_expert, [n for n in names if not found[n]]), None


class ExpertCounts:
    """The "experts" section of counters(): blocks owned, experts seen, experts no token
    reached, experts below their fallback threshold, rows, rounds of the forwards ("chunks"),
    experts whose Hessians were summed off the rows' GPU ("placed"); and the seconds
    the stage spent in its forwards and in GPTQModel's stage over its modules (the solves,
    packs and what GPTQModel does per module), the split of a layer's time each run reports."""

    def __init__(self):
        self.lock = threading.Lock()
        self.values = {"blocks": 0, "experts": 0, "empty": 0, "few": 0, "rows": 0, "chunks": 0,
                       "placed": 0, "forwards_s": 0.0, "solved_s": 0.0}

    def add(self, **counts):
        with self.lock:
            for key, n in counts.items():
                self.values[key] += n

    def snapshot(self):
        with self.lock:
            return dict(self.values)


def stage_refusal(installation, looper, plan, processor, layer_inputs):
    """Why GPTQModel's own stage runs this expert subset, or None."""
    host, model = installation.host, looper.gptq_model
    if type(processor) is not host.GPTQProcessor:
        return "a %s processor" % type(processor).__name__
    if not plan.execute_forward:
        return "a subset without forwards"
    if not layer_inputs:
        return "no calibration batches"
    if plan.need_forward_outputs:
        return "the subset's forward outputs are the next layer's inputs (no replay after process)"
    if plan.batching_enabled:
        return "the subset runs in module chunks (MoE routing bypass)"
    if getattr(looper, "moe_routing_override", None) or getattr(looper, "moe_routing_bypass", False):
        return "MoE routing options"
    for name in ("prepare_layer_replay_kwargs", "update_layer_replay_kwargs_from_output"):
        if getattr(type(model), name, None) is not getattr(host.BaseQModel, name):
            return "%s has its own %s (per-batch replay state)" % (type(model).__name__, name)
    return None


def _forwards(module, routed, experts, layer_inputs, layer_input_kwargs, position_ids, attention_masks):
    """The layer's forward of every batch, with the kwargs GPTQModel's forward gives it,
    the block's experts running `routed`."""
    with torch.inference_mode(), routed.installed_on(experts):
        for index, layer_input in enumerate(layer_inputs):
            kwargs = {}
            if attention_masks[index] is not None:
                kwargs["attention_mask"] = attention_masks[index]
            if position_ids:
                kwargs["position_ids"] = position_ids[index]
            kwargs.update(layer_input_kwargs[index])
            module(*layer_input, **kwargs)


def _fill(looper, plan, device, skip=()):
    """GPTQModel's fill for the forward (_prepare_named_module_for_forward) of each subset
    module but those in `skip` whose weight is not on `device` yet (on meta: offloaded or a
    shell); a module the layer's fill already put there holds the checkpoint's bytes, which
    a second fill would copy again."""
    for name, named in plan.modules.items():
        if name in skip:
            continue
        weight = getattr(getattr(named, "module", None), "weight", None)
        if torch.is_tensor(weight) and weight.device != resolved_device(device):
            looper._prepare_named_module_for_forward(named_module=named, fallback_device=device)


def _quantizers_to(installation, tasks, devices):
    """Each task's quantizer moved to its device (devices, one a task), one qlink move a
    device: GPTQModel rehomes each task's before its solve, one move a module (388 an MoE
    layer), and then finds it there."""
    by_device = {}
    for task, device in zip(tasks, devices):
        quantizer = getattr(task, "quantizer", None)
        if isinstance(quantizer, torch.nn.Module) and not has_meta(quantizer):
            by_device.setdefault(device, []).append(quantizer)
    for device, quantizers in by_device.items():
        installation.ctx.move_module_to_device(torch.nn.ModuleList(quantizers), device)


def make_run_subset_stage(installation, original):
    """GPTQModel's run_subset_stage for `installation` (qlink.integrations.gptqmodel's)."""
    counters, guard = installation.counters, installation.guard

    def run_subset_stage(looper, *, plan, processor, module, layer_inputs, layer_input_kwargs, position_ids,
                         attention_masks, **rest):
        args = dict(plan=plan, processor=processor, module=module, layer_inputs=layer_inputs,
                    layer_input_kwargs=layer_input_kwargs, position_ids=position_ids,
                    attention_masks=attention_masks, **rest)
        if not installation.expert_stage:
            counters.host(PATCH, "expert_stage=False")
            return original(looper, **args)
        names = [n for n in plan.ordered_module_names if n in plan.modules]
        found, reason = expert_subset(names)
        if reason is None:
            reason = stage_refusal(installation, looper, plan, processor, layer_inputs)
        experts = None
        if reason is None:
            experts = module.get_submodule(found[0])
            reason = layout_refusal(experts)
        if reason:
            counters.host(PATCH, reason)
            return original(looper, **args)
        path, record, by_expert, others = found

        def forwards(sink):
            """The routed forwards of every batch, the pass's rows to `sink`: (rows, reached)."""
            start = time.perf_counter()
            routed = ExpertPass(ExpertWeights(experts), record, sink)
            _forwards(module, routed, experts, layer_inputs, layer_input_kwargs, position_ids, attention_masks)
            totals = routed.totals()
            installation.expert_counts.add(forwards_s=time.perf_counter() - start)
            return totals

        def named(experts_in):
            return [name for e in experts_in for name in by_expert[e]]

        def owned():
            _fill(looper, plan, rest["cur_layer_device"], skip=others)
            owned_names = named(by_expert)
            # The experts make no second fill: their copies kept for one go back to the allocator.
            installation.prefetch.drop_kept(owned_names)
            weights, first = ExpertWeights(experts), layer_inputs[0][0]
            columns = first.shape[-1] if record == "inputs" else weights.inter
            # What add_batch would check of each expert's rows: their dtype, columns and device.
            like = torch.empty(0, columns, dtype=first.dtype, device=first.device)
            for name in owned_names:
                why = unsupported(processor.tasks[name], like, installation.host, installation.ctx)
                if why:
                    raise ValueError("%s: %s" % (name, why))
            solved_weights = sum(processor.tasks[name].module.weight.numel() for name in next(iter(by_expert.values())))
            budgets, need = {}, solve_bytes(columns, solved_weights)

            def budget_of(device):
                if device not in budgets:
                    budgets[device] = budget(installation, device)
                return budgets[device]
            placed = placed_experts(looper, plan, by_expert, first.device, installation.ctx,
                                    lambda device: None if budget_of(device) is None else budget_of(device) // need)
            _quantizers_to(installation, [processor.tasks[n] for n in owned_names],
                           [placed.get(e, rest["cur_layer_device"]) for e in by_expert for _ in by_expert[e]])
            devices = [placed.get(e, first.device) for e in range(weights.num_experts)]
            rounds = expert_rounds(devices, columns, {d: budget_of(d) for d in set(devices)}, solved_weights)
            sink = ChunkHessians(installation.accumulator, rounds[0], placed)
            rows, reached = forwards(sink)
            return rows, reached, rounds, placed, sink.partials

        def land(made, rows, reached):
            for expert, hessian in made.items():
                device = torch.device(hessian.device)
                for task in (processor.tasks[name] for name in by_expert[expert]):
                    with task.lock:  # as GPTQModel's add_batch leaves a task after its batches
                        task._device_hessian_partials[device] = hessian
                        count_batch(task, device, rows[expert], fwd=reached[expert])
                    installation.ahead.seen(task)  # fed, as add_batch says: the subset's solves in one call
            made.clear()  # the tasks hold the partials now: each freed once its tasks' merge took it

        def solved(names, forward=False):
            """GPTQModel's stage over these modules (all of the plan's: the plan)."""
            start = time.perf_counter()
            part = plan if len(set(names)) == len(plan.modules) else plan.for_modules(
                {name: named for name, named in plan.modules.items() if name in names})
            result = original(looper, **dict(args, plan=dataclasses.replace(part, execute_forward=forward)))
            installation.expert_counts.add(solved_s=time.perf_counter() - start)
            return result

        def commit(result):
            rows, reached, rounds, placed, made = result
            tasks = [processor.tasks[by_expert[e][0]] for e in by_expert]
            few = sum(bool(rows[e]) and bool(installation.host.should_use_fallback(
                task.fallback, float(rows[e]), task.expected_nsamples)) for e, task in zip(by_expert, tasks))
            installation.expert_counts.add(
                blocks=1, experts=len(by_expert), empty=sum(1 for e in by_expert if not rows[e]), few=few,
                rows=sum(rows[e] for e in by_expert), chunks=len(rounds), placed=len(placed))
            processed, last = {}, None
            for i, chunk in enumerate(rounds):
                if i:  # the forwards again for this round, once the round before is solved
                    sink = ChunkHessians(installation.accumulator, chunk, placed)
                    try:
                        forwards(sink)
                    except Exception as error:  # noqa: BLE001 (earlier rounds solved: the rest is GPTQModel's)
                        guard.fallback(PATCH, error)
                        sink = None
                    if sink is None:  # out of the except block: the failed pass's memory is gone first
                        last = solved(named(e for c in rounds[i:] for e in c if e in by_expert) + others,
                                      forward=True)
                        processed.update(last.processed_subset)
                        return dataclasses.replace(last, processed_subset=processed, plan=plan)
                    made = sink.partials
                names = named(e for e in chunk if e in by_expert)
                if not names:
                    continue
                land(made, rows, reached)
                last = solved(names)
                processed.update(last.processed_subset)
            if others:  # fed by GPTQModel's forward, whose inputs the experts' solves leave as they were
                last = solved(others, forward=True)
                processed.update(last.processed_subset)
            return dataclasses.replace(last, processed_subset=processed, plan=plan)
        return guard.attempt(PATCH, owned, lambda: original(looper, **args), commit)
    return run_subset_stage
