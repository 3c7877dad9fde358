"""Stand-in for gptqmodel.looper.stage_layer: imports run_subset_stage by name, as the host's
layer stage does, and runs a layer's subset plans one after another with it."""
from .stage_subset import run_subset_stage


def run_layer_stage(looper, *, plans, processor, module, cache, layer_index, fallback=False):
    """Each plan's subset stage over `cache` (an InputCache); returns the stage results."""
    results, layer_inputs = [], cache.layer_inputs
    for plan in plans:
        result = run_subset_stage(looper, plan=plan, processor=processor, module=module, layer_inputs=layer_inputs,
                                  layer_input_kwargs=cache.layer_input_kwargs, position_ids=cache.position_ids,
                                  attention_masks=cache.attention_masks, cur_layer_device=_device(module),
                                  layer_index=layer_index, fallback=fallback)
        layer_inputs = result.layer_inputs
        results.append(result)
    return results


def _device(module):
    return next(module.parameters()).device
