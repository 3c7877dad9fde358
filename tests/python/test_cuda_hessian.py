"""hessian_accumulate's precisions and the HessianAccumulator on a real GPU (the accelerator
machine); skipped where PyTorch sees none. The bounds are loose ones a wrong path breaks by
orders of magnitude (an unsummed block, an unmirrored triangle, fp16 read as bf16); the
measured errors are bench/hessian_precision.py's."""
import pytest
import torch

from qlink.quant import HessianAccumulator

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _tokens(rows, cols, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, cols, device="cuda", generator=gen)
    x[:, 5] *= 40  # an outlier channel
    return x.to(dtype)


def _relative_error(h, x):
    exact = x.double().T @ x.double()
    return (torch.linalg.matrix_norm(h.double() - exact) / torch.linalg.matrix_norm(exact)).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cols", [1024, 1030])  # an odd half: the diagonal blocks differ in size
def test_tensor_precision_is_close_and_symmetric(ctx, dtype, cols):
    x = _tokens(5000, cols, dtype)  # 3 products of at most 2048 rows
    results = {}
    for precision in ("ieee_fp32", "tensor"):
        h = torch.zeros(cols, cols, device="cuda")
        ctx.hessian_accumulate([x], [h], precision=precision)
        torch.cuda.synchronize()
        assert torch.equal(h, h.T), precision
        results[precision] = h
    assert _relative_error(results["ieee_fp32"], x) < 1e-5
    assert _relative_error(results["tensor"], x) < 1e-3
    assert not torch.equal(results["tensor"], results["ieee_fp32"])  # the tensor cores did sum it


def test_fp32_inputs_keep_the_ieee_path_under_tensor(ctx):
    x = _tokens(3000, 512, torch.float32)
    out = []
    for precision in ("ieee_fp32", "tensor"):
        h = torch.zeros(512, 512, device="cuda")
        ctx.hessian_accumulate([x], [h], precision=precision)
        out.append(h)
    torch.cuda.synchronize()
    assert torch.equal(out[0], out[1])


def test_the_accumulator_shares_on_the_gpu_and_matches_one_call(ctx):
    xs = [_tokens(2048, 768, torch.bfloat16, seed=s) for s in range(4)]
    acc = HessianAccumulator(ctx, precision="tensor")
    q = k = None
    for x in xs:
        q, k = acc.add(x, q), acc.add(x.data.view(1, 2048, 768), k)
    assert q is k
    whole = torch.zeros(768, 768, device="cuda")
    for x in xs:  # the same products, one call per batch as the accumulator makes them
        ctx.hessian_accumulate([x], [whole], precision="tensor")
    torch.cuda.synchronize()
    assert torch.equal(q, whole)
    assert acc.counters() == {"accumulations": 4, "shared": 4, "rows": 4 * 2048, "calls": 4}
