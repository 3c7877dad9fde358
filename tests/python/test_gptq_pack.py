"""qlink.quant.gptq_pack against the stand-in GPTQModel's Python packer (tests/python/hosts,
written from what GPTQModel's pack_block does): the same int32 words, bit for bit, for 2-,
4- and 8-bit codes, weights in each 16- and 32-bit float dtype, groups in any column order
(act-order) and counted from the end, codes on exact halves; and every refusal names its
argument. gptq_pack_many: each layer of a batch packed as gptq_pack packs it alone, a layer
it cannot hold refused alone."""
import pytest
import torch

from qlink.integrations import gptqmodel as adapter
from qlink.quant import gptq_pack, gptq_pack_many

from stand_in_hosts import stand_in


@pytest.fixture
def packer():
    with stand_in("gptqmodel", adapter):
        from gptqmodel.nn_modules.qlinear import PackableQuantLinear
        yield PackableQuantLinear


def layer(out_features=64, in_features=256, group_size=32, bits=4, dtype=torch.bfloat16, act_order=False, seed=0):
    """A quantized linear as GPTQModel's finalizer hands it to pack_block: the weight
    dequantized from its codes in the layer's dtype, scales and zeros (out, groups),
    each input column's group."""
    gen = torch.Generator().manual_seed(seed)
    groups, maxq = in_features // group_size, 2 ** bits - 1
    scales = torch.rand(out_features, groups, generator=gen) * 0.02 + 1e-3
    zeros = torch.randint(0, maxq + 1, (out_features, groups), generator=gen).float()
    g_idx = torch.arange(in_features) // group_size
    if act_order:
        g_idx = g_idx[torch.randperm(in_features, generator=gen)]
    codes = torch.randint(0, maxq + 1, (out_features, in_features), generator=gen).float()
    weight = (scales[:, g_idx] * (codes - zeros[:, g_idx])).to(dtype)
    linear = torch.nn.Linear(in_features, out_features, bias=False)
    linear.weight.data = weight
    return linear, scales, zeros, g_idx.to(torch.int32)


def reference(packer, linear, scales, zeros, g_idx, bits):
    module = packer(bits, linear.in_features, linear.out_features)
    module._pack_in_python(linear.weight.detach(), scales.T.contiguous(), zeros.T.contiguous(), g_idx)
    return module.qweight, module.qzeros


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("act_order", [False, True])
def test_the_words_are_the_python_packers_bit_for_bit(packer, bits, dtype, act_order):
    linear, scales, zeros, g_idx = layer(bits=bits, dtype=dtype, act_order=act_order)
    qweight, qzeros = gptq_pack(linear.weight.detach(), scales.T.contiguous(), zeros.T.contiguous(), g_idx, bits)
    expected = reference(packer, linear, scales, zeros, g_idx, bits)
    assert same_bits(qweight, expected[0]) and same_bits(qzeros, expected[1])
    assert qweight.shape == (linear.in_features * bits // 32, linear.out_features)


def test_codes_on_exact_halves_round_to_even_as_the_python_packer_does(packer):
    linear, scales, zeros, g_idx = layer(dtype=torch.float32, group_size=256)
    scales.fill_(0.5)  # w / 0.5 + zero lands on .25 steps: the halves are exact
    linear.weight.data = torch.arange(linear.weight.numel(), dtype=torch.float32).remainder(29).sub(14).mul(0.25) \
        .view_as(linear.weight)
    qweight, qzeros = gptq_pack(linear.weight.detach(), scales.T.contiguous(), zeros.T.contiguous(), g_idx, 4)
    expected = reference(packer, linear, scales, zeros, g_idx, 4)
    assert same_bits(qweight, expected[0]) and same_bits(qzeros, expected[1])


def test_groups_counted_from_the_end_are_the_groups_they_name(packer):
    linear, scales, zeros, g_idx = layer(act_order=True, seed=3)
    groups = scales.shape[1]
    negative = torch.where(torch.arange(g_idx.numel()) % 3 == 0, g_idx - groups, g_idx)
    words = gptq_pack(linear.weight.detach(), scales.T.contiguous(), zeros.T.contiguous(), negative, 4)
    expected = reference(packer, linear, scales, zeros, g_idx, 4)
    assert same_bits(words[0], expected[0]) and same_bits(words[1], expected[1])


def test_codes_past_the_range_saturate_instead_of_wrapping(packer):
    linear, scales, zeros, g_idx = layer(dtype=torch.float32)
    linear.weight.data[0, :8] = torch.tensor([1e3, -1e3] * 4)
    qweight, _ = gptq_pack(linear.weight.detach(), scales.T.contiguous(), zeros.T.contiguous(), g_idx, 4)
    assert same_bits(qweight, reference(packer, linear, scales, zeros, g_idx, 4)[0])
    assert (qweight[0, 0] & 0xF).item() == 15 and ((qweight[0, 0] >> 4) & 0xF).item() == 0


def args(**change):
    linear, scales, zeros, g_idx = layer()
    given = dict(weight=linear.weight.detach(), scales=scales.T.contiguous(), zeros=zeros.T.contiguous(), g_idx=g_idx,
                 bits=4)
    given.update(change)
    return given


@pytest.mark.parametrize("change, named", [
    (dict(bits=3), "bits"),
    (dict(weight=torch.zeros(64)), "weight"),
    (dict(weight=torch.zeros(64, 250)), "weight"),
    (dict(scales=torch.ones(8, 63)), "scales"),
    (dict(zeros=torch.zeros(4, 64)), "zeros"),
    (dict(g_idx=torch.zeros(255, dtype=torch.int32)), "g_idx"),
    (dict(g_idx=torch.zeros(256)), "g_idx"),
])
def test_shapes_and_widths_the_layout_cannot_hold_are_refused_by_name(change, named):
    with pytest.raises(ValueError, match="^" + named):
        gptq_pack(**args(**change))


def _spoiled(name, index, value):
    given = args()
    given[name] = given[name].clone()
    given[name].view(-1)[index] = value
    return given


@pytest.mark.parametrize("name, value", [
    ("weight", float("nan")), ("weight", float("inf")), ("scales", 0.0), ("scales", float("nan")),
    ("zeros", 0.5), ("zeros", -1.0), ("zeros", 16.0), ("g_idx", 8), ("g_idx", -9),
])
def test_values_the_layout_cannot_hold_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match="^" + name):
        gptq_pack(**_spoiled(name, 5, value))


def _batch(count=5, **kwargs):
    layers = [layer(seed=seed, act_order=seed % 2 == 1, **kwargs) for seed in range(count)]
    return ([linear.weight.detach() for linear, *_ in layers], [s.T.contiguous() for _, s, _, _ in layers],
            [z.T.contiguous() for _, _, z, _ in layers], [g for *_, g in layers])


@pytest.mark.parametrize("chunk_elements", [1 << 26, 1])
def test_a_batch_packs_each_layer_as_gptq_pack_does_it_alone(chunk_elements):
    weights, scales, zeros, g_idx = _batch()
    qweight, qzeros, refusals = gptq_pack_many(weights, scales, zeros, g_idx, 4, chunk_elements=chunk_elements)
    assert refusals == [None] * 5 and qweight.shape[0] == qzeros.shape[0] == 5
    for i, words in enumerate(zip(weights, scales, zeros, g_idx)):
        alone = gptq_pack(*words, 4)
        assert same_bits(qweight[i], alone[0]) and same_bits(qzeros[i], alone[1])


def test_a_layer_of_a_batch_the_layout_cannot_hold_is_refused_alone_by_name():
    weights, scales, zeros, g_idx = _batch()
    scales[2] = scales[2].clone()
    scales[2][0, 3] = 0.0
    qweight, _, refusals = gptq_pack_many(weights, scales, zeros, g_idx, 4)
    assert refusals[2].startswith("scales") and refusals[:2] + refusals[3:] == [None] * 4
    assert same_bits(qweight[3], gptq_pack(weights[3], scales[3], zeros[3], g_idx[3], 4)[0])


def test_a_batch_of_unlike_shapes_is_refused_by_name():
    weights, scales, zeros, g_idx = _batch(count=2)
    other = layer(out_features=32)
    with pytest.raises(ValueError, match="^weights"):
        gptq_pack_many([weights[0], other[0].weight.detach()], [scales[0], other[1].T.contiguous()],
                       [zeros[0], other[2].T.contiguous()], [g_idx[0], other[3]], 4)
    with pytest.raises(ValueError, match="^weights"):
        gptq_pack_many([], [], [], [], 4)
