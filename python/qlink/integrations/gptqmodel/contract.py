"""The GPTQModel rules qlink's seams restate, each pinned to the host function it copies
(qlink.integrations.contracts): what a batch, a merge and a solve leave on a GPTQ task,
what GPTQModel's clone does to each replica, what a module's finalize reads of the
model's walks, how a processor hands over a quantized weight, and a hooked linear whose
product no one reads."""
import torch

from ..contracts import Contract

CONTRACT = Contract("GPTQModel")
_GPTQ = "gptqmodel/quantization/gptq.py"


@CONTRACT.copies(_GPTQ, "GPTQ.add_batch", "38de3a24afaebb90")
def count_batch(gptq, device, rows, fwd=1):
    """A batch's counts on the task, in GPTQModel's order of fields (negative rows and fwd
    take one back)."""
    gptq._device_sample_counts[device] = gptq._device_sample_counts.get(device, 0) + rows
    gptq.nsamples += rows
    gptq._hessian_dirty = True
    gptq.fwd_counter += fwd


@CONTRACT.copies(_GPTQ, "GPTQ.materialize_global_hessian", "1d5edb85a1c2229a")
def merged(gptq, hessian, total):
    """The merged Hessian of `total` samples made the task's, its partials dropped."""
    gptq.H, gptq.nsamples, gptq._hessian_dirty = hessian, total, False
    gptq._final_hessian_device_hint = hessian.device
    gptq._device_hessian_partials.clear()
    gptq._device_sample_counts.clear()


@CONTRACT.copies(_GPTQ, "GPTQ.quantize", "5214a139a35b65f1")
def solved(gptq, result):
    """A solve's result made the task's: its Hessian dropped, as GPTQModel's solve drops it."""
    del gptq.H
    return result


@CONTRACT.copies("gptqmodel/utils/looper_helpers.py", "clone_module_for_devices", "75a8e6dcc7ab8dd6")
def replica_ready(replica, device, clear):
    """A replica as GPTQModel's clone leaves it: eval mode, its state cleared, its device
    hinted."""
    replica.eval()
    clear(replica)
    replica._gptqmodule_device_hint = device


def along(root, path):
    """The module at dotted `path` under `root` through its children, or None."""
    node = root
    for part in path.split("."):
        node = node._modules.get(part) if node is not None else None
    return node


@CONTRACT.copies("gptqmodel/looper/gptq_processor.py", "GPTQProcessor.submodule_finalize", "f603d0e8379ff955")
@CONTRACT.copies("gptqmodel/utils/model.py", "find_modules", "c9502da81e73c3e3")
def finalized_entry(root, path, types):
    """What submodule_finalize reads of find_modules(model.model[, types]): the entry of
    the module at `path` it finalizes ({path: module} where that module is of `types`, else
    none). None where the walk stops above it (at the root or an ancestor of `types`) or
    the path leads nowhere: the host's walk decides there."""
    node = root
    for part in path.split("."):
        if node is None or isinstance(node, types):
            return None
        node = node._modules.get(part)
    if node is None:
        return None
    return {path: node} if isinstance(node, types) else {}


@CONTRACT.copies("gptqmodel/utils/offload.py", "get_module_fullname", "09ffe106ba5c7d05")
@CONTRACT.copies("gptqmodel/utils/structure.py", "_get_qualified_name", "76e58c58e1029f29")
def leads_to(root, path, module):
    """Whether `path` names `module` under `root` as get_module_fullname and
    _get_qualified_name would: the dotted path of its children to a module held at one place."""
    return along(root, path) is module


@CONTRACT.copies("gptqmodel/looper/gptq_processor.py", "GPTQProcessor.process", "1b079f9786cc69ef")
def replaces_weights(processor, gptq_processor):
    """Whether `processor` hands each quantized weight over as a new tensor
    (GPTQProcessor.process ends module.weight.data = wq), never writing a weight in place."""
    return type(processor) is gptq_processor


@CONTRACT.copies("gptqmodel/nn_modules/hooked_linear.py", "HookedLinear.forward", "d72dd006ed178123")
@CONTRACT.copies("gptqmodel/looper/gptq_processor.py", "GPTQProcessor.pre_process_fwd_hook", "377025596dd78bff")
@CONTRACT.copies("gptqmodel/looper/module_looper.py", "ModuleLooper._masked_hook_wrapper", "d5bac28873e72ba0")
@CONTRACT.copies(_GPTQ, "GPTQ.add_batch", "38de3a24afaebb90")
def unproduced_forward(module, input, helpers):
    """HookedLinear.forward of a hooked module whose output no one reads but its hook: the
    subset's last (forward_hook_last), whose hook StopForward follows, or one whose output
    only flows to what that stop drops. GPTQ's hook (masked, or split by sample) hands the
    output to add_batch, which reads the input alone. The same steps, the product an
    uncomputed tensor of its shape and dtype. helpers: hooked_linear's names by name."""
    original_device = input.device
    helpers["_materialize_if_meta_weight"](module, input_device=original_device)
    target_device = module.weight.data.device
    name = getattr(module, "module_name", None) or getattr(module, "full_name", None) or getattr(
        module, "name", None) or "unknown"
    helpers["emit_device_telemetry"]("hooked_linear_forward", module=name, weight_device=target_device,
                                     input_device=original_device)
    if original_device != target_device:
        input = input.to(device=target_device)
    input = helpers["apply_online_hadamard"](
        input, online_full_had=getattr(module, "online_full_had", False),
        online_partial_had=getattr(module, "online_partial_had", False), had_K=getattr(module, "had_K", None),
        K=getattr(module, "K", 1), had_dim=getattr(module, "had_dim", -1))
    output = input.new_empty(input.shape[:-1] + (module.out_features,),
                             dtype=torch.promote_types(input.dtype, module.weight.dtype))
    module.forward_hook(module, (input,), output)
    if module.forward_hook_last:
        raise helpers["STOP_FORWARD_EXCEPTION"].with_traceback(None)
    return helpers["_restore_output_device"](output, original_device)
