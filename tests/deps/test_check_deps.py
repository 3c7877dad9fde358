"""tools/check_deps.py on this machine: it passes on the project's own install step, and
fails naming the library and its package when the install step stops naming one the
tests load (a fake install script; nothing is installed or removed)."""
import os
import subprocess
import sys

RUNFILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(RUNFILES, "tools"))
import check_deps  # noqa: E402

BARE = [p for p in ["/usr/share/package-lists/installed-cpp.txt"] if os.path.exists(p)]
LIBRARY = os.path.join(RUNFILES, "libqlink.so")
ELVES = [os.path.join(RUNFILES, "tests", "abi_test"),
         os.path.join(RUNFILES, "tools", "gptq_libtorch_host")]


def run(install_deps, bare=BARE):
    """(exit code, output) of the check over the tests' binaries and the probe."""
    argv = [sys.executable, os.path.join(RUNFILES, "tools", "check_deps.py"), "--install-deps", install_deps,
            "--library", LIBRARY, "--python-dir", os.path.join(RUNFILES, "python"),
            "--own", os.path.dirname(os.path.realpath(LIBRARY))]
    for path in bare:
        argv += ["--bare", path]
    r = subprocess.run(argv + ELVES, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def test_every_library_the_tests_load_comes_from_the_install_step():
    code, out = run(os.path.join(RUNFILES, "tools", "install_deps.sh"))
    assert code == 0, out
    assert " 0 outside the install step" in out


def test_a_library_the_install_step_stops_naming_fails_the_check_naming_it(tmp_path):
    # An install step that names only the C library, on a bare machine that has nothing:
    # the BLAS the engine loaded (OpenBLAS, or the reference BLAS python3-torch brings) is
    # then outside it, and the check names it with its package.
    blas = sorted(f for f in check_deps.probe_libraries(LIBRARY, os.path.join(RUNFILES, "python"))
                  if os.path.basename(f).startswith(("libopenblas", "libblas")))
    assert blas, "the probe mapped no BLAS"
    package = check_deps.package_of(blas[0], check_deps.file_owners())
    assert package is not None
    fake_install = tmp_path / "install_deps.sh"
    fake_install.write_text("packages=(libc6)\n")
    fake_bare = tmp_path / "bare.txt"
    fake_bare.write_text("")
    code, out = run(str(fake_install), [str(fake_bare)])
    assert code == 1, out
    assert "%s: from package %s, which tools/install_deps.sh does not name" % (blas[0], package) in out


def test_the_install_step_names_are_read_from_its_package_list(tmp_path):
    script = tmp_path / "install.sh"
    script.write_text("packages=(a-pkg b-pkg   # why (see here)\n    c-pkg)\nother=(x)\n")
    assert check_deps.named_packages(str(script)) == {"a-pkg", "b-pkg", "c-pkg"}
    assert check_deps.closure({"a"}, {"a": ["b"], "b": ["c", "a"], "d": ["e"]}) == {"a", "b", "c"}
