"""`qlink probe` and `qlink demo`: the native CLI (tools/qlink_main.cc) shipped beside
libqlink.so, which it loads from its own folder."""
import os

from ..context import default_library_path


def native_binary():
    return os.path.join(os.path.dirname(default_library_path()), "qlink")


def _exec(a):
    binary = native_binary()
    if not os.access(binary, os.X_OK):
        raise SystemExit("qlink %s: the native CLI is missing at %s (a package built without it)" % (a.command, binary))
    argv = [binary, a.command, "--config", a.config] + (["--bytes", str(a.bytes)] if a.bytes is not None else [])
    os.execv(binary, argv)


def add_parser(commands):
    for name, text in (("probe", "backend, devices, peer matrix, copy bandwidth and latency per ordered pair"),
                       ("demo", "a module-shaped batch moved around every device and verified, then a small "
                                "Llama-shaped model quantized with GPTQ, serially and data-parallel")):
        p = commands.add_parser(name, help=text, description=text)
        p.add_argument("--config", default="{}", help="the qlink JSON config (default: backend auto)")
        p.add_argument("--bytes", type=int, default=None, help="probe: bytes per timed copy")
        p.set_defaults(handler=_exec)
