"""An MoE block's routed-expert subsets (GPTQModel's run_subset_stage for a subset of
`<block>.<i>.gate_proj`/`up_proj`, or of `<block>.<i>.down_proj`) owned by qlink as one
unit: qlink runs the layer's forwards of every calibration batch itself with the block's
experts as one grouped pass (expert_pass: tokens sorted by expert once a forward, no
module call or hook per expert), then each expert's Hessian from its rows of all batches
in one product (gate and up sharing one), in expert chunks that fit a memory budget, the
chunks placed over the devices in turn (any count), the products of a chunk in one native
call. The results land in GPTQModel's tasks as its own add_batch leaves them (the
partials and counts; contract.count_batch), and GPTQModel's stage then runs without its
forward (execute_forward=False): its coverage policy (an expert no token reached is
pruned, or left to its fallback) and its solves (qlink's engine through the task class)
act on them, so experts with no or few rows are handled exactly as GPTQModel handles
them; qlink counts them ("experts" in counters()).

What the stage does not cover goes to GPTQModel's stage for the whole subset, with the
reason counted (by design) or, where qlink's pass fails, as a fallback (FallbackRefused
under strict). Block outputs are the host's: the pass's output equals defuser's loop's on
the same weights, and the layer's replay after the subsets is GPTQModel's own. Off unless
install(expert_stage=True): CPU-tested against the stand-ins, not yet measured in
GPTQModel's real loop."""
import dataclasses
import re
import threading

import torch

from ...streams import resolved_device
from .contract import count_batch
from .expert_layout import ExpertWeights, refusal as layout_refusal
from .expert_pass import ExpertPass
from .hessian_queue import unsupported

PATCH = "expert_stage"
_EXPERT = re.compile(r"^(?P<block>.+)\.(?P<index>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)$")
_RECORD = {"gate_proj": "inputs", "up_proj": "inputs", "down_proj": "intermediates"}


def expert_subset(names):
    """(experts module path, record, {expert: [names]}) where `names` are one block's
    gate/up or down expert linears, else (None, reason)."""
    found = [_EXPERT.match(n) for n in names]
    if not names or not all(found):
        return None, "not an MoE expert subset"
    blocks = {m.group("block") for m in found}
    records = {_RECORD[m.group("proj")] for m in found}
    if len(blocks) > 1 or len(records) > 1:
        return None, "a subset mixing %d expert blocks and %d kinds of expert input" % (
            len(blocks), len(records))
    by_expert = {}
    for name, m in zip(names, found):
        by_expert.setdefault(int(m.group("index")), []).append(name)
    return (blocks.pop(), records.pop(), by_expert), None


def expert_chunks(rows, columns, budget, itemsize=4):
    """The experts with rows, in consecutive chunks whose fp32 Hessians (columns^2 each) and
    rows (their copies, itemsize bytes an element) fit `budget` bytes (None: one chunk)."""
    chunks, chunk, used = [], [], 0
    for expert, n in enumerate(rows):
        if n == 0:
            continue
        need = 4 * columns * columns + itemsize * n * columns
        if budget is not None and need > budget:
            raise ValueError("memory_budget %d bytes does not hold expert %d's Hessian and rows (%d bytes)"
                             % (budget, expert, need))
        if chunk and budget is not None and used + need > budget:
            chunks.append(chunk)
            chunk, used = [], 0
        chunk.append(expert)
        used += need
    return chunks + ([chunk] if chunk else [])


def placement(chunks, devices):
    """[(device, chunk)]: chunk i on devices[i % len(devices)], for any count of devices."""
    if not devices:
        raise ValueError("devices must name at least one device, got %r" % (devices,))
    return [(devices[i % len(devices)], chunk) for i, chunk in enumerate(chunks)]


def hessians(accumulator, routed, budget=None, devices=None):
    """({expert: fp32 X^T X of its rows over every forward}, the count of chunks) of an
    ExpertPass, one product per expert, a chunk's in one native call on its device.
    devices: qlink device ids (None: the rows' own); a CUDA chunk's rows move to its GPU."""
    rows, _ = routed.totals()
    sample = next((k for k in routed.kept if k.numel()), None)
    if sample is None:
        return {}, 0
    out = {}
    chunks = expert_chunks(rows, sample.shape[-1], budget, sample.element_size())
    for device, chunk in placement(chunks, devices or [None]):
        items = []
        for expert in chunk:
            x = routed.rows(expert)
            if device is not None and x.device.type == "cuda":
                x = x.to(torch.device("cuda", device))
            items.append((x.contiguous(), None))
        for expert, partial in zip(chunk, accumulator.add_many(items, device=device)):
            out[expert] = partial
    return out, len(chunks)


class ExpertCounts:
    """The "experts" section of counters(): blocks owned, experts seen, experts no token
    reached, experts below their fallback threshold, rows, Hessian chunks."""

    def __init__(self):
        self.lock = threading.Lock()
        self.values = {"blocks": 0, "experts": 0, "empty": 0, "few": 0, "rows": 0, "chunks": 0}

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


def budget(installation, layer_inputs):
    """Bytes a Hessian chunk may take: install(expert_budget=...), else half the free memory
    of the GPU the batches are on, else (CPU memory) no bound."""
    if installation.expert_budget is not None:
        return installation.expert_budget
    first = layer_inputs[0][0]
    if first.device.type == "cuda":
        return torch.cuda.mem_get_info(first.device)[0] // 2
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


def _fill(looper, plan, device):
    """GPTQModel's fill for the forward (_prepare_named_module_for_forward) of each subset
    module whose weight is not on `device` yet (on meta: offloaded or a shell); a module the
    layer's fill already put there holds the checkpoint's bytes, which a second fill would
    copy again."""
    for named in plan.modules.values():
        weight = getattr(getattr(named, "module", None), "weight", None)
        if torch.is_tensor(weight) and weight.device != resolved_device(device):
            looper._prepare_named_module_for_forward(named_module=named, fallback_device=device)


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
        path, record, by_expert = found

        def owned():
            _fill(looper, plan, rest["cur_layer_device"])
            routed = ExpertPass(ExpertWeights(experts), record)
            _forwards(module, routed, experts, layer_inputs, layer_input_kwargs, position_ids, attention_masks)
            rows, reached = routed.totals()
            # What add_batch would check of each expert's rows: their dtype, columns and device.
            like = next((k for k in routed.kept if k.numel()), routed.kept[0])[:0]
            for name in (name for members in by_expert.values() for name in members):
                why = unsupported(processor.tasks[name], like, installation.host, installation.ctx)
                if why:
                    raise ValueError("%s: %s" % (name, why))
            made, chunks = hessians(installation.accumulator, routed, budget(installation, layer_inputs))
            return rows, reached, made, chunks  # the kept rows go with the pass, before GPTQModel's solves

        def commit(result):
            rows, reached, made, chunks = result
            few = 0
            for expert, members in by_expert.items():
                tasks = [processor.tasks[name] for name in members]
                for task in tasks if expert in made else ():
                    device = torch.device(made[expert].device)
                    with task.lock:  # as GPTQModel's add_batch leaves a task after its batches
                        task._device_hessian_partials[device] = made[expert]
                        count_batch(task, device, rows[expert], fwd=reached[expert])
                    installation.ahead.seen(task)  # fed, as add_batch says: the subset's solves in one call
                few += bool(rows[expert]) and bool(installation.host.should_use_fallback(
                    tasks[0].fallback, float(rows[expert]), tasks[0].expected_nsamples))
            installation.expert_counts.add(
                blocks=1, experts=len(by_expert), empty=sum(1 for e in by_expert if not rows[e]), few=few,
                rows=sum(rows[e] for e in by_expert), chunks=chunks)
            result = original(looper, **dict(args, plan=dataclasses.replace(plan, execute_forward=False)))
            return dataclasses.replace(result, plan=plan)
        return guard.attempt(PATCH, owned, lambda: original(looper, **args), commit)
    return run_subset_stage
