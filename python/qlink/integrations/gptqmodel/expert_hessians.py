"""An MoE block's expert Hessians, accumulated as the expert stage's routed forwards
(expert_pass) go: each forward's rows of every expert of a chunk added to that expert's
partial in one native call, in place (the partials are the sink's alone), nothing of the
rows kept. The experts are taken in consecutive chunks whose solve fits a memory budget:
each Hessian twice over (the engine keeps its inverse beside it until the call returns) and
3 bytes a weight of the expert's layers (the solve's codes and dequantized weight); the
forwards run once a chunk. The expert stage runs its chunks on the rows' device, each solved
before the next.

Invariant: an expert's Hessian is the sum of its rows' products forward by forward, in
forward order, whatever the chunking: chunked equals unchunked, bit for bit."""
import torch


def expert_chunks(experts, columns, budget, weights=0):
    """Consecutive chunks of range(experts) whose solves fit `budget` bytes (None: one chunk):
    each expert's fp32 Hessian (columns^2) twice over, and 3 bytes a weight of its `weights`
    (the elements of the expert's layers the chunk solves)."""
    need = 2 * 4 * columns * columns + 3 * weights
    if budget is None:
        return [list(range(experts))]
    if need > budget:
        raise ValueError("expert_budget %d bytes does not hold one expert's solve (%d bytes)"
                         % (budget, need))
    per = budget // need
    return [list(range(start, min(start + per, experts))) for start in range(0, experts, per)]


class ChunkHessians:
    """An ExpertPass's sink: each forward's rows of the chunk's experts added to their partials,
    in place, in one native call on the rows' device. partials: {expert: fp32 X^T X so far},
    experts without rows absent."""

    def __init__(self, accumulator, chunk):
        self.accumulator, self.chunk = accumulator, chunk
        self.partials = {}

    def __call__(self, rows, counts):
        starts, at = {}, 0
        for expert, n in enumerate(counts):
            starts[expert], at = at, at + n
        items = []
        for expert in self.chunk:
            if counts[expert]:
                x = rows[starts[expert]:starts[expert] + counts[expert]]
                if expert not in self.partials:
                    self.partials[expert] = torch.zeros(x.shape[-1], x.shape[-1], dtype=torch.float32, device=x.device)
                items.append((x, self.partials[expert]))
        self.accumulator.add_into(items)
