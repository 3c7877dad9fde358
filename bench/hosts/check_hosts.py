"""Both integrations against the hosts' real trees: every name the seams touch
(HostSpec.names) looked up in the tree's source, every host rule qlink restates
(the integration's contract) digested from the tree and compared with its pin, then, where the host
imports (its dependencies present: the GPU machine's image with the stand-ins), each
integration installed and uninstalled on the CPU backend: install() resolves every name
(HostChanged otherwise), every patched binding must be qlink's after it and the host's
own after uninstall(). Prints what ran and exits 1 naming any name that moved. The
hosts' code is never committed and CI has no network: CI runs the same lookups against
the stand-ins (tests/python/test_integration_base.py).

    python3 check_hosts.py [--hosts DIR] [--library libqlink.so]
    (DIR: the hosts folder tools/pack.sh lays out, by default the one beside this folder)
"""
import argparse
import importlib
import os
import sys

from common import setup_paths

setup_paths()

# Per integration: its module, its install call, and a class method it replaces.
INTEGRATIONS = {
    "gptqmodel": ("qlink.integrations.gptqmodel", lambda m, ctx: m.install(ctx=ctx),
                  "gptqmodel.looper.module_looper:ModuleLooper", "loop"),
    "auto_round": ("qlink.integrations.autoround", lambda m, ctx: m.install(2, ctx=ctx),
                   "auto_round.algorithms.quantization.sign_round.quantizer:SignRoundQuantizer", "quantize_block"),
}


def live(package, module_name, install, owner_name, method, library):
    """Installs and uninstalls the integration in the imported host; returns the problems."""
    import qlink
    integration = importlib.import_module(module_name)
    module, _, path = owner_name.partition(":")
    owner = getattr(importlib.import_module(module), path)
    before = vars(owner)[method]
    ctx = qlink.load({"backend": "cpu", "cpu_devices": 2, "log_level": "warn"}, library=library)
    problems = []
    try:
        install(integration, ctx)
    except Exception as error:  # noqa: BLE001 (HostChanged names what moved; anything else is said as it is)
        return ["install(): %s: %s" % (type(error).__name__, error)]
    if not getattr(vars(owner)[method], "__module__", "").startswith("qlink."):
        problems.append("%s.%s is not qlink's after install()" % (owner_name, method))
    left = integration.uninstall()
    if vars(owner)[method] is not before:
        problems.append("%s.%s is not the host's own after uninstall()" % (owner_name, method))
    if left["kept"]:
        problems.append("uninstall() kept %s" % left["kept"])
    return problems


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    a = argparse.ArgumentParser()
    a.add_argument("--hosts", default=os.path.join(here, "..", "..", "hosts"))
    a.add_argument("--library", default=None, help="libqlink.so (default: the package's own qlink/lib)")
    args = a.parse_args()
    hosts = os.path.abspath(args.hosts)
    sys.path.insert(0, hosts)
    from host_sources import SourceTree, changed_rules
    tree, failed = SourceTree([hosts]), False
    for package, (module_name, install, owner_name, method) in INTEGRATIONS.items():
        spec = importlib.import_module(module_name).HOST
        missing = tree.missing(spec)
        print("%s: %d names looked up in %s: %s" %
              (spec.title, len(spec.names), hosts, "all found" if not missing else "MOVED: " + "; ".join(missing)))
        failed |= bool(missing)
        changed = changed_rules(importlib.import_module(module_name + ".contract").CONTRACT, hosts)
        print("%s: %d restated rules against their host functions: %s" % (
            spec.title, len(importlib.import_module(module_name + ".contract").CONTRACT.rules),
            "all as pinned" if not changed else "CHANGED: " + "; ".join(changed)))
        failed |= bool(changed)
        try:
            importlib.import_module(package)
            version = spec.version()
        except ImportError as error:
            print("%s: install/uninstall not run: importing %s failed (%s: %s)" % (
                spec.title, package, type(error).__name__, error))
            continue
        problems = live(package, module_name, install, owner_name, method, args.library)
        print("%s %s: install/uninstall on the imported package: %s" % (
            spec.title, version, "ok" if not problems else "FAILED: " + "; ".join(problems)))
        failed |= bool(problems)
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
