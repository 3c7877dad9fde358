"""A HostSpec's names looked up in the host's source tree without importing it: where the
host's own dependencies are not installed (this build machine), its tree still says
whether every name the patches touch is where the integration expects it. Module-level
definitions, assignments and imports count, those in a module-level try or if too (an
optional import and its fallback; star imports and base classes followed);
a class's "attr" counts as a member or as self.attr set in it or a base class. A contract's
restated rules are digested from the same tree (changed_rules)."""
import ast
import os

from qlink.integrations.contracts import source_digest


class SourceTree:
    def __init__(self, roots):
        self.roots = list(roots)
        self._parsed = {}

    def module(self, name):
        """The parsed module `name`, or None when no root has it."""
        if name not in self._parsed:
            self._parsed[name] = None
            for root in self.roots:
                base = os.path.join(root, *name.split("."))
                for path in (base + ".py", os.path.join(base, "__init__.py")):
                    if os.path.isfile(path):
                        with open(path, encoding="utf-8") as f:
                            self._parsed[name] = (ast.parse(f.read(), path), path.endswith("__init__.py"))
                        break
                if self._parsed[name] is not None:
                    break
        return self._parsed[name]

    def missing(self, spec):
        """The names of spec that the tree does not have, each with what was not found."""
        out = []
        for name in spec.names:
            module, _, path = name.partition(":")
            why = self._find(module, path.split("."))
            if why:
                out.append("%s (%s)" % (name, why))
        return out

    def _find(self, module, parts, seen=None):
        seen = set() if seen is None else seen
        if (module, tuple(parts)) in seen:
            return "an import cycle"
        seen.add((module, tuple(parts)))
        parsed = self.module(module)
        if parsed is None:
            return "no module %s" % module
        tree, is_package = parsed
        head, rest = parts[0], parts[1:]
        why = None  # the first binding of head that did not lead on (another may: an import's fallback)
        for node in _statements(tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == head:
                if not rest:
                    return None
                if isinstance(node, ast.ClassDef) and len(rest) == 1 and self._class_has(module, node, rest[0], seen):
                    return None
                why = why or "no %s in %s.%s" % (".".join(rest), module, head)
            if not rest and head in _assigned(node):
                return None
            if isinstance(node, ast.ImportFrom):
                source = _absolute(module, is_package, node)
                for alias in node.names:
                    if alias.name == "*" and self._find(source, parts, seen) is None:
                        return None
                    if (alias.asname or alias.name) == head:
                        if not rest or self.module(source + "." + alias.name) is not None:
                            found = None if not rest else self._find(source + "." + alias.name, rest, seen)
                        else:
                            found = self._find(source, [alias.name] + rest, seen)
                        if found is None:
                            return None
                        why = why or found
        return why or "no %s in %s" % (head, module)

    def _class_has(self, module, cls, attr, seen):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == attr:
                return True
            if attr in _assigned(node) and node in cls.body:
                return True
            if (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
                    and node.value.id == "self"):
                return True
        for base in cls.bases:  # a base class defined or imported by name in the same module
            if isinstance(base, ast.Name) and self._find(module, [base.id, attr], seen) is None:
                return True
        return False


def _statements(body):
    """A module body's statements, those of its try and if blocks (every branch) included."""
    for node in body:
        yield node
        if isinstance(node, ast.Try):
            for branch in [node.body, node.orelse, node.finalbody] + [h.body for h in node.handlers]:
                yield from _statements(branch)
        elif isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)


def _assigned(node):
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _absolute(module, is_package, node):
    if not node.level:
        return node.module
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[:len(package) - node.level + 1]
    return ".".join(package + ([node.module] if node.module else []))


def changed_rules(contract, root):
    """The contract's rules whose host function, in the tree at `root`, is gone or digests
    otherwise than pinned: a line each naming the rule."""
    out = []
    for rule in contract.rules:
        path = os.path.join(root, rule.host_file)
        digest = None
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                digest = source_digest(f.read(), rule.host_function)
        if digest != rule.digest:
            out.append("%s: %s" % (rule.label, "gone" if digest is None else "digest %s, pinned %s" % (
                digest, rule.digest)))
    return out
