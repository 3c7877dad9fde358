"""SignRound's native quant-dequant (ABI 1.7) on a LLaMA-7B decoder layer's 7 linears, one
GPU: q, k, v, o (4096 x 4096), gate, up (11008 x 4096), down (4096 x 11008), bf16 weights,
W4 g128 (AutoRound's default: sym, fp16 scales). Prints, for the forward (all 7 layers in
one call) and the backward (likewise), the device time (a CUDA graph of the call replayed,
so host overhead is out), the bytes it must move and that over the time as a share of the
H200's 4.8 TB/s; the SignSGD step of the 21 tuning tensors likewise; and the engine against
the tests' reference of AutoRound's arithmetic (tests/python/signround_reference.py) run
eagerly on the GPU: qdq and grad_v bit-identical, the range factors' gradients.
    python3 bench/signround_bench.py --library DIST/libqlink.so [--reps 50]
"""
import argparse
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


if __name__ == "__main__":
    main()
