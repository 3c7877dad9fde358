"""The quantization engines on real GPUs (the accelerator machine); skipped where PyTorch
sees none."""
import os
import threading

import pytest
import torch

import qlink
from gptq_reference import ill_conditioned_problem, reference_gptq
from qlink.quant import (GPTQLayer, HessianAccumulator, Placement, gptq_quantize, parallel_gptq, parallel_hessian,
                         sign_round)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@pytest.mark.parametrize("bits,group_size,sym,desc_act,static_groups,act_group_aware", [
    (4, 128, True, False, False, False), (4, 32, False, True, False, False), (3, 64, True, True, True, False),
    (2, -1, False, False, False, False), (8, 128, True, True, False, False), (4, 128, True, False, False, True)])
def test_gptq_on_the_gpu_matches_the_reference(ctx, bits, group_size, sym, desc_act, static_groups, act_group_aware):
    # gate_proj's shape, a dead column; the engine follows PyTorch's CUDA calls one for one.
    w, h = ill_conditioned_problem(rows=11008, cols=4096)
    h[9, :], h[:, 9] = 0, 0  # a dead column
    opts = dict(bits=bits, group_size=group_size, sym=sym, desc_act=desc_act, static_groups=static_groups,
                act_group_aware=act_group_aware)
    got = gptq_quantize(w.bfloat16(), h, ctx=ctx, **opts)
    codes, scales, zeros, g_idx, weight, loss, damp = reference_gptq(w.bfloat16(), h, **opts)
    assert got.weight.dtype == torch.bfloat16
    assert (got.codes == codes).float().mean() >= 0.999
    assert torch.equal(got.g_idx, g_idx)
    same = (got.codes == codes).all(1)  # rows whose codes agree have the same ranges
    assert torch.equal(got.scales[same], scales[same]) and torch.equal(got.zeros[same], zeros[same])
    assert got.loss == pytest.approx(loss, rel=1e-3)
    g = got.g_idx.long()
    assert torch.equal(got.weight, (got.scales[:, g] * (got.codes.float() - got.zeros[:, g])).bfloat16())


@pytest.mark.parametrize("desc_act", [False, True])
def test_the_triangular_inverse_on_the_gpu_stays_with_float64_gptq(ctx, desc_act):
    # Each route to U on the GPU (GPTQModel's chain; the reversed potrf and cuSOLVER's trtri,
    # ABI 1.11) as close to float64 GPTQ's codes as the same route in PyTorch's fp32 (within
    # half a point: fp32 GPTQ parts from float64 at near-ties), the loss within 0.5 %, the
    # dead column at zero. (How far apart the two routes are: bench/gptq_inverse_bench.py.)
    w, h = ill_conditioned_problem(rows=1024, cols=4096)
    w = w.bfloat16()
    h[9, :], h[:, 9] = 0, 0  # a dead column
    codes, *_, loss, _ = reference_gptq(w.double(), h.double(), desc_act=desc_act)
    for inverse in ("cholesky_inverse", "triangular"):
        fp32 = (reference_gptq(w, h, desc_act=desc_act, inverse=inverse)[0] == codes).float().mean().item()
        got = gptq_quantize(w, h, ctx=ctx, desc_act=desc_act, inverse=inverse)
        alike = (got.codes == codes).float().mean().item()
        assert alike >= fp32 - 0.005, (inverse, alike, fp32)
        assert got.loss == pytest.approx(loss, rel=5e-3), inverse
        assert (got.codes[:, 9] == 8).all(), inverse


def test_gpu_hessian_matches_float64(ctx):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 700, 512, generator=gen).cuda().bfloat16()
    h = parallel_hessian([x], Placement([0], ctx=ctx))
    want = x.reshape(-1, 512).double()
    want = (want.t() @ want) * (2.0 / 2100)
    assert torch.allclose(h.double(), want, rtol=1e-4, atol=1e-5) and torch.equal(h, h.t())


def test_gpu_hessian_converts_the_next_chunk_beside_the_update(ctx):
    # 3.5 chunks of bf16 rows at 1024 columns (a chunk is 512 MiB of fp32): each converted on
    # a second stream while the previous one's update runs, the same sums as chunk by chunk.
    cols = 1024
    chunk = (512 << 20) // (4 * cols)
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(chunk * 7 // 2, cols, generator=gen, device="cuda").bfloat16()
    whole, pieces = torch.zeros(cols, cols, device="cuda"), torch.zeros(cols, cols, device="cuda")
    ctx.hessian_accumulate([x], [whole])
    ctx.hessian_accumulate([x[r:r + chunk] for r in range(0, len(x), chunk)], [pieces])
    torch.cuda.synchronize()
    assert torch.equal(whole, pieces) and torch.equal(whole, whole.t())
    want = x.double().t() @ x.double()
    assert (whole.double() - want).abs().max() <= 2e-4 * want.abs().max()  # fp32 sums of 458752 rows


def test_many_hessians_on_lanes_equal_each_layer_solved_alone(ctx):
    # An MoE layer's shape in miniature: 12 experts, gate and up sharing each expert's
    # Hessian, down its own; 24 Hessians on one GPU run on the engine's lanes, each layer's
    # kernels the ones it runs alone (the same calls on another stream).
    layers = []
    for e in range(12):
        w, h = ill_conditioned_problem(rows=192, cols=512, seed=2 * e)
        wd, hd = ill_conditioned_problem(rows=512, cols=192, seed=2 * e + 1)
        layers += [GPTQLayer(w, h, "gate%d" % e), GPTQLayer(w * 0.7, h, "up%d" % e), GPTQLayer(wd, hd, "down%d" % e)]
    together = parallel_gptq(layers, None, ctx=ctx, act_group_aware=True, group_size=64)
    for layer, got in zip(layers, together):
        alone = parallel_gptq([layer], None, ctx=ctx, act_group_aware=True, group_size=64)[0]
        assert torch.equal(got.codes, alone.codes) and torch.equal(got.weight, alone.weight), layer.name
        assert torch.equal(got.scales, alone.scales) and got.loss == alone.loss and got.damp == alone.damp


def test_callers_on_two_streams_at_once_get_what_each_gets_alone(ctx):
    # Two threads, each on a stream of its own, share the device's library state for callers'
    # streams (one cuBLAS and cuSOLVER workspace): each stream's use of it waits for the other's
    # last, so twenty rounds of IEEE Hessians and solves side by side give each one's bytes.
    gen = torch.Generator(device="cuda").manual_seed(3)
    inputs = [torch.randn(8192, 2048, generator=gen, device="cuda") for _ in range(2)]
    problems = [ill_conditioned_problem(rows=1024, cols=2048, seed=seed) for seed in (4, 5)]

    def run(i):
        h = HessianAccumulator(ctx, "ieee_fp32").add(inputs[i])
        got = gptq_quantize(problems[i][0].bfloat16(), problems[i][1], ctx=ctx, inverse="triangular", tf32=True)
        return h, got

    alone = [run(0), run(1)]
    torch.cuda.synchronize()
    rounds, barrier = [[], []], threading.Barrier(2)

    def worker(i):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            barrier.wait()
            rounds[i] = [run(i) for _ in range(20)]
        stream.synchronize()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (h, want) in enumerate(alone):
        assert len(rounds[i]) == 20
        for got_h, got in rounds[i]:
            assert torch.equal(got_h, h) and torch.equal(got.codes, want.codes) and got.loss == want.loss, i


@two_gpus
def test_parallel_gptq_on_two_gpus_equals_one(ctx):
    (w1, h1), (w2, h2) = ill_conditioned_problem(rows=301), ill_conditioned_problem(rows=200, cols=256, seed=1)
    layers = [GPTQLayer(w1, h1, "a"), GPTQLayer(w1 * 0.5, h1, "b"), GPTQLayer(w2, h2, "c")]
    one = parallel_gptq(layers, Placement([0], ctx=ctx))
    two = parallel_gptq(layers, Placement([0, 1], ctx=ctx))
    for a, b in zip(one, two):  # whole layers per device: the same kernels on the same rows
        assert torch.equal(a.codes, b.codes) and torch.equal(a.weight, b.weight) and a.loss == b.loss


@two_gpus
def test_sign_round_on_two_gpus_tracks_one(ctx):
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.SiLU(), torch.nn.Linear(384, 256)).cuda()
    inputs = torch.randn(16, 32, 256, device="cuda:0")
    rtn = sign_round(block, inputs, Placement([0], ctx=ctx), iters=0)
    one = sign_round(block, inputs, Placement([0], ctx=ctx), iters=40, lr=1 / 200)
    two = sign_round(block, inputs, Placement([0, 1], ctx=ctx), iters=40, lr=1 / 200)
    assert one.loss < rtn.loss and two.loss < rtn.loss
    assert abs(two.loss - one.loss) <= 0.05 * one.loss
    assert all(w.device == torch.device("cuda:0") for w in two.weights.values())


def test_a_failed_library_setup_leaves_no_half_made_state_and_names_the_status(library):
    # cuSOLVER's first handle creation fails: that call is refused naming the vendor's call
    # and status; the next one makes all of the device's handles afresh and solves as usual.
    fake = os.path.join(os.path.dirname(library), "libfake_cusolver.so")
    if not os.path.exists(fake):
        pytest.skip("libfake_cusolver.so is not beside the library (tools/pack.sh puts it there)")
    w, h = ill_conditioned_problem()
    with qlink.load({"backend": "cuda", "log_level": "off"}, library=library) as plain:
        want = gptq_quantize(w, h, ctx=plain)
    with qlink.load({"backend": "cuda", "log_level": "off", "solver_library": fake}, library=library) as ctx:
        with pytest.raises(qlink.QlinkError, match="cusolverDnCreate failed: CUSOLVER_STATUS_NOT_INITIALIZED"):
            gptq_quantize(w, h, ctx=ctx)
        got = gptq_quantize(w, h, ctx=ctx)
    assert torch.equal(got.codes, want.codes) and torch.equal(got.weight, want.weight)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gptq_pack_on_the_gpu_gives_the_cpus_words(bits, dtype):
    """The GPU packs what the CPU packs (the stand-in GPTQModel's Python packer is the CPU's
    reference in test_gptq_pack.py), bit for bit, on a 7B down_proj's shape with act-order
    groups, the CPU weight going up and the words coming back."""
    from qlink.quant import gptq_pack
    from test_gptq_pack import layer
    linear, scales, zeros, g_idx = layer(out_features=4096, in_features=11008, group_size=128, bits=bits,
                                         dtype=dtype, act_order=True, seed=bits)
    args = (linear.weight.detach(), scales.T.contiguous(), zeros.T.contiguous(), g_idx, bits)
    on_cpu, on_gpu = gptq_pack(*args), gptq_pack(*args, device="cuda")
    assert all(g.device.type == "cpu" and torch.equal(g, c) for g, c in zip(on_gpu, on_cpu))


def test_gptq_pack_of_host_tensors_does_not_wait_for_the_callers_stream():
    """A finalizer packs CPU tensors while the layer loop's kernels are queued: the pack
    returns (with the CPU's words) before the current stream's work is done; given the same
    tensors on the GPU, written on that stream, it packs what the stream wrote."""
    from qlink.quant import gptq_pack
    from test_gptq_pack import layer
    linear, scales, zeros, g_idx = layer(out_features=768, in_features=2048, group_size=128, bits=4,
                                         dtype=torch.bfloat16, act_order=True, seed=7)
    args = (linear.weight.detach(), scales.T.contiguous(), zeros.T.contiguous(), g_idx, 4)
    on_cpu = gptq_pack(*args)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of the caller's stream busy
    on_gpu = gptq_pack(*args, device="cuda")
    assert not torch.cuda.current_stream().query()  # the pack did not wait for it
    assert all(torch.equal(g, c) for g, c in zip(on_gpu, on_cpu))
    source, rest = args[0].cuda(), [t.cuda() for t in args[1:4]]
    weight = torch.zeros_like(source)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    weight.copy_(source)  # on the current stream, behind the sleep: read before it, the pack sees zeros
    from_device = gptq_pack(weight, *rest, 4)
    assert all(d.device.type == "cuda" and torch.equal(d.cpu(), c) for d, c in zip(from_device, on_cpu))


def test_gptq_pack_many_on_the_gpu_gives_the_cpus_words_layer_by_layer():
    """A batch of MoE-expert-shaped layers (768 x 2048, act-order groups) packed on the GPU in
    chunks gives each layer's CPU words, bit for bit."""
    from qlink.quant import gptq_pack, gptq_pack_many
    from test_gptq_pack import layer
    layers = [layer(out_features=768, in_features=2048, group_size=128, bits=4, dtype=torch.bfloat16,
                    act_order=True, seed=seed) for seed in range(6)]
    args = [(lin.weight.detach(), s.T.contiguous(), z.T.contiguous(), g) for lin, s, z, g in layers]
    qweight, qzeros, refusals = gptq_pack_many(*([a[i].cuda() for a in args] for i in range(4)), 4,
                                               chunk_elements=4 * 768 * 2048)
    assert refusals == [None] * 6 and qweight.is_cuda
    for i, a in enumerate(args):
        on_cpu = gptq_pack(*a, 4)
        assert torch.equal(qweight[i].cpu(), on_cpu[0]) and torch.equal(qzeros[i].cpu(), on_cpu[1]), i


@pytest.mark.parametrize("improved", [True, False])
@pytest.mark.parametrize("group_size,cols", [(128, 512), (32, 512), (-1, 384)])  # team kernels; the generic one
def test_v_stepped_in_the_backward_equals_the_backward_then_signsgd_on_the_gpu(ctx, group_size, cols, improved):
    """ABI 1.9's step of v inside signround_qdq_backward, on the GPU's kernels: v and its
    kept copy as a backward writing grad_v then signsgd_step leave them, bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    rows = 64
    group_len = cols if group_size == -1 else group_size
    groups = rows * cols // group_len
    w = (0.05 * torch.randn(rows, cols, generator=gen, device="cuda")).to(torch.bfloat16)
    v = torch.rand(groups, group_len, generator=gen, device="cuda") - 0.5
    lo, hi = (torch.rand(groups, generator=gen, device="cuda") for _ in range(2))
    upstream = torch.randn(rows, cols, generator=gen, device="cuda").to(torch.bfloat16)
    options = {"bits": 4, "group_size": group_size, "sym": True, "scale_dtype": torch.float16, "q_scale_thresh": 1e-5}
    lrs, loss = torch.tensor([0.005, 0.25], device="cuda"), torch.tensor([1.0], device="cuda")
    best_loss = torch.tensor([2.0 if improved else 0.5], device="cuda")

    def layer(**more):
        return dict({"name": "up", "weight": w, "v": v.clone(), "min_scale": lo.clone(), "max_scale": hi.clone(),
                     "grad_qdq": upstream, "grad_min_scale": torch.empty_like(lo)}, **more)
    plain = layer(grad_v=torch.empty_like(v))
    ctx.signround_qdq([plain], options, backward=True)
    kept = torch.full_like(v, 7.0)
    ctx.signsgd_step([{"param": plain["v"], "grad": plain["grad_v"], "best": kept, "lr_group": 1}], lrs.clone(),
                     loss=loss, best_loss=best_loss.clone())
    fused = layer(lr_group=1, best_v=torch.full_like(v, 7.0))
    ctx.signround_qdq([fused], options, backward=True, step={"step_lrs": lrs, "loss": loss, "best_loss": best_loss})
    torch.cuda.synchronize()
    assert torch.equal(fused["v"], plain["v"]) and torch.equal(fused["best_v"], kept)
    assert torch.equal(fused["best_v"], v) == improved
    assert torch.equal(fused["grad_min_scale"], plain["grad_min_scale"])
