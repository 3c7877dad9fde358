#!/bin/bash
# The wheel end to end, as a user gets it: built by pip from the package, the metadata and
# the Bazel-built binaries; installed into a fresh `python3 -m venv --system-site-packages`
# (Debian's PyTorch); then, with no path to pass and nothing on PYTHONPATH:
#   - one version: the wheel's name, its metadata, qlink.__version__ and `qlink --version`;
#   - `qlink env` on the CPU backend;
#   - `qlink run` over a stand-in host script with no qlink line in it: the report shows
#     the patched paths taken, the host never imported said once, the exit code passed on;
#     settings from a TOML file, then QLINK_*, then flags;
#   - refusals before the script starts: an unknown integration, a bad context field, a
#     misspelt QLINK_ variable.
set -euo pipefail
root="$TEST_SRCDIR/qlink"
work="$TEST_TMPDIR/wheel"
rm -rf "$work" && mkdir -p "$work/src" "$work/dist"
unset PYTHONPATH
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
fail() { echo "FAIL: $*" >&2; exit 1; }

# Build: pip + setuptools write beside the sources, so from a copy (runfiles are read-only).
cp -rL "$root/python" "$root/pyproject.toml" "$root/setup.py" "$root/README.md" "$work/src/"
QLINK_NATIVE_DIR="$root" /usr/bin/python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$work/dist" \
  "$work/src"
wheel=$(ls "$work"/dist/qlink-*-cp310-abi3-linux_x86_64.whl)
/usr/bin/python3 -m venv --system-site-packages --without-pip "$work/venv"
"$work/venv/bin/python" -m pip install -q --no-index --no-deps "$wheel"
qlink="$work/venv/bin/qlink"
py="$work/venv/bin/python"

# Hosts: the stand-ins and the user's script, outside the source tree; run from elsewhere.
cp -rL "$root/tests/python/hosts" "$work/hosts"
mkdir -p "$work/cwd" && cd "$work/cwd"

echo "== one version"
version=$(basename "$wheel" | cut -d- -f2)
abi=$("$py" -c "from qlink import _abi; print('%d.%d' % (_abi.ABI_MAJOR, _abi.ABI_MINOR))")
[ "$("$qlink" --version)" = "qlink $version (C ABI $abi)" ] || fail "qlink --version: $("$qlink" --version)"
"$py" - "$version" <<'EOF'
import importlib.metadata, os, sys
import qlink
assert qlink.__version__ == importlib.metadata.version("qlink") == sys.argv[1], qlink.__version__
assert qlink.__file__.startswith(sys.prefix), qlink.__file__  # the venv's copy, not a source tree
assert os.path.isfile(os.path.join(os.path.dirname(qlink.__file__), "lib", "libqlink.so"))
with qlink.load({"backend": "cpu", "log_level": "off"}) as ctx:  # the library found beside the package
    assert ctx.backend == "cpu" and ctx.abi_version == (qlink._abi.ABI_MAJOR, qlink._abi.ABI_MINOR)
EOF

echo "== qlink env"
"$qlink" env | tee "$work/env.txt"
grep -q "^backend: cpu (auto: no GPU backend has a device" "$work/env.txt" || fail "env: backend choice"
"$qlink" env --json > "$work/env.json"
"$py" - "$work/env.json" "$version" <<'EOF'
import json, sys
info = json.load(open(sys.argv[1]))
assert info["qlink"]["version"] == sys.argv[2], info["qlink"]
assert info["qlink"]["library_abi"] == info["qlink"]["package_abi"], info["qlink"]
assert info["qlink"]["library"].startswith(info["python"]["executable"].rsplit("/bin/", 1)[0]), info["qlink"]
assert "cpu" in info["qlink"]["backend_libraries"], info["qlink"]
assert info["backend"]["chosen"] == "cpu" and info["backend"]["cpu_memory"], info["backend"]
assert len(info["devices"]) == 4 and len(info["peers"]) == 12, info["devices"]
assert {p["state"] for p in info["peers"]} == {"not_applicable"}, info["peers"]
assert not info["hosts"]["gptqmodel"]["importable"] and not info["hosts"]["autoround"]["importable"]
assert info["torch"]["version"]
EOF

echo "== qlink run: a stand-in host script, no qlink line in it"
! grep -qE "(import|from) qlink|qlink\." "$work/hosts/quantize_standin.py" || fail "the script must not use qlink"
cat > "$work/run.json" <<'EOF'
{"qlink": {"backend": "cpu", "cpu_devices": 4, "log_level": "off"}}
EOF
set +e
"$qlink" run --config "$work/run.json" --report "$work/report.json" -- python "$work/hosts/quantize_standin.py" \
  --exit-code 3 > "$work/run.out" 2> "$work/run.err"
rc=$?
set -e
cat "$work/run.out" "$work/run.err"
[ $rc -eq 3 ] || fail "qlink run returned $rc, the script exited 3"
grep -q "^solves digest" "$work/run.out" || fail "the script did not run to its end"
[ "$(grep -c "auto_round was never imported" "$work/run.err")" -eq 1 ] || fail "the host never imported, said once"
"$py" - "$work/report.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["exit_code"] == 3 and r["processes"] == 1 and not r["errors"], r
g = r["integrations"]["gptqmodel"]
assert g["state"] == "installed", g
c = g["counters"]
assert c["move_to"]["qlink"] == 4, c["move_to"]                    # the forward pass's moves
assert c["materialize_global_hessian"]["qlink"] == 2, c             # both layers' Hessians
assert c["quantize"]["qlink"] == 1 and c["quantize"]["host"] == 1, c["quantize"]  # native engine; mse: host's
assert list(c["quantize"]["reasons"]) == ["mse > 0 (a scale search per group)"], c["quantize"]
assert all(p["fallback"] == 0 for p in c.values()), c
assert r["integrations"]["autoround"] == {"host": "auto_round", "state": "not imported", "counters": {}}, r
EOF

echo "== qlink run: TOML file, then QLINK_*, then flags"
cat > "$work/run.toml" <<'EOF'
integrations = ["gptqmodel"]
[qlink]
backend = "cpu"
log_level = "off"
EOF
QLINK_INTEGRATIONS=autoround QLINK_REPORT="$work/env-report.json" "$qlink" run --config "$work/run.toml" \
  --integrations gptqmodel --strict -- python "$work/hosts/quantize_standin.py" > /dev/null 2> "$work/run2.err" \
  || { cat "$work/run2.err"; fail "the TOML run failed"; }
"$py" - "$work/env-report.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))  # the report path from QLINK_REPORT, integrations from the flag
assert r["settings"]["strict"] is True and r["settings"]["integrations"] == ["gptqmodel"], r["settings"]
assert list(r["integrations"]) == ["gptqmodel"] and r["integrations"]["gptqmodel"]["state"] == "installed", r
EOF

echo "== refusals, before the script starts"
refused() {  # expected message, qlink run arguments...
  local expected=$1; shift
  set +e
  "$@" -- python "$work/hosts/quantize_standin.py" > "$work/refused.out" 2> "$work/refused.err"
  local rc=$?
  set -e
  cat "$work/refused.err"
  [ $rc -eq 2 ] || fail "$* returned $rc"
  grep -qF "$expected" "$work/refused.err" || fail "$* did not say: $expected"
  [ ! -s "$work/refused.out" ] || fail "$*: the script ran"
}
refused "integrations: unknown integration 'vllm'" "$qlink" run --integrations gptqmodel,vllm
echo '{"qlink": {"backend": "cpu", "p2p": {"mode": "sometimes"}}}' > "$work/bad.json"
refused "p2p.mode" "$qlink" run --config "$work/bad.json"
echo '{"stirct": true}' > "$work/typo.json"
refused "unknown field 'stirct'" "$qlink" run --config "$work/typo.json"
refused "QLINK_STIRCT" env QLINK_STIRCT=1 "$qlink" run
echo "wheel test passed"
