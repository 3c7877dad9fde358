"""Inside a process `qlink run` started: qlink installed into each host package as that
package is first imported (a sys.meta_path finder that wraps the host's loader), and at
exit this process's part of the report (what each integration ran through qlink, what
fell back and why) written where the launcher collects it."""
import atexit
import importlib.abc
import importlib.metadata
import json
import os
import sys
import threading

from .settings import HOSTS


def host_version(package):
    """The installed distribution's version of a host package, or None."""
    for name in (package, package.replace("_", "-")):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


class _InstallAfterExec(importlib.abc.Loader):
    """The host's own loader, then the installation; the module keeps the host's loader."""

    def __init__(self, loader, then):
        self._loader, self._then = loader, then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._then(module.__name__)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the host's
        return getattr(self._loader, name)


class HostImportHook(importlib.abc.MetaPathFinder):
    """Calls install(package) right after a watched top-level package is first imported."""

    def __init__(self, packages, install):
        self._pending, self._install = set(packages), install
        self._lock = threading.Lock()

    def find_spec(self, name, path=None, target=None):
        if name not in self._pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _InstallAfterExec(spec.loader, self._installed)
        return spec

    def _installed(self, package):
        with self._lock:
            if package not in self._pending:
                return
            self._pending.discard(package)
        self._install(package)


class Run:
    """This process's installations and its part of the report."""

    def __init__(self, settings, report_dir):
        self.settings, self.report_dir = settings, report_dir
        self.ctx = None
        self.states = {name: {"host": HOSTS[name], "state": "not imported"} for name in settings.integrations}
        self._by_package = {HOSTS[name]: name for name in settings.integrations}

    def start(self):
        packages = self._by_package
        already = [p for p in packages if p in sys.modules]  # imported before this process's site ran
        sys.meta_path.insert(0, HostImportHook(set(packages) - set(already), self.install))
        atexit.register(self.write)
        for package in already:
            self.install(package)

    def _context(self):
        if self.ctx is None:
            from ..defaults import configure
            self.ctx = configure(self.settings.qlink)
        return self.ctx

    def install(self, package):
        name = self._by_package[package]
        state = self.states[name]
        state["version"] = host_version(package)
        try:
            if name == "gptqmodel":
                from ..integrations import gptqmodel
                gptqmodel.install(ctx=self._context(), strict=self.settings.strict, **self.settings.gptqmodel)
            else:
                from ..integrations import autoround
                options = self.settings.autoround
                autoround.install(options.get("parallel_quantization", "auto"), ctx=self._context(),
                                  **{k: v for k, v in options.items() if k != "parallel_quantization"})
        except Exception as error:  # noqa: BLE001 (reported; under strict the import fails with it)
            state.update(state="failed", error="%s: %s" % (type(error).__name__, error))
            if self.settings.strict:
                raise
            print("qlink run: %s not installed into %s (%s); it runs as it would without qlink" % (
                name, package, state["error"]), file=sys.stderr)
            return
        state["state"] = "installed"

    def counters(self):
        out = {}
        for name, state in self.states.items():
            if state["state"] == "installed":
                module = sys.modules["qlink.integrations." + name]
                out[name] = module.counters().get("seams", {})
        return out

    def write(self):
        report = {"pid": os.getpid(), "argv": sys.argv, "integrations": {}}
        counters = self.counters()
        for name, state in self.states.items():
            report["integrations"][name] = dict(state, counters=counters.get(name, {}))
        path = os.path.join(self.report_dir, "process-%d.json" % os.getpid())
        with open(path + ".part", "w") as f:
            json.dump(report, f, default=str)
        os.replace(path + ".part", path)  # the launcher never reads half a report
