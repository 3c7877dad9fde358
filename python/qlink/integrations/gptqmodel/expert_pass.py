"""The routed forwards of one MoE block's experts over every calibration batch, run by
qlink's expert stage: while installed on the block's experts module, each forward sorts
the router's choices by expert once (defuser_moe's plan: one host read a forward), runs
every expert's linears on its contiguous slice of the sorted rows straight from the
weights (a grouped GEMM: no module call, hook or host read per expert) and hands the rows
the stage's Hessians need, the gathered inputs (gate/up) or the experts' intermediates
(down), sorted by expert with each expert's count, to its sink (expert_hessians
accumulates them); nothing of them is kept.

Invariant: an expert's rows are the eager loop's (defuser's run_routed_experts), the
block's output added in its order (grouped_experts.combine). On a GPU with PyTorch's grouped
GEMM (bf16, sm90+) every expert's linears run as one grouped product each: the output equals
the host's loop's within bf16 rounding. Elsewhere each expert's linears run in turn, the
loop's arithmetic: equal bit for bit."""
import contextlib
import threading

import torch
import torch.nn.functional as F

from .. import grouped_experts
from . import defuser_moe

RECORDS = ("inputs", "intermediates")


class ExpertPass:
    """One block's routed forwards (see the module's docstring). record: "inputs" (the rows
    gate and up read) or "intermediates" (the rows down reads); sink(rows, counts) takes each
    forward's recorded rows, sorted by expert, counts[e] of them expert e's. Thread-safe:
    forwards on several threads reach the sink and the counts under one lock."""

    def __init__(self, weights, record, sink):
        if record not in RECORDS:
            raise ValueError("record must be one of %s, got %r" % (RECORDS, record))
        self.weights, self.record, self.sink = weights, record, sink
        self.lock = threading.Lock()
        self.counts = []     # per forward: rows per expert
        self.grouped = None  # (gate_up, down) stacked, once a forward takes the grouped path

    @contextlib.contextmanager
    def installed_on(self, experts):
        """experts (the module the block calls as experts(hidden, top_k_index, top_k_weights))
        runs this pass's forward inside; its own forward back after."""
        experts.forward = self.forward
        try:
            yield self
        finally:
            del experts.forward

    def forward(self, hidden_states, top_k_index, top_k_weights):
        tokens, num = hidden_states.shape[0], self.weights.num_experts
        order, counts = defuser_moe._plan(top_k_index, tokens, 1, num)
        counts = [c[0] for c in counts]
        x = hidden_states[order % tokens]
        act = self.weights.one_act() if grouped_experts.fits(x) else None
        out, inter = self._grouped(x, counts, act) if act is not None else self._looped(x, counts)
        final = grouped_experts.combine(out, order, top_k_index, top_k_weights, hidden_states)
        with self.lock:
            self.counts.append(counts)
            self.sink(x if self.record == "inputs" else inter, counts)
        return final

    def _looped(self, x, counts):
        """(output, intermediates) of x's rows sorted by expert, one expert's linears at a time."""
        out, inter, at = torch.empty_like(x), [], 0
        for expert, rows in enumerate(counts):
            if rows == 0:
                continue
            part = slice(at, at + rows)
            at += rows
            gate, up = self.weights.gate_up(expert)
            h = self.weights.act(expert, F.linear(x[part], gate)) * F.linear(x[part], up)
            inter.append(h)
            out[part] = F.linear(h, self.weights.down(expert))
        return out, (torch.cat(inter) if inter else x[:0, :0])

    def _grouped(self, x, counts, act):
        """(output, intermediates) of x's rows sorted by expert, every expert's gate/up and
        down each one grouped GEMM (the weights stacked once a pass where split)."""
        if self.grouped is None:
            self.grouped = self.weights.stacked()
        return grouped_experts.linears(x, grouped_experts.offsets(counts, x.device), *self.grouped, act)

    def totals(self):
        """(rows, forwards reached) per expert over every forward so far."""
        with self.lock:
            rows = [sum(c[e] for c in self.counts) for e in range(self.weights.num_experts)]
            reached = [sum(1 for c in self.counts if c[e]) for e in range(self.weights.num_experts)]
        return rows, reached
