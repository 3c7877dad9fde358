"""Where an MoE block's expert stage (expert_stage) keeps each expert's Hessian and solves
its modules, and how much of a device a round of them may take.

GPTQModel quantizes on every visible GPU of its device's kind and deals each module's
device round robin, one module at a time (an expert's gate and up apart), unless the
module's state carries a preferred_quant_device hint. The stage gives the block's experts
to those GPUs in contiguous, equal ranges instead, the rows' GPU first, and writes each
expert's GPU as that hint: its Hessian is summed there (expert_hessians) and GPTQModel
solves its modules there, so no Hessian crosses GPUs. One GPU, or the CPU backend: every
expert stays on the rows' device."""
import torch

from ...quant.placement import shard_sizes


def budget(installation, device):
    """Bytes a round's solves may take on `device` (expert_hessians.expert_chunks counts
    them): install(expert_budget=...), else half the GPU's free memory, else (CPU memory)
    no bound."""
    if installation.expert_budget is not None:
        return installation.expert_budget
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    return None


def placed_experts(looper, plan, by_expert, home, ctx):
    """{expert: GPU} of the experts whose Hessians are summed, and whose modules are solved,
    on another GPU than the rows' `home` (see the module's docstring): GPTQModel's
    quantization devices (looper._quant_devices) that are GPUs of ctx, in ranges, home
    first; an expert whose modules carry a hint of the host's (its balanced MoE strategy's)
    keeps that one; each expert's modules get its device as their hint. {} (no hint) for one GPU."""
    pool = [torch.device(d) for d in getattr(looper, "_quant_devices", None) or ()]
    pool = [d for d in pool if d.type == "cuda" and d.index is not None and d.index < ctx.device_count]
    if ctx.cpu_memory or len(set(pool)) < 2:
        return {}
    pool = sorted(set(pool), key=lambda d: (d != home, pool.index(d)))
    experts = sorted(by_expert)
    ranges = shard_sizes(len(experts), len(pool))
    devices = [device for device, n in zip(pool, ranges) for _ in range(n)]
    placed = {}
    for expert, device in zip(experts, devices):
        hints = [plan.modules[name].state.get("preferred_quant_device") for name in by_expert[expert]]
        hinted = [torch.device(h) for h in hints if h is not None and torch.device(h) in pool]
        device = hinted[0] if hinted else device
        for name in by_expert[expert]:
            plan.modules[name].state["preferred_quant_device"] = device
        if device != home:
            placed[expert] = device
    return placed
