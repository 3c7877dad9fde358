"""GPTQModel's calibration cache (the InputCache its input capture returns: every batch's
layer inputs, kwargs, position ids and attention masks) moved once to the GPU the layers
run on.

GPTQModel runs the capture on the CPU and keeps the cache there, so every forward of every
layer (four subset forwards and a replay per decoder layer, a batch at a time) moves the
batch's tensors to the GPU again: layer 0's hidden states five times, the position ids and
rotary tables of every batch for every forward of every layer, each through a pinned twin
the CPU fills (GPTQModel captures under inference_mode, and an inference tensor has no
version counter that would let a twin be kept). With the cache on the GPU those moves find
their tensors already there (GPTQModel's move_to returns them as they are). The cache
holds the same bytes, in tensors made under the same inference mode; nothing else changes.

The cache stays where it is when the forwards may run on several GPUs (GPTQModel spreads
batches over every visible one), when it would take more than half of the GPU's free
memory, and on the host-memory backends.

Its one-sample batches are then grouped into forwards of up to GROUP_ROWS tokens where
nothing but GPTQ's hooks sees them (grouping_refusal, grouping_plan, grouped)."""
import dataclasses

import torch

from ...moves import map_nested, nested_tensors
from ...streams import resolved_device

FREE_SHARE = 0.5  # of the GPU's free memory the cache may take


def _fields(cache):
    return {f.name: getattr(cache, f.name) for f in dataclasses.fields(cache)}


def placement(ctx, quantize_device, cache):
    """(the GPU the cache should move to, None), or (None, why it stays)."""
    if ctx.cpu_memory:
        return None, "the %s backend computes in CPU memory" % ctx.backend
    if not dataclasses.is_dataclass(cache) or isinstance(cache, type):
        return None, "a cache of type %s, not GPTQModel's InputCache" % type(cache).__name__
    if torch.cuda.device_count() != 1:
        return None, "%d GPUs visible: GPTQModel may spread the forwards over them" % torch.cuda.device_count()
    try:
        device = torch.device(str(getattr(quantize_device, "value", quantize_device)))
    except (RuntimeError, TypeError):
        return None, "quantize_config.device %r is not a torch device" % (quantize_device,)
    if device.type != "cuda":
        return None, "the layers run on %s" % device
    device = resolved_device(device)
    nbytes = sum(t.numel() * t.element_size() for t in nested_tensors(_fields(cache)) if t.device.type == "cpu")
    if nbytes == 0:
        return None, "nothing of the cache is in CPU memory"
    free = torch.cuda.mem_get_info(device)[0]
    if nbytes > FREE_SHARE * free:
        return None, "the cache (%.2f GiB) would take more than %d %% of %s's free %.2f GiB" % (
            nbytes / 2 ** 30, 100 * FREE_SHARE, device, free / 2 ** 30)
    return device, None


def on_device(ctx, cache, device):
    """A new cache of the same type with every tensor on `device` (one the cache holds
    twice, moved once, as move_nested_to_device moves it), made under inference_mode as the
    host's are. Moved once, before the first layer, by ctx's moves: a one-time move this
    large streams through the staging's few page-locked slots, enqueued on the device's
    current stream, where the forwards read it (about a quarter of the time of PyTorch's
    pageable copies: bench/RESULTS.md; pinned twins would page-lock the whole cache anew)."""
    def move(tensors):
        with torch.inference_mode():
            return ctx.move_tensors(tensors, device)
    return dataclasses.replace(cache, **map_nested(_fields(cache), move))


# -- grouped batches -----------------------------------------------------------------------
#
# GPTQModel replays the cache a batch at a time: four subset forwards and a replay per decoder
# layer, each through its per-batch Python (moves, masks, hooks, progress): for a 2048-token
# sample, more host time than its forward keeps a GPU busy (bench/RESULTS.md). Consecutive
# batches grouped into one forward (as GPTQModel's own batch_size would have made them) leave
# every token's computation as it was: the hooks see the same rows, GPTQ counts them as
# rows, and a kwarg every batch holds alike (the rotary tables, position ids of unpadded
# samples) stays one tensor that broadcasts over the group, as the model itself passes it
# for a batch of unpadded samples.

GROUP_ROWS = 16384  # tokens per grouped forward: eight of GPTQModel's 2048-token samples
SAME, CAT = "same", "cat"


def grouping_refusal(looper, layers, host, routed=False):
    """Why the looper's batches must stay as GPTQModel made them, or None. routed: whether
    defuser's routed experts' loop is qlink's (it tells add_batch each sample's rows)."""
    model = looper.gptq_model
    if not getattr(looper, "support_batch_quantize", False):
        return "%s does not support batched calibration" % type(model).__name__
    others = sorted({type(p).__name__ for p in looper.processors if type(p) is not host.GPTQProcessor})
    if others:
        return "processors other than GPTQ's see the batches (%s)" % ", ".join(others)
    for name in ("prepare_layer_replay_kwargs", "update_layer_replay_kwargs_from_output"):
        if getattr(type(model), name, None) is not getattr(host.BaseQModel, name):
            return "%s has its own %s (per-batch replay state)" % (type(model).__name__, name)
    shares_kv = any(getattr(layer, "reuse_kv", False) for layer in layers or ())
    if shares_kv or getattr(model, "write_shared_kv_cache", False):
        return "layers share a KV cache between batches"
    if getattr(looper, "moe_routing_override", None) or getattr(looper, "moe_routing_bypass", False):
        return "MoE routing options"
    # An expert's hook sees its routed rows of every grouped sample as one 2-D input, where
    # GPTQModel adds each sample's rows as a rank-k update of its own: only qlink's loop over
    # defuser's split experts tells add_batch where each sample's rows are.
    blocks = [m for layer in layers or () for m in layer.modules() if hasattr(m, "experts")]
    if getattr(type(model), "dynamic_expert_index", None) is not None or blocks:
        if not routed:
            return "MoE experts (each sees its routed rows of all the grouped samples at once)"
        unsplit = sorted({type(m).__name__ for m in blocks if not _split_by_defuser(m)})
        if unsplit or not blocks:
            return "MoE experts not split by defuser (%s): their loop does not tell each sample's rows" % (
                ", ".join(unsplit) or "none found")
    return None


def _split_by_defuser(block):
    """Whether the MoE block's experts run defuser's routed experts' loop: the block is
    defuser's, or its experts module is."""
    return any(type(m).__module__.split(".")[0] == "defuser" for m in (block, block.experts))


def _same_tensor(a, b):
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b))


def _leaf_rule(values, rows, what, batch_dim_only=False):
    """SAME when every batch holds this leaf alike, CAT when each holds its rows of it along
    dim 0; else the reason the batches cannot be grouped."""
    first = values[0]
    if all(v is None for v in values):
        return SAME, None
    if all(isinstance(v, torch.Tensor) for v in values):
        if not batch_dim_only and all(_same_tensor(first, v) for v in values[1:]):
            return SAME, None
        if all(v.dim() >= 1 and v.shape[0] == r and v.shape[1:] == first.shape[1:] and v.dtype == first.dtype
               and v.device == first.device for v, r in zip(values, rows)):
            return CAT, None
        return None, "%s differs between batches along no batch dimension" % what
    if batch_dim_only or any(isinstance(v, torch.Tensor) for v in values):
        return None, "%s is not a tensor in every batch" % what
    try:
        alike = all(bool(v == first) for v in values[1:])
    except Exception:  # noqa: BLE001 (a value without a plain equality cannot be shared)
        alike = False
    return (SAME, None) if alike else (None, "%s differs between batches" % what)


def _rules(values, rows, what, path, out, batch_dim_only=False):
    """Fills out[path] with a leaf rule for every leaf of the batches' `values` walked in
    lockstep; returns the first reason a leaf cannot be grouped, or None."""
    first = values[0]
    if isinstance(first, dict) and all(isinstance(v, dict) and list(v) == list(first) for v in values):
        children = [(k, [v[k] for v in values], "%s[%r]" % (what, k)) for k in first]
    elif isinstance(first, (list, tuple)) and all(type(v) is type(first) and len(v) == len(first) for v in values):
        children = [(i, [v[i] for v in values], "%s[%d]" % (what, i)) for i in range(len(first))]
    elif isinstance(first, (dict, list, tuple)):
        return "%s has a different structure in different batches" % what
    else:
        out[path], reason = _leaf_rule(values, rows, what, batch_dim_only)
        return reason
    for key, child, name in children:
        reason = _rules(child, rows, name, path + (key,), out, batch_dim_only)
        if reason:
            return reason
    return None


def _build(values, path, rules):
    rule = rules.get(path)
    if rule == SAME:
        return values[0]
    if rule == CAT:
        return torch.cat(values)
    first = values[0]
    if isinstance(first, dict):
        return type(first)((k, _build([v[k] for v in values], path + (k,), rules)) for k in first)
    parts = [_build([v[i] for v in values], path + (i,), rules) for i in range(len(first))]
    return type(first)(*parts) if hasattr(first, "_fields") else type(first)(parts)


def grouping_plan(cache, group_rows=None):
    """(plan, None) for grouped(), or (None, why the cache's batches cannot be grouped).
    Compares the batches' kwargs by value: made once, before the first layer."""
    group_rows = GROUP_ROWS if group_rows is None else group_rows
    if not dataclasses.is_dataclass(cache) or isinstance(cache, type):
        return None, "a cache of type %s, not GPTQModel's InputCache" % type(cache).__name__
    inputs, n = cache.layer_inputs, len(cache.layer_inputs)
    if n < 2:
        return None, "%d batch" % n
    if any(not batch or not isinstance(batch[0], torch.Tensor) or batch[0].dim() < 2 for batch in inputs):
        return None, "a batch whose first input is not a (batch, ...) tensor"
    rows = [batch[0].shape[0] for batch in inputs]
    if any(r != 1 for r in rows):  # add_batch then adds a grouped batch's rows sample by sample
        return None, "batches of more than one sample (batch_size %d)" % max(rows)
    tokens = [batch[0].numel() // max(batch[0].shape[-1], 1) for batch in inputs]
    groups, current, held = [], [], 0
    for i, t in enumerate(tokens):
        if current and held + t > group_rows:
            groups.append(current)
            current, held = [], 0
        current.append(i)
        held += t
    groups.append(current)
    if len(groups) == n:
        return None, "no two consecutive batches fit in %d tokens" % group_rows
    if len(cache.layer_input_kwargs) != n or len(cache.attention_masks) != n or len(cache.position_ids) not in (0, n):
        return None, "per-batch lists of different lengths"
    rules = {}
    for field, batch_dim_only in (("layer_inputs", True), ("attention_masks", True), ("position_ids", False),
                                  ("layer_input_kwargs", False)):
        values = getattr(cache, field)
        if values:
            reason = _rules(values, rows, field, (field,), rules, batch_dim_only)
            if reason:
                return None, reason
    return {"groups": groups, "rules": rules}, None


def grouped(cache, plan):
    """A new cache of the same type holding plan's groups of consecutive batches, each one
    batch (see the section's comment); `cache` is not changed."""
    fields = {}
    with torch.inference_mode():  # the host's cache is made of inference tensors
        for field in ("layer_inputs", "attention_masks", "position_ids", "layer_input_kwargs"):
            values = getattr(cache, field)
            fields[field] = [_build([values[i] for i in g], (field,), plan["rules"]) for g in plan["groups"]] \
                if values else values
    return dataclasses.replace(cache, **fields)
