"""The seams of an integration, declared once: each names the host binding it replaces,
the qlink module that implements the replacement, what the host did there, the counters
it keeps and the host names it reads. Everything else is derived from the table: what
apply() rebinds, the host names HostSpec checks (so nothing is touched undeclared), the
counters, and the table in docs/HOSTS.md (a test compares them)."""
import importlib


class Seam:
    """One host binding replaced by qlink.

    target: "module:Qualified.name" of the binding. make(installation, original) returns
    the replacement. how: "set" (the binding itself) or "everywhere" (the object in every
    loaded module of the host package that imported it by name, and in default
    arguments). counters: the counter names it keeps (its own first). reads: every other
    host name it calls, reads or writes ("module:Class.attr" for task state). when(installation):
    whether this installation applies it (default always). package: the host package the
    target lives in, where it is another than the integration's (defuser): such a seam is
    applied only where that package imports."""

    def __init__(self, target, implementation, replaces, counters, make, how="set", reads=(), when=None,
                 package=None):
        if how not in ("set", "everywhere"):
            raise ValueError("how must be 'set' or 'everywhere', got %r" % (how,))
        self.target, self.implementation, self.replaces = target, implementation, replaces
        self.counters, self.make, self.how = tuple(counters), make, how
        self.reads, self.when, self.package = tuple(reads), when, package

    @property
    def owner_and_name(self):
        """(owner path "module:Qualified", attribute name) of the target."""
        module, _, path = self.target.partition(":")
        owner, _, name = path.rpartition(".")
        return (module + (":" + owner if owner else "")), name

    def resolve_owner(self):
        """The module or class that holds the target binding."""
        owner, _ = self.owner_and_name
        module, _, path = owner.partition(":")
        value = importlib.import_module(module)
        for part in path.split(".") if path else ():
            value = getattr(value, part)
        return value


class SeamTable:
    """An integration's seams, in the order apply() makes them; counters: further counters
    the seams keep (a stage's sub-steps), listed after the seams' own."""

    def __init__(self, package, seams, counters=()):
        self.package, self.seams, self.extra_counters = package, tuple(seams), tuple(counters)
        labels = [s.target for s in self.seams]
        if len(set(labels)) != len(labels):
            raise ValueError("a target is declared twice in %s's seams" % package)

    def counters(self):
        """Every counter name, each once, in table order."""
        names = []
        for name in [c for s in self.seams for c in s.counters] + list(self.extra_counters):
            if name not in names:
                names.append(name)
        return tuple(names)

    def host_names(self):
        """The names HostSpec checks: every target and read of the seams on the host's own
        package (a seam on another package is checked where that package imports)."""
        names = []
        for seam in self.seams:
            if seam.package is not None:
                continue
            for name in (seam.target,) + seam.reads:
                if name not in names:
                    names.append(name)
        return tuple(names)

    def applicable(self, installation):
        """The seams this installation applies, with their originals: [(seam, original)]."""
        out = []
        for seam in self.seams:
            if seam.when is not None and not seam.when(installation):
                continue
            if seam.package is not None:
                try:
                    owner = seam.resolve_owner()
                except ImportError:
                    continue  # the other package is not installed: nothing to replace
                original = getattr(owner, seam.owner_and_name[1], None)
                if original is None:
                    continue
            else:
                original = installation.names[seam.target]  # resolved by HostSpec at install
            out.append((seam, original))
        return out

    def apply(self, installation):
        """Makes every applicable seam's replacement and binds it through the installation's
        rebindings."""
        for seam, original in self.applicable(installation):
            replacement = seam.make(installation, original)
            if seam.how == "everywhere":
                installation.rebindings.everywhere(original, replacement, seam.package or self.package)
            else:
                installation.rebindings.set(seam.resolve_owner(), seam.owner_and_name[1], replacement)

    def markdown(self):
        """The table docs/HOSTS.md shows: a row a seam."""
        rows = ["| seam (counters) | host target | qlink module | replaces |", "|---|---|---|---|"]
        for s in self.seams:
            rows.append("| %s | `%s`%s | `%s` | %s |" % (
                ", ".join("`%s`" % c for c in s.counters), s.target,
                " (every binding)" if s.how == "everywhere" else "", s.implementation, s.replaces))
        return "\n".join(rows)
