"""Where an MoE block's expert stage (expert_stage) keeps each expert's Hessian and solves
its modules, and how much of a device a round of them may take.

GPTQModel quantizes on every visible GPU of its device's kind and deals each module's
device round robin, one module at a time (an expert's gate and up apart), unless the
module's state carries a preferred_quant_device hint. The stage gives the block's experts
to those GPUs in contiguous ranges instead, the rows' GPU first, each range in proportion to
the solves its GPU's budget holds (one that holds none gets none), so every GPU needs about
as many rounds of the forwards as the others; and it writes each expert's GPU as that hint:
its Hessian is summed there (expert_hessians) and GPTQModel solves its modules there, so no
Hessian crosses GPUs. One GPU, or the CPU backend: every expert stays on the rows' device."""
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


def placed_experts(looper, plan, by_expert, home, ctx, room):
    """{expert: GPU} of the experts whose Hessians are summed, and whose modules are solved,
    on another GPU than the rows' `home` (see the module's docstring): GPTQModel's
    quantization devices (looper._quant_devices) that are GPUs of ctx and hold at least one
    expert's solve (room(device): how many a round may hold there, None for no bound),
    home first, each given a range of the experts in proportion to its room; an expert
    whose modules carry a hint of the host's (its balanced MoE strategy's) keeps that one;
    each expert's modules get its device as their hint. {} (no hint) for one GPU."""
    pool = [torch.device(d) for d in getattr(looper, "_quant_devices", None) or ()]
    pool = [d for d in pool if d.type == "cuda" and d.index is not None and d.index < ctx.device_count]
    pool = sorted(set(pool), key=lambda d: (d != home, pool.index(d)))
    if ctx.cpu_memory or len(pool) < 2:
        return {}
    rooms = {d: room(d) for d in pool}
    pool = [d for d in pool if d == home or rooms[d] is None or rooms[d] > 0]
    if len(pool) < 2:
        return {}
    experts = sorted(by_expert)
    sizes = shares(len(experts), [rooms[d] for d in pool])
    devices = [device for device, n in zip(pool, sizes) for _ in range(n)]
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


def shares(count, rooms):
    """`count` experts over devices in proportion to their rooms (None: no bound, then equal
    shares), largest remainders first, earlier devices first among equals; sums to count."""
    if any(r is None for r in rooms) or not sum(rooms):
        return shard_sizes(count, len(rooms))
    exact = [count * r / sum(rooms) for r in rooms]
    sizes = [int(x) for x in exact]
    for i in sorted(range(len(rooms)), key=lambda i: (-(exact[i] - sizes[i]), i))[:count - sum(sizes)]:
        sizes[i] += 1
    return sizes
