"""An MoE block's expert Hessians, accumulated as the expert stage's routed forwards
(expert_pass) go: each forward's rows of every expert of a round added to that expert's
partial, one native call a device, in place (the partials are the sink's alone), nothing of
the rows kept. An expert's partial lives on its device: the rows' own, or another GPU the
stage placed it on (its rows copied there once a forward, each device's in one copy). The
experts of each device are taken in consecutive chunks whose solve fits that device's
memory budget: each Hessian twice over (the engine keeps its inverse beside it until the
call returns) and 3 bytes a weight of the expert's layers (the solve's codes and
dequantized weight); a round is every device's next chunk, and the forwards run once a
round, each round solved before the next.

Invariant: an expert's Hessian is the sum of its rows' products forward by forward, in
forward order, whatever the rounds or the device: chunked and placed equal one round on
the rows' device, bit for bit (on GPUs of one kind)."""
import torch


def solve_bytes(columns, weights=0):
    """Bytes one expert's solve takes: its fp32 Hessian (columns^2) twice over, and 3 bytes a
    weight of its `weights` (the elements of the expert's layers the solve makes)."""
    return 2 * 4 * columns * columns + 3 * weights


def expert_chunks(experts, columns, budget, weights=0):
    """Consecutive chunks of range(experts) whose solves (solve_bytes) fit `budget` bytes
    (None: one chunk)."""
    need = solve_bytes(columns, weights)
    if budget is None:
        return [list(range(experts))]
    if need > budget:
        raise ValueError("expert_budget %d bytes does not hold one expert's solve (%d bytes)"
                         % (budget, need))
    per = budget // need
    return [list(range(start, min(start + per, experts))) for start in range(0, experts, per)]


def expert_rounds(devices, columns, budgets, weights=0):
    """The rounds of the forwards, each a sorted list of experts: devices[e] is expert e's
    device, budgets[device] its budget (None: no bound); round r holds each device's r-th
    chunk (expert_chunks over that device's experts in order). One device: its chunks."""
    mine = {}
    for expert, device in enumerate(devices):
        mine.setdefault(device, []).append(expert)
    chunked = [[[experts[i] for i in chunk] for chunk in expert_chunks(len(experts), columns, budgets[device], weights)]
               for device, experts in mine.items()]
    return [sorted(e for chunks in chunked if r < len(chunks) for e in chunks[r])
            for r in range(max(len(chunks) for chunks in chunked))]


def _gathered(rows, spans):
    """rows' (start, count) spans, in order, as one tensor: a view where they are adjacent."""
    runs = []
    for start, count in spans:
        if runs and runs[-1][1] == start:
            runs[-1][1] = start + count
        else:
            runs.append([start, start + count])
    parts = [rows[start:end] for start, end in runs]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class ChunkHessians:
    """An ExpertPass's sink: each forward's rows of the round's experts added to their
    partials, in place, one native call a device. placed: {expert: device} of the experts
    whose partials live off the rows' device (their rows copied there, one copy a device).
    partials: {expert: fp32 X^T X so far}, experts without rows absent."""

    def __init__(self, accumulator, chunk, placed=None):
        self.accumulator, self.chunk, self.placed = accumulator, chunk, placed or {}
        self.partials = {}

    def __call__(self, rows, counts):
        starts, at = [], 0
        for n in counts:
            starts.append(at)
            at += n
        here, away = [], {}
        for expert in self.chunk:
            if counts[expert]:
                device = self.placed.get(expert)
                (here if device is None else away.setdefault(device, [])).append(expert)
        self._add([(e, rows[starts[e]:starts[e] + counts[e]]) for e in here])
        for device, experts in away.items():
            moved = _gathered(rows, [(starts[e], counts[e]) for e in experts]).to(device, non_blocking=True)
            self._add(zip(experts, torch.split(moved, [counts[e] for e in experts])))

    def _add(self, pairs):
        items = []
        for expert, x in pairs:
            if expert not in self.partials:
                self.partials[expert] = torch.zeros(x.shape[-1], x.shape[-1], dtype=torch.float32, device=x.device)
            items.append((x, self.partials[expert]))
        self.accumulator.add_into(items)
