"""Whether AutoRound's 0/1 attention bias can cost what unmasked attention costs instead of what cuDNN's biased path
does (issue 22). AutoRound's input cache casts each sample's boolean mask to bf16 (bench/attention_mask_cost.py), so
its block tuning hands SDPA an additive bias, not a mask: bias[b, 0, i, j] = 1.0 where j <= i and j != L-1 (every
sample's last token is masked out of the padding mask), 0.0 elsewhere. Every query reads every key, so cuDNN computes
the whole square with a bias: 6.63 ms forward + backward on an H200 at batch 8 x 2048 tokens, 32 heads of 128, bf16,
against 2.40 ms for causal (half the square, no bias).

The bias is constant on two triangles, and a constant added to a block of scores is what log-sum-exp merging absorbs
(ring attention merges its blocks so). So the biased attention is two bias-free causal cuDNN attentions:
 - C: causal over all L keys (j <= i): for every query but the last, exactly the keys at +1;
 - U: the strict upper triangle (j > i) at 0, for queries 0..L-2: a causal square on the reversed sequence, of
   queries L-2..0 over keys L-1..1;
merged per query as lse = logaddexp(lse_C + 1, lse_U), O = exp(lse_C + 1 - lse) O_C + exp(lse_U - lse) O_U. The last
query reads keys 0..L-2 at +1 and itself at 0, which neither triangle holds: its row is computed explicitly (one row
of scores). The backward runs each part's fused backward with the merged output and lse (lse - 1 for C, whose scores
carry the +1; C's dO of the last row zeroed, that row being the explicit one's), which is the biased attention's
gradient split by keys: the fused backward computes D = rowsum(dO * O), P = exp(s - lse), dS = P * (dP - D) from the
O and lse it is handed. Mathematically equal to the biased attention, not bitwise. The two triangles are the whole
square's work, so the floor is unmasked attention's time (about twice causal's), timed here beside it.

Prints JSON: the split's errors against cuDNN with the bias, both against a float32 explicit-bias reference on the
first --check-batch samples (whether the split is at least as accurate as what it would replace), the mean times of
forward + backward and of the forward alone (grad enabled, as in tuning), and which kernels ran.

    python3 bench/attention_split.py [--reps 20] [--batch 8 --heads 32 --seq 2048 --dim 128] [--check-batch 1]
    python3 bench/attention_split.py --cpu-check   # the split's formulas in fp64 on CPU, against autograd
"""
import argparse
import functools
import json

import torch

from timing import mean_us


class _TorchBackend:
    """Causal attention in plain torch ops, its backward written out as the fused kernels compute theirs from the O
    and lse they are handed, so that on CPU the split runs the same merge and lse bookkeeping as on the GPU."""
    name = "torch"

    @staticmethod
    def _scores(q, k, scale):
        s = torch.matmul(q, k.transpose(-1, -2)) * scale
        hidden = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1)
        return s.masked_fill(hidden, float("-inf"))

    def forward(self, q, k, v, scale):
        s = self._scores(q, k, scale)
        lse = torch.logsumexp(s, dim=-1)
        return torch.matmul(torch.exp(s - lse[..., None]), v), lse, ((), ())

    def backward(self, dout, q, k, v, out, lse, aux, scale):
        p = torch.exp(self._scores(q, k, scale) - lse[..., None])
        dp = torch.matmul(dout, v.transpose(-1, -2))
        ds = p * (dp - (dout * out).sum(-1, keepdim=True))
        return (torch.matmul(ds, k) * scale, torch.matmul(ds.transpose(-1, -2), q) * scale,
                torch.matmul(p.transpose(-1, -2), dout))


_TORCH = _TorchBackend()


class _CudnnBackend:
    """cuDNN's fused causal attention through the aten ops SDPA's cuDNN backend calls. The schemas are PyTorch's
    aten/src/ATen/native/native_functions.yaml:
      _scaled_dot_product_cudnn_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_bias,
        bool compute_log_sumexp, float dropout_p=0., bool is_causal=False, bool return_debug_mask=False, *,
        float? scale=None) -> (Tensor output, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q,
        SymInt max_k, Tensor philox_seed, Tensor philox_offset, Tensor debug_attn_mask)
      _scaled_dot_product_cudnn_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value,
        Tensor out, Tensor logsumexp, Tensor philox_seed, Tensor philox_offset, Tensor attn_bias, Tensor cum_seq_q,
        Tensor cum_seq_k, SymInt max_q, SymInt max_k, float dropout_p, bool is_causal, *, float? scale=None)
        -> (Tensor, Tensor, Tensor)
    The lse is fp32 natural-log log-sum-exp of the scaled scores, [B, H, S, 1] (aten/src/ATen/native/cudnn/MHA.cpp,
    run_cudnn_SDP_fprop; [B, H, S] in older releases): the backward is handed back the rank the forward gave, and
    builds its graph from the strides it is handed, so the lse passed is contiguous as the forward's was. The
    causal mask of the dense path is top-left (MHA.cpp, CausalMask::TOP_LEFT); both parts here are square."""
    name = "cudnn"

    def forward(self, q, k, v, scale):
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, True, False, scale=scale)
        return out, lse.reshape(lse.shape[:3]), ((lse.dim(), max_q, max_k), (cum_q, cum_k, seed, offset))

    def backward(self, dout, q, k, v, out, lse, aux, scale):
        (rank, max_q, max_k), (cum_q, cum_k, seed, offset) = aux
        lse = lse.reshape(lse.shape + (1,) * (rank - 3))
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, True, scale=scale)


class _FlashBackend:
    """FlashAttention's fused causal attention, where cuDNN's refuses the shapes. native_functions.yaml:
      _scaled_dot_product_flash_attention(Tensor query, Tensor key, Tensor value, float dropout_p=0.0,
        bool is_causal=False, bool return_debug_mask=False, *, float? scale=None) -> (Tensor output,
        Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k, Tensor rng_state,
        Tensor unused, Tensor debug_attn_mask)
      _scaled_dot_product_flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value,
        Tensor out, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, SymInt max_k,
        float dropout_p, bool is_causal, Tensor philox_seed, Tensor philox_offset, *, float? scale=None)
        -> (Tensor grad_query, Tensor grad_key, Tensor grad_value)
    The lse is fp32 [B, H, S] (transformers/cuda/flash_attn/flash_api.cpp, mha_fwd's softmax_lse)."""
    name = "flash"

    def forward(self, q, k, v, scale):
        out, lse, cum_q, cum_k, max_q, max_k, rng, unused, _ = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=scale)
        return out, lse, ((max_q, max_k), (cum_q, cum_k, rng, unused))

    def backward(self, dout, q, k, v, out, lse, aux, scale):
        (max_q, max_k), (cum_q, cum_k, rng, unused) = aux
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, True, rng, unused, scale=scale)


@functools.lru_cache(maxsize=None)
def fused_backend(device, dtype, seq, dim):
    """(backend, refusals): cuDNN's causal attention where it takes both parts' shapes (seq and seq - 1 tokens of
    dim), else FlashAttention's; tried once per shape, forward and backward on one head, since the ops are called
    directly and no SDPA dispatcher checks them first. refusals: each refused backend's first error line."""
    refusals = {}
    for backend in (_CudnnBackend(), _FlashBackend()):
        try:
            for n in (seq, seq - 1):
                q, k, v, dout = (torch.randn(1, 1, n, dim, device=device, dtype=dtype) for _ in range(4))
                out, lse, aux = backend.forward(q, k, v, dim ** -0.5)
                backend.backward(dout, q, k, v, out, lse, aux, dim ** -0.5)
            return backend, refusals
        except (RuntimeError, AttributeError) as error:  # AttributeError: a torch without the op
            refusals[backend.name] = str(error).splitlines()[0]
    raise RuntimeError("no fused causal attention takes %s x %d tokens x %d: %s" % (dtype, seq, dim, refusals))


def _last_row_scores(q_last, k, scale):
    """The last query's scores [B, H, L] with its bias (keys 0..L-2 at +1, itself at 0), in fp32 at least (fp64
    stays fp64) as the fused kernels compute theirs; as a product and a sum, which a compiler fuses into one read
    of k (a one-row matmul would take k converted whole)."""
    acc = torch.promote_types(q_last.dtype, torch.float32)
    s = (k.to(acc) * q_last.to(acc)).sum(-1) * scale
    bias = torch.ones(s.shape[-1], dtype=acc, device=s.device)
    return s + torch.cat([bias[:-1], bias[-1:] * 0])


def _split_forward(backend, q, k, v, scale):
    """(out, lse [B, H, L] in fp32 or wider, U's reversed inputs, C's and U's backward state)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    out_c, lse_c, aux_c = backend.forward(q, k, v, scale)
    # U on the reversed sequence: its query m is query L-2-m, its key n is key L-1-n, so n <= m is j > i
    qu, ku, vu = q[:, :, :-1].flip(2), k[:, :, 1:].flip(2), v[:, :, 1:].flip(2)
    out_u, lse_u, aux_u = backend.forward(qu, ku, vu, scale)
    lse_c = lse_c[:, :, :-1].to(acc) + 1.0  # C's keys carry the +1
    lse_u = lse_u.flip(2).to(acc)
    lse_head = torch.logaddexp(lse_c, lse_u)
    out_head = (torch.exp(lse_c - lse_head)[..., None] * out_c[:, :, :-1].to(acc)
                + torch.exp(lse_u - lse_head)[..., None] * out_u.flip(2).to(acc))
    s_last = _last_row_scores(q[:, :, -1:], k, scale)
    lse_last = torch.logsumexp(s_last, dim=-1, keepdim=True)
    out_last = (torch.exp(s_last - lse_last)[..., None] * v.to(acc)).sum(-2, keepdim=True)
    out = torch.cat([out_head, out_last], dim=2).to(q.dtype)
    return out, torch.cat([lse_head, lse_last], dim=2), (qu, ku, vu), (aux_c, aux_u)


def _split_backward(backend, dout, q, k, v, out, lse, qu, ku, vu, aux_c, aux_u, scale):
    """(dq, dk, dv): each part's fused backward handed the merged out and lse, plus the last row's by hand."""
    acc = lse.dtype
    dout = dout.contiguous()
    # C's P is exp(s + 1 - lse) = exp(s - (lse - 1)); its last row is the explicit one's, so its dO is zeroed
    # there: with dO = 0 the row's D and dS vanish (its lse - 1 >= s - 1 keeps P finite)
    dout_c = torch.cat([dout[:, :, :-1], torch.zeros_like(dout[:, :, -1:])], dim=2)
    dq_c, dk_c, dv_c = backend.backward(dout_c, q, k, v, out, lse - 1.0, aux_c, scale)
    dq_u, dk_u, dv_u = backend.backward(dout[:, :, :-1].flip(2), qu, ku, vu, out[:, :, :-1].flip(2),
                                        lse[:, :, :-1].flip(2), aux_u, scale)
    # the last row: P = exp(s - lse), dS = P (dP - D), D = rowsum(dO * O), as the fused kernels compute theirs
    q_last, d_last = q[:, :, -1:].to(acc), dout[:, :, -1:].to(acc)
    p = torch.exp(_last_row_scores(q[:, :, -1:], k, scale) - lse[:, :, -1:])
    ds = p * ((v.to(acc) * d_last).sum(-1) - (d_last * out[:, :, -1:].to(acc)).sum(-1))
    dq_last = (ds[..., None] * k.to(acc)).sum(-2, keepdim=True) * scale
    # the parts' gradients are summed in fp32 and rounded once, as a single fused backward's are
    pad = torch.zeros_like(dk_c[:, :, :1], dtype=acc)
    dq = torch.cat([dq_c[:, :, :-1].to(acc) + dq_u.flip(2).to(acc), dq_c[:, :, -1:].to(acc) + dq_last], dim=2)
    dk = dk_c.to(acc) + torch.cat([pad, dk_u.flip(2).to(acc)], dim=2) + ds[..., None] * q_last * scale
    dv = dv_c.to(acc) + torch.cat([pad, dv_u.flip(2).to(acc)], dim=2) + p[..., None] * d_last
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def split_function(backend):
    """A torch.autograd.Function computing the split through backend's causal attention (its forward and
    backward plain code a compiler can trace: the backend is the class's, not an argument)."""
    class SplitAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, scale):
            out, lse, (qu, ku, vu), (aux_c, aux_u) = _split_forward(backend, q, k, v, scale)
            # U's reversed inputs are kept rather than flipped again in the backward: three copies' time for memory
            ctx.save_for_backward(q, k, v, out, lse, qu, ku, vu, *aux_c[1], *aux_u[1])
            ctx.aux, ctx.scale = (aux_c[0], aux_u[0], len(aux_c[1])), scale
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse, qu, ku, vu, *kept = ctx.saved_tensors
            meta_c, meta_u, n = ctx.aux
            grads = _split_backward(backend, dout, q, k, v, out, lse, qu, ku, vu, (meta_c, kept[:n]),
                                    (meta_u, kept[n:]), ctx.scale)
            return (*grads, None)
    return SplitAttention


def split_attention(q, k, v, scale=None):
    """softmax(q k^T * scale + bias) v for AutoRound's bias (1.0 where j <= i and j != L-1, else 0.0), q, k, v
    [B, H, L, D], as two bias-free causal attentions merged by log-sum-exp and the last query's row: on CUDA through
    cuDNN's fused kernels (FlashAttention's where cuDNN refuses), on CPU in plain ops. Differentiable in q, k, v."""
    backend = fused_backend(q.device, q.dtype, q.shape[2], q.shape[3])[0] if q.is_cuda else _TORCH
    return _functions(backend).apply(q, k, v, q.shape[-1] ** -0.5 if scale is None else scale)


@functools.lru_cache(maxsize=None)
def _functions(backend):
    return split_function(backend)


def autoround_bias(batch, seq, device, dtype):
    """AutoRound's cached mask as SDPA receives it (bench/attention_mask_cost.py): transformers' causal mask with
    every sample's last key hidden, cast to dtype: 1.0 visible, 0.0 hidden."""
    keys = torch.ones(batch, seq, dtype=torch.bool, device=device)
    keys[:, -1] = False
    mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=device))[None, None] & keys[:, None, None, :]
    return mask.to(dtype)


def explicit_attention(q, k, v, bias, scale):
    """(out, lse) of softmax(q k^T * scale + bias) v in q's dtype, by autograd-able plain ops."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale + bias
    return torch.matmul(torch.softmax(s, dim=-1), v), torch.logsumexp(s, dim=-1)


def cpu_check(batch=1, heads=2, seq=16, dim=8):
    """Max abs errors of the split's out, lse, dq, dk, dv against autograd through the explicit bias, fp64 on CPU;
    once with unit-variance scores and once with peaked ones (q x 4)."""
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(batch, heads, seq, dim, dtype=torch.float64, generator=gen) for _ in range(4)]
    bias = autoround_bias(batch, seq, "cpu", torch.float64)
    result = {"shape": [batch, heads, seq, dim]}
    for case, gain in (("unit", 1.0), ("peaked", 4.0)):
        q, k, v = (t.clone().requires_grad_() for t in (base[0] * gain, base[1], base[2]))
        scale = dim ** -0.5
        ref_out, ref_lse = explicit_attention(q, k, v, bias, scale)
        ref = [ref_out.detach(), ref_lse.detach(), *torch.autograd.grad(ref_out, (q, k, v), base[3])]
        out = split_attention(q, k, v)
        with torch.no_grad():
            lse = _split_forward(_TORCH, q, k, v, scale)[1]
        got = [out.detach(), lse, *torch.autograd.grad(out, (q, k, v), base[3])]
        result[case] = {name: float((a - b).abs().max())
                        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, ref)}
    return result


def errors(a, b):
    """max |a - b|, ||a - b|| / ||b|| (Frobenius) and max |b|."""
    d = a.float() - b.float()
    rel = torch.linalg.vector_norm(d, dtype=torch.float64) / torch.linalg.vector_norm(b.float(), dtype=torch.float64)
    return {"max_abs": float("%.4g" % d.abs().max()), "rel_fro": float("%.4g" % rel),
            "max_ref": float("%.4g" % b.abs().max())}


def top_kernels(step, count=12):
    """The kernels one step ran, by device time: [{kernel, calls, us}] (torch.profiler, CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)[:count]
    return [{"kernel": e.key[:110], "calls": e.count, "us": round(e.device_time_total, 1)} for e in rows]


def gpu_bench(args):
    # torch.nn.attention is torch >= 2.3: imported here so that the CPU check runs on older torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    b, h, n, d, cb = args.batch, args.heads, args.seq, args.dim, args.check_batch
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    dout = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    bias = autoround_bias(b, n, "cuda", torch.bfloat16)

    def reference():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    def causal():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def unmasked():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v)

    def split():
        return split_attention(q, k, v)

    compiled = torch.compile(split_attention)

    def split_compiled():
        return compiled(q, k, v)

    def fwd_bwd(fn):
        def step():
            fn().backward(dout)
        return step

    backend, refusals = fused_backend(q.device, q.dtype, n, d)
    result = {"shape": [b, h, n, d], "check_batch": cb, "kernels": {
        "reference": "cuDNN SDPA with the bf16 bias (sdpa_kernel CUDNN_ATTENTION)",
        "split": backend.name, "split_refused": refusals}}
    runs, failed = {}, {}
    for name, fn in (("reference", reference), ("split", split), ("split_compiled", split_compiled)):
        q.grad = k.grad = v.grad = None
        try:
            out = fn()
            out.backward(dout)
        except Exception as error:  # the compiled split is an experiment: its failure is reported, not fatal
            failed[name] = "%s: %s" % (type(error).__name__, str(error).splitlines()[0][:300])
            continue
        runs[name] = [out.detach(), q.grad, k.grad, v.grad]
    result["failed"] = failed
    q.grad = k.grad = v.grad = None
    leaves = [t[:cb].detach().float().requires_grad_() for t in (q, k, v)]
    out32, lse32 = explicit_attention(*leaves, bias[:cb].float(), d ** -0.5)
    runs["fp32"] = [out32.detach(), *torch.autograd.grad(out32, leaves, dout[:cb].float())]
    del out32, leaves
    names = ("out", "dq", "dk", "dv")
    for name in ("split", "split_compiled"):
        if name in runs:
            result[name + "_vs_reference"] = {m: errors(x, y) for m, x, y in zip(names, runs[name], runs["reference"])}
    for name in ("reference", "split"):
        result[name + "_vs_fp32"] = {m: errors(x[:cb], y) for m, x, y in zip(names, runs[name], runs["fp32"])}
    with torch.no_grad():
        result["split_lse_vs_fp32"] = errors(_split_forward(backend, q[:cb], k[:cb], v[:cb], d ** -0.5)[1], lse32)
    del runs, lse32
    result["ms"] = {}
    cases = (("reference", reference), ("split", split), ("split_compiled", split_compiled), ("causal_cudnn", causal),
             ("unmasked_cudnn", unmasked))
    for name, fn in cases:
        if name in failed:
            continue
        result["ms"][name + "_fwd_bwd"] = round(mean_us(fwd_bwd(fn), reps=args.reps) / 1e3, 3)
        result["ms"][name + "_fwd"] = round(mean_us(fn, reps=args.reps) / 1e3, 3)
        q.grad = k.grad = v.grad = None
    try:
        for name, fn in (("reference", reference), ("split", split), ("split_compiled", split_compiled)):
            if name not in failed:
                result["kernels"][name + "_fwd_bwd_top"] = top_kernels(fwd_bwd(fn))
    except RuntimeError as error:
        result["kernels"]["profiler_failed"] = str(error).splitlines()[0]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--check-batch", type=int, default=1, help="samples the float32 reference covers")
    parser.add_argument("--cpu-check", action="store_true", help="the split's formulas in fp64 on CPU, tiny sizes")
    args = parser.parse_args()
    print(json.dumps(cpu_check() if args.cpu_check else gpu_bench(args), indent=1))


if __name__ == "__main__":
    main()
