"""The defuser stand-in (bench/hosts/standins/defuser) on a fused-experts MoE block written
here in transformers 5's Qwen3-MoE layout (its router, its experts with `gate_up_proj`
(experts, 2 * intermediate, hidden) and `down_proj` (experts, hidden, intermediate), its
eager experts loop and its sparse block's forward): split into per-expert linears, the
block gives the fused block's output, every per-expert weight is its fused slice bit for
bit, experts no token reaches still work, and each expert's linears see only its routed
rows (what GPTQModel's forward hooks record)."""
import copy
import importlib
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

STANDINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "hosts", "standins")


@pytest.fixture
def defuser():
    """The stand-in imported from bench/hosts/standins, forgotten after the test."""
    sys.path.insert(0, STANDINS)
    try:
        yield importlib.import_module("defuser")
    finally:
        sys.path.remove(STANDINS)
        for name in [n for n in sys.modules if n == "defuser" or n.startswith("defuser.")]:
            del sys.modules[name]


class Config:
    def __init__(self, hidden=32, inter=24, experts=16, top_k=4, norm_topk_prob=True):
        self.hidden_size, self.moe_intermediate_size = hidden, inter
        self.num_experts, self.num_experts_per_tok, self.norm_topk_prob = experts, top_k, norm_topk_prob


class TopKRouter(nn.Module):
    """transformers' Qwen2MoeTopKRouter (Qwen3MoeTopKRouter's parent)."""

    def __init__(self, config):
        super().__init__()
        self.top_k, self.num_experts = config.num_experts_per_tok, config.num_experts
        self.norm_topk_prob, self.hidden_dim = config.norm_topk_prob, config.hidden_size
        self.weight = nn.Parameter(torch.zeros(self.num_experts, self.hidden_dim))

    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = F.linear(hidden_states, self.weight)
        router_probs = F.softmax(router_logits, dtype=torch.float, dim=-1)
        top_value, indices = torch.topk(router_probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_value /= top_value.sum(dim=-1, keepdim=True)
        return router_logits, top_value.to(router_logits.dtype), indices


def _default_apply_gate(self, gate_up_out):
    """transformers.integrations.moe's default gate, which its use_experts_implementation
    decorator gives every experts class that has none."""
    gate, up = gate_up_out.chunk(2, dim=-1)
    return self.act_fn(gate) * up


class Experts(nn.Module):
    """transformers' fused experts (MixtralExperts, which Qwen3MoeExperts inherits), eager,
    with the attributes use_experts_implementation adds."""

    _apply_gate = _default_apply_gate
    is_transposed = False
    has_bias = False

    def __init__(self, config):
        super().__init__()
        self.num_experts = config.num_experts
        self.hidden_dim, self.intermediate_dim = config.hidden_size, config.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, 2 * self.intermediate_dim, self.hidden_dim))
        self.down_proj = nn.Parameter(torch.empty(self.num_experts, self.hidden_dim, self.intermediate_dim))
        self.act_fn = nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final = torch.zeros_like(hidden_states)
        with torch.no_grad():
            mask = F.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for index in hit:
            index = index[0]
            if index == self.num_experts:
                continue
            top_k_pos, token_idx = torch.where(mask[index])
            gate, up = F.linear(hidden_states[token_idx], self.gate_up_proj[index]).chunk(2, dim=-1)
            out = F.linear(self.act_fn(gate) * up, self.down_proj[index])
            out = out * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, out.to(final.dtype))
        return final


class SparseMoeBlock(nn.Module):
    """transformers' Qwen3MoeSparseMoeBlock."""

    def __init__(self, config):
        super().__init__()
        self.experts = Experts(config)
        self.gate = TopKRouter(config)

    def forward(self, hidden_states):
        batch, seq, hidden = hidden_states.shape
        flat = hidden_states.view(-1, hidden)
        _, routing_weights, selected = self.gate(flat)
        return self.experts(flat, selected, routing_weights).reshape(batch, seq, hidden)


class Layer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.mlp = SparseMoeBlock(config)


class Model(nn.Module):
    """Just enough of a decoder for the names GPTQModel's qwen3_moe tree uses."""

    def __init__(self, config, layers=2):
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([Layer(config) for _ in range(layers)])


def randomized(model, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.2)
    return model.to(dtype)


def bits(t):
    """t's bytes as integers of its width: equal only where every bit is."""
    return t.view({torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}[t.dtype])


def tokens(config, dtype, batch=2, seq=5, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, config.hidden_size, generator=gen, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_the_split_block_gives_the_fused_output_in_float64(defuser, norm_topk_prob):
    config = Config(norm_topk_prob=norm_topk_prob)
    fused = randomized(Model(config), torch.float64)
    split = copy.deepcopy(fused)
    assert defuser.convert_model(split) is True
    x = tokens(config, torch.float64, batch=3, seq=7)
    for a, b in zip(fused.model.layers, split.model.layers):
        want, got = a.mlp(x), b.mlp(x)
        assert got.dtype == torch.float64
        assert torch.allclose(got, want, rtol=0, atol=1e-12), (got - want).abs().max().item()


def test_the_split_block_gives_the_fused_output_in_bfloat16(defuser):
    config = Config(hidden=64, inter=48, experts=32, top_k=8)
    fused = randomized(Model(config, layers=1), torch.bfloat16)
    split = copy.deepcopy(fused)
    defuser.convert_model(split)
    x = tokens(config, torch.bfloat16, batch=4, seq=16)
    want, got = fused.model.layers[0].mlp(x), split.model.layers[0].mlp(x)
    assert got.dtype == torch.bfloat16
    # The same routing, and each expert's rows through the same arithmetic: at most a
    # unit in the last place of bfloat16 where a split matmul rounds apart from the fused.
    assert torch.allclose(got.float(), want.float(), rtol=2 ** -7, atol=1e-6), (got - want).abs().max().item()


def test_every_per_expert_weight_is_its_fused_slice_bit_for_bit(defuser):
    config = Config()
    for dtype in (torch.float64, torch.bfloat16):
        fused = randomized(Model(config, layers=1), dtype)
        split = copy.deepcopy(fused)
        defuser.convert_model(split)
        experts, inter = fused.model.layers[0].mlp.experts, config.moe_intermediate_size
        names = dict(split.named_modules())
        for e in range(config.num_experts):
            expert = names["model.layers.0.mlp.experts.%d" % e]
            for proj, want in (("gate_proj", experts.gate_up_proj[e, :inter]),
                               ("up_proj", experts.gate_up_proj[e, inter:]),
                               ("down_proj", experts.down_proj[e])):
                linear = names["model.layers.0.mlp.experts.%d.%s" % (e, proj)]
                assert type(linear) is nn.Linear and linear.bias is None and linear is getattr(expert, proj)
                w = linear.weight
                assert w.dtype == dtype and w.device == want.device and w.is_contiguous()
                assert w.shape == want.shape and torch.equal(bits(w), bits(want.contiguous()))
        assert not any(p.dim() == 3 for p in split.parameters())
        # the copies own their storage: nothing ties them to each other or to the fused tensors
        pointers = [p.data_ptr() for p in split.parameters()]
        assert len(set(pointers)) == len(pointers)


def test_experts_no_token_reaches_still_work(defuser):
    config = Config(experts=64, top_k=2)
    fused = randomized(Model(config, layers=1), torch.float64)
    split = copy.deepcopy(fused)
    defuser.convert_model(split)
    x = tokens(config, torch.float64, batch=1, seq=3)  # 6 routed rows: at most 6 of 64 experts
    block = split.model.layers[0].mlp
    _, _, selected = block.gate(x.view(-1, config.hidden_size))
    idle = sorted(set(range(config.num_experts)) - set(selected.flatten().tolist()))
    assert len(idle) >= config.num_experts - 6
    assert torch.allclose(block(x), fused.model.layers[0].mlp(x), rtol=0, atol=1e-12)
    experts = fused.model.layers[0].mlp.experts
    rows = tokens(config, torch.float64, batch=1, seq=4, seed=3).view(-1, config.hidden_size)
    for e in idle:
        assert block.experts[e](rows[:0]).shape == (0, config.hidden_size)
        gate, up = F.linear(rows, experts.gate_up_proj[e]).chunk(2, dim=-1)
        want = F.linear(F.silu(gate) * up, experts.down_proj[e])
        assert torch.allclose(block.experts[e](rows), want, rtol=0, atol=1e-12)


def test_each_experts_linears_see_only_its_routed_rows(defuser):
    config = Config(experts=16, top_k=4)
    split = randomized(Model(config, layers=1), torch.float64)
    defuser.convert_model(split)
    block = split.model.layers[0].mlp
    seen = {}

    def hook(name):
        def record(module, inputs, output):
            seen.setdefault(name, []).append(inputs[0].shape[0])
        return record
    for name, module in block.named_modules():
        if isinstance(module, nn.Linear):
            module.register_forward_hook(hook(name))
    x = tokens(config, torch.float64, batch=2, seq=6)
    block(x)
    _, _, selected = block.gate(x.view(-1, config.hidden_size))
    counts = torch.bincount(selected.flatten(), minlength=config.num_experts).tolist()
    for e, count in enumerate(counts):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            assert seen.get("experts.%d.%s" % (e, proj), []) == ([count] if count else [])


def test_nothing_fused_is_left_as_it_is_and_a_second_conversion_does_nothing(defuser):
    plain = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 4))
    before = copy.deepcopy(plain.state_dict())
    assert defuser.convert_model(plain) is False
    assert all(torch.equal(before[k], v) for k, v in plain.state_dict().items())
    config = Config()
    split = randomized(Model(config, layers=1), torch.float64)
    assert defuser.convert_model(split) is True
    experts = split.model.layers[0].mlp.experts
    assert defuser.convert_model(split) is False and split.model.layers[0].mlp.experts is experts
    from defuser.modeling.replace_modules import materialize_model
    assert materialize_model(split) is split and split.model.layers[0].mlp.experts is experts
    assert defuser.replace_fused_blocks("qwen3_moe") is None


def test_a_meta_model_splits_into_meta_linears(defuser):
    config = Config()
    shell = Model(config, layers=1).to(device="meta", dtype=torch.bfloat16)
    assert defuser.convert_model(shell, cleanup_original=False) is True
    linears = [m for m in shell.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 3 * config.num_experts
    assert all(m.weight.is_meta and m.weight.dtype == torch.bfloat16 for m in linears)


def test_fused_experts_with_biases_stay_fused(defuser):
    config = Config()
    model = Model(config, layers=1)
    experts = model.model.layers[0].mlp.experts
    experts.down_proj_bias = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))
    assert defuser.convert_model(model) is False and model.model.layers[0].mlp.experts is experts


@pytest.mark.parametrize("layout", ["transposed", "interleaved", "own_gate"])
def test_fused_experts_in_other_layouts_stay_fused(defuser, layout):
    config = Config()
    model = Model(config, layers=1)
    experts = model.model.layers[0].mlp.experts
    if layout == "transposed":
        experts.is_transposed = True
    elif layout == "interleaved":
        experts.is_concatenated = False
    else:  # a class with a gate of its own (GPT-OSS clamps and offsets it)
        class OwnGate(Experts):
            def _apply_gate(self, gate_up_out):
                gate, up = gate_up_out.chunk(2, dim=-1)
                return self.act_fn(gate) * (up + 1)

        experts = OwnGate(config)
        model.model.layers[0].mlp.experts = experts
    assert defuser.convert_model(model) is False and model.model.layers[0].mlp.experts is experts
