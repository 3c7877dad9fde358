"""The torch bridge's own logic over a fake PyTorch shim (fake_torch_shim.cc), so it runs
where no PyTorch has the real one (CI's 1.13): each scenario in a process of its own
(fake_bridge_scenarios.py), ending with no handle or storage left alive."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("scenario", ["describe", "move", "copy", "run", "arguments"])
def test_bridge_over_the_fake_shim(library, scenario):
    # Bazel's runfiles put it here; outside Bazel it is found beside libqlink.so (dist/) or under bazel-bin/.
    built = os.path.dirname(library)
    shim = next((p for p in (os.path.join(d, "libfake_torch_shim.so") for d in (HERE, built, os.path.join(
        built, "tests", "python"))) if os.path.exists(p)), None)
    assert shim, "libfake_torch_shim.so not found: bazel build //tests/python:libfake_torch_shim.so"
    run = subprocess.run([sys.executable, os.path.join(HERE, "fake_bridge_scenarios.py"), library, shim, scenario],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
