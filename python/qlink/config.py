"""The context configuration: GPTQModel's P2PConfig, a plain dict of its fields, or the
whole JSON config as a dict (backend, log_level, ..., p2p)."""
import dataclasses
import json
import sys

from . import _abi
from .errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True)
class P2PConfig:
    mode: str = "auto"        # auto | on | off
    probe: bool = False       # time each ordered pair before accepting it
    probe_mib: int = 64       # MiB per probe copy
    min_gbps: float = 0.0     # a probed pair below this bandwidth is rejected
    min_ratio: float = 0.8    # ... or below this ratio to the regular path
    # Replicas cloned by torch.nn.parallel.replicate instead of qlink's broadcast (GIL builds
    # only: replicate funnels into broadcast_coalesced, which tears copies without the GIL).
    use_torch_replicate: bool = False


P2P_FIELDS = frozenset(f.name for f in dataclasses.fields(P2PConfig))
# Fields this package acts on itself; the plugin never sees them.
_PACKAGE_FIELDS = ("use_torch_replicate",)


@dataclasses.dataclass(frozen=True)
class Resolved:
    plugin_json: str           # what context_create parses (the plugin validates it)
    use_torch_replicate: bool


def resolve(config):
    """config: None, a P2PConfig, a dict of P2PConfig's fields, or a dict of the whole
    config (whose "p2p" may be a P2PConfig or a dict).

    Validation is the plugin's: unknown keys, wrong types and out-of-range values come
    back as InvalidArgumentError naming the field. backend "auto" under a ROCm build of
    PyTorch (which calls AMD GPUs "cuda") means the HIP backend."""
    if config is None:
        whole = {}
    elif isinstance(config, P2PConfig):
        whole = {"p2p": config}
    elif isinstance(config, dict):
        whole = {"p2p": config} if config and set(config) <= P2P_FIELDS else dict(config)
    else:
        raise TypeError("config must be None, a dict or a qlink.P2PConfig, got %s" % type(config).__name__)
    p2p = whole.get("p2p")
    if isinstance(p2p, P2PConfig):
        p2p = dataclasses.asdict(p2p)
    package = {}
    if isinstance(p2p, dict):
        p2p = dict(p2p)
        package = {name: p2p.pop(name) for name in _PACKAGE_FIELDS if name in p2p}
        whole["p2p"] = p2p
    use_torch_replicate = package.get("use_torch_replicate", False)
    if not isinstance(use_torch_replicate, bool):
        raise InvalidArgumentError(_abi.INVALID_ARGUMENT, "p2p.use_torch_replicate must be a bool, got %r" % (
            use_torch_replicate,))
    if whole.get("backend", "auto") == "auto" and _torch_is_rocm():
        whole["backend"] = "hip"
    return Resolved(json.dumps(whole), use_torch_replicate)


def to_json(config):
    """The plugin's JSON for `config` (see resolve)."""
    return resolve(config).plugin_json


def _torch_is_rocm():
    torch = sys.modules.get("torch")
    return bool(torch is not None and getattr(torch.version, "hip", None))
