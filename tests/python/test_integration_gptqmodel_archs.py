"""install(strict=True) with grouped calibration batches over every architecture's shape of
decoder layer (tests/python/hosts/decoder_layers.py: OPT, LLaMA with grouped-query attention,
Qwen2, Qwen3, Mistral, Gemma2, Mixtral through defuser's split experts), through the stand-in
GPTQModel's layer walk on the CPU backend: the batches grouped, no add_batch refused or left
to GPTQModel (OPT's fc1 and fc2 read the grouped samples' tokens flattened to (tokens,
hidden)), and every linear's Hessian what GPTQModel's own path gives with its one-sample
batches; a flattened grouped input sums sample by sample as the samples' own batches did,
bit for bit."""
import re

import pytest
import torch

import qlink
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.gptqmodel import input_cache

from stand_in_hosts import stand_in
from test_defuser_standin import defuser  # noqa: F401 (the fixture: the stand-in importable before qlink installs)

BATCHES = 7  # grouped three to a forward: 3, 3 and a group of one

# architecture, GPTQModel's definition class, the linears whose hooks see 2-D inputs
TABLE = [
    ("opt", "OptQModel", r"\d\.fc[12]"),
    ("llama", "LlamaQModel", None),
    ("qwen2", "Qwen2QModel", None),
    ("qwen3", "Qwen3QModel", None),
    ("mistral", "MistralQModel", None),
    ("gemma2", "Gemma2QModel", None),
    ("mixtral", "MixtralQModel", r"\d\.mlp\.experts\.\d\.(gate|up|down)_proj"),
]


@pytest.fixture
def host(library, defuser):  # noqa: F811 (defuser importable before install: routed_experts patches it)
    with stand_in("gptqmodel", adapter):
        yield qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=library), defuser


def walk(arch, definition, defuser):  # noqa: F811
    """The stand-in loop's walk over two `arch` layers: {linear: (H, nsamples)} and the
    dimensions of the inputs each linear's hook saw."""
    import decoder_layers
    from gptqmodel.looper.gptq_processor import GPTQProcessor
    from gptqmodel.looper.input_cache import InputCache
    from gptqmodel.looper.module_looper import ModuleLooper
    from gptqmodel.models.base import BaseQModel
    layers = decoder_layers.layers(arch, defuser=defuser)
    dims = {}
    for index, layer in enumerate(layers):
        for path, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_hook(
                    lambda m, inp, out, key="%d.%s" % (index, path): dims.setdefault(key, set()).add(inp[0].dim()))
    fields = {"dynamic_expert_index": "num_local_experts"} if arch == "mixtral" else {}
    model = type(definition, (BaseQModel,), fields)()
    model.quantize_config = type("QuantizeConfig", (), {"device": "cpu"})()
    cache = InputCache(**decoder_layers.capture(arch, BATCHES))
    looper = ModuleLooper(gptq_model=model, capture=lambda calibration: cache, processors=[GPTQProcessor()],
                          layers=layers)
    return {name: (task.H, task.nsamples) for name, task in looper.hessians(None).items()}, dims


@pytest.mark.parametrize("arch, definition, flat", TABLE, ids=[row[0] for row in TABLE])
def test_strict_grouped_calibration_takes_every_architectures_inputs(host, monkeypatch, arch, definition, flat):
    ctx, defuser = host  # noqa: F811
    own, _ = walk(arch, definition, defuser)  # GPTQModel alone: a forward per one-sample batch
    monkeypatch.setattr(input_cache, "GROUP_ROWS", 3 * 16)
    adapter.install(ctx=ctx, strict=True)
    mine, dims = walk(arch, definition, defuser)  # raises FallbackRefused where a path is refused
    counts = adapter.counters()["seams"]
    assert counts["group_batches"]["qlink"] == 1, counts["group_batches"]
    assert counts["add_batch"]["host"] == counts["add_batch"]["fallback"] == 0, counts["add_batch"]
    assert counts["add_batch"]["qlink"] > 0 and counts["materialize_global_hessian"]["qlink"] > 0
    if arch == "mixtral":
        assert counts["routed_experts"]["qlink"] == 2 * 3  # two layers, three grouped forwards
    flattened = sorted(k for k, d in dims.items() if d == {2})
    assert flattened == sorted(k for k in dims if flat and re.fullmatch(flat, k)), flattened
    assert all(d in ({2}, {3}) for d in dims.values()), dims
    assert mine.keys() == own.keys() and len(own) >= 12
    for name, (h, rows) in own.items():
        other, other_rows = mine[name]
        assert rows == other_rows, name
        if arch != "mixtral":
            assert rows == BATCHES * 16, name
        torch.testing.assert_close(other, h, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("shape", ["3-D", "flattened"])
def test_a_grouped_input_sums_into_gptq_as_its_samples_did(host, monkeypatch, shape):
    """A grouped forward's (samples, seq, columns) input and the (samples * seq, columns) one
    OPT's layer flattens it to reach GPTQ's Hessian sample by sample: bit-identical to the
    samples' own batches; a group of one sample as its own batch."""
    from gptqmodel.looper.input_cache import InputCache
    from gptqmodel.looper import gptq_processor
    from gptqmodel.quantization import config
    import decoder_layers
    ctx, _ = host
    monkeypatch.setattr(input_cache, "GROUP_ROWS", 3 * 16)
    adapter.install(ctx=ctx, strict=True)
    from test_integration_gptqmodel_groups import _looper
    assert len(_looper(InputCache(**decoder_layers.capture("llama", BATCHES))).loop(0).layer_inputs) == 3
    gen = torch.Generator().manual_seed(5)
    samples = [torch.randn(1, 16, 32, generator=gen).to(torch.bfloat16) for _ in range(BATCHES)]
    alone, grouped = (gptq_processor.GPTQ(torch.nn.Linear(32, 8, bias=False), config.QuantizeConfig())
                      for _ in range(2))
    for x in samples:
        alone.add_batch(x if shape == "3-D" else x.reshape(-1, 32), None)
    for group in (samples[:3], samples[3:6], samples[6:]):
        x = torch.cat(group)
        grouped.add_batch(x if shape == "3-D" else x.reshape(-1, 32), None)
    adapter.flush_hessians()
    cpu = torch.device("cpu")
    assert torch.equal(grouped._device_hessian_partials[cpu], alone._device_hessian_partials[cpu])
    assert grouped.nsamples == alone.nsamples == BATCHES * 16
