"""The native GPTQ engine on LLaMA-7B shapes, against GPTQModel's own GPTQ.quantize and
the Python engine it replaces, on one GPU, same weights and Hessians, same run:
gate_proj (11008 x 4096) and down_proj (4096 x 11008), 4-bit g128 sym, columns in their
order, in act-order (desc_act) and in GPTQModel's group-aware order (act_group_aware, its
default without desc_act); codes equal to GPTQModel's and the loss; the Hessian of 128 x 2048 tokens at
d = 4096, on one GPU and at each world; peak device memory per solve; the 7 linears of a
decoder layer at each world.
    python3 bench/gptq_bench.py --library DIST/libqlink.so [--gptqmodel DIR] [--python-engine FILE]
        [--markdown OUT.md]
"""
import argparse
import importlib.util
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import qlink  # noqa: E402
from timing import median_s  # noqa: E402
from qlink.quant import GPTQLayer, Placement, gptq_quantize, parallel_gptq, parallel_hessian  # noqa: E402

HIDDEN, INTERMEDIATE, TOKENS = 4096, 11008, 128 * 2048


class PeakMemory:
    """Device memory in use at its highest while inside, by polling cudaMemGetInfo (qlink
    allocates outside PyTorch's caching allocator)."""

    def __enter__(self):
        torch.cuda.synchronize()
        self.base = torch.cuda.mem_get_info()[0]
        self.low, self.stop = self.base, False
        self.thread = threading.Thread(target=self._poll)
        self.thread.start()
        return self

    def _poll(self):
        while not self.stop:
            self.low = min(self.low, torch.cuda.mem_get_info()[0])
            time.sleep(0.0002)

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.stop = True
        self.thread.join()
        self.peak = self.base - self.low


def hessian_of(d, gen, tokens=8192, device="cuda"):
    """A realistic-looking (correlated, positive definite) Hessian of dimension d."""
    x = torch.randn(tokens, d // 8, device=device, generator=gen) @ torch.randn(d // 8, d, device=device, generator=gen)
    x += 0.3 * torch.randn(tokens, d, device=device, generator=gen)
    return (x.t() @ x) * (2.0 / tokens)


def gptqmodel_solver(paths):
    """GPTQModel's GPTQ.quantize as a function (w, h, desc_act, act_group_aware, nsamples) ->
    (Q, scale, zero, g_idx, loss, damp), or the reason it cannot be imported. paths: where its package (and the
    stand-ins for what it imports) live, os.pathsep-separated."""
    sys.path[:0] = paths.split(os.pathsep)
    try:
        from gptqmodel.quantization.config import QuantizeConfig
        from gptqmodel.quantization.gptq import GPTQ
    except Exception as e:  # noqa: BLE001  (any import failure is reported, not fatal)
        return None, "%s: %s" % (type(e).__name__, e)

    def solve(w, h, desc_act, act_group_aware, nsamples):
        layer = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="cuda", dtype=w.dtype)
        layer.weight.data.copy_(w)
        cfg = QuantizeConfig(bits=4, group_size=128, sym=True, desc_act=desc_act, act_group_aware=act_group_aware,
                             damp_percent=0.01, damp_auto_increment=0.01)
        g = GPTQ(layer, cfg)
        g.quantizer.configure(perchannel=True)
        g.H, g.nsamples, g._hessian_dirty = h.clone(), nsamples, False
        q, scale, zero, g_idx, _, loss, damp, _ = g.quantize(blocksize=128)
        return q, scale, zero, g_idx, loss, damp
    return solve, None


def codes_of(q, scale, zero, g_idx):
    """GPTQModel's integer levels (as its packers compute them) from Q, scale, zero, g_idx."""
    g = g_idx.long()
    return torch.round(q.float() / scale[:, g] + zero[:, g]).to(torch.uint8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--gptqmodel", help="folders holding the gptqmodel package and stand-ins for what it imports")
    ap.add_argument("--log-level", default="warn", help="qlink's (debug: the engine's timings per inverse and share)")
    ap.add_argument("--python-engine", help="the previous Python engine's gptq.py (gptq_quantize(w, h))")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--markdown")
    a = ap.parse_args()
    ctx = qlink.configure({"backend": "cuda", "log_level": a.log_level}, library=a.library)
    gen = torch.Generator(device="cuda").manual_seed(0)
    lines = []
    say = lambda s="": (print(s, flush=True), lines.append(s))  # noqa: E731

    say("## GPTQ solve of one layer, 4-bit g128 sym, one GPU (%s)" % torch.cuda.get_device_name())
    say()
    say("| layer | column order | qlink ms | GPTQModel ms | speedup | Python engine ms | codes = GPTQModel | "
        "loss qlink / GPTQModel | peak device memory (qlink) |")
    say("|---|---|---|---|---|---|---|---|---|")
    solve_gm, why = gptqmodel_solver(a.gptqmodel) if a.gptqmodel else (None, "not given")
    if solve_gm is None:
        print("GPTQModel unavailable: %s" % why, flush=True)
    python_engine = None
    if a.python_engine:
        spec = importlib.util.spec_from_file_location("old_gptq", a.python_engine)
        python_engine = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(python_engine)
    h_gate, h_down = hessian_of(HIDDEN, gen), hessian_of(INTERMEDIATE, gen)
    for name, rows, h in (("gate_proj", INTERMEDIATE, h_gate), ("down_proj", HIDDEN, h_down)):
        w = (torch.randn(rows, h.shape[0], device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
        for order in ("as given", "desc_act", "act_group_aware"):
            desc_act, gar = order == "desc_act", order == "act_group_aware"
            run = lambda: gptq_quantize(w, h, bits=4, group_size=128, sym=True, desc_act=desc_act,  # noqa: E731
                                        act_group_aware=gar, nsamples=TOKENS, ctx=ctx)
            with PeakMemory() as mem:
                run()
            q, t_q = median_s(run, a.reps)
            gm_ms = speed = same = loss_ratio = "-"
            if solve_gm is not None:
                (gq, gs, gz, gg, gloss, gdamp), t_gm = median_s(lambda: solve_gm(w, h, desc_act, gar, TOKENS),
                                                                max(1, a.reps // 2))
                gm_ms, speed = "%.1f" % (t_gm * 1e3), "%.1fx" % (t_gm / t_q)
                same = "%.4f %%" % (100 * (q.codes == codes_of(gq, gs, gz, gg)).float().mean().item())
                loss_ratio = "%.5f" % (q.loss / gloss)
            py_ms = "-"
            if python_engine is not None and order == "as given":
                _, t_py = median_s(lambda: python_engine.gptq_quantize(w, h, bits=4, group_size=128),
                                   max(1, a.reps // 2))
                py_ms = "%.1f" % (t_py * 1e3)
            say("| %s %d x %d | %s | **%.1f** | %s | %s | %s | %s | %s | %.0f MiB |" % (
                name, rows, h.shape[0], order, t_q * 1e3, gm_ms, speed, py_ms, same, loss_ratio, mem.peak / 2**20))
    say()

    say("## Hessian of 128 x 2048 tokens, d = 4096 (bf16 activations), one GPU")
    say()
    x = torch.randn(TOKENS, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    one = Placement([0], ctx=ctx)
    h, t_h = median_s(lambda: parallel_hessian([x], one), a.reps)

    def torch_fp32():  # GPTQModel's compute_hessian_xtx: fp32 matmul of the whole batch
        x32 = x.float()
        return (x32.t() @ x32) * (2.0 / TOKENS)
    torch.backends.cuda.matmul.allow_tf32 = False
    ref, t_ref = median_s(torch_fp32, a.reps)
    err = ((h - ref).abs().max() / ref.abs().max()).item()
    say("| qlink hessian_accumulate + reduce | torch fp32 X^T X (GPTQModel's) | max rel. difference |")
    say("|---|---|---|")
    say("| **%.1f ms** | %.1f ms | %.1e |" % (t_h * 1e3, t_ref * 1e3, err))
    say()
    say("The same tokens split over the GPUs: a partial per device, merged in device order on GPU 0.")
    say()
    say("| world | seconds | speedup | max rel. difference to world 1 |")
    say("|---|---|---|---|")
    for world in range(1, torch.cuda.device_count() + 1):
        place = Placement(list(range(world)), ctx=ctx)
        shards = [s.to("cuda:%d" % r) for r, s in enumerate(x.chunk(world))]
        hw, t = median_s(lambda: parallel_hessian(shards, place), a.reps)  # the merge waits for every partial
        diff = ((hw - h).abs().max() / h.abs().max()).item()
        say("| %d | %.4f | %.2fx | %.1e |" % (world, t, t_h / t, diff))
    say()

    say("## The 7 linears of a LLaMA-7B decoder layer (4 Hessians), solved together")
    say()
    h_attn, h_o = hessian_of(HIDDEN, gen), hessian_of(HIDDEN, gen)
    shapes = [("q_proj", HIDDEN, h_attn), ("k_proj", HIDDEN, h_attn), ("v_proj", HIDDEN, h_attn),
              ("o_proj", HIDDEN, h_o), ("gate_proj", INTERMEDIATE, h_gate), ("up_proj", INTERMEDIATE, h_gate),
              ("down_proj", HIDDEN, h_down)]
    layers = [GPTQLayer((torch.randn(r, hh.shape[0], device="cuda", generator=gen) * 0.02).to(torch.bfloat16), hh, n)
              for n, r, hh in shapes]
    say("| world | seconds | speedup | identical to world 1 |")
    say("|---|---|---|---|")
    base = None
    for world in range(1, torch.cuda.device_count() + 1):
        place = Placement(list(range(world)), ctx=ctx)
        res, t = median_s(lambda: parallel_gptq(layers, place, nsamples=TOKENS), a.reps)
        if base is None:
            base, t1 = res, t
        same = all(torch.equal(r.codes, b.codes) and torch.equal(r.weight, b.weight) for r, b in zip(res, base))
        say("| %d | %.3f | %.2fx | %s |" % (world, t, t1 / t, same))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
