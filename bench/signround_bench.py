"""SignRound's native quant-dequant (ABI 1.7) on a LLaMA-7B decoder layer's 7 linears, one
GPU: q, k, v, o (4096 x 4096), gate, up (11008 x 4096), down (4096 x 11008), bf16 weights,
W4 g128 (AutoRound's default: sym, fp16 scales). Prints, for the forward (all 7 layers in
one call) and the backward (likewise), the device time (a CUDA graph of the call replayed,
so host overhead is out), the bytes it must move and that over the time as a share of the
H200's 4.8 TB/s; the SignSGD step of the 21 tuning tensors likewise; the engine against
the tests' reference of AutoRound's arithmetic (tests/python/signround_reference.py) run
eagerly on the GPU: qdq and grad_v bit-identical, the range factors' gradients; and the
engine on the GPU against the CPU backend, every output bit for bit (the range factors'
gradients too: both add the per-group sums in the order signround_math.h documents), over
the layers' first rows and small cases that reach every kernel (team sizes, the generic
path's group lengths, misaligned buffers, every weight and scale dtype, bits 2/3/4/8).
    python3 bench/signround_bench.py --library DIST/libqlink.so [--reps 50]
"""
import argparse
import itertools
import os
import statistics
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
sys.path.insert(0, os.path.join(here, "..", "tests", "python"))
import qlink  # noqa: E402
from qlink.quant import signround_qdq  # noqa: E402
from signround_reference import reference_qdq  # noqa: E402

HBM_BYTES_PER_S = 4.8e12
SHAPES = {"q_proj": (4096, 4096), "k_proj": (4096, 4096), "v_proj": (4096, 4096), "o_proj": (4096, 4096),
          "gate_proj": (11008, 4096), "up_proj": (11008, 4096), "down_proj": (4096, 11008)}
GROUP, BITS = 128, 4
OPTIONS = {"bits": BITS, "group_size": GROUP, "sym": True, "scale_dtype": torch.float16, "q_scale_thresh": 1e-5}


def layers(device):
    gen = torch.Generator(device=device).manual_seed(0)
    out = []
    for name, (rows, cols) in SHAPES.items():
        groups = rows * cols // GROUP
        out.append({
            "name": name,
            "weight": (torch.randn(rows, cols, device=device, generator=gen) * 0.02).to(torch.bfloat16),
            "v": torch.rand(groups, GROUP, device=device, generator=gen) - 0.5,
            "min_scale": 0.8 + 0.3 * torch.rand(groups, device=device, generator=gen),
            "max_scale": 0.8 + 0.3 * torch.rand(groups, device=device, generator=gen),
        })
    return out


def device_ms(fn, reps):
    """Median device time of one fn() call: captured once in a CUDA graph and replayed (the
    graph holds exactly the call's kernels), or, where capture fails, timed between events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    run, how = fn, "events"
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run, how = graph.replay, "graph"
    except RuntimeError as e:
        print("  (graph capture failed: %s; timing the calls between events)" % e)
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), how


def report(what, ms, nbytes, how):
    rate = nbytes / (ms * 1e-3)
    print("%-28s %8.3f ms  %7.2f GB moved  %7.1f GB/s  %5.1f %% of HBM  (%s)" % (
        what, ms, nbytes / 1e9, rate / 1e9, 100 * rate / HBM_BYTES_PER_S, how))


OUTPUTS = ("qdq", "min_scale", "max_scale", "grad_v", "grad_min_scale", "grad_max_scale")


def engine_outputs(ctx, weight, v, lo, hi, upstream, options, streams=None):
    """The forward then the backward on the engine, the range factors copied (the forward
    clamps them): qdq, the clamped factors, grad_v, grad_min_scale, grad_max_scale."""
    lo, hi, qdq = lo.clone(), hi.clone(), torch.empty_like(weight)
    layer = {"weight": weight, "v": v, "min_scale": lo, "max_scale": hi}
    ctx.signround_qdq([dict(layer, qdq=qdq)], options, streams=streams)
    grads = {"grad_v": torch.empty_like(v), "grad_min_scale": torch.empty_like(lo),
             "grad_max_scale": torch.empty_like(hi)}
    ctx.signround_qdq([dict(layer, grad_qdq=upstream, **grads)], options, backward=True, streams=streams)
    return [qdq, lo, hi, grads["grad_v"], grads["grad_min_scale"], grads["grad_max_scale"]]


def same_bits(a, b):
    """a and b hold the same bits, zero signs included, where either is a number; NaN where
    one is NaN. A NaN's sign and payload are the hardware's: x86 makes the negative quiet
    NaN, CUDA the positive one, for the same 0/0 (fp16 scales at W2 underflow to zero)."""
    bits = lambda t: t.detach().cpu().contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])  # noqa
    if a.dtype != b.dtype:
        return False
    nan_a, nan_b = torch.isnan(a).cpu(), torch.isnan(b).cpu()
    return torch.equal(nan_a, nan_b) and torch.equal(bits(a)[~nan_a], bits(b)[~nan_b])


def differing(got, want, names=OUTPUTS):
    """The names of the outputs whose bits differ."""
    return [name for name, a, b in zip(names, got, want) if not same_bits(a, b)]


def misaligned(t):
    """t's values one element past an aligned address: no vector loads."""
    storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = storage[1:].view(t.shape)
    out.copy_(t)
    return out


def case_inputs(rows, cols, group_size, dtype, seed):
    """As the tests' inputs: all-positive, all-negative and all-zero rows, range factors
    around [0, 1] (clamped by the forward) with some 0; on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * 0.05
    w[1], w[2], w[3] = w[1].abs(), -w[2].abs(), 0
    group_len = cols if group_size == -1 else group_size
    groups = rows * cols // group_len
    v = torch.rand(groups, group_len, generator=gen) - 0.5
    lo, hi = (torch.rand(groups, generator=gen) * 1.4 - 0.1 for _ in range(2))
    lo[::5], hi[::7] = 0, 0
    upstream = torch.randn(rows, cols, generator=gen)
    return w.to(dtype), v, lo, hi, upstream.to(dtype)


# (group_size, columns, aligned): 13 rows, so 39 groups where columns = 3 groups, which
# leaves the last warp or block part-filled for every team size.
CASES = [(32, 96, True), (64, 192, True), (128, 384, True), (256, 768, True), (512, 1536, True),
         (96, 288, True), (36, 108, True), (30, 90, True), (-1, 1000, True), (-1, 1001, True), (128, 384, False)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def check_cases(gpu, cpu, dev, streams):
    """Every case on the GPU against the CPU backend (sym: all outputs bit for bit; asym
    divides by maxq as a product with its reciprocal on the GPU, as PyTorch does there, so
    its qdq and grad_v are held to the reference on the GPU instead). True when all agree."""
    all_equal = True
    for group_size, cols, aligned in CASES:
        power = group_size in (32, 64, 128, 256, 512)
        path = "team of %d" % (group_size // 16) if power and aligned else "generic"
        failures = []
        for k, (wdtype, sdtype, sym) in enumerate(itertools.product(DTYPES, DTYPES, (True, False))):
            bits = (2, 3, 4, 8)[k % 4]
            options = {"bits": bits, "group_size": group_size, "sym": sym, "scale_dtype": sdtype,
                       "q_scale_thresh": 1e-8 if sdtype == torch.float32 else 1e-5}
            host = case_inputs(13, cols, group_size, wdtype, seed=k * 100 + cols)
            on_gpu = [t.to(dev) if aligned else misaligned(t.to(dev)) for t in host]
            got = engine_outputs(gpu, *on_gpu, options, streams=streams())
            torch.cuda.synchronize()
            what = "%s/%s scale/%s/W%d" % (str(wdtype)[6:], str(sdtype)[6:], "sym" if sym else "asym", bits)
            if sym:
                off = differing(got, engine_outputs(cpu, *host, options))
            else:
                w, v, lo, hi, upstream = on_gpu
                lo, hi = lo.clone().requires_grad_(True), hi.clone().requires_grad_(True)
                v = v.clone().requires_grad_(True)
                q = reference_qdq(w, v, lo, hi, **options)
                q.backward(upstream)
                off = differing([got[0], got[3]], [q, v.grad], ("qdq", "grad_v"))
            if off:
                failures.append("%s: %s" % (what, ", ".join(off)))
        all_equal = all_equal and not failures
        print("  group %4d, 13 x %4d%s (%s): %s" % (
            group_size, cols, "" if aligned else ", misaligned", path,
            "DIFFERS: " + "; ".join(failures) if failures else "9 dtype pairs x sym/asym identical"))
    return all_equal


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--library", required=True)
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    ctx = qlink.load({"backend": "cuda", "log_level": "warn"}, library=args.library)
    dev = torch.device("cuda", 0)
    print("device: %s, torch %s" % (torch.cuda.get_device_name(dev), torch.__version__))
    specs = layers(dev)
    elements = sum(spec["weight"].numel() for spec in specs)
    groups = sum(spec["min_scale"].numel() for spec in specs)
    for spec in specs:
        spec["qdq"] = torch.empty_like(spec["weight"])
    fwd = [{k: spec[k] for k in ("name", "weight", "v", "min_scale", "max_scale", "qdq")} for spec in specs]
    upstream = [torch.randn(spec["weight"].shape, device=dev).to(torch.bfloat16) for spec in specs]
    bwd = [{"name": spec["name"], "weight": spec["weight"], "v": spec["v"], "min_scale": spec["min_scale"],
            "max_scale": spec["max_scale"], "grad_qdq": g, "grad_v": torch.empty_like(spec["v"]),
            "grad_min_scale": torch.empty_like(spec["min_scale"]),
            "grad_max_scale": torch.empty_like(spec["max_scale"])}
           for spec, g in zip(specs, upstream)]
    streams = lambda: {0: torch.cuda.current_stream().cuda_stream}  # noqa: E731

    # Bytes each pass must move at least: the weight, v and the output (forward) or the
    # weight, v, the upstream gradient and grad_v (backward); range factors per group.
    fwd_bytes = elements * (2 + 4 + 2) + groups * (4 + 4) * 2
    bwd_bytes = elements * (2 + 4 + 2 + 4) + groups * (4 + 4) * 2
    print("7 linears: %.1f M weights, %.2f M groups, W%d g%d sym, fp16 scales" % (elements / 1e6, groups / 1e6, BITS,
                                                                                  GROUP))
    ms, how = device_ms(lambda: ctx.signround_qdq(fwd, OPTIONS, streams=streams()), args.reps)
    report("qdq forward (1 call)", ms, fwd_bytes, how)
    fwd_ms = ms
    ms, how = device_ms(lambda: ctx.signround_qdq(bwd, OPTIONS, backward=True, streams=streams()), args.reps)
    report("qdq backward (1 call)", ms, bwd_bytes, how)
    print("%-28s %8.3f ms" % ("forward + backward", fwd_ms + ms))

    params = []
    for spec, b in zip(specs, bwd):
        params += [{"param": spec["v"], "grad": b["grad_v"], "best": torch.empty_like(spec["v"]), "lr_group": 0},
                   {"param": spec["min_scale"], "grad": b["grad_min_scale"],
                    "best": torch.empty_like(spec["min_scale"]), "lr_group": 1},
                   {"param": spec["max_scale"], "grad": b["grad_max_scale"],
                    "best": torch.empty_like(spec["max_scale"]), "lr_group": 1}]
    lrs = torch.tensor([0.005, 0.005], device=dev)
    epoch = torch.zeros(1, dtype=torch.int64, device=dev)
    loss, best_loss = torch.zeros(1, device=dev), torch.ones(1, device=dev)
    snapshot = [p["param"].clone() for p in params]
    step_bytes = sum(p["param"].numel() for p in params) * 4 * 4  # param read + write, grad, best
    ms, how = device_ms(lambda: ctx.signsgd_step(params, lrs, epoch, 10 ** 9, loss, best_loss, streams=streams()),
                        args.reps)
    report("signsgd step (21 tensors)", ms, step_bytes, how)
    for p, s in zip(params, snapshot):
        p["param"].copy_(s)

    # Against the reference, eagerly on this GPU, through the autograd Function.
    print("engine vs the tests' reference of AutoRound's arithmetic, on the GPU:")
    all_equal = True
    for spec, g in zip(specs, upstream):
        got, want = [], []
        for fn, out in ((lambda *a, **o: signround_qdq(*a, ctx=ctx, **o), got), (reference_qdq, want)):
            v, lo, hi = (spec[k].clone().requires_grad_(True) for k in ("v", "min_scale", "max_scale"))
            q = fn(spec["weight"], v, lo, hi, **OPTIONS)
            q.backward(g)
            out += [q.detach(), v.grad, lo.grad, hi.grad]
        qdq_equal, gv_equal = torch.equal(got[0], want[0]), torch.equal(got[1], want[1])
        all_equal = all_equal and qdq_equal and gv_equal
        ranges = []
        for a, b in zip(got[2:], want[2:]):
            ranges.append("%.4f %% identical, max rel diff %.2e" % (
                100.0 * float((a == b).float().mean()),
                float(((a - b).abs() / b.abs().clamp(min=1e-12)).max())))
        print("  %-10s qdq %s, grad_v %s; grad_min_scale %s; grad_max_scale %s" % (
            spec["name"], "bit-identical" if qdq_equal else "DIFFERS", "bit-identical" if gv_equal else "DIFFERS",
            ranges[0], ranges[1]))
    print("RESULT: qdq and grad_v bit-identical on every layer: %s" % ("yes" if all_equal else "NO"))

    print("engine on the GPU vs the CPU backend, every output bit for bit (sym; asym: qdq and grad_v vs the "
          "reference):")
    cpu = qlink.load({"backend": "cpu", "log_level": "warn"}, library=args.library)
    rows = 64
    layers_equal = True
    for spec, g in zip(specs, upstream):
        cols = spec["weight"].shape[1]
        head = [spec["weight"][:rows], spec["v"][:rows * cols // GROUP], spec["min_scale"][:rows * cols // GROUP],
                spec["max_scale"][:rows * cols // GROUP], g[:rows]]
        got = engine_outputs(ctx, *head, OPTIONS, streams=streams())
        torch.cuda.synchronize()
        off = differing(got, engine_outputs(cpu, *[t.cpu() for t in head], OPTIONS))
        layers_equal = layers_equal and not off
        print("  %-10s first %d rows: %s" % (spec["name"], rows, "DIFFERS: " + ", ".join(off) if off else "identical"))
    cases_equal = check_cases(ctx, cpu, dev, streams)
    print("RESULT: bit-identical to the CPU backend on the layers and every case: %s" % (
        "yes" if layers_equal and cases_equal else "NO"))


if __name__ == "__main__":
    main()
