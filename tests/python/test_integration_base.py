"""What both integrations share (qlink.integrations.base), against the stand-in hosts:
the host version checked at install (another warns once, strict refuses it), every
patched name resolved first (HostChanged naming the ones that moved, nothing patched),
uninstall restoring only what is still qlink's, AutoRound's fallback and strict; a fallback
running after qlink's failed attempt let go of what it held."""
import importlib
import logging
import os
import shutil
import sys
import types

import pytest
import qlink
from qlink.integrations import autoround, base, gptqmodel

from stand_in_hosts import HOSTS, stand_in

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "hosts"))
from host_sources import SourceTree  # noqa: E402 (bench/hosts/check_hosts.py's lookup, out of the package)

INTEGRATIONS = {"gptqmodel": gptqmodel, "auto_round": autoround}


@pytest.fixture(params=sorted(INTEGRATIONS))
def integration(request, library):
    """(the integration's module, its host package freshly imported, a CPU context)."""
    adapter = INTEGRATIONS[request.param]
    with stand_in(request.param, adapter):
        package = importlib.import_module(request.param)
        ctx = qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library)
        yield adapter, package, ctx


def _install(adapter, ctx, strict=False):
    return adapter.install(ctx=ctx, strict=strict) if adapter is gptqmodel else adapter.install(2, strict, ctx=ctx)


# A host method install() replaces, per integration: (its class, its name).
PATCHED = {gptqmodel: ("gptqmodel.looper.module_looper:ModuleLooper", "loop"),
           autoround: ("auto_round.algorithms.quantization.sign_round.quantizer:SignRoundQuantizer", "quantize_block")}


def _module_attribute(adapter):
    """The first of the host's names that is a module's own attribute (a class or function)."""
    return next(name for name in adapter.HOST.names if "." not in name.partition(":")[2])


def _owner(adapter):
    module, _, path = PATCHED[adapter][0].partition(":")
    return getattr(importlib.import_module(module), path), PATCHED[adapter][1]


def test_another_host_version_warns_once_saying_what_was_checked(integration, monkeypatch, caplog):
    adapter, package, ctx = integration
    version = importlib.import_module(adapter.HOST.version_module)
    monkeypatch.setattr(version, "__version__", "99.0.1")
    monkeypatch.setattr(base, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="qlink"):
        _install(adapter, ctx)
        _install(adapter, ctx)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["qlink: %s 99.0.1 is not the version qlink's integration was checked against (%s.x, %s); its "
                    "%d patched names resolve, their behaviour is unchecked" % (
                        adapter.HOST.title, adapter.HOST.supported, adapter.HOST.checked_at, len(adapter.HOST.names))]
    assert adapter.counters()["seams"] != {}  # installed all the same


def test_strict_refuses_another_host_version_patching_nothing(integration, monkeypatch):
    adapter, package, ctx = integration
    owner, name = _owner(adapter)
    before = vars(owner)[name]
    monkeypatch.setattr(importlib.import_module(adapter.HOST.version_module), "__version__", "99.0.1")
    with pytest.raises(base.UnsupportedHost, match="99.0.1 is not the version.*strict=True refuses it"):
        _install(adapter, ctx, strict=True)
    assert vars(owner)[name] is before and adapter.counters() == {}


@pytest.mark.parametrize("which", [0, -1])  # a module attribute, a task attribute
def test_a_patched_name_that_moved_is_named_and_nothing_is_patched(integration, monkeypatch, which):
    adapter, package, ctx = integration
    owner, name = _owner(adapter)
    before = vars(owner)[name]
    moved = _module_attribute(adapter) if which == 0 else adapter.HOST.names[which]
    module, _, path = moved.partition(":")
    holder = importlib.import_module(module)
    for part in path.split(".")[:-1]:
        holder = getattr(holder, part)
    if path.split(".")[-1] in vars(holder):
        monkeypatch.delattr(holder, path.split(".")[-1])
    else:  # task state set in __init__: the class is given a source without it
        monkeypatch.setattr(base, "_source", lambda cls: "")
    with pytest.raises(base.HostChanged, match=r"has moved what qlink patches.*%s \(AttributeError" % moved.replace(
            ".", r"\.")):
        _install(adapter, ctx)
    assert vars(owner)[name] is before and adapter.counters() == {}


def test_uninstall_keeps_a_later_patchers_binding_and_says_so(integration, caplog):
    adapter, package, ctx = integration
    owner, name = _owner(adapter)
    original = vars(owner)[name]
    _install(adapter, ctx)

    def later(*args, **kwargs):
        return "a later patcher's"

    setattr(owner, name, later)
    with caplog.at_level(logging.WARNING, logger="qlink"):
        left = adapter.uninstall()
    assert vars(owner)[name] is later
    assert left["kept"] == ["%s.%s" % (owner.__qualname__, name)] and left["peer_pairs"] == []
    assert "left %s's %s.%s as they are" % (adapter.HOST.title, owner.__qualname__, name) in caplog.text
    setattr(owner, name, original)


def test_the_stand_ins_carry_every_name_the_patches_touch(integration):
    adapter, package, ctx = integration
    assert adapter.HOST.resolve()


@pytest.mark.parametrize("adapter", [gptqmodel, autoround], ids=["gptqmodel", "auto_round"])
def test_the_source_lookup_finds_every_name_in_the_stand_ins_and_names_one_that_moved(adapter, tmp_path):
    """bench/hosts/check_hosts.py's lookup, which runs against the hosts' real trees where
    they are fetched (their code is never committed), here against the stand-ins."""
    assert SourceTree([HOSTS]).missing(adapter.HOST) == []
    shutil.copytree(HOSTS, str(tmp_path / "hosts"))
    first = _module_attribute(adapter)
    module, _, path = first.partition(":")
    source = tmp_path.joinpath("hosts", *module.split(".")).with_suffix(".py")
    text = source.read_text()
    source.write_text(text.replace("def %s(" % path, "def %s_renamed(" % path).replace(
        "class %s(" % path, "class %s_renamed(" % path))
    moved = SourceTree([str(tmp_path / "hosts")]).missing(adapter.HOST)
    assert "%s (no %s in %s)" % (first, path, module) in moved
    assert all(m.startswith(first) for m in moved)  # a class's members move with it


def test_the_source_lookup_takes_an_optional_imports_fallback(tmp_path):
    """A name bound in a module-level try (an import of a package outside the tree) or its
    except branch (AutoRound's ALL_EXPERTS_FUNCTIONS without transformers 5) is found; one in
    no branch is not."""
    package = tmp_path / "host"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "interface.py").write_text(
        "try:\n    from elsewhere.moe import FUNCTIONS\n    HAS = True\nexcept ImportError:\n"
        "    FUNCTIONS = None\n    HAS = False\nif HAS:\n    KIND = 'linear_loop'\n")
    spec = types.SimpleNamespace(names=["host.interface:FUNCTIONS", "host.interface:KIND", "host.interface:GONE"])
    assert SourceTree([str(tmp_path)]).missing(spec) == ["host.interface:GONE (no GONE in host.interface)"]


def test_a_fallback_runs_after_qlinks_failed_attempt_let_go_of_its_memory():
    """What a failed qlink attempt held in its frames (an out-of-memory error's block tuning
    state) is released before the host's path runs in its place."""
    import gc
    import weakref

    import torch
    from qlink.integrations.patches import Counters, Guard
    held = []

    def attempt():
        state = torch.zeros(1024)
        held.append(weakref.ref(state))
        raise RuntimeError("out of memory")

    def host():
        gc.collect()
        return held[0]() is None
    assert Guard(Counters(["p"]), strict=False).attempt("p", attempt, host) is True
