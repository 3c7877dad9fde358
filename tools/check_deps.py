"""Fails when a shared library qlink's tests load comes from a Debian package that neither
tools/install_deps.sh names (with what those packages depend on) nor the bare machine has:
a test that passes only because something was installed by hand.

The libraries: what `ldd` lists for each ELF file given, and what a probe process maps
after it has loaded PyTorch, the plugin and its CPU backend, and run the GPTQ engine (which
dlopens its BLAS and LAPACK).

  python3 tools/check_deps.py --install-deps tools/install_deps.sh \\
      [--bare /usr/share/package-lists/installed-cpp.txt] [--library bazel-bin/libqlink.so] [ELF ...]

Dependencies count through the first alternative of each "a | b" only: libopenblas0-pthread
provides libblas.so.3 for python3-torch's "libblas3 | libblas.so.3", but only libblas3 is
what installing python3-torch brings.
"""
import argparse
import os
import re
import subprocess
import sys

PROBE = r"""
import sys, ctypes
import torch
sys.path.insert(0, sys.argv[2])
import qlink
from qlink.quant import gptq_quantize
with qlink.load({"backend": "cpu", "cpu_devices": 1, "log_level": "off"}, library=sys.argv[1]) as ctx:
    x = torch.randn(64, 32)
    gptq_quantize(torch.randn(8, 32), x.t() @ x, bits=4, group_size=-1, ctx=ctx)
    print(open("/proc/self/maps").read())
"""


def named_packages(install_deps):
    """The package names the install script lists (its packages=(...) array; comments, which
    may hold parentheses, dropped first)."""
    code = " ".join(line.split("#", 1)[0] for line in open(install_deps).read().splitlines())
    body = re.search(r"packages=\((.*?)\)", code)
    if body is None:
        raise SystemExit("%s: no packages=(...) list" % install_deps)
    return set(body.group(1).split())


def bare_packages(lists):
    """The Debian packages a bare machine has, from its image's package lists."""
    names = set()
    for path in lists:
        for line in open(path):
            fields = line.rstrip("\n").split("\t")
            if len(fields) >= 2 and fields[0] == "apt":
                names.add(fields[1].split(":")[0])
    return names


def installed_dependencies():
    """{package: [first installed alternative of each dependency]} of the installed packages."""
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Status}\t${Pre-Depends}, ${Depends}\n"],
                         check=True, capture_output=True, text=True).stdout
    rows = [line.split("\t") for line in out.splitlines()]
    installed = {r[0] for r in rows if r[1].endswith(" installed")}
    deps = {}
    for name, status, depends in rows:
        if name not in installed:
            continue
        firsts = []
        for group in depends.split(","):
            alternatives = [a.split("(")[0].strip().split(":")[0] for a in group.split("|") if a.strip()]
            if alternatives and alternatives[0] in installed:
                firsts.append(alternatives[0])
        deps[name] = firsts
    return deps


def closure(roots, deps):
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(deps.get(p, []))
    return seen


def ldd_libraries(elf):
    out = subprocess.run(["ldd", elf], capture_output=True, text=True).stdout
    return {m.group(1) for m in re.finditer(r"=> (/\S+)", out)}


def probe_libraries(library, python_dir):
    out = subprocess.run(["/usr/bin/python3", "-c", PROBE, library, python_dir], check=True, capture_output=True,
                         text=True).stdout
    files = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5].startswith("/") and ".so" in os.path.basename(fields[5]):
            files.add(fields[5])
    return files


def file_owners(info_dir="/var/lib/dpkg/info"):
    """{path: package} for every shared library an installed package put on the machine
    (dpkg's own file lists, read once: asking dpkg-query per library takes minutes)."""
    owners = {}
    for name in os.listdir(info_dir):
        if name.endswith(".list"):
            package = name[:-len(".list")].split(":")[0]
            with open(os.path.join(info_dir, name), errors="replace") as f:
                for line in f:
                    if ".so" in line:
                        owners[line.rstrip("\n")] = package
    return owners


def package_of(path, owners):
    """The Debian package that installed `path` (symlinks followed, usr-merge aware), or None."""
    candidates = {path, os.path.realpath(path)}
    for p in list(candidates):
        if p.startswith("/usr/lib/"):
            candidates.add(p[len("/usr"):])
        elif p.startswith("/lib/"):
            candidates.add("/usr" + p)
    found = sorted(owners[p] for p in candidates if p in owners)
    return found[0] if found else None


def check(libraries, allowed, own_roots, owners):
    """The problems, one line each: a library from a package outside `allowed`, or from no
    package at all (unless under one of own_roots: the project's own build)."""
    problems = []
    for lib in sorted(libraries):
        real = os.path.realpath(lib)
        if any(real.startswith(root) for root in own_roots):
            continue
        package = package_of(lib, owners)
        if package is None:
            problems.append("%s: installed by no Debian package" % lib)
        elif package not in allowed:
            problems.append("%s: from package %s, which tools/install_deps.sh does not name (nor brings, nor is it "
                            "on the bare machine)" % (lib, package))
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--install-deps", required=True)
    parser.add_argument("--bare", action="append", default=[], help="a bare image's package list (repeatable)")
    parser.add_argument("--library", help="libqlink.so: probe what a process running the CPU engine maps")
    parser.add_argument("--python-dir", help="the qlink package's parent folder, for the probe")
    parser.add_argument("--own", action="append", default=[], help="a folder of the project's own build outputs")
    parser.add_argument("elf", nargs="*")
    args = parser.parse_args(argv)
    libraries = set()
    for elf in args.elf:
        libraries |= ldd_libraries(elf)
    if args.library:
        libraries |= probe_libraries(os.path.abspath(args.library), os.path.abspath(args.python_dir))
    allowed = closure(named_packages(args.install_deps) | bare_packages(args.bare), installed_dependencies())
    own = [os.path.realpath(o) + "/" for o in args.own]
    problems = check(libraries, allowed, own, file_owners())
    for p in problems:
        print(p)
    print("%d shared libraries checked, %d outside the install step" % (len(libraries), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
