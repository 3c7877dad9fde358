"""The pack patch against the stand-in GPTQModel (tests/python/hosts) on the CPU backend:
pack_block's native-packer slot taken by qlink.quant.gptq_pack, every buffer it registers
equal to the stand-in's Python packer's, counted; a layer qlink refuses packed by the host
(counted as a fallback, or FallbackRefused under strict); uninstall gives the slot back."""
import pytest
import torch

import qlink
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.patches import FallbackRefused

from stand_in_hosts import stand_in
from test_gptq_pack import layer


@pytest.fixture
def host(library):
    with stand_in("gptqmodel", adapter):
        from gptqmodel.nn_modules import qlinear
        from gptqmodel.nn_modules.qlinear import pack_block_ext
        ctx = qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library)
        yield dict(qlinear=qlinear, pack_block_ext=pack_block_ext, ctx=ctx)


def packed(host, linear, scales, zeros, g_idx, bits=4):
    module = host["qlinear"].PackableQuantLinear(bits, linear.in_features, linear.out_features,
                                                 name="model.layers.0.mlp.down_proj")
    module.pack_block(linear, scales, zeros, g_idx)
    return {name: buffer.clone() for name, buffer in module.named_buffers()}


def same(a, b):
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_block_runs_through_qlink_with_the_python_packers_buffers(host, bits):
    linear, scales, zeros, g_idx = layer(bits=bits, act_order=True)
    linear.bias = torch.nn.Parameter(torch.randn(linear.out_features))
    alone = packed(host, linear, scales, zeros, g_idx, bits)
    original = host["pack_block_ext"].pack_block_cpu
    adapter.install(ctx=host["ctx"], strict=True)
    assert host["pack_block_ext"].pack_block_cpu is not original
    through_qlink = packed(host, linear, scales, zeros, g_idx, bits)
    assert same(through_qlink, alone) and {"qweight", "qzeros", "scales", "g_idx", "bias"} <= alone.keys()
    assert adapter.counters()["seams"]["pack"] == {"qlink": 1, "host": 0, "fallback": 0, "reasons": {}}
    adapter.uninstall()
    assert host["pack_block_ext"].pack_block_cpu is original


def test_a_layer_qlink_refuses_is_packed_by_the_host_or_raises_when_strict(host):
    linear, scales, zeros, g_idx = layer()
    scales[3, 1] = 0.0  # the Python packer divides by it; gptq_pack refuses it
    alone = packed(host, linear, scales, zeros, g_idx)
    adapter.install(ctx=host["ctx"])
    assert same(packed(host, linear, scales, zeros, g_idx), alone)
    counts = adapter.counters()["seams"]["pack"]
    assert counts["fallback"] == 1 and counts["qlink"] == 0
    assert list(counts["reasons"]) == ["ValueError: scales: a zero or non-finite scale"]
    adapter.install(ctx=host["ctx"], strict=True)
    with pytest.raises(FallbackRefused, match="^model.layers.0.mlp.down_proj: qlink's pack failed.*scales"):
        packed(host, linear, scales, zeros, g_idx)


def test_words_of_another_width_go_to_the_hosts_packer_counted(host):
    linear, scales, zeros, g_idx = layer()
    adapter.install(ctx=host["ctx"], strict=True)
    with pytest.raises(RuntimeError, match="extension unavailable"):  # the stand-in's absent extension
        host["pack_block_ext"].pack_block_cpu(linear.weight, scales.T, zeros.T, g_idx, 4, 16, 8192, 1)
    assert adapter.counters()["seams"]["pack"]["reasons"] == {"16-bit words": 1}
