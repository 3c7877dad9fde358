"""Stand-in for gptqmodel.looper.stage_subset: a subset's plan (SubsetPlan, the fields the
stage reads) and run_subset_stage, called by keyword from the layer stage: with
execute_forward, a forward hook per subset module feeds its processor task (add_batch of
inp[0].data, out.data, batch_index, as GPTQProcessor's hook does) over every batch's
forward of the layer; then, as the host's coverage policy with fallback off, a module its
forwards never reached is pruned from the subset and its task dropped (recorded as a
dynamic exclusion); every other module is processed (processor.process). The layer's
outputs become the next inputs only where the plan needs them (not replay_after_process)."""
from dataclasses import dataclass, field, replace
from typing import Dict, List

import torch


@dataclass
class SubsetPlan:
    modules: Dict[str, object]
    subset_index: int
    subset_total: int
    execute_forward: bool
    replay_after_process: bool
    batch_count: int
    module_chunks: List[Dict[str, object]]
    ordered_module_names: List[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.ordered_module_names:
            self.ordered_module_names = list(self.modules.keys())

    @property
    def need_forward_outputs(self):
        return self.execute_forward and not self.replay_after_process

    @property
    def batching_enabled(self):
        return len(self.module_chunks) > 1

    def for_modules(self, modules):
        ordered = [name for name in self.ordered_module_names if name in modules]
        return replace(self, modules=modules, ordered_module_names=ordered, module_chunks=[modules])


@dataclass
class SubsetStageResult:
    processed_subset: Dict[str, object]
    layer_inputs: List[List[torch.Tensor]]
    plan: SubsetPlan


def _forward(module, layer_inputs, layer_input_kwargs, position_ids, attention_masks, subset, processor, plan):
    handles, outputs, batch = [], [], [0]
    for name in plan.ordered_module_names:
        task = processor.tasks[name]
        handles.append(subset[name].module.register_forward_hook(
            lambda m, inp, out, task=task: task.add_batch(inp[0].data, out.data, batch_index=batch[0])))
    try:
        for batch[0], layer_input in enumerate(layer_inputs):
            kwargs = {}
            if attention_masks[batch[0]] is not None:
                kwargs["attention_mask"] = attention_masks[batch[0]]
            if position_ids:
                kwargs["position_ids"] = position_ids[batch[0]]
            kwargs.update(layer_input_kwargs[batch[0]])
            out = module(*layer_input, **kwargs)
            outputs.append([out if isinstance(out, torch.Tensor) else out[0]])
    finally:
        for handle in handles:
            handle.remove()
    return outputs


def run_subset_stage(looper, *, plan, processor, module, layer_inputs, layer_input_kwargs, position_ids,
                     attention_masks, cur_layer_device, layer_index, fallback=False, **rest):
    subset = dict(plan.modules)
    outputs = None
    if plan.execute_forward:
        with torch.inference_mode():
            outputs = _forward(module, layer_inputs, layer_input_kwargs, position_ids, attention_masks, subset,
                               processor, plan)
    for name in list(plan.ordered_module_names):
        if processor.tasks[name].fwd_counter == 0 and not fallback:
            skipped = subset.pop(name)
            processor.tasks.pop(name)
            processor.qcfg.dynamic = dict(processor.qcfg.dynamic or {}, **{"-:%s" % skipped.full_name: {}})
    processed = {}
    for name in [n for n in plan.ordered_module_names if n in subset]:
        processor.process(module=subset[name])
        processed[name] = subset[name]
    if plan.need_forward_outputs and outputs is not None:
        layer_inputs = outputs
    return SubsetStageResult(processed_subset=processed, layer_inputs=layer_inputs, plan=plan)
