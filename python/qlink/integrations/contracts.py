"""Host rules qlink restates, pinned: each contract function names the host file and
function it copies and a digest of that function's source, so a check over the host's
real tree (bench/hosts/check_hosts.py) fails by name where the host changed the rule
instead of letting the copy drift. The digest ignores docstrings, comments and layout."""
import ast
import hashlib


class Rule:
    """host_file: the path in the host's tree; host_function: its qualified name there;
    digest: source_digest() of it as copied; copy: the qlink function restating it."""

    def __init__(self, host_file, host_function, digest, copy):
        self.host_file, self.host_function, self.digest, self.copy = host_file, host_function, digest, copy

    @property
    def label(self):
        return "%s.%s (%s:%s)" % (self.copy.__module__, self.copy.__qualname__, self.host_file, self.host_function)


class Contract:
    """One host's restated rules; copies(...) registers a function as one."""

    def __init__(self, title):
        self.title, self.rules = title, []

    def copies(self, host_file, host_function, digest):
        def register(fn):
            self.rules.append(Rule(host_file, host_function, digest, fn))
            return fn
        return register


def _find(tree, qualname):
    nodes = tree.body
    found = None
    for part in qualname.split("."):
        found = next((n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.name == part), None)
        if found is None:
            return None
        nodes = found.body
    return found


def source_digest(source, qualname):
    """The digest of function `qualname` ("Class.method" or "function") in module source
    `source`, or None where the module has no such function."""
    node = _find(ast.parse(source), qualname)
    if node is None:
        return None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        node.body = body[1:]  # the docstring is not the rule
    return hashlib.sha256(ast.dump(node, include_attributes=False).encode()).hexdigest()[:16]
