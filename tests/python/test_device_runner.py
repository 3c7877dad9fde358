"""tools/device.sh, the accelerator machine's runner, said through (DRY_RUN): every part
names its commands and each script a command names by a relative path is where that command
starts (bench/hosts unless the part says otherwise). A part whose script is not there would
spend a lease's call on an exit status 2."""
import os
import subprocess

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RUNNER = os.path.join(ROOT, "tools", "device.sh")


def _runner(*args, **env):
    return subprocess.run(["bash", RUNNER, *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **env))


def test_every_part_finds_its_scripts(tmp_path):
    parts = _runner("--list").stdout.splitlines()[0].split()
    assert "moe_isolated" in parts and "pytest" in parts
    said = _runner(str(tmp_path / "out"), *parts, DRY_RUN="1", BUDGET="0", ALT_LIB=str(tmp_path))
    assert said.returncode == 0, [line for line in said.stdout.splitlines() if ": no " in line or "not passed" in line]
    assert "=== moe_stage_isolated (at most" in said.stdout


def test_a_script_that_is_not_where_its_command_starts_is_named(tmp_path):
    broken = tmp_path / "tools" / "device.sh"
    broken.parent.mkdir()
    with open(RUNNER) as f:
        text = f.read().replace('cwd=$hosts_dir ', 'cwd=$P/tools ', 1)
    broken.write_text(text.replace('P=$(cd "$(dirname "$0")/.." && pwd)', 'P=%s' % os.path.abspath(ROOT), 1))
    said = subprocess.run(["bash", str(broken), str(tmp_path / "out"), "isolated"], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, DRY_RUN="1", BUDGET="0"))
    assert said.returncode == 1
    assert "=== iso_host: no gptqmodel_run.py in %s/tools" % os.path.abspath(ROOT) in said.stdout
