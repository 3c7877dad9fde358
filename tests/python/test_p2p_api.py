"""GPTQModel's P2P names and shapes (docs/HOSTS.md): P2PConfig with every field, a plain dict of
them, the module-level functions as calls on a context, and the hardware warning exactly
once per process."""
import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import qlink
from qlink.config import resolve

GPTQMODEL_FIELDS = ["mode", "probe", "probe_mib", "min_gbps", "min_ratio", "use_torch_replicate"]


def test_p2p_config_has_every_field_of_gptqmodels():
    assert [f.name for f in dataclasses.fields(qlink.P2PConfig)] == GPTQMODEL_FIELDS
    assert qlink.P2PConfig().use_torch_replicate is False


@pytest.mark.parametrize("config", [
    {"mode": "off", "probe": False, "use_torch_replicate": True},
    qlink.P2PConfig(mode="off", use_torch_replicate=True),
    {"backend": "cpu", "p2p": {"mode": "off", "use_torch_replicate": True}},
    {"backend": "cpu", "p2p": qlink.P2PConfig(mode="off", use_torch_replicate=True)},
])
def test_a_dict_of_p2p_fields_is_a_p2p_config(library, config):
    resolved = resolve(config)
    assert resolved.use_torch_replicate is True
    assert '"mode": "off"' in resolved.plugin_json and "use_torch_replicate" not in resolved.plugin_json
    with qlink.load(config, library=library) as ctx:
        assert ctx.use_torch_replicate is True
        assert all(p.state in ("disabled", "not_applicable") for p in ctx.peer_matrix().values())


def test_a_p2p_dict_with_an_unknown_field_is_refused_naming_it(library):
    with pytest.raises(qlink.InvalidArgumentError, match="p2p.probes"):
        qlink.load({"backend": "cpu", "p2p": {"probes": True}}, library=library)


def test_module_functions_are_the_contexts_calls(library):
    ctx = qlink.load({"backend": "cpu", "cpu_devices": 3, "log_level": "off"}, library=library)
    assert qlink.peer_matrix(ctx=ctx) == ctx.peer_matrix()
    assert qlink.enable_peer_access([0, 2], ctx=ctx) == ctx.peer_matrix([0, 2])
    assert qlink.can_copy(0, 1, ctx=ctx) is False  # host memory: no peer path
    src, dst = [torch.arange(10.0)], [torch.zeros(10)]
    qlink.peer_copy_batch(src, dst, ctx=ctx)
    assert torch.equal(dst[0], src[0])
    module = torch.nn.Linear(4, 4)
    assert qlink.move_module_to_device(module, "cpu", ctx=ctx) is module
    nested = qlink.move_nested_to_device({"a": [src[0]], "b": 3}, "cpu", ctx=ctx)
    assert nested["b"] == 3 and nested["a"][0] is src[0]  # already there: as is


def test_enable_for_devices_skips_host_devices_without_a_warning(library, capfd):
    ctx = qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "warn"}, library=library)
    assert ctx.enable_for_devices([torch.device("cpu"), "cpu"]) == {}
    assert qlink.can_copy("cpu", "cuda:0", ctx=ctx) is False
    assert "peer" not in capfd.readouterr().err


def test_clone_module_for_devices_is_keyed_in_device_order_with_independent_clones(library):
    ctx = qlink.load({"backend": "cpu", "log_level": "off"}, library=library)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    clones = ctx.clone_module_for_devices(block, ["cpu"])
    assert list(clones) == [torch.device("cpu")]
    clone = clones[torch.device("cpu")]
    for a, b in zip(block.state_dict().values(), clone.state_dict().values()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    with pytest.raises(ValueError, match="each replica needs its own device"):
        ctx.clone_module_for_devices(block, ["cpu", torch.device("cpu")])


def _peers_script(library, fault, contexts):
    """A process creating one fault-backend context per log level in `contexts`, each with a
    refused pair, and enabling peer access on each."""
    return textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        import qlink
        for level in %r:
            ctx = qlink.load({"backend": %r, "log_level": level,
                              "backend_options": {"devices": 2, "unsupported_pairs": [[0, 1]]}}, library=%r)
            ctx.enable_peer_access()
    """ % (os.path.join(os.path.dirname(qlink.__file__), ".."), contexts, fault, library))


@pytest.mark.parametrize("levels, warnings", [
    (["warn", "warn", "warn"], 1),
    (["off", "warn", "warn"], 1),  # a silent first context does not use the warning up
    (["off", "off"], 0),
])
def test_the_hardware_warning_is_printed_once_per_process(library, levels, warnings):
    fault = os.path.join(os.path.dirname(library), "libqlink_backend_fault.so")
    if not os.path.exists(fault):
        pytest.skip("no fault backend beside %s" % library)
    run = subprocess.run([sys.executable, "-c", _peers_script(library, fault, levels)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("motherboard compatibility") == warnings, run.stderr
