"""The quantization engines on the CPU backend's virtual devices (worlds 1 to 8): the
native GPTQ engine against the PyTorch reference and across worlds, Hessians merged in
device order, SignRound with sign-cast gradients against the serial engine."""
import itertools
import os

import pytest
import torch

import qlink
from gptq_reference import ill_conditioned_problem, inverse_factor, reference_gptq, torch_linalg_files
from qlink import collectives
from qlink.quant import (GPTQLayer, Placement, gptq_quantize, parallel_devices, parallel_gptq, parallel_hessian,
                         shard_sizes, sign_round)

WORLDS = [1, 2, 3, 4, 8]


@pytest.fixture(scope="module")
def cpu8(library):
    with qlink.load({"backend": "cpu", "cpu_devices": 8, "log_level": "off"}, library=library) as ctx:
        yield ctx


def _xtx(x):
    x = x.reshape(-1, x.shape[-1]).double()
    return (x.t() @ x).float()


def _layer(rows, cols, seed):
    gen = torch.Generator().manual_seed(seed)
    # Correlated inputs (what a model's activations are): GPTQ's error feedback pays off.
    x = torch.randn(4 * cols, 32, generator=gen) @ torch.randn(32, cols, generator=gen) + 0.1 * torch.randn(
        4 * cols, cols, generator=gen)
    return torch.randn(rows, cols, generator=gen), _xtx(x) * (2.0 / x.shape[0]), x


def test_shards_are_contiguous_with_the_remainder_first():
    assert shard_sizes(129, 4) == [33, 32, 32, 32]
    assert shard_sizes(8, 8) == [1] * 8
    assert sum(shard_sizes(1000, 7)) == 1000


@pytest.mark.parametrize("world", WORLDS)
def test_merged_hessian_matches_serial(cpu8, world):
    gen = torch.Generator().manual_seed(world)
    x = torch.randn(129, 96, generator=gen).to(torch.bfloat16)
    place = Placement(range(world), ctx=cpu8)
    shards = list(torch.split(x, shard_sizes(129, world)))
    h = parallel_hessian(shards, place)
    assert torch.allclose(h, _xtx(x.float()) * (2.0 / 129), atol=5e-7, rtol=5e-7)
    assert torch.equal(h, parallel_hessian(shards, place))  # device order: the same bits every time


def test_merged_hessian_is_bit_identical_for_every_arrival_order(cpu8):
    gen = torch.Generator().manual_seed(5)
    partials = [torch.zeros(64, 64) for _ in range(3)]
    cpu8.hessian_accumulate([torch.randn(40 + d, 64, generator=gen) for d in range(3)], partials, [0, 1, 2],
                            [0, 1, 2])
    merged = []
    for order in itertools.permutations(range(3)):
        out = torch.empty(64, 64)
        collectives.reduce([partials[d] for d in order], out, scale=2.0 / 123, ctx=cpu8, input_devices=list(order),
                           output_device=0)
        merged.append(out)
    assert all(torch.equal(m, merged[0]) for m in merged)


# The engine either on PyTorch's own BLAS and LAPACK files ("same": both run the same
# kernels, so the results must agree bit for bit) or on its default library ("own": whatever
# the machine has, against whatever PyTorch runs on; then only what holds across BLAS
# implementations is asserted). "same" skips where PyTorch carries its BLAS inside itself.
@pytest.fixture(scope="module", params=["same", "own"])
def engine_blas(request, library):
    config = {"backend": "cpu", "cpu_devices": 8, "log_level": "off"}
    if request.param == "same":
        files = torch_linalg_files()
        expected = os.environ.get("QLINK_TEST_EXPECT_BLAS")  # set where the BUILD file chose PyTorch's BLAS
        assert expected is None or (files is not None and files[0].startswith(expected)), (files, expected)
        if files is None:
            pytest.skip("PyTorch's BLAS is built into it: no file to point the engine at")
        config.update(blas_library=files[0], solver_library=files[1])
    with qlink.load(config, library=library) as ctx:
        yield request.param, ctx


# What holds across BLAS implementations (the same algorithm; the Hessian's inverse rounded
# by other blockings, a few ulps that error feedback carries along the row). Measured
# between OpenBLAS and the reference BLAS on these layers: >= 99.68 % of codes equal; on rows
# whose codes agree, scales and weights within 91 ulps and zeros equal; the loss within
# 3.6 % (one flipped code moves its row's later columns).
CODES_EQUAL_ACROSS_BLAS = 0.995
ULPS_ACROSS_BLAS = 256
LOSS_ACROSS_BLAS = 0.05


def _within_ulps(got, want, ulps):
    spacing = torch.nextafter(want.abs(), torch.tensor(float("inf"))) - want.abs()
    return bool(((got - want).abs() <= ulps * spacing).all())


@pytest.mark.parametrize("bits,group_size,sym,desc_act,static_groups,act_group_aware", [
    (4, 128, True, False, False, False), (4, 32, False, True, False, False), (3, 64, True, True, True, False),
    (2, -1, False, False, False, False), (8, 32, True, False, True, False), (4, 32, True, False, False, True),
    (3, 64, False, False, False, True)])
def test_gptq_matches_the_reference(engine_blas, bits, group_size, sym, desc_act, static_groups, act_group_aware):
    blas, ctx = engine_blas
    w, h, _ = _layer(40, 256, bits)
    h[7, :], h[:, 7] = 0, 0  # a dead column
    opts = dict(bits=bits, group_size=group_size, sym=sym, desc_act=desc_act, static_groups=static_groups,
                act_group_aware=act_group_aware)
    got = gptq_quantize(w, h, ctx=ctx, nsamples=4, **opts)
    codes, scales, zeros, g_idx, weight, loss, damp = reference_gptq(w, h, **opts)
    same = (got.codes == codes).all(1)
    assert torch.equal(got.g_idx, g_idx) and got.damp == damp
    if blas == "same":
        assert (got.codes == codes).float().mean() >= 0.999
        assert torch.equal(got.scales[same], scales[same]) and torch.equal(got.zeros[same], zeros[same])
        assert torch.equal(got.weight[same], weight[same])
        assert got.loss == pytest.approx(loss / 4, rel=1e-6)
    else:
        assert (got.codes == codes).float().mean() >= CODES_EQUAL_ACROSS_BLAS
        assert torch.equal(got.zeros[same], zeros[same])
        assert _within_ulps(got.scales[same], scales[same], ULPS_ACROSS_BLAS)
        assert _within_ulps(got.weight[same], weight[same], ULPS_ACROSS_BLAS)
        assert got.loss == pytest.approx(loss / 4, rel=LOSS_ACROSS_BLAS)


def test_gptq_beats_round_to_nearest(cpu8):
    w, h, x = _layer(64, 256, 0)
    q = gptq_quantize(w, h, bits=4, group_size=128, ctx=cpu8)
    rtn = gptq_quantize(w, torch.eye(256), bits=4, group_size=128, ctx=cpu8)  # identity H: plain rounding
    err = lambda wq: ((x @ (wq - w).t()) ** 2).mean()  # noqa: E731
    assert err(q.weight) < 0.5 * err(rtn.weight)
    g = q.g_idx.long()
    assert torch.equal(q.weight, q.scales[:, g] * (q.codes.float() - q.zeros[:, g]))
    assert q.codes.max() <= 15


def test_the_references_two_routes_give_one_factor_in_float64():
    # The reference's triangular route (the engine's, in PyTorch) is the chain's U: in
    # float64 the two agree to 1e-9 relative, so where their fp32 codes part, rounding does.
    _, h = ill_conditioned_problem(rows=8, cols=256, seed=3, device="cpu")
    hd = h.double() + 0.01 * torch.diag(h.double()).mean() * torch.eye(256, dtype=torch.float64)
    chain, triangular = (inverse_factor(hd, inverse) for inverse in ("cholesky_inverse", "triangular"))
    assert torch.equal(triangular, triangular.triu())
    assert ((triangular - chain).norm() / chain.norm()).item() < 1e-9
    assert torch.allclose(triangular.T @ triangular @ hd, torch.eye(256, dtype=torch.float64), atol=1e-8)


def test_both_inverses_stay_with_the_float64_gptq_on_an_ill_conditioned_hessian(cpu8):
    """inverse="triangular" (ABI 1.11) makes the same factor as GPTQModel's chain to fp32
    rounding: on activations with outlier channels and a shared low-rank part (H's
    condition about 1e4 after the damp) each inverse's codes stay with float64 GPTQ's but
    for near-ties, and its loss within 0.5 %."""
    gen = torch.Generator().manual_seed(5)
    cols, tokens = 1024, 4096
    shared = torch.randn(tokens, cols // 16, generator=gen, dtype=torch.float64) @ torch.randn(
        cols // 16, cols, generator=gen, dtype=torch.float64)
    x = 0.1 * torch.randn(tokens, cols, generator=gen, dtype=torch.float64) + 0.9 * shared / (cols // 16) ** 0.5
    x[:, ::37] *= 30
    h = ((2.0 / tokens) * x.T @ x).float()
    w = 0.02 * torch.randn(256, cols, generator=gen)
    codes, *_, loss, _ = reference_gptq(w.double(), h.double())
    for inverse in ("cholesky_inverse", "triangular"):
        got = gptq_quantize(w, h, inverse=inverse, ctx=cpu8)
        assert (got.codes == codes).float().mean() > 0.995, inverse
        assert got.loss == pytest.approx(loss, rel=5e-3), inverse
    with pytest.raises(ValueError, match="inverse must be one of cholesky_inverse, triangular, got 'lu'"):
        gptq_quantize(w, h, inverse="lu", ctx=cpu8)


# Worlds on the reference BLAS, the fallback's library (tests/quant:gptq_engine_test runs
# them on OpenBLAS's kernels: the machine's own and Haswell's).
REFERENCE_BLAS = {"blas_library": "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3",
                  "solver_library": "/usr/lib/x86_64-linux-gnu/lapack/liblapack.so.3"}


@pytest.fixture(scope="module")
def cpu8_reference_blas(library):
    missing = [path for path in REFERENCE_BLAS.values() if not os.path.exists(path)]
    if missing:  # tools/install_deps.sh installs them (libblas3, liblapack3); a GPU image may lack them
        pytest.skip("the reference BLAS is not installed: %s" % ", ".join(missing))
    with qlink.load(dict({"backend": "cpu", "cpu_devices": 8, "log_level": "off"}, **REFERENCE_BLAS),
                    library=library) as ctx:
        yield ctx


@pytest.mark.parametrize("world", WORLDS)
def test_parallel_gptq_is_bit_identical_at_every_world(cpu8_reference_blas, world):
    cpu8 = cpu8_reference_blas
    h_qkv, h_down = _layer(1, 128, 1)[1], _layer(1, 256, 2)[1]
    layers = [GPTQLayer(_layer(rows, h.shape[0], 10 + i)[0], h, name)
              for i, (name, rows, h) in enumerate([("q", 48, h_qkv), ("k", 48, h_qkv), ("down", 128, h_down)])]
    order = dict(desc_act=True) if world % 2 else dict(act_group_aware=True, group_size=32)
    serial = parallel_gptq(layers, None, ctx=cpu8, **order)
    dp = parallel_gptq(layers, Placement(range(world), ctx=cpu8), **order)
    for a, b in zip(serial, dp):
        for field in ("codes", "scales", "zeros", "g_idx", "weight"):
            assert torch.equal(getattr(a, field), getattr(b, field)), field
        assert a.loss == b.loss and a.damp == b.damp


def test_an_moe_layers_experts_in_one_call_equal_each_solved_alone(cpu8):
    """Issue 20's batched solve on the CPU backend: 6 experts' gate/up (sharing their
    expert's Hessian) and down, 18 linears of two shapes in one call (its 12 Hessians on the
    engine's lanes, a thread each, as many as the cores up to eight), every output
    bit-identical to its linear solved in a call of its own."""
    layers = []
    for e in range(6):
        h_up, h_down = _layer(1, 128, 40 + e)[1], _layer(1, 64, 60 + e)[1]
        layers += [GPTQLayer(_layer(64, 128, 80 + 3 * e)[0], h_up, "experts.%d.gate_proj" % e),
                   GPTQLayer(_layer(64, 128, 81 + 3 * e)[0], h_up, "experts.%d.up_proj" % e),
                   GPTQLayer(_layer(128, 64, 82 + 3 * e)[0], h_down, "experts.%d.down_proj" % e)]
    options = dict(bits=4, group_size=32, act_group_aware=True)
    together = parallel_gptq(layers, None, ctx=cpu8, **options)
    for layer, got in zip(layers, together):
        alone = gptq_quantize(layer.weight, layer.hessian.clone(), ctx=cpu8, **options)
        for field in ("codes", "scales", "zeros", "g_idx", "weight"):
            assert torch.equal(getattr(got, field), getattr(alone, field)), (layer.name, field)
        assert got.loss == alone.loss and got.damp == alone.damp, layer.name


def test_refusals_name_the_layer_and_argument(cpu8, library):
    w, h, _ = _layer(8, 96, 3)
    with pytest.raises(qlink.InvalidArgumentError, match=r"'v_proj': options->group_size 64 does not divide"):
        parallel_gptq([GPTQLayer(w, h, "v_proj")], None, ctx=cpu8, group_size=64)
    with pytest.raises(qlink.InvalidArgumentError, match=r"options->bits = 5"):
        gptq_quantize(w, h, bits=5, ctx=cpu8)
    with pytest.raises(qlink.InvalidArgumentError, match=r"options->act_group_aware excludes options->static_groups"):
        gptq_quantize(w, h, group_size=32, static_groups=True, act_group_aware=True, ctx=cpu8)
    with pytest.raises(qlink.InvalidArgumentError, match=r"'o_proj': the Hessian is not positive definite"):
        parallel_gptq([GPTQLayer(w, -h, "o_proj")], None, ctx=cpu8, group_size=32, damp_auto_increment=0.3)
    with qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=library) as other:
        with pytest.raises(ValueError, match="ctx: another context than the placement's"):
            parallel_gptq([GPTQLayer(w, h)], Placement([0], ctx=cpu8), ctx=other)


class Mlp(torch.nn.Module):
    def __init__(self, dim=128, hidden=256):
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


@pytest.mark.parametrize("world", [2, 4, 8])
def test_sign_round_with_sharded_rows_matches_serial(cpu8, world):
    torch.manual_seed(0)
    block = Mlp()
    inputs = torch.randn(16, 4, 128)
    rtn = sign_round(block, inputs, Placement([0], ctx=cpu8), iters=0)
    serial = sign_round(block, inputs, Placement([0], ctx=cpu8), iters=30, batch_size=8)
    dp = sign_round(block, inputs, Placement(range(world), ctx=cpu8), iters=30, batch_size=8)
    assert serial.loss < rtn.loss
    assert dp.loss < rtn.loss
    assert abs(dp.loss - serial.loss) <= 0.05 * serial.loss
    for name, w in serial.weights.items():
        agree = (dp.weights[name] == w).float().mean().item()
        assert agree > 0.99, (name, agree)
    again = sign_round(block, inputs, Placement(range(world), ctx=cpu8), iters=30, batch_size=8)
    # Gradients are summed in device order: a second run gives the same bits.
    assert all(torch.equal(again.weights[name], w) for name, w in dp.weights.items())


def test_sign_round_with_fewer_rows_than_replicas(cpu8):
    torch.manual_seed(2)
    block = torch.nn.Linear(128, 3)  # 3 rows over 8 replicas: five own none
    inputs = torch.randn(16, 128)
    serial = sign_round(block, inputs, Placement([0], ctx=cpu8), iters=10, batch_size=8)
    dp = sign_round(block, inputs, Placement(range(8), ctx=cpu8), iters=10, batch_size=8)
    assert abs(dp.loss - serial.loss) <= 0.05 * serial.loss


def test_parallel_devices_follow_autoround(cpu8):
    devs = [3, 0, 1, 2, 4]
    assert parallel_devices("off", devs, iters=200, batch_size=8, home=3) == [3]
    assert parallel_devices("auto", devs, iters=200, batch_size=8, home=3) == [3, 0, 1, 2]  # power of two
    assert parallel_devices("auto", devs, iters=0, batch_size=8, home=3) == [3, 0, 1, 2, 4]  # all at iters=0
    assert parallel_devices("auto", devs, iters=200, batch_size=3, home=3) == [3, 0]  # batch demotes
    assert parallel_devices(2, devs, iters=200, batch_size=8) == [3, 0]
    gpus = ["cuda:10", "cuda:2", "cuda:0"]
    assert parallel_devices("auto", gpus, iters=0, batch_size=8, home="cuda:0") == ["cuda:0", "cuda:2", "cuda:10"]
    with pytest.raises(ValueError) as refused:
        parallel_devices(6, devs, iters=200, batch_size=8)
    assert "6 replicas asked, 5 devices visible" in str(refused.value)
    assert "power-of-two world" in str(refused.value)
    with pytest.raises(ValueError, match="at least 2 replicas, got 1"):
        parallel_devices(1, devs, iters=0, batch_size=8)
    with pytest.raises(ValueError, match="must be 'off', 'auto' or an int"):
        parallel_devices("on", devs, iters=0, batch_size=8)


def test_sign_round_demotes_a_world_larger_than_the_batch(cpu8):
    torch.manual_seed(1)
    block, inputs = Mlp(), torch.randn(8, 128)
    serial = sign_round(block, inputs, Placement([0], ctx=cpu8), iters=5, batch_size=2)
    demoted = sign_round(block, inputs, Placement(range(4), ctx=cpu8), iters=5, batch_size=2)  # runs at world 2
    assert abs(demoted.loss - serial.loss) <= 0.05 * serial.loss


def test_sign_round_refuses_what_cannot_engage(cpu8):
    with pytest.raises(ValueError, match="in_features 100 is not a multiple of group_size 128"):
        sign_round(torch.nn.Linear(100, 8), torch.randn(8, 100), Placement([0], ctx=cpu8), iters=1)
    with pytest.raises(ValueError, match="each replica needs its own device"):
        Placement([0, 0], ctx=cpu8)


def test_the_engine_leaves_the_process_openblas_threads_as_it_found_them(cpu8):
    """The CPU engine runs OpenBLAS on one thread under each virtual device, only while its
    calls are inside it: PyTorch shares that OpenBLAS on Debian, and its own matmuls keep
    the process's setting."""
    import ctypes
    try:
        openblas = ctypes.CDLL("libopenblas.so.0")
    except OSError:
        pytest.skip("no libopenblas.so.0: the engine runs on another BLAS")
    before = openblas.openblas_get_num_threads()
    openblas.openblas_set_num_threads(2)
    try:
        if openblas.openblas_get_num_threads() != 2:
            pytest.skip("OpenBLAS runs one thread on this machine")
        w, h, x = _layer(64, 256, seed=11)
        parallel_gptq([GPTQLayer(w, h, device=d) for d in range(4)], None, ctx=cpu8, bits=4, group_size=128)
        parallel_hessian(list(torch.split(x, shard_sizes(x.shape[0], 4))), Placement(range(4), ctx=cpu8))
        assert openblas.openblas_get_num_threads() == 2
    finally:
        openblas.openblas_set_num_threads(before)
