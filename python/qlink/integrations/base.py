"""What every integration shares: the host it was checked against (HostSpec: its version
and every name its seams touch, derived from its SeamTable), one installation's state
(Installation: the context, strict, counters, the guard, the rebindings) and the process's
one installation per integration (Integration: install, uninstall, counters)."""
import functools
import importlib
import inspect
import logging
import re
import sys

from .patches import Counters, Guard, Rebindings

log = logging.getLogger("qlink")


class HostChanged(RuntimeError):
    """A name the patches touch is not where the integration expects it in the host."""


class UnsupportedHost(RuntimeError):
    """strict=True: the host's version is not one the integration was checked against."""


class HostSpec:
    """A host framework as an integration was checked against it.

    names: "module:Qualified.name" of every module attribute, class or member the patches
    read or replace; a "Class.attr" also passes when the class's source (or a base
    class's) sets self.attr, for the task state the patches read and write."""

    def __init__(self, title, package, version_module, supported, checked_at, names):
        self.title, self.package, self.version_module = title, package, version_module
        self.supported, self.checked_at, self.names = supported, checked_at, tuple(names)

    def version(self):
        return importlib.import_module(self.version_module).__version__

    def supports(self, version):
        return version == self.supported or version.startswith(self.supported + ".")

    def resolve(self):
        """{name: object} for the names that are module attributes or class members;
        HostChanged naming every one that moved."""
        found, missing = {}, []
        for name in self.names:
            try:
                found[name] = _lookup(name)
            except (ImportError, AttributeError) as error:
                missing.append("%s (%s: %s)" % (name, type(error).__name__, error))
        if missing:
            raise HostChanged("%s %s has moved what qlink patches (checked against %s.x at %s): %s" % (
                self.title, self.version(), self.supported, self.checked_at, "; ".join(missing)))
        return {name: value for name, value in found.items() if value is not _INSTANCE}

    def check_version(self, strict):
        """Warns once per process and version when the host is not the supported one
        (UnsupportedHost instead under strict)."""
        version = self.version()
        if self.supports(version):
            return
        said = "%s %s is not the version qlink's integration was checked against (%s.x, %s); its %d " \
               "patched names resolve, their behaviour is unchecked" % (
                   self.title, version, self.supported, self.checked_at, len(self.names))
        if strict:
            raise UnsupportedHost(said + "; strict=True refuses it")
        if (self.title, version) not in _warned:
            _warned.add((self.title, version))
            log.warning("qlink: %s", said)


_warned = set()
_INSTANCE = object()  # a "Class.attr" found only as self.attr in the class's source


def _lookup(name):
    module, _, path = name.partition(":")
    value = importlib.import_module(module)
    parts = path.split(".")
    for i, part in enumerate(parts):
        if hasattr(value, part):
            value = getattr(value, part)
        elif i == len(parts) - 1 and inspect.isclass(value) and _sets(value, part):
            return _INSTANCE
        else:
            raise AttributeError("no %s in %s" % (part, ".".join([module] + parts[:i])))
    return value


def _sets(cls, attr):
    pattern = re.compile(r"\bself\.%s\b" % re.escape(attr))
    return any(pattern.search(_source(klass)) for klass in cls.__mro__)


@functools.lru_cache(maxsize=None)
def _source(cls):
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # a builtin base: no source
        return ""


def enable_visible_gpus(ctx):
    """Peer access between every pair of the GPUs PyTorch sees (per the context's p2p
    config): the hosts never ask for it, and qlink's copies and collectives between them
    would otherwise be staged through CPU memory. Returns the pairs enabled."""
    torch = sys.modules.get("torch")
    if torch is None or ctx.cpu_memory or not torch.cuda.is_available():
        return []
    matrix = ctx.enable_for_devices(range(min(torch.cuda.device_count(), ctx.device_count)))
    return sorted(pair for pair, status in matrix.items() if status.enabled)


class Installation:
    """One integration installed in its host: its seams (a SeamTable) applied through
    self.rebindings, each call counted and guarded; HOST is the host as checked."""

    def __init__(self, ctx, strict, seams, host_spec):
        self.ctx, self.strict, self.seams, self.HOST = ctx, strict, seams, host_spec
        host_spec.check_version(strict)
        self.names = host_spec.resolve()
        self.counters = Counters(seams.counters())
        self.guard = Guard(self.counters, strict)
        self.rebindings = Rebindings()
        self.peer_pairs = []

    def apply(self):
        self.seams.apply(self)

    def close(self):
        """Work the seams still hold (queued, not yet handed to the host) completed before
        uninstall restores the host's bindings."""

    def counter_sections(self):
        """Further counters of the installation's own parts, by section ({} here)."""
        return {}


class Integration:
    """The process's one installation of an integration."""

    def __init__(self):
        self.current = None

    def install(self, installation):
        """Applies `installation` (made after uninstall(): its originals are the host's own)."""
        assert self.current is None, "uninstall() first"
        installation.peer_pairs = enable_visible_gpus(installation.ctx)
        installation.apply()
        self.current = installation
        return installation

    def uninstall(self):
        """Restores every binding that is still qlink's (a later patcher's stays) and says
        what it left: {"kept": bindings another patcher holds now, "peer_pairs": GPU pairs
        whose peer access install() enabled, which stays enabled (the runtime offers no
        undo qlink could use)}."""
        installation, self.current = self.current, None
        if installation is None:
            return {"kept": [], "peer_pairs": []}
        try:
            installation.close()
        finally:  # the host's bindings come back even if the work the patches held fails
            kept = installation.rebindings.undo()
        title = installation.HOST.title
        if kept:
            log.warning("qlink: uninstall left %s's %s as they are: rebound since qlink patched them", title,
                        ", ".join(kept))
        if installation.peer_pairs:
            log.info("qlink: peer access between GPU pairs %s stays enabled after uninstalling from %s",
                     installation.peer_pairs, title)
        return {"kept": kept, "peer_pairs": list(installation.peer_pairs)}

    def counters(self):
        """{"seams": per counter, what ran through qlink, the host's by design ("host") or
        after qlink failed ("fallback"), and why; then the installation's own sections}
        ({} when not installed)."""
        if self.current is None:
            return {}
        return dict({"seams": self.current.counters.snapshot()}, **self.current.counter_sections())
