"""hessian_accumulate's precisions and the HessianAccumulator on a real GPU (the accelerator
machine); skipped where PyTorch sees none. The bounds are loose ones a wrong path breaks by
orders of magnitude (an unsummed block, an unmirrored triangle, fp16 read as bf16), except
that the tensor precision's CUDA kernel, which promotes its sums out of the tensor cores
every 32 rows, must be as accurate as the IEEE path; the measured errors are
bench/hessian_precision.py's."""
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


# 1024: CUDA's kernel; 1030 (not a multiple of 8: the kernel's 16-byte loads cannot take
# it): GemmEx, with an odd half, so its diagonal blocks differ in size.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cols", [1024, 1030])
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


# Columns past the last whole 128-column tile (136, 264) and rows past the last whole 32-row
# k-tile (600 and 400 rows per call, into one partial) must be summed like the rest: a tile
# missed, a tail not zero-filled or a partial overwritten instead of added to is an error
# of 1e-3 or more, where both paths should be near 1e-6 or below. No outlier channel: one
# entry would then carry most of either error, and the ratio would be a coin toss.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cols", [136, 264])
def test_tensor_precision_is_as_accurate_as_ieee_on_tile_tails(ctx, dtype, cols):
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(1000, cols, device="cuda", generator=gen).to(dtype)
    errors = {}
    for precision in ("ieee_fp32", "tensor"):
        h = torch.zeros(cols, cols, device="cuda")
        for part in (x[:600], x[600:]):
            ctx.hessian_accumulate([part], [h], precision=precision)
        torch.cuda.synchronize()
        assert torch.equal(h, h.T), precision
        errors[precision] = _relative_error(h, x)
    assert errors["ieee_fp32"] < 1e-5
    assert errors["tensor"] <= 2 * errors["ieee_fp32"], errors


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tensor_gemm_precision_is_the_vendors_gemm_close_and_symmetric(ctx, dtype):
    """tensor_gemm (ABI 1.11) at 1024 columns, where "tensor" takes qlink's kernel: GemmEx
    instead (its bytes are what "tensor" gives at 1030 columns' path), symmetric, within the
    tensor precision's bound of float64."""
    x = _tokens(5000, 1024, dtype)
    results = {}
    for precision in ("tensor", "tensor_gemm"):
        h = torch.zeros(1024, 1024, device="cuda")
        ctx.hessian_accumulate([x], [h], precision=precision)
        torch.cuda.synchronize()
        assert torch.equal(h, h.T), precision
        assert _relative_error(h, x) < 1e-3, precision
        results[precision] = h
    assert not torch.equal(results["tensor"], results["tensor_gemm"])  # not qlink's kernel


# GemmEx's lower triangle split again while a half keeps 4096 columns: 4099 once, into
# unequal halves; 8200 twice. A block missed or added twice is an error of 0.1 or more.
@pytest.mark.parametrize("cols", [4099, 8200])
def test_tensor_gemm_sums_every_block_of_a_split_triangle(ctx, cols):
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(2500, cols, device="cuda", generator=gen).to(torch.bfloat16)  # two calls of at most 2048 rows
    h = torch.zeros(cols, cols, device="cuda")
    ctx.hessian_accumulate([x], [h], precision="tensor_gemm")
    torch.cuda.synchronize()
    assert torch.equal(h, h.T)
    assert _relative_error(h, x) < 1e-3


def test_tensor_precision_takes_misaligned_inputs(ctx):
    # Two bytes into the buffer: not 16-byte aligned, so GemmEx rather than the kernel.
    flat = _tokens(1, 3000 * 512 + 1, torch.bfloat16).flatten()
    x = flat[1:].view(3000, 512)
    h = torch.zeros(512, 512, device="cuda")
    ctx.hessian_accumulate([x], [h], precision="tensor")
    torch.cuda.synchronize()
    assert torch.equal(h, h.T)
    assert _relative_error(h, x) < 1e-3


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
