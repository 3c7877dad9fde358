"""The quantization engines on real GPUs (the accelerator machine); skipped where PyTorch
sees none."""
import pytest
import torch

from qlink.quant import Placement, gptq, parallel_gptq, sign_round

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


def _problem(rows=96, cols=384, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 32, generator=gen) @ torch.randn(32, cols, generator=gen) + 0.1 * torch.randn(512, cols,
                                                                                                      generator=gen)
    return torch.randn(rows, cols, generator=gen).cuda(), (gptq.hessian(x) * (2.0 / 512)).cuda()


@pytest.mark.parametrize("group_size", [128, 32, -1])
def test_graphed_gptq_equals_the_eager_loop(monkeypatch, group_size):
    w, h = _problem(cols=384 + 40)  # three full blocks through the graph, then a partial one eagerly
    graphed = gptq.gptq_quantize(w, h, group_size=group_size)
    monkeypatch.setattr(gptq, "_graphs_usable", lambda device: False)
    eager = gptq.gptq_quantize(w, h, group_size=group_size)
    assert torch.equal(graphed.weight, eager.weight)
    assert torch.equal(graphed.scales, eager.scales) and torch.equal(graphed.zeros, eager.zeros)


@two_gpus
def test_parallel_gptq_on_two_gpus_equals_one(ctx):
    w, h = _problem(rows=301)
    one = parallel_gptq(w, h, Placement([0], ctx=ctx))
    two = parallel_gptq(w, h, Placement([0, 1], ctx=ctx))
    # Row shards run the same kernels on fewer rows; cuBLAS may round a row subset apart.
    assert torch.allclose(two.scales, one.scales, rtol=1e-5, atol=1e-7)
    assert (two.weight == one.weight).float().mean() > 0.9


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
