"""Issue 20's engine figures for one Qwen3-30B-A3B layer (128 experts, gate_proj and
up_proj 768 x 2048 sharing each expert's input, down_proj 2048 x 768):
- the routed Hessians of --batches forwards of 2048 tokens routed top-8: every expert's
  gate/up and down partial of a forward in one native call (HessianAccumulator.add_many,
  what the add_batch queue makes) against GPTQModel's GPTQ.add_batch per expert linear
  (gate and up each computing theirs);
- the 384 expert linears solved in one parallel_gptq call against GPTQModel's own
  GPTQ.quantize one expert linear at a time on the same Hessians (4-bit g128 sym, its
  default group-aware order); codes equal, losses. Each Hessian from its expert's share of
  128 x 2048 tokens routed top-8 (about 16k rows).
    python3 bench/moe_solve_bench.py --library DIST/libqlink.so [--gptqmodel DIRS] [--markdown OUT.md]
        [--experts 128] [--device cpu --experts 4: a smoke run of qlink's half] [--profile OPS.txt]
        [--check-alone K]
--profile: torch.profiler over one more run of the one call; its kernel table and the GPU's
busy share of that run's wall time to OPS.txt (the figures above are from unprofiled runs).
--check-alone: K of the linears, evenly spaced, solved again each in a call of its own; their
results must equal the one call's bit for bit (how the engine shares a device between many
solves changes no result).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qlink  # noqa: E402
from gptq_bench import codes_of, gptqmodel_solver, hessian_of  # noqa: E402
from qlink.quant import GPTQLayer, parallel_gptq  # noqa: E402
from timing import median_s, sync_all  # noqa: E402

HIDDEN, MOE_INTER, TOP_K, TOKENS = 2048, 768, 8, 128 * 2048


def expert_hessians(experts, device, gen):
    """Per expert: its routed rows' Hessian at the gate/up input (HIDDEN) and the down input
    (MOE_INTER), 2 X^T X / rows, from correlated activations, and its row count."""
    rows = max(TOKENS * TOP_K // 128, 64)  # a 128-expert layer's share, whatever `experts` is
    return [(hessian_of(HIDDEN, gen, rows, device), hessian_of(MOE_INTER, gen, rows, device), rows)
            for _ in range(experts)]


def gptqmodel_task_factory():
    """GPTQModel's GPTQ for a fresh bf16 linear (in, out) on the GPU (its package imports:
    gptqmodel_solver put it on the path)."""
    from gptqmodel.quantization.config import QuantizeConfig
    from gptqmodel.quantization.gptq import GPTQ
    return lambda i, o: GPTQ(torch.nn.Linear(i, o, bias=False, device="cuda", dtype=torch.bfloat16), QuantizeConfig(
        bits=4, group_size=128))


def routed_hessian_table(say, ctx, experts, batches, device, make_task, gen):
    """The routed Hessians of one layer's forwards, qlink's one call per forward against
    GPTQModel's add_batch per expert linear; the largest difference between the two."""
    from qlink.quant import HessianAccumulator
    forwards = []
    for _ in range(batches):
        x = torch.randn(2048, HIDDEN, device=device, generator=gen).to(torch.bfloat16)
        chosen = torch.rand(2048, experts, device=device, generator=gen).topk(min(TOP_K, experts), dim=1).indices
        ups = [x[(chosen == e).any(1)] for e in range(experts)]
        downs = [torch.randn(u.shape[0], MOE_INTER, device=device, generator=gen).to(torch.bfloat16) for u in ups]
        forwards.append((ups, downs))

    def qlink_layer():
        acc = HessianAccumulator(ctx)
        held = [None] * (2 * experts)
        for ups, downs in forwards:
            held = acc.add_many([(u, held[e]) for e, u in enumerate(ups)] +
                                [(d, held[experts + e]) for e, d in enumerate(downs)])
        return held, acc.counters()["calls"]
    (held, calls), t_q = median_s(qlink_layer, 1)
    row = "| %d x %d experts | **%.1f** (%d calls) |" % (batches, experts, t_q * 1e3, calls)
    if make_task is None:
        say(row + " - | - |")
        return

    def gptqmodel_layer():
        tasks = [make_task(HIDDEN, MOE_INTER) for _ in range(2 * experts)] + [
            make_task(MOE_INTER, HIDDEN) for _ in range(experts)]
        for ups, downs in forwards:
            for e, u in enumerate(ups):
                tasks[2 * e].add_batch(u, None)      # gate_proj
                tasks[2 * e + 1].add_batch(u, None)  # up_proj: the same rows, its own product
            for e, d in enumerate(downs):
                tasks[2 * experts + e].add_batch(d, None)
        for t in tasks:
            t.finalize_hessian()
        return tasks
    tasks, t_gm = median_s(gptqmodel_layer, 1)
    worst = 0.0
    for e in range(experts):
        for mine, theirs in ((held[e], tasks[2 * e]), (held[experts + e], tasks[2 * experts + e])):
            if mine is not None:
                scaled = mine * (2.0 / theirs.nsamples)
                worst = max(worst, ((scaled - theirs.H).abs().max() / theirs.H.abs().max()).item())
    say(row + " %.1f | %.1fx | %.1e |" % (t_gm * 1e3, t_gm / t_q, worst))


def check_alone(layers, together, count, ctx, options):
    """Raises unless `count` of the layers, evenly spaced, solved each in a call of its own
    give the one call's results bit for bit."""
    picked = sorted({i * len(layers) // count for i in range(count)})
    fields = ("codes", "weight", "scales", "zeros", "g_idx")
    for i in picked:
        alone = parallel_gptq([layers[i]], None, ctx=ctx, **options)[0]
        got = together[i]
        same = all(torch.equal(getattr(got, f), getattr(alone, f)) for f in fields)
        if not (same and got.loss == alone.loss and got.damp == alone.damp):
            raise SystemExit("%s: the one call's result differs from its solve alone" % layers[i].name)
    print("alone: %d linears solved again each alone, bit-identical to the one call" % len(picked), flush=True)


def profile_call(run, path):
    """One more run under torch.profiler: the kernel table, then the GPU's busy shares of the
    run's wall time."""
    from torch.profiler import profile
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosts"))
    from common import busy_shares, kernel_table, profiler_activities
    with profile(**profiler_activities()) as prof:
        start = time.perf_counter()
        run()
        sync_all()
        wall = time.perf_counter() - start
    kernel_table(prof, path)
    kernels, any_ = busy_shares(prof, wall)
    with open(path, "a") as f:
        f.write("\nwall %.1f ms; busy: kernels %.1f %%, kernels or copies %.1f %%\n" % (
            wall * 1e3, 100 * kernels, 100 * any_))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--gptqmodel", help="folders holding the gptqmodel package and stand-ins for what it imports")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", type=int, default=128, help="forwards of 2048 tokens for the routed Hessians")
    ap.add_argument("--gptqmodel-every", type=int, default=1,
                    help="GPTQModel solves every K-th expert's three linears, its time scaled to all of them")
    ap.add_argument("--markdown")
    ap.add_argument("--profile", help="torch.profiler over one more run of the one call; its kernel table here")
    ap.add_argument("--check-alone", type=int, default=0, metavar="K",
                    help="K linears solved again each alone, checked bit for bit against the one call")
    a = ap.parse_args()
    backend = "cuda" if a.device == "cuda" else "cpu"
    ctx = qlink.configure({"backend": backend, "log_level": "warn"}, library=a.library)
    gen = torch.Generator(device=a.device).manual_seed(0)
    hessians = expert_hessians(a.experts, a.device, gen)
    layers, solves = [], []
    for e, (h_up, h_down, rows) in enumerate(hessians):
        for name, shape, h in (("gate_proj", (MOE_INTER, HIDDEN), h_up), ("up_proj", (MOE_INTER, HIDDEN), h_up),
                               ("down_proj", (HIDDEN, MOE_INTER), h_down)):
            w = (torch.randn(*shape, device=a.device, generator=gen) * 0.02).to(torch.bfloat16)
            layers.append(GPTQLayer(w, h, name="experts.%d.%s" % (e, name)))
            solves.append((w, h, rows))
    options = dict(bits=4, group_size=128, sym=True, act_group_aware=True, nsamples=hessians[0][2])
    run = lambda: parallel_gptq(layers, None, ctx=ctx, **options)  # noqa: E731
    results, t_q = median_s(run, a.reps)
    if a.profile:
        profile_call(run, a.profile)
    if a.check_alone:
        check_alone(layers, results, a.check_alone, ctx, options)
    lines = []
    say = lambda s="": (print(s, flush=True), lines.append(s))  # noqa: E731
    say("## One MoE layer's %d expert linears, 4-bit g128 sym, act_group_aware (%s)" % (
        len(layers), torch.cuda.get_device_name() if a.device == "cuda" else a.device))
    say()
    print("qlink, %d linears in one call: %.1f ms (GPTQModel's own solves next)" % (len(layers), t_q * 1e3),
          flush=True)  # before GPTQModel's half, which may outlast a lease's timeout
    solve_gm, why = gptqmodel_solver(a.gptqmodel) if a.gptqmodel else (None, "not given")
    gm = "-"
    same = ratio = "-"
    if solve_gm is not None:
        sampled = [i for i in range(len(solves)) if (i // 3) % a.gptqmodel_every == 0]

        def gptqmodel_all():
            return [solve_gm(*solves[i][:2], False, True, solves[i][2]) for i in sampled]
        theirs, t_gm = median_s(gptqmodel_all, 1)
        t_gm *= len(solves) / len(sampled)
        gm = "%.1f" % (t_gm * 1e3) + ("" if len(sampled) == len(solves) else " (%d of them timed, scaled)" % len(
            sampled))
        equal = [(results[i].codes == codes_of(q, s, z, g)).float().mean().item()
                 for i, (q, s, z, g, _, _) in zip(sampled, theirs)]
        losses = [results[i].loss / t[4] for i, t in zip(sampled, theirs)]
        same = "%.4f %% (worst %.4f %%)" % (100 * sum(equal) / len(equal), 100 * min(equal))
        ratio = "%.5f - %.5f" % (min(losses), max(losses))
        say("speedup: **%.1fx**" % (t_gm / t_q))
    else:
        print("GPTQModel unavailable: %s" % why, flush=True)
    say("| linears | qlink, one call (ms) | GPTQModel, one at a time (ms) | codes = GPTQModel | "
        "loss qlink / GPTQModel |")
    say("|---|---|---|---|---|")
    say("| %d | **%.1f** | %s | %s | %s |" % (len(layers), t_q * 1e3, gm, same, ratio))
    say()
    say("## The routed Hessians of one layer (2048-token forwards, top-%d)" % TOP_K)
    say()
    say("| forwards x experts | qlink, a call per forward (ms) | GPTQModel add_batch per linear (ms) | speedup | "
        "max rel. difference |")
    say("|---|---|---|---|---|")
    routed_hessian_table(say, ctx, a.experts, a.batches, a.device,
                         gptqmodel_task_factory() if solve_gm is not None else None, gen)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
