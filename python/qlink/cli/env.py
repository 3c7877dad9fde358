"""`qlink env`: what a bug report needs: qlink, ABI and backend versions, the backend
chosen and why, devices and the peer matrix, PyTorch / CUDA / driver versions, the host
packages importable here and which integrations `qlink run` would engage."""
import ctypes
import glob
import importlib.util
import json
import os
import platform
import sys

import torch

from .. import _abi, _bridge
from .._version import __version__
from ..context import Context, default_library_path
from ..errors import QlinkError
from ..launcher.hooks import host_version
from ..launcher.settings import HOSTS

_GPU_BACKENDS = ("cuda", "hip")


def _driver_version():
    """The CUDA driver's version ("13.0"), or None without one."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int()
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return "%d.%d" % (version.value // 1000, version.value % 1000 // 10)


def _backend_libraries(library):
    folder = os.path.dirname(library)
    return sorted(os.path.basename(p)[len("libqlink_backend_"):-3]
                  for p in glob.glob(os.path.join(folder, "libqlink_backend_*.so")))


def _try_backend(name, library):
    """A GPU backend's device count, or why it cannot serve."""
    try:
        with Context({"backend": name, "log_level": "off"}, library) as ctx:
            return {"devices": ctx.device_count}
    except QlinkError as error:
        return {"refused": str(error)}


def _choice(config, library, tried):
    """The backend `config` resolves to, and why."""
    backend = config.get("backend", "auto")
    if backend != "auto":
        return "config names it (backend %r)" % backend
    with_devices = [n for n in _GPU_BACKENDS if tried.get(n, {}).get("devices")]
    if with_devices:
        return "auto: %s is the first GPU backend with devices" % with_devices[0]
    why = "; ".join("%s: %s" % (n, "0 devices" if "devices" in r else r["refused"]) for n, r in tried.items())
    return "auto: no GPU backend has a device (%s), so the CPU backend's virtual devices" % (why or "none built")


def collect(config, library):
    library = os.path.abspath(library or default_library_path())
    info = {"qlink": {"version": __version__, "package": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "library": library, "package_abi": "%d.%d" % (_abi.ABI_MAJOR, _abi.ABI_MINOR),
                      "backend_libraries": _backend_libraries(library)},
            "python": {"version": platform.python_version(), "executable": sys.executable,
                       "platform": platform.platform()}}
    tried = {n: _try_backend(n, library) for n in _GPU_BACKENDS if n in info["qlink"]["backend_libraries"]}
    with Context(config, library) as ctx:
        info["qlink"]["library_abi"] = "%d.%d" % ctx.abi_version
        devices = ctx.devices()
        matrix = ctx.enable_peer_access() if len(devices) > 1 and not ctx.cpu_memory else ctx.peer_matrix()
        info["backend"] = {"chosen": ctx.backend, "why": _choice(config, library, tried), "gpu_backends": tried,
                           "cpu_memory": ctx.cpu_memory}
        info["devices"] = [{"index": d.index, "name": d.name, "total_bytes": d.total_bytes, "free_bytes": d.free_bytes}
                           for d in devices]
        info["peers"] = [{"src": s, "dst": d, "state": st.state, "reason": st.reason}
                         for (s, d), st in sorted(matrix.items())]
    info["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                     "hip": getattr(torch.version, "hip", None), "cuda_available": torch.cuda.is_available(),
                     "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                     "bridge": _bridge.get() is not None, "driver": _driver_version()}
    info["hosts"] = {}
    for integration, package in HOSTS.items():
        importable = importlib.util.find_spec(package) is not None
        info["hosts"][integration] = {"package": package, "importable": importable,
                                      "version": host_version(package) if importable else None,
                                      "engages_under_qlink_run": importable}
    return info


def _gib(n):
    return "%.1f GiB" % (n / (1 << 30))


def text(info):
    q, b, t = info["qlink"], info["backend"], info["torch"]
    out = ["qlink %s (package speaks C ABI %s, library provides %s)" %
           (q["version"], q["package_abi"], q["library_abi"]),
           "  package: %s" % q["package"], "  library: %s" % q["library"],
           "  backend libraries: %s" % ", ".join(q["backend_libraries"]),
           "backend: %s (%s)" % (b["chosen"], b["why"])]
    out += ["  %s: %s" % (n, "%d device(s)" % r["devices"] if "devices" in r else "refused: " + r["refused"])
            for n, r in b["gpu_backends"].items()]
    out.append("devices: %d%s" % (len(info["devices"]), " (virtual, in CPU memory)" if b["cpu_memory"] else ""))
    out += ["  %d: %s, %s total, %s free" % (d["index"], d["name"], _gib(d["total_bytes"]), _gib(d["free_bytes"]))
            for d in info["devices"]]
    groups = {}
    for p in info["peers"]:
        groups.setdefault((p["state"], p["reason"]), []).append("%d->%d" % (p["src"], p["dst"]))
    for (state, reason), pairs in groups.items():  # one line per outcome: 8 GPUs have 56 pairs
        which = "all %d ordered pairs" % len(pairs) if len(groups) == 1 else ", ".join(pairs)
        out.append("peers %s: %s%s" % (which, state, " (%s)" % reason if reason else ""))
    out.append("torch %s, CUDA %s%s, driver %s, GPUs: %s; torch bridge %s" % (
        t["version"], t["cuda"], ", HIP %s" % t["hip"] if t["hip"] else "", t["driver"] or "none",
        ", ".join(t["gpus"]) or "none", "bound" if t["bridge"] else "not bound (plain-Python path)"))
    out.append("python %s (%s), %s" % (info["python"]["version"], info["python"]["executable"],
                                       info["python"]["platform"]))
    for name, h in info["hosts"].items():
        out.append("%s: %s" % (name, "%s %s importable; qlink run installs into it" % (h["package"], h["version"] or "")
                               if h["importable"] else "%s not importable; qlink run would skip it" % h["package"]))
    return "\n".join(out)


def _env(a):
    info = collect(json.loads(a.config), a.library)
    print(json.dumps(info, indent=1) if a.json else text(info))
    return 0


def add_parser(commands):
    p = commands.add_parser("env", help="versions, backend, devices, peers and hosts, for a bug report")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.add_argument("--config", default="{}", help="the qlink JSON config (default: backend auto)")
    p.add_argument("--library", default=None, help="libqlink.so (default: the package's own)")
    p.set_defaults(handler=_env)
