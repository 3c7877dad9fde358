"""The data-parallel plan (qlink.plan) and `python3 -m qlink plan` on the CPU backend: every
rule of AutoRound's parallel_quantization, and every reason a device or a size is left out."""
import os
import subprocess
import sys

import pytest

from qlink.plan import GIB, PlanRefused, resolve_plan

DEVICES = [0, 1, 2, 3, 4]


def test_off_is_home_alone_and_says_so():
    plan = resolve_plan("off", DEVICES, iters=200, batch_size=8, home=3)
    assert plan.devices == (3,) and plan.world == 1
    assert plan.left_out == ("parallel_quantization is off: home alone",)


def test_auto_takes_a_power_of_two_when_tuning_and_every_device_at_iters_0():
    tuning = resolve_plan("auto", DEVICES, iters=200, batch_size=8, home=3)
    assert tuning.devices == (3, 0, 1, 2)  # home first, then ascending
    assert tuning.left_out == ("device 4: tuning (iters=200) needs a power-of-two world, 5 usable -> 4",)
    assert resolve_plan("auto", DEVICES, iters=0, batch_size=1, home=3).devices == (3, 0, 1, 2, 4)


def test_a_small_batch_demotes_the_world_naming_each_device():
    plan = resolve_plan("auto", DEVICES, iters=200, batch_size=3)
    assert plan.devices == (0, 1)
    assert plan.left_out[1:] == tuple("device %d: batch_size 3 < 4 replicas, demoted to 2 (every replica needs a "
                                      "sample)" % d for d in (2, 3))
    assert resolve_plan(4, DEVICES, iters=200, batch_size=2).devices == (0, 1)


def test_auto_on_one_device_runs_serial_and_says_why():
    plan = resolve_plan("auto", ["cuda:0"], iters=200, batch_size=8)
    assert plan.devices == ("cuda:0",) and plan.left_out == ("only 1 device visible: serial",)


def test_the_memory_guard_names_each_device_and_what_it_lacked():
    free = {0: 1 * GIB, 1: 3 * GIB, 2: 20 * GIB, 3: 20 * GIB}
    parts = {"block": 6 * GIB, "tuning": GIB // 2, "activations": 4 * GIB}
    plan = resolve_plan("auto", [0, 1, 2, 3], iters=200, batch_size=8, free_bytes=free, mirror_parts=parts)
    assert plan.devices == (0, 2)  # home holds the block already; 3 usable -> 2
    assert plan.left_out[0] == ("device 1: 3.0 GiB free, a mirror needs 12.5 GiB (block 6.0 GiB + tuning 0.5 GiB "
                                "+ activations 4.0 GiB + margin 2.0 GiB)")
    assert plan.left_out[1] == "device 3: tuning (iters=200) needs a power-of-two world, 3 usable -> 2"
    with pytest.raises(PlanRefused) as refused:
        resolve_plan(4, [0, 1, 2, 3], iters=200, batch_size=8, free_bytes=free, mirror_parts=parts)
    assert refused.value.reasons[0] == "4 replicas asked, 3 devices have the memory for a mirror"
    assert refused.value.reasons[1].startswith("device 1: 3.0 GiB free")


def test_an_explicit_world_that_cannot_engage_names_every_reason():
    with pytest.raises(PlanRefused) as refused:
        resolve_plan(6, DEVICES, iters=200, batch_size=8, home_is_accelerator=False,
                     block_devices=["cuda:0", "cuda:1"])
    assert refused.value.reasons == [
        "home device 0 is not an accelerator",
        "the block is spread over cuda:0, cuda:1 (device_map): each replica needs it whole",
        "6 replicas asked, 5 devices visible",
        "tuning (iters=200) needs a power-of-two world for halving-doubling, got 6"]
    assert str(refused.value).startswith("parallel_quantization=6 cannot engage: home device 0")
    with pytest.raises(PlanRefused, match="at least 2 replicas, got 1"):
        resolve_plan(1, DEVICES, iters=0, batch_size=8)
    assert resolve_plan(3, DEVICES, iters=0, batch_size=8).devices == (0, 1, 2)  # any world at iters=0


def test_auto_with_a_blocking_reason_runs_serial_and_names_it():
    plan = resolve_plan("auto", ["cpu"], iters=200, batch_size=8, home_is_accelerator=False)
    assert plan.devices == ("cpu",) and plan.left_out == ("home device cpu is not an accelerator",)


@pytest.mark.parametrize("parallel", ["on", True, 2.0])
def test_a_setting_that_is_not_one_is_refused_naming_it(parallel):
    with pytest.raises(ValueError, match="parallel_quantization must be 'off', 'auto' or an int"):
        resolve_plan(parallel, DEVICES, iters=0, batch_size=8)


def test_devices_are_ordered_by_index_not_by_name():
    plan = resolve_plan("auto", ["cuda:10", "cuda:2", "cuda:0"], iters=0, batch_size=8)
    assert plan.devices == ("cuda:10", "cuda:0", "cuda:2")  # home (the first) first


def _qlink_plan(library, *args):
    python = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    return subprocess.run([sys.executable, "-m", "qlink", "plan", "--library", library,
                           "--config", '{"backend": "cpu", "cpu_devices": 5, "log_level": "off"}'] + list(args),
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=python), timeout=120)


def test_the_plan_command_prints_the_world_the_devices_and_every_reason(library):
    run = _qlink_plan(library, "--parallel", "auto", "--iters", "200", "--batch-size", "2")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "backend: cpu, 5 device(s): virtual, in CPU memory",
        "parallel_quantization=auto, iters=200, batch_size=2",
        "world: 2",
        "devices: 0 (home), 1",
        "left out:",
        "  device 4: tuning (iters=200) needs a power-of-two world, 5 usable -> 4",
        "  device 2: batch_size 2 < 4 replicas, demoted to 2 (every replica needs a sample)",
        "  device 3: batch_size 2 < 4 replicas, demoted to 2 (every replica needs a sample)"]


def test_the_plan_command_refuses_what_cannot_engage(library):
    run = _qlink_plan(library, "--parallel", "8", "--iters", "0", "--batch-size", "8")
    assert run.returncode == 1
    assert run.stdout.splitlines()[1:] == ["refused: parallel_quantization=8 cannot engage",
                                           "  8 replicas asked, 5 devices visible"]
    huge = _qlink_plan(library, "--parallel", "auto", "--iters", "0", "--mirror-gib", "1000000")
    assert "world: 1 (serial)" in huge.stdout
    assert huge.stdout.count("GiB free, a mirror needs") == 4
