"""GPTQModel's CPU pool through qlink (cpu_pool) on the GPTQModel stand-in: install()
builds it with cpu_workers threads where asked, GPTQModel's own size by default
(cpu_workers=None), with GPTQMODEL_CPU_WORKERS set (its setting wins) or in a free-threaded
interpreter; a pool started before install() keeps its size, the reason counted; the
argument is checked."""
import pytest

import qlink
from qlink.integrations import gptqmodel as adapter
from qlink.integrations.gptqmodel import cpu_pool

from stand_in_hosts import stand_in


@pytest.fixture
def host(library, monkeypatch):
    """The stand-in GPTQModel, freshly imported (its pool not yet started), and a context."""
    monkeypatch.delenv("GPTQMODEL_CPU_WORKERS", raising=False)
    with stand_in("gptqmodel", adapter):
        import gptqmodel
        ctx = qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=library)
        yield gptqmodel, ctx


def _seam():
    return adapter.counters()["seams"]["cpu_workers"]


def test_cpu_workers_sizes_the_pool_until_uninstalled(host):
    gptqmodel, ctx = host
    hosts_own = gptqmodel._default_cpu_workers()
    adapter.install(ctx=ctx, cpu_workers=2)
    assert gptqmodel.get_device_thread_pool()["cpu"] == 2
    assert _seam()["qlink"] == 1
    adapter.uninstall()
    assert gptqmodel._default_cpu_workers() == hosts_own


def test_by_default_the_pool_keeps_gptqmodels_size(host):
    gptqmodel, ctx = host
    hosts_own = gptqmodel._default_cpu_workers()
    original = gptqmodel._default_cpu_workers
    adapter.install(ctx=ctx)
    assert gptqmodel._default_cpu_workers is original
    assert gptqmodel.get_device_thread_pool()["cpu"] == hosts_own


def test_gptqmodels_own_setting_wins(host, monkeypatch):
    gptqmodel, ctx = host
    monkeypatch.setenv("GPTQMODEL_CPU_WORKERS", "5")
    adapter.install(ctx=ctx, cpu_workers=2)
    assert gptqmodel.get_device_thread_pool()["cpu"] == 5
    assert _seam()["qlink"] == 0 and _seam()["reasons"] == {"GPTQMODEL_CPU_WORKERS is set": 1}


def test_without_a_gil_the_pool_keeps_gptqmodels_size(host, monkeypatch):
    gptqmodel, ctx = host
    monkeypatch.setattr(cpu_pool, "gil_enabled", lambda: False)
    hosts_own = gptqmodel._default_cpu_workers()
    adapter.install(ctx=ctx, cpu_workers=2)
    assert gptqmodel.get_device_thread_pool()["cpu"] == hosts_own
    assert _seam()["reasons"] == {"no GIL (free-threaded Python)": 1}


def test_a_pool_started_before_install_keeps_its_size_the_reason_counted(host):
    gptqmodel, ctx = host
    started = dict(gptqmodel.get_device_thread_pool())
    adapter.install(ctx=ctx, cpu_workers=2)
    assert gptqmodel.get_device_thread_pool() == started
    assert _seam()["qlink"] == 0
    assert _seam()["reasons"] == {"GPTQModel's CPU pool was started before install()": 1}


@pytest.mark.parametrize("value", [1, 0, 2.0, True, "2"])
def test_cpu_workers_must_be_two_threads_or_more(host, value):
    _, ctx = host
    with pytest.raises(ValueError, match="cpu_workers must be a number of threads, 2 or more"):
        adapter.install(ctx=ctx, cpu_workers=value)
