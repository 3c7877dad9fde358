"""ABI 1.10's experts calls on the GPU's kernels (one launch a pass, 224 experts a launch):
every expert's qdq, gradients, stepped v and SignSGD step equal the per-layer kernels',
bit for bit, experts without tokens left as they were; skipped where PyTorch sees no GPU."""
import pytest
import torch

from test_signround_experts import _backward_layers, _forward_layers

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _experts(count, rows, cols, group_size, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    group_len = cols if group_size == -1 else group_size
    groups = rows * cols // group_len
    out = []
    for _ in range(count):
        w = (0.05 * torch.randn(rows, cols, generator=gen, device="cuda")).to(dtype)
        v = torch.rand(groups, group_len, generator=gen, device="cuda") - 0.5
        lo, hi = (torch.rand(groups, generator=gen, device="cuda") * 1.4 - 0.1 for _ in range(2))
        out.append((w, v, lo, hi, torch.randn(rows, cols, generator=gen, device="cuda").to(dtype)))
    return out


def _layers(experts, backward, step):
    return _backward_layers(experts, step) if backward else _forward_layers(experts)


# Team kernels (group lengths 128, 32 with vector loads) and the generic one (-1 over 384).
@pytest.mark.parametrize("count,group_size,cols,sym,dtype", [
    (3, 128, 512, True, torch.bfloat16), (230, 32, 256, False, torch.float16), (4, -1, 384, True, torch.bfloat16),
    (5, 64, 512, False, torch.float32)])
@pytest.mark.parametrize("with_tokens", [False, True])
def test_experts_equal_the_per_layer_kernels(ctx, count, group_size, cols, sym, dtype, with_tokens):
    options = {"bits": 4, "group_size": group_size, "sym": sym, "scale_dtype": torch.float16, "q_scale_thresh": 1e-5}
    experts = _experts(count, 16, cols, group_size, dtype, seed=count)
    tokens = torch.tensor([0 if i % 3 == 1 else i + 1 for i in range(count)], device="cuda") if with_tokens else None
    empty = {i for i in range(count) if with_tokens and i % 3 == 1}
    step = {"step_lrs": torch.tensor([0.25, 0.005], device="cuda"), "loss": torch.tensor([1.0], device="cuda"),
            "best_loss": torch.tensor([2.0], device="cuda")}
    for backward, with_step, fields in [(False, False, ("qdq", "min_scale", "max_scale")),
                                        (True, False, ("grad_v", "grad_min_scale", "grad_max_scale")),
                                        (True, True, ("v", "best_v", "grad_min_scale"))]:
        grouped, single = _layers(experts, backward, with_step), _layers(experts, backward, with_step)
        s = step if with_step else None
        ctx.signround_experts_qdq(grouped, options, tokens=tokens, backward=backward, step=s)
        for i, layer in enumerate(single):
            if i not in empty:
                ctx.signround_qdq([layer], options, backward=backward, step=s)
        torch.cuda.synchronize()
        for i, (g, o) in enumerate(zip(grouped, single)):
            for field in fields:
                if i in empty and field == "best_v":
                    assert torch.equal(g[field], experts[i][1]), "expert %d: v kept as best" % i
                else:  # an empty expert's as it was before the call
                    torch.testing.assert_close(g[field], o[field], rtol=0, atol=0, equal_nan=True,
                                               msg="expert %d: %s" % (i, field))


def test_the_experts_step_equals_signsgd_step_on_the_gpu(ctx):
    """240 experts of two tensors each, every fourth without tokens: those keep their
    params, every expert is kept as best, the others step as signsgd_step steps them."""
    count = 240
    tokens = torch.tensor([i % 4 for i in range(count)], device="cuda", dtype=torch.int32)

    def state():
        gen = torch.Generator(device="cuda").manual_seed(6)
        params = [{"param": torch.randn(n, generator=gen, device="cuda"),
                   "grad": torch.randn(n, generator=gen, device="cuda"), "best": torch.zeros(n, device="cuda"),
                   "lr_group": k} for _ in range(count) for k, n in enumerate((1024, 8))]
        lrs = torch.tensor([0.25, 0.005], device="cuda")
        schedule = {"epoch": torch.tensor([0], device="cuda"), "total_iters": 4,
                    "loss": torch.tensor([1.0], device="cuda"), "best_loss": torch.tensor([2.0], device="cuda")}
        return params, lrs, schedule
    grouped, g_lrs, g_schedule = state()
    single, s_lrs, s_schedule = state()
    before = [p["param"].clone() for p in grouped]
    ctx.signsgd_experts_step(grouped, count, g_lrs, tokens=tokens, **g_schedule)
    ctx.signsgd_step([p for i, p in enumerate(single) if i // 2 % 4 != 0], s_lrs, **s_schedule)
    torch.cuda.synchronize()
    for i, (g, o) in enumerate(zip(grouped, single)):
        assert torch.equal(g["best"], before[i])
        assert torch.equal(g["param"], before[i] if i // 2 % 4 == 0 else o["param"])
    assert torch.equal(g_lrs, s_lrs) and torch.equal(g_schedule["epoch"], s_schedule["epoch"])
