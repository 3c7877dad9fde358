"""AutoRound's optimized-RTN scale search through qlink (scale_search) on the AutoRound
stand-in: the scales AutoRound's own search keeps, bit for bit, for every bit width's
candidate grid, with and without the imatrix weights, in each float dtype, on ties and
all-zero groups, with AR_SEARCH_SCALE_RATIO read as AutoRound reads it; installed in
place of AutoRound's and counted; on a GPU, no wait for it where AutoRound's waits."""
import pytest
import torch

from qlink.integrations import autoround as adapter
from qlink.integrations.autoround import scale_search

from test_integration_autoround import cpu, host  # noqa: F401 (host: the stand-in's fixture)


def _groups(dtype, device="cpu", seed=0):
    """Weight groups as AutoRound's search sees them (rows of 32), with an all-zero group and
    groups of repeated values (candidates of equal loss), and imatrix weights of their shape."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(64, 32, generator=g)
    data[3] = 0
    data[5] = data[5].sign() * 0.25  # every candidate's loss ties with the first's, or beats it
    data[7, :16] = data[7, 16:]
    weights = torch.rand(64, 32, generator=g) * 4
    return data.to(device, dtype), weights.to(device)


def _ours(int_host, data, bits, qw):
    return scale_search.search_scales(data, bits, qw, int_host.int.get_reciprocal,
                                      int_host.int.envs.AR_SEARCH_SCALE_RATIO)


@pytest.fixture
def int_host(host):  # noqa: F811
    from auto_round.data_type import int as host_int
    host.int = host_int
    return host


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # float16: the GPU test (no CPU round)
@pytest.mark.parametrize("weighted", [False, True])
def test_the_scales_are_autorounds_bit_for_bit(int_host, bits, dtype, weighted):
    data, weights = _groups(dtype)
    qw = weights if weighted else None
    want = int_host.int.search_scales(data, bits, qw)
    got = _ours(int_host, data, bits, qw)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)
    assert not torch.equal(got, int_host.int.get_reciprocal(-int(2 ** (bits - 1)) *
                                                            int_host.int.get_reciprocal(data.abs().amax(-1, True))))


@pytest.mark.parametrize("chunk", [1, 3, 16, 1000])
def test_any_chunk_of_candidates_keeps_autorounds_scales(int_host, monkeypatch, chunk):
    """Equal losses across a chunk's edge keep the earlier candidate; NaN and infinite
    losses never replace the kept scale, as AutoRound's strict comparison has it."""
    data, weights = _groups(torch.float32, seed=3)
    data[9, 4] = float("nan")
    data[11, 2] = float("inf")
    data[13] *= 1e20  # every candidate's loss overflows to infinity, their scales apart
    monkeypatch.setattr(scale_search, "CHUNK_CANDIDATES", chunk)
    for bits in (2, 4):
        want = int_host.int.search_scales(data, bits, weights)
        got = _ours(int_host, data, bits, weights)
        assert torch.allclose(got, want, rtol=0, atol=0, equal_nan=True)  # equal, NaN where AutoRound's is


def test_the_search_ratio_is_read_from_autorounds_settings(int_host, monkeypatch):
    data, weights = _groups(torch.float32, seed=1)
    default = _ours(int_host, data, 4, weights)
    monkeypatch.setenv("AR_SEARCH_SCALE_RATIO", "0.2")
    narrow = _ours(int_host, data, 4, weights)
    assert torch.equal(narrow, int_host.int.search_scales(data, 4, weights))
    assert not torch.equal(narrow, default)


def test_installed_the_host_search_is_qlinks_and_counted(int_host, library):
    data, weights = _groups(torch.float32, seed=2)
    want = int_host.int.search_scales(data, 4, weights)
    adapter.install("auto", ctx=cpu(library, 1), strict=True)
    assert int_host.int.search_scales is not scale_search.search_scales
    assert torch.equal(int_host.int.search_scales(data, 4, weights), want)
    assert int_host.int.search_scales(data, 4) is not None
    assert adapter.counters()["seams"]["scale_search"]["qlink"] == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_on_a_gpu_nothing_waits_for_the_search(int_host, dtype):
    data, weights = _groups(dtype, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = _ours(int_host, data, 4, weights)
        with pytest.raises(RuntimeError, match="synchroniz"):
            int_host.int.search_scales(data, 4, weights)  # the host's: a wait a candidate
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got, int_host.int.search_scales(data, 4, weights))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_on_a_gpu_a_layer_sized_search_is_autorounds(int_host, dtype):
    """A 4096 x 2048 weight in groups of 128 (chunks of 4 candidates): the chunk's reductions
    over (candidates, groups, columns) sum each group as AutoRound's do over (groups, columns)."""
    g = torch.Generator().manual_seed(4)
    data = (torch.randn(65536, 128, generator=g) * 0.02).to("cuda", dtype)
    weights = (torch.rand(65536, 128, generator=g) * 4).cuda()
    assert torch.equal(_ours(int_host, data, 4, weights), int_host.int.search_scales(data, 4, weights))
