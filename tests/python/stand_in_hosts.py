"""The stand-in hosts of hosts/ (shaped like GPTQModel and AutoRound) on the import path for
one test, and forgotten after it."""
import contextlib
import os
import sys

HOSTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosts")


@contextlib.contextmanager
def stand_in(package, adapter):
    """`package` importable from hosts/ inside; on the way out `adapter` (its qlink
    integration) uninstalled, hosts/ off the path and every module of `package` dropped, so
    the next test imports it fresh."""
    sys.path.insert(0, HOSTS)
    try:
        yield
    finally:
        adapter.uninstall()
        sys.path.remove(HOSTS)
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]
