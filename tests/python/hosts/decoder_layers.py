"""Stand-ins for transformers 5's decoder layers of the architectures GPTQModel quantizes
(OPT, LLaMA with grouped-query attention, Qwen2, Qwen3, Mistral, Gemma2, Mixtral), small
and random, written for the tests: no transformers code. What they keep of the real
modules is what GPTQModel's hooks see: each nn.Linear's name and the shape of its input
(OPT flattens its hidden states to (tokens, hidden) before fc1 and fc2; the others keep
(batch, seq, features); Mixtral's split experts see their routed rows as (rows, hidden)),
biases (OPT, Qwen2's q/k/v), the norms around them (Qwen3's q/k norms, Gemma2's four), the
rotary tables and position ids the layer is given, and the layer's call signature
(hidden_states, then attention_mask, position_ids, position_embeddings ... by keyword)."""
import math
import types

import torch
from torch import nn
from torch.nn import functional as F

SEQ, HIDDEN, HEADS, INTER = 16, 32, 4, 48
HEAD_DIM = HIDDEN // HEADS


def config(arch):
    """The few config fields each stand-in reads, as transformers' configs name them."""
    base = dict(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=HEAD_DIM,
                intermediate_size=INTER, rms_norm_eps=1e-6, attention_bias=False, rope_theta=10000.0)
    extra = {
        "opt": dict(ffn_dim=INTER, enable_bias=True, do_layer_norm_before=True),
        "llama": dict(num_key_value_heads=HEADS // 2),  # grouped-query attention
        "qwen2": dict(num_key_value_heads=HEADS // 2, qkv_bias=True),
        "qwen3": dict(num_key_value_heads=HEADS // 2, qk_norm=True),
        "mistral": dict(num_key_value_heads=HEADS // 2),
        "gemma2": dict(num_key_value_heads=HEADS // 2, query_pre_attn_scalar=HEAD_DIM, attn_logit_softcapping=50.0),
        "mixtral": dict(num_key_value_heads=HEADS // 2, num_local_experts=4, num_experts_per_tok=2),
    }[arch]
    return types.SimpleNamespace(model_type=arch, **dict(base, **extra))


ARCHS = ("opt", "llama", "qwen2", "qwen3", "mistral", "gemma2", "mixtral")


class RMSNorm(nn.Module):
    """LlamaRMSNorm (Gemma's: offset=1, the weight stored as weight - 1)."""

    def __init__(self, size, eps, offset=0.0):
        super().__init__()
        self.weight, self.eps, self.offset = nn.Parameter(torch.randn(size) / 8 + 1 - offset), eps, offset

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return ((self.offset + self.weight.float()) * h).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_tables(position_ids, theta=10000.0):
    """(cos, sin) of shape (batch, seq, head_dim), as the model's rotary embedding gives
    every layer (batch 1 for the calibration's one-sample batches)."""
    inv = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    freqs = position_ids[..., None].float() * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def causal_mask(seq, dtype=torch.float32):
    """The additive (1, 1, seq, seq) causal mask of an eager attention."""
    return torch.full((seq, seq), torch.finfo(dtype).min).triu(1)[None, None]


def eager_attention(q, k, v, mask, scaling, softcap=None):
    """(batch, heads, seq, d) attention, key/value heads repeated to the query's (repeat_kv)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(2, 3) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores + (causal_mask(q.shape[2], q.dtype) if mask is None else mask)
    return F.softmax(scores.float(), dim=-1).to(q.dtype) @ v


class RotaryAttention(nn.Module):
    """LlamaAttention and its kin: q/k/v/o_proj, key/value heads fewer than the query's,
    Qwen2's q/k/v bias, Qwen3's per-head q_norm/k_norm, Gemma2's scaling and softcapping."""

    def __init__(self, cfg):
        super().__init__()
        heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = getattr(cfg, "qkv_bias", cfg.attention_bias)
        self.q_proj = nn.Linear(cfg.hidden_size, heads * d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=bias)
        self.o_proj = nn.Linear(heads * d, cfg.hidden_size, bias=cfg.attention_bias)
        if getattr(cfg, "qk_norm", False):
            self.q_norm, self.k_norm = RMSNorm(d, cfg.rms_norm_eps), RMSNorm(d, cfg.rms_norm_eps)
        self.head_dim, self.scaling = d, getattr(cfg, "query_pre_attn_scalar", d) ** -0.5
        self.softcap = getattr(cfg, "attn_logit_softcapping", None)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        shape = hidden_states.shape[:-1] + (-1, self.head_dim)
        q, k, v = (p(hidden_states).view(shape) for p in (self.q_proj, self.k_proj, self.v_proj))
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        out = eager_attention(q, k, v, attention_mask, self.scaling, self.softcap)
        return self.o_proj(out.transpose(1, 2).reshape(hidden_states.shape[:-1] + (-1,)))


class GatedMLP(nn.Module):
    """LlamaMLP: down_proj(act(gate_proj(x)) * up_proj(x)) on (batch, seq, hidden)."""

    def __init__(self, cfg, act=F.silu):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act_fn = act

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class TopKRouter(nn.Module):
    """MixtralTopKRouter: a weight, not an nn.Linear (GPTQModel hooks no router); the top-k
    weights renormalized."""

    def __init__(self, cfg):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.weight = nn.Parameter(torch.randn(cfg.num_local_experts, cfg.hidden_size) / math.sqrt(cfg.hidden_size))

    def forward(self, hidden_states):
        logits = F.linear(hidden_states, self.weight)
        weights, index = torch.topk(F.softmax(logits.float(), dim=-1), self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(hidden_states.dtype), index


class FusedExperts(nn.Module):
    """MixtralExperts: every expert's gate and up in gate_up_proj (experts, 2 * inter, hidden),
    down_proj (experts, hidden, inter), as defuser finds them (it splits them into per-expert
    gate_proj/up_proj/down_proj linears, called on their routed rows)."""

    def __init__(self, cfg):
        super().__init__()
        e, h, i = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, h) / math.sqrt(h))
        self.down_proj = nn.Parameter(torch.randn(e, h, i) / math.sqrt(i))
        self.act_fn = F.silu


class SparseMoeBlock(nn.Module):
    """MixtralSparseMoeBlock: the router and the experts on the flattened (tokens, hidden)."""

    def __init__(self, cfg):
        super().__init__()
        self.gate, self.experts = TopKRouter(cfg), FusedExperts(cfg)

    def forward(self, hidden_states):
        shape = hidden_states.shape
        hidden_states = hidden_states.reshape(-1, shape[-1])
        _, weights, index = self.gate(hidden_states)
        return self.experts(hidden_states, index, weights).reshape(shape)


class RotaryDecoderLayer(nn.Module):
    """LlamaDecoderLayer, Qwen2's, Qwen3's, Mistral's, Mixtral's (mlp the sparse MoE block) and
    Gemma2's (post_attention_layernorm on the attention's output, pre/post_feedforward_layernorm
    around the MLP, GELU tanh, norms with Gemma's offset)."""

    def __init__(self, cfg):
        super().__init__()
        gemma = cfg.model_type == "gemma2"
        norm = (lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0 if gemma else 0.0))
        self.self_attn = RotaryAttention(cfg)
        if cfg.model_type == "mixtral":
            self.mlp = SparseMoeBlock(cfg)
        else:
            self.mlp = GatedMLP(cfg, (lambda x: F.gelu(x, approximate="tanh")) if gemma else F.silu)
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        if gemma:
            self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                cache_position=None, position_embeddings=None, **kwargs):
        residual = hidden_states
        h = self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask)
        if hasattr(self, "pre_feedforward_layernorm"):
            h = residual + self.post_attention_layernorm(h)
            return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
        h = residual + h
        return h + self.mlp(self.post_attention_layernorm(h))


class OPTAttention(nn.Module):
    """OPTAttention: q/k/v/out_proj with biases on (batch, seq, hidden), no rotary tables."""

    def __init__(self, cfg):
        super().__init__()
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self, name, nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.enable_bias))
        self.scaling = HEAD_DIM ** -0.5

    def forward(self, hidden_states, attention_mask=None):
        b, s, _ = hidden_states.shape
        q, k, v = (p(hidden_states).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        out = eager_attention(q, k, v, attention_mask, self.scaling)
        return self.out_proj(out.transpose(1, 2).reshape(b, s, -1))


class OPTDecoderLayer(nn.Module):
    """OPTDecoderLayer (do_layer_norm_before): the attention on (batch, seq, hidden), then the
    hidden states flattened to (tokens, hidden) for final_layer_norm, fc1, ReLU, fc2, and
    viewed back."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn = OPTAttention(cfg)
        self.self_attn_layer_norm = nn.LayerNorm(cfg.hidden_size)
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.ffn_dim, bias=cfg.enable_bias)
        self.fc2 = nn.Linear(cfg.ffn_dim, cfg.hidden_size, bias=cfg.enable_bias)
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size)

    def forward(self, hidden_states, attention_mask=None, layer_head_mask=None, past_key_values=None,
                output_attentions=False, use_cache=False, position_ids=None, cache_position=None, **kwargs):
        h = hidden_states + self.self_attn(self.self_attn_layer_norm(hidden_states), attention_mask)
        shape = h.shape
        h = h.reshape(-1, h.size(-1))
        h = h + self.fc2(F.relu(self.fc1(self.final_layer_norm(h))))
        return (h.view(shape),)  # OPT's layer returns a tuple


def layers(arch, count=2, seed=0, defuser=None):
    """`count` decoder layers of `arch` with random weights (seeded); Mixtral's fused experts
    split by `defuser` (the stand-in module), as GPTQModel has them split on load."""
    torch.manual_seed(seed)
    cfg = config(arch)
    made = [OPTDecoderLayer(cfg) if arch == "opt" else RotaryDecoderLayer(cfg) for _ in range(count)]
    for layer in made:
        layer.eval()
        if arch == "mixtral":
            assert defuser is not None and defuser.convert_model(layer)
    return made


def capture(arch, batches, seed=1):
    """What GPTQModel's input capture keeps for `arch` (an InputCache's fields): per batch one
    sample's (1, SEQ, HIDDEN) hidden states, unpadded; OPT an eager attention's additive
    causal mask per batch and no rotary tables, the others no mask (sdpa needs none) and the
    rotary tables as the model computes them per forward, position ids, cache_position."""
    gen = torch.Generator().manual_seed(seed)
    hidden = [[torch.randn(1, SEQ, HIDDEN, generator=gen)] for _ in range(batches)]
    positions = [torch.arange(SEQ).unsqueeze(0) for _ in range(batches)]
    if arch == "opt":
        kwargs = [{"use_cache": False, "output_attentions": False} for _ in range(batches)]
        return dict(layer_inputs=hidden, layer_input_kwargs=kwargs, position_ids=positions,
                    attention_masks=[causal_mask(SEQ) for _ in range(batches)])
    kwargs = [{"position_embeddings": rotary_tables(p), "cache_position": torch.arange(SEQ), "use_cache": False}
              for p in positions]
    return dict(layer_inputs=hidden, layer_input_kwargs=kwargs, position_ids=positions,
                attention_masks=[None] * batches)
