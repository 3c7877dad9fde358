"""An MoE block's expert Hessians from the expert stage's routed rows (expert_pass): the
experts with rows in consecutive chunks whose fp32 Hessians and row copies fit a memory
budget, a chunk's products in one native call on its device, chunks placed over the devices
in turn (any count).

Invariant: an expert's Hessian is one product over its rows of every forward, in forward
order, whatever the chunking or placement: chunked equals unchunked, bit for bit."""
import torch


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


def chunk_hessians(accumulator, routed, chunk, device=None):
    """{expert: fp32 X^T X of its rows over every forward} for a chunk of an ExpertPass's
    experts (each with rows), in one native call on qlink device `device` (None: the rows'
    own; a CUDA chunk's rows move to its GPU)."""
    items = []
    for expert in chunk:
        x = routed.rows(expert)
        if device is not None and x.device.type == "cuda":
            x = x.to(torch.device("cuda", device))
        items.append((x.contiguous(), None))
    return dict(zip(chunk, accumulator.add_many(items, device=device)))


def hessians(accumulator, routed, budget=None, devices=None):
    """({expert: its Hessian}, the count of chunks) of an ExpertPass, every chunk's (see
    chunk_hessians), chunks placed over `devices` (qlink device ids; None: the rows' own)."""
    rows, _ = routed.totals()
    sample = next((k for k in routed.kept if k.numel()), None)
    if sample is None:
        return {}, 0
    out = {}
    chunks = expert_chunks(rows, sample.shape[-1], budget, sample.element_size())
    for device, chunk in placement(chunks, devices or [None]):
        out.update(chunk_hessians(accumulator, routed, chunk, device))
    return out, len(chunks)
