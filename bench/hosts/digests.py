"""Digests of tensors on their device for comparing repeated runs (gptqmodel_run.py,
compare_runs.py): checksums enqueued on the device without a host wait, read to the host
after the timed run."""
import hashlib
import re

_POSITIONS = {}  # (length, device) -> (positions, their multipliers): made once a chunk length


def device_checksum(t, chunk=1 << 23):
    """Three int64 sums of a tensor's words on its device (plain, position-weighted, xor with
    the position), enqueued without a host wait: a digest of the exact bits that costs the
    timed run no device-to-host copy; chunked, so it adds little to peak memory, and with few
    operations a chunk (the positions are made once a length: the solves' worker threads run
    it under the GIL the timed loop needs)."""
    import torch
    words = t.detach().contiguous().view(-1)
    words = words.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[words.element_size()])
    sums = None
    for at in range(0, words.numel(), chunk):
        w = words[at:at + chunk].to(torch.int64)
        key = (w.numel(), w.device)
        if key not in _POSITIONS:
            position = torch.arange(w.numel(), dtype=torch.int64, device=w.device)
            _POSITIONS[key] = (position, position * 2654435761 + 97)
        position, multiplier = _POSITIONS[key]
        if at:
            position, multiplier = position + at, multiplier + at * 2654435761
        part = torch.stack([w.sum(), (w * multiplier).sum(), (w ^ position).sum()])
        sums = part if sums is None else sums + part
    return sums if sums is not None else torch.zeros(3, dtype=torch.int64, device=words.device)


def hessian_traits(h, group, order=None):
    """What of the square matrix h (a merged Hessian) a solve's order and damp read, as device
    tensors without a host wait: "diag_ties", how many entries of its diagonal, taken in
    consecutive groups of `group` columns, equal another of their group (the ties a within-
    group descending sort, GPTQModel's group-aware order, must break in some order);
    "mean_off", 1 where PyTorch's fp32 mean of the diagonal taken in `order` (GPTQModel
    permutes the Hessian before its damp takes the mean: gar_order) is not the exact mean
    rounded to fp32 (what a float64 sum gives, the engine's); "asymmetric", how many entries
    differ from their transpose's (where a factorization reading the other triangle would
    read other bits)."""
    import torch
    diag = torch.diagonal(h).clone()
    whole = diag.numel() // group * group
    ordered = diag[:whole].view(-1, group).sort(dim=1).values
    taken = diag if order is None else diag[order]
    return {"diag_ties": (ordered[:, 1:] == ordered[:, :-1]).sum(),
            "mean_off": (torch.mean(taken) != diag.double().mean().float()).to(torch.int64),
            "asymmetric": (h != h.t()).sum()}


def gar_order(h, group):
    """The column order GPTQModel's quantize takes for the Hessian h with act_group_aware
    (its gar.py: each group's columns by their diagonal, largest first, then the groups by
    their largest), made by GPTQModel's own functions."""
    from gptqmodel.quantization.gar import (compose_final_perm, compute_global_perm, compute_local_perms,
                                            extend_perm_with_tail)
    import torch
    diag = torch.diag(h)  # a copy, as GPTQModel's quantize takes it
    local, values = compute_local_perms(diag, group, return_values=True)
    order = compose_final_perm(local, compute_global_perm(diag, group, precomputed_values=values), group)
    return extend_perm_with_tail(order, diag.numel())


def record_calls(model, pattern, into):
    """Each call of a module of `model` named to match `pattern`: device_checksum of every
    tensor in its arguments (keyword ones by name, tuples flattened) and of each of its
    parameters, appended to into[name] as [(label, sums)]. Wraps the matching modules'
    classes' forward; a module is named on its first call (GPTQModel may fill them late)."""
    import torch
    names = {}

    def name_of(module):
        if id(module) not in names:
            names.update({id(m): n for n, m in model.named_modules()})
        return names.get(id(module))

    def tensors(label, value):
        if torch.is_tensor(value):
            yield label, value
        elif isinstance(value, (tuple, list)):
            for i, part in enumerate(value):
                yield from tensors("%s[%d]" % (label, i), part)

    def wrap(cls):
        forward = cls.forward

        def recording(self, *args, **kwargs):
            name = name_of(self)
            if name is not None and re.search(pattern, name):
                sums = [(label, device_checksum(t)) for i, a in enumerate(args) for label, t in tensors("arg%d" % i, a)]
                sums += [(label, device_checksum(t)) for k in sorted(kwargs) for label, t in tensors(k, kwargs[k])]
                sums += [(n, device_checksum(p)) for n, p in self.named_parameters()]
                into.setdefault(name, []).append(sums)
            return forward(self, *args, **kwargs)
        cls.forward = recording
    for cls in {type(m) for n, m in model.named_modules() if re.search(pattern, n)}:
        wrap(cls)


def short_digest(sums):
    """device_checksum's sums read to the host as 16 hex digits."""
    return hashlib.sha256(sums.cpu().numpy().tobytes()).hexdigest()[:16]


def call_digests(calls):
    """record_calls' records as {name: [{label: digest}]}, read to the host."""
    return {name: [{label: short_digest(sums) for label, sums in call} for call in records]
            for name, records in calls.items()}
