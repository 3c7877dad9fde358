"""qlink run's parts in process (the wheel test runs the whole): the import hook installs
once, right after a host package has executed, leaving the host its own loader; a failed
installation is reported, or fails the import under strict; the per-process reports
merge into one summary; QLINK_* variables map onto settings and a misspelt one is refused;
the integrations' switches (gptqmodel.expert_stage, autoround.grouped_moe) reach their
installs, a bad one named."""
import json
import sys

import pytest

from qlink.launcher import summary
from qlink.launcher.hooks import HostImportHook, Run
from qlink.launcher.settings import Settings, SettingsError, environment_settings


@pytest.fixture
def fake_host(tmp_path, monkeypatch):
    """A package `fakehost` on sys.path."""
    (tmp_path / "fakehost").mkdir()
    (tmp_path / "fakehost" / "__init__.py").write_text("value = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fakehost"
    sys.modules.pop("fakehost", None)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, HostImportHook)]


def test_the_hook_installs_once_after_the_package_ran(fake_host):
    seen = []
    sys.meta_path.insert(0, HostImportHook({fake_host}, lambda p: seen.append((p, sys.modules[p].__name__))))
    import fakehost
    import fakehost as again  # noqa: F401
    assert seen == [("fakehost", "fakehost")]
    assert type(fakehost.__loader__).__name__ == "SourceFileLoader"
    assert fakehost.__spec__.loader is fakehost.__loader__


def test_a_failed_installation_is_reported_or_fails_the_import_under_strict(tmp_path, monkeypatch):
    def broken(name):
        raise RuntimeError("no %s here" % name)

    run = Run(Settings(integrations=["gptqmodel"]), str(tmp_path))
    monkeypatch.setattr(run, "_context", lambda: broken("context"))
    run.install("gptqmodel")
    assert run.states["gptqmodel"]["state"] == "failed"
    assert run.states["gptqmodel"]["error"] == "RuntimeError: no context here"
    run.settings.strict = True
    with pytest.raises(RuntimeError, match="no context here"):
        run.install("gptqmodel")


def _part(tmp_path, pid, state, counters):
    part = {"pid": pid, "argv": [], "integrations": {"gptqmodel": {"host": "gptqmodel", "state": state,
                                                                   "counters": counters}}}
    (tmp_path / ("process-%d.json" % pid)).write_text(json.dumps(part))


def test_the_processes_reports_merge_into_one_summary(tmp_path):
    count = {"move_to": {"qlink": 2, "host": 1, "fallback": 0, "reasons": {"a dtype conversion": 1}}}
    _part(tmp_path, 1, "installed", count)
    _part(tmp_path, 2, "installed", count)
    _part(tmp_path, 3, "not imported", {})
    report = summary.merge(str(tmp_path), Settings(), ["python", "x.py"], 0)
    assert report["processes"] == 3
    g = report["integrations"]["gptqmodel"]
    assert g["state"] == "installed"
    assert g["counters"]["move_to"] == {"qlink": 4, "host": 2, "fallback": 0, "reasons": {"a dtype conversion": 2}}
    assert report["integrations"]["autoround"]["state"] == "not imported"
    text = summary.lines(report)
    assert sum("auto_round was never imported" in line for line in text) == 1
    assert any("2x a dtype conversion" in line for line in text)


def test_qlink_variables_map_onto_settings_and_a_misspelt_one_is_refused():
    values = environment_settings({"QLINK_BACKEND": "cuda", "QLINK_STRICT": "1", "QLINK_LAUNCHER_STATE": "{}",
                                   "QLINK_PARALLEL_QUANTIZATION": "2", "PATH": "/bin"})
    assert values == {"qlink": {"backend": "cuda"}, "strict": "1", "autoround": {"parallel_quantization": "2"}}
    with pytest.raises(SettingsError, match="QLINK_STIRCT"):
        environment_settings({"QLINK_STIRCT": "1"})


def test_the_integrations_switches_reach_their_installs_and_bad_ones_are_named(tmp_path, monkeypatch):
    from qlink.integrations import autoround, gptqmodel
    from qlink.launcher import settings as launcher_settings
    from qlink.launcher.settings import resolve
    monkeypatch.setattr(launcher_settings, "_check_context_config", lambda config: None)  # no context here
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"gptqmodel": {"expert_stage": True}, "autoround": {"grouped_moe": "yes"}}))
    settings = resolve(str(config), environ={})
    assert settings.gptqmodel == {"expert_stage": True} and settings.autoround == {"grouped_moe": True}
    installed = {}
    monkeypatch.setattr(gptqmodel, "install", lambda **kwargs: installed.setdefault("gptqmodel", kwargs))
    monkeypatch.setattr(autoround, "install", lambda *args, **kwargs: installed.setdefault("autoround", kwargs))
    run = Run(settings, str(tmp_path))
    monkeypatch.setattr(run, "_context", lambda: None)
    monkeypatch.setattr("qlink.launcher.hooks.host_version", lambda package: "0")
    run.install("gptqmodel")
    run.install("auto_round")
    assert installed["gptqmodel"]["expert_stage"] is True and installed["autoround"]["grouped_moe"] is True
    for bad, message in (({"gptqmodel": {"expert_stage": 2}}, "gptqmodel.expert_stage must be true or false, got 2"),
                         ({"gptqmodel": {"expert_stages": True}}, "gptqmodel: unknown field 'expert_stages'"),
                         ({"gptqmodel": []}, "gptqmodel must be an object")):
        config.write_text(json.dumps(bad))
        with pytest.raises(SettingsError, match=message):
            resolve(str(config), environ={})
