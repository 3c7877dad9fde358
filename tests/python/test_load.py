"""qlink.load: finding the plugin, negotiating the ABI, configs and their refusals."""
import threading

import pytest
import torch

import qlink
from qlink import _abi


def test_load_cpu_backend_with_virtual_devices(cpu4):
    assert cpu4.backend == "cpu"
    assert cpu4.device_count == 4
    names = [d.name for d in cpu4.devices()]
    assert names == ["cpu:virtual:%d" % i for i in range(4)]
    assert all(d.total_bytes > 0 for d in cpu4.devices())


def test_p2p_is_a_no_op_on_cpu(library):
    ctx = qlink.load({"backend": "cpu", "log_level": "off", "p2p": qlink.P2PConfig(mode="on", probe=True)},
                     library=library)
    matrix = ctx.enable_peer_access()
    assert len(matrix) == 4 * 3
    assert all(p.state == "not_applicable" and not p.enabled for p in matrix.values())
    assert not ctx.can_copy(0, 1)


def test_p2p_config_alone_is_accepted(library):
    with qlink.load(qlink.P2PConfig(mode="off"), library=library) as ctx:
        assert ctx.device_count >= 1


@pytest.mark.parametrize("config, culprit", [
    ({"backend": "cpu", "cpu_devices": 0}, "'cpu_devices' = 0 is out of range"),
    ({"backend": "cpu", "p2p": {"mode": "sometimes"}}, "'p2p.mode'"),
    ({"backend": "cpu", "p2p": {"probe": "yes"}}, "'p2p.probe' must be a boolean"),
    ({"backend": "cpu", "p2p": {"use_torch_replicate": "yes"}}, "p2p.use_torch_replicate must be a bool"),
    ({"backend": "cpu", "verbose": True}, "unknown field 'verbose'"),
])
def test_bad_config_raises_invalid_argument_naming_the_field(library, config, culprit):
    with pytest.raises(qlink.InvalidArgumentError, match=culprit) as info:
        qlink.load(config, library=library)
    assert info.value.status == _abi.INVALID_ARGUMENT
    assert isinstance(info.value, ValueError)


def test_backend_that_does_not_exist_is_unavailable(library):
    with pytest.raises(qlink.UnavailableError, match="/no/such/backend.so"):
        qlink.load({"backend": "/no/such/backend.so"}, library=library)


def test_config_of_the_wrong_type_raises_type_error(library):
    with pytest.raises(TypeError, match="config must be"):
        qlink.load("mode=on", library=library)


def test_missing_library_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        qlink.load(library=str(tmp_path / "libqlink.so"))


@pytest.mark.parametrize("major, minor, why", [(_abi.ABI_MAJOR + 1, 0, "major differs"),
                                               (_abi.ABI_MAJOR, _abi.ABI_MINOR + 1, "minor too new")])
def test_plugin_with_another_abi_is_refused_with_both_versions(library, monkeypatch, major, minor, why):
    provided = "provides ABI %d.%d" % (_abi.ABI_MAJOR, _abi.ABI_MINOR)
    monkeypatch.setattr(_abi, "ABI_MAJOR", major)
    monkeypatch.setattr(_abi, "ABI_MINOR", minor)
    monkeypatch.setattr(qlink.context, "_LIBRARIES", {})
    with pytest.raises(qlink.VersionMismatchError) as info:
        qlink.load({"backend": "cpu"}, library=library)
    message = str(info.value)
    assert provided in message and ("asked for %d.%d" % (major, minor)) in message and why in message


def test_errors_are_per_thread(library):
    """A failure on one thread does not leak its message into another thread's success."""
    errors = []

    def bad():
        for _ in range(50):
            with pytest.raises(qlink.InvalidArgumentError, match="cpu_devices"):
                qlink.load({"backend": "cpu", "cpu_devices": -1}, library=library)

    def good():
        for _ in range(50):
            with qlink.load({"backend": "cpu", "log_level": "off"}, library=library) as ctx:
                errors.append(ctx.function("last_error")())

    threads = [threading.Thread(target=f) for f in (bad, good, bad, good)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors and all(e == b"" for e in errors)


def test_auto_means_hip_under_a_rocm_build_of_torch(monkeypatch):
    from qlink.config import to_json
    monkeypatch.setattr(torch.version, "hip", "6.2.0", raising=False)
    assert '"backend": "hip"' in to_json(None)
    assert '"backend": "hip"' in to_json({"backend": "auto"})
    assert '"backend": "cpu"' in to_json({"backend": "cpu"})
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert "hip" not in to_json(None)
