"""The package's modules import one another without cycles: the Context's areas sit below
it, the default context and the module-level functions above it. Every import counts,
those inside functions included (a deferred import is still a cycle, only hidden)."""
import ast
import os

import pytest

PACKAGE_ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "python")


def _modules():
    """{dotted module name: path} of every module of the qlink package."""
    found = {}
    for folder, _, files in os.walk(os.path.join(PACKAGE_ROOT, "qlink")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, PACKAGE_ROOT)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = path
    return found


def _imports(module, path, modules):
    """The qlink modules `module` imports, anywhere in its source."""
    is_package = path.endswith("__init__.py")
    package = module if is_package else module.rsplit(".", 1)[0]
    targets = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names if a.name.split(".")[0] == "qlink")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "qlink":
                base = node.module
            else:
                continue
            named = [base + "." + a.name for a in node.names if base + "." + a.name in modules]
            # "from . import x" imports module x; "from .x import y" imports module x.
            targets.update(named if named else [base])
    return {t for t in targets if t in modules and t != module}


def _graph():
    modules = _modules()
    return {m: _imports(m, path, modules) for m, path in modules.items()}


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(m, trail):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return trail[trail.index(n):] + [n]
            if n not in state:
                found = visit(n, trail + [n])
                if found:
                    return found
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_the_package_has_no_import_cycle():
    graph = _graph()
    assert "qlink.context" in graph and "qlink.defaults" in graph
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_context_sits_below_the_default_context():
    graph = _graph()
    below = set()
    stack = ["qlink.context"]
    while stack:
        for n in graph[stack.pop()]:
            if n not in below:
                below.add(n)
                stack.append(n)
    assert "qlink.defaults" not in below
    assert "qlink.context" in graph["qlink.defaults"]


@pytest.mark.parametrize("edges,expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
])
def test_the_cycle_finder_finds_cycles(edges, expected):
    assert _cycle(edges) == expected
