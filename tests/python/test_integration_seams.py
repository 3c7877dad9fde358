"""Both integrations' seam tables (qlink.integrations.seams) against the stand-in hosts:
every seam's binding is qlink's after install() and the host's own after uninstall(),
derived from the table (a seam added to it is tested without a line here); docs/HOSTS.md
shows the table as it is; and no host object's private attribute is read or written by
qlink's code unless its HostSpec declares it (an audit over a run of each host's seams,
shown to catch a planted undeclared write)."""
import importlib
import os
import re
import sys
import types

import pytest
import torch

import qlink
from qlink.integrations import autoround, gptqmodel
from qlink.integrations.gptqmodel import hessian_queue

from stand_in_hosts import stand_in
from test_defuser_standin import defuser  # noqa: F401 (the fixture: defuser importable before install)

INTEGRATIONS = {"gptqmodel": gptqmodel, "auto_round": autoround}
SEAMS = [(package, seam) for package, adapter in sorted(INTEGRATIONS.items()) for seam in adapter.SEAMS.seams]
# install()'s arguments that apply every seam: the defaults, and each opt-in seam asked for
EVERY_SEAM = {gptqmodel: dict(cpu_workers=2), autoround: {}}
HOSTS_MD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "HOSTS.md")


@pytest.fixture
def cpu(library):
    return qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library)


def _bindings(seam, package):
    """Where the host holds the seam's target now: [(owner, attribute, value)]; for an
    "everywhere" seam every module attribute of the package that holds the same object."""
    owner, name = seam.resolve_owner(), seam.owner_and_name[1]
    value = vars(owner)[name]
    out = [(owner, name, value)]
    if seam.how == "everywhere":
        prefix = (seam.package or package) + "."
        for module_name, module in sorted(sys.modules.items()):
            if module is not None and module is not owner and module_name.startswith(prefix):
                out += [(module, attr, v) for attr, v in sorted(vars(module).items()) if v is value]
    return out


@pytest.mark.parametrize("package, seam", SEAMS, ids=["%s:%s" % (p, s.target.partition(":")[2]) for p, s in SEAMS])
def test_every_seam_is_qlinks_after_install_and_the_hosts_after_uninstall(package, seam, cpu, defuser):  # noqa: F811
    adapter = INTEGRATIONS[package]
    with stand_in(package, adapter):
        importlib.import_module(package)
        importlib.import_module(seam.target.partition(":")[0])
        before = _bindings(seam, package)
        assert before, "%s is not bound anywhere" % seam.target
        if adapter is gptqmodel:
            adapter.install(ctx=cpu, **EVERY_SEAM[adapter])
        else:
            adapter.install(2, ctx=cpu, **EVERY_SEAM[adapter])
        after = [getattr(owner, attr) for owner, attr, _ in before]
        assert len({id(v) for v in after}) == 1, "%s: one replacement wherever it was bound" % seam.target
        assert after[0] is not before[0][2] and after[0].__module__.startswith("qlink.integrations."), seam.target
        assert set(seam.counters) <= set(adapter.counters()["seams"])
        assert adapter.uninstall()["kept"] == []
        assert all(getattr(owner, attr) is value for owner, attr, value in before), seam.target


@pytest.mark.parametrize("package", sorted(INTEGRATIONS))
def test_docs_show_each_hosts_seam_table_as_declared(package):
    with open(HOSTS_MD, encoding="utf-8") as f:
        text = f.read()
    begin, end = "<!-- seams: %s -->" % package, "<!-- end seams: %s -->" % package
    assert begin in text and end in text, "docs/HOSTS.md has no %s table" % package
    shown = text[text.index(begin) + len(begin):text.index(end)].strip()
    assert shown == INTEGRATIONS[package].SEAMS.markdown(), (
        "docs/HOSTS.md's %s table is not SEAMS.markdown(); regenerate it" % package)


# -- the audit of host private names -----------------------------------------------------


def _declared(spec):
    """{attribute: {qualified names of the classes that declare it}} from a HostSpec."""
    out = {}
    for name in spec.names:
        path = name.partition(":")[2]
        owner, _, attr = path.rpartition(".")
        if owner:
            out.setdefault(attr, set()).add(owner)
    return out


class _Audit:
    """Every private attribute of a host package's objects that qlink's code reads or writes
    (the caller's module is qlink's), over the package's classes: [(class, attribute)]."""

    def __init__(self, monkeypatch, package):
        self.touched = set()
        prefix = package + "."
        classes = {cls for name, module in list(sys.modules.items()) if module is not None and
                   (name == package or name.startswith(prefix)) for cls in vars(module).values()
                   if isinstance(cls, type) and cls.__module__.startswith(package)}
        for cls in classes:
            self._watch(monkeypatch, cls)

    def _record(self, obj, attr):
        if attr.startswith("_") and not attr.startswith("__"):
            caller = sys._getframe(2).f_globals.get("__name__", "")
            if caller.startswith("qlink."):
                self.touched.add((type(obj), attr))

    def _watch(self, monkeypatch, cls):
        get, put = cls.__getattribute__, cls.__setattr__
        record = self._record

        def __getattribute__(obj, attr):
            record(obj, attr)
            return get(obj, attr)

        def __setattr__(obj, attr, value):
            record(obj, attr)
            return put(obj, attr, value)
        monkeypatch.setattr(cls, "__getattribute__", __getattribute__)
        monkeypatch.setattr(cls, "__setattr__", __setattr__)

    def undeclared(self, spec):
        declared = _declared(spec)
        return sorted("%s.%s" % (cls.__qualname__, attr) for cls, attr in self.touched
                      if not {c.__qualname__ for c in cls.__mro__} & declared.get(attr, set()))


def _run_gptqmodel(monkeypatch, defuser):  # noqa: F811
    """The stand-in's layer walk over a MoE architecture (grouped batches, routed experts,
    the tasks' Hessians) and one task's solve through qlink."""
    from test_integration_gptqmodel_archs import walk
    monkeypatch.setattr(gptqmodel.input_cache, "GROUP_ROWS", 3 * 16)
    from gptqmodel.looper import gptq_processor
    from gptqmodel.quantization import config
    walk("mixtral", "MixtralQModel", defuser)
    task = gptq_processor.GPTQ(torch.nn.Linear(64, 16), config.QuantizeConfig())
    task.quantizer.configure(perchannel=True)
    task.name = "o_proj"
    task.add_batch(torch.randn(96, 64), None)
    task.quantize()


def _run_auto_round(monkeypatch, defuser):  # noqa: F811
    """A block tuned by the native loop with a masked loss, and a block's RTN spread."""
    from test_integration_autoround import _rtn, _tune
    host = types.SimpleNamespace(
        sign_round=importlib.import_module("auto_round.algorithms.quantization.sign_round.quantizer"),
        block_runner=importlib.import_module("auto_round.algorithms.block_runner"))
    _tune(host, token_ids=True, iters=3, nsamples=8)
    _rtn(host, importlib.import_module("auto_round.algorithms.quantization.rtn.quantizer").RTNQuantizer)


RUNS = {"gptqmodel": _run_gptqmodel, "auto_round": _run_auto_round}


def _audit(package, monkeypatch, defuser, library):  # noqa: F811
    adapter = INTEGRATIONS[package]
    importlib.import_module(package)
    for name in ("looper.module_looper", "looper.gptq_processor", "quantization.gptq", "looper.input_cache",
                 "models.base") if package == "gptqmodel" else ("algorithms.quantization.rtn.quantizer",
                                                                "algorithms.quantization.sign_round.quantizer",
                                                                "algorithms.block_runner", "compressors.utils"):
        importlib.import_module(package + "." + name)
    audit = _Audit(monkeypatch, package)
    ctx = qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "off"}, library=library)
    adapter.install(ctx=ctx, strict=True) if adapter is gptqmodel else adapter.install(2, True, ctx=ctx)
    RUNS[package](monkeypatch, defuser)
    adapter.uninstall()
    return audit


@pytest.mark.parametrize("package", sorted(INTEGRATIONS))
def test_qlink_touches_no_host_private_attribute_it_does_not_declare(
        package, monkeypatch, defuser, library):  # noqa: F811
    with stand_in(package, INTEGRATIONS[package]):
        audit = _audit(package, monkeypatch, defuser, library)
        assert audit.touched, "the audit saw no private attribute: it is not watching"
        assert audit.undeclared(INTEGRATIONS[package].HOST) == []


def test_the_audit_names_a_planted_undeclared_write(monkeypatch, defuser, library):  # noqa: F811
    """A write of qlink's code to a GPTQ task's private attribute that HostSpec does not
    declare (planted in the add_batch seam's counting, as qlink's own code) fails the audit."""
    counting = hessian_queue.count_batch
    namespace = {"counting": counting}
    source = "def planted(gptq, *args, **kwargs):\n    gptq._planted_state = 1\n    counting(gptq, *args, **kwargs)\n"
    exec(compile(source, hessian_queue.__file__, "exec"), dict(vars(hessian_queue), **namespace), namespace)
    assert re.match(r"qlink\.", namespace["planted"].__globals__["__name__"])
    monkeypatch.setattr(hessian_queue, "count_batch", namespace["planted"])
    with stand_in("gptqmodel", gptqmodel):
        audit = _audit("gptqmodel", monkeypatch, defuser, library)
        assert audit.undeclared(gptqmodel.HOST) == ["GPTQ._planted_state"]
