"""GPTQModel's calibration batches grouped into fewer forwards (the group_batches step of
qlink.integrations.gptqmodel's cache_inputs patch): every sample's forward through a
layer shaped like a decoder layer (rotary tables, position ids) gives what it gave alone,
its rows reach the hooks as they did, kwargs every batch holds alike stay one tensor, and
every reason to keep GPTQModel's batches is named with the host's cache left as it was."""
import re

import pytest
import torch

import qlink
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.gptqmodel import input_cache
from qlink.integrations.patches import FallbackRefused

from stand_in_hosts import stand_in

SEQ, HIDDEN, HEAD = 16, 32, 8


@pytest.fixture
def host(library):
    with stand_in("gptqmodel", adapter):
        ctx = qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=library)
        yield ctx


def _capture(batches=8, seed=0, cache_position_offset=0):
    """A capture as GPTQModel's on the CPU: per batch one sample's hidden states, the rotary
    tables as the model computes them per forward (equal values, a tensor per batch), the
    position ids, no mask (sdpa needs none for unpadded samples)."""
    from gptqmodel.looper.input_cache import InputCache
    gen = torch.Generator().manual_seed(seed)
    angles = torch.arange(SEQ, dtype=torch.float64).unsqueeze(1) / (1 + torch.arange(HEAD, dtype=torch.float64))
    hidden, kwargs = [], []
    for b in range(batches):
        hidden.append([torch.randn(1, SEQ, HIDDEN, generator=gen, dtype=torch.float64)])
        kwargs.append({"position_embeddings": (angles.cos().unsqueeze(0), angles.sin().unsqueeze(0)),
                       "cache_position": torch.arange(SEQ) + b * cache_position_offset, "use_cache": False})
    return InputCache(hidden, kwargs, [torch.arange(SEQ).unsqueeze(0) for _ in range(batches)], [None] * batches)


class _Layer(torch.nn.Module):
    """A decoder layer's shape of computation: a projection rotated by the rotary tables
    (broadcast over the batch), a position-id embedding, a per-token norm."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(7)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN, bias=False, dtype=torch.float64)
        self.proj.weight.data = torch.randn(HIDDEN, HIDDEN, generator=gen, dtype=torch.float64)
        self.positions = torch.randn(SEQ, HIDDEN, generator=gen, dtype=torch.float64)
        self.seen = []  # the rows the projection's hook saw, call by call

    def forward(self, x, position_embeddings, position_ids, cache_position, use_cache):
        cos, sin = position_embeddings
        h = self.proj(x).view(x.shape[0], SEQ, HIDDEN // HEAD, HEAD)
        h = h * cos.unsqueeze(2) + h.flip(-1) * sin.unsqueeze(2)
        h = h.reshape(x.shape[0], SEQ, HIDDEN) + self.positions[position_ids] + cache_position.unsqueeze(-1)
        return torch.nn.functional.layer_norm(h, (HIDDEN,))


def _replay(layer, cache):
    """GPTQModel's per-batch replay (ForwardExecutor.run_single): inputs, position ids and
    kwargs of each batch into the layer; the outputs, one per batch."""
    return [layer(*cache.layer_inputs[i], position_ids=cache.position_ids[i], **cache.layer_input_kwargs[i])
            for i in range(len(cache.layer_inputs))]


def _looper(capture, processors=None, model_class=None, layers=()):
    from gptqmodel.looper.gptq_processor import GPTQProcessor
    from gptqmodel.looper.module_looper import ModuleLooper
    from gptqmodel.models.base import BaseQModel
    model = (model_class or type("LlamaQModel", (BaseQModel,), {}))()
    model.quantize_config = type("QuantizeConfig", (), {"device": "cpu"})()
    return ModuleLooper(gptq_model=model, capture=lambda calibration: capture,
                        processors=[GPTQProcessor()] if processors is None else processors, layers=layers)


def test_each_sample_gives_in_its_group_what_it_gave_alone(host, monkeypatch):
    monkeypatch.setattr(input_cache, "GROUP_ROWS", 3 * SEQ)  # groups of 3, 3, 2
    adapter.install(ctx=host, strict=True)
    host_cache = _capture()
    cache = _looper(host_cache).loop(0)
    assert [t[0].shape[0] for t in cache.layer_inputs] == [3, 3, 2]
    assert adapter.counters()["seams"]["group_batches"]["qlink"] == 1
    assert all(t[0].is_inference() for t in cache.layer_inputs)
    layer = _Layer()
    with torch.no_grad():
        alone, grouped = _replay(layer, host_cache), _replay(layer, cache)
    samples = torch.cat(grouped)
    assert samples.shape == (8, SEQ, HIDDEN)
    for i, out in enumerate(alone):
        torch.testing.assert_close(samples[i:i + 1], out, rtol=1e-12, atol=1e-12)
    # The hooks see every sample's rows, in the same order, once.
    rows = [torch.cat([t[0] for t in c.layer_inputs]) for c in (cache, host_cache)]
    assert torch.equal(*rows)


def test_what_every_batch_holds_alike_stays_one_tensor(host, monkeypatch):
    monkeypatch.setattr(input_cache, "GROUP_ROWS", 4 * SEQ)
    adapter.install(ctx=host, strict=True)
    host_cache = _capture()
    cache = _looper(host_cache).loop(0)
    assert len(cache.layer_inputs) == 2
    for g, first in ((0, 0), (1, 4)):
        cos, sin = cache.layer_input_kwargs[g]["position_embeddings"]
        assert cos is host_cache.layer_input_kwargs[first]["position_embeddings"][0]
        assert sin is host_cache.layer_input_kwargs[first]["position_embeddings"][1]
        assert cache.position_ids[g] is host_cache.position_ids[first]  # (1, SEQ): broadcast, as the model passes it
        assert cache.layer_input_kwargs[g]["use_cache"] is False
    assert cache.attention_masks == [None, None]


def test_a_batch_dimension_is_concatenated_where_batches_differ(host, monkeypatch):
    monkeypatch.setattr(input_cache, "GROUP_ROWS", 4 * SEQ)
    adapter.install(ctx=host, strict=True)
    host_cache = _capture(4)
    for i, kwargs in enumerate(host_cache.layer_input_kwargs):
        kwargs["scale"] = torch.full((1, 1), float(i))  # one row per sample, different values
    host_cache.attention_masks[:] = [torch.ones(1, SEQ, dtype=torch.bool) for _ in range(4)]
    cache = _looper(host_cache).loop(0)
    assert torch.equal(cache.layer_input_kwargs[0]["scale"], torch.arange(4.0).view(4, 1))
    assert cache.attention_masks[0].shape == (4, SEQ)  # masks are per sample, always stacked


class _OtherProcessor:
    pass


def _own_replay(base):
    return type("GemmaQModel", (base,), {"update_layer_replay_kwargs_from_output": lambda self, *a: a[2]})


def _reuse_kv_layer():
    layer = torch.nn.Identity()
    layer.reuse_kv = True
    return layer


def _moe_layer():
    layer = torch.nn.Module()
    layer.mlp = torch.nn.Module()
    layer.mlp.experts = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
    return layer


@pytest.mark.parametrize("case, reason", [
    ("processor", r"processors other than GPTQ's see the batches \(_OtherProcessor\)"),
    ("replay", r"GemmaQModel has its own update_layer_replay_kwargs_from_output"),
    ("kv", r"layers share a KV cache between batches"),
    ("unbatched", r"does not support batched calibration"),
    ("cache_position", r"layer_input_kwargs\['cache_position'\] differs between batches along no batch dimension"),
    ("large", r"no two consecutive batches fit in 16 tokens"),
    ("two_samples", r"batches of more than one sample \(batch_size 2\)"),
    ("moe_definition", r"MoE experts \(each sees its routed rows of all the grouped samples at once\)"),
    ("moe_layer", r"MoE experts"),
])
def test_a_reason_to_keep_the_batches_is_named_and_the_cache_kept(host, monkeypatch, case, reason):
    from gptqmodel.looper.gptq_processor import GPTQProcessor
    from gptqmodel.models.base import BaseQModel
    adapter.install(ctx=host, strict=True)
    host_cache = _capture(cache_position_offset=SEQ if case == "cache_position" else 0)
    if case == "two_samples":
        host_cache.layer_inputs[:] = [[torch.cat([x, x])] for (x,) in host_cache.layer_inputs]
    model_class = _own_replay(BaseQModel) if case == "replay" else None
    if case == "moe_definition":
        model_class = type("Qwen3MoeQModel", (BaseQModel,), {"dynamic_expert_index": "num_experts"})
    layers = {"kv": [_reuse_kv_layer()], "moe_layer": [_moe_layer()]}.get(case, ())
    looper = _looper(host_cache, processors=[GPTQProcessor(), _OtherProcessor()] if case == "processor" else None,
                     model_class=model_class, layers=layers)
    if case == "unbatched":
        looper.support_batch_quantize = False
    if case == "large":
        monkeypatch.setattr(input_cache, "GROUP_ROWS", SEQ)
    assert looper.loop(0) is host_cache
    (said,) = adapter.counters()["seams"]["group_batches"]["reasons"]
    assert re.search(reason, said), said


def test_a_failed_grouping_keeps_the_hosts_cache_or_raises_when_strict(host, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(input_cache, "_build", broken)
    adapter.install(ctx=host)
    host_cache = _capture()
    looper = _looper(host_cache)
    assert looper.loop(0) is host_cache
    assert adapter.counters()["seams"]["group_batches"]["fallback"] == 1
    adapter.install(ctx=host, strict=True)
    with pytest.raises(FallbackRefused, match="group_batches failed and strict=True.*injected"):
        looper.loop(0)


def test_a_grouped_hook_input_sums_into_gptq_as_its_samples_did(host, monkeypatch):
    """Once the loop's batches are grouped, a hook's (samples, seq, columns) input reaches
    GPTQ's Hessian sample by sample: bit-identical to the samples' own batches."""
    from gptqmodel.looper import gptq_processor
    from gptqmodel.quantization import config
    monkeypatch.setattr(input_cache, "GROUP_ROWS", 4 * SEQ)
    adapter.install(ctx=host, strict=True)
    assert len(_looper(_capture()).loop(0).layer_inputs) == 2
    gen = torch.Generator().manual_seed(5)
    samples = [torch.randn(1, SEQ, HIDDEN, generator=gen).to(torch.bfloat16) for _ in range(4)]
    alone, grouped = (gptq_processor.GPTQ(torch.nn.Linear(HIDDEN, 8, bias=False), config.QuantizeConfig())
                      for _ in range(2))
    for x in samples:
        alone.add_batch(x, None)
    grouped.add_batch(torch.cat(samples), None)
    adapter.flush_hessians()
    cpu = torch.device("cpu")
    assert torch.equal(grouped._device_hessian_partials[cpu], alone._device_hessian_partials[cpu])
    assert grouped.nsamples == alone.nsamples == 4 * SEQ
