"""The context configuration, shaped like GPTQModel's P2PConfig (a plain dict works too)."""
import dataclasses
import json
import sys


@dataclasses.dataclass(frozen=True)
class P2PConfig:
    mode: str = "auto"        # auto | on | off
    probe: bool = False       # time each ordered pair before accepting it
    probe_mib: int = 64       # MiB per probe copy
    min_gbps: float = 0.0     # a probed pair below this bandwidth is rejected
    min_ratio: float = 0.8    # ... or below this ratio to the regular path


def to_json(config):
    """config: None, a P2PConfig (the p2p section alone) or a dict of the whole config.

    Validation is the plugin's: unknown keys, wrong types and out-of-range values come
    back as InvalidArgumentError naming the field. backend "auto" under a ROCm build of
    PyTorch (which calls AMD GPUs "cuda") means the HIP backend."""
    if config is None:
        whole = {}
    elif isinstance(config, P2PConfig):
        whole = {"p2p": dataclasses.asdict(config)}
    elif isinstance(config, dict):
        whole = dict(config)
        if isinstance(whole.get("p2p"), P2PConfig):
            whole["p2p"] = dataclasses.asdict(whole["p2p"])
    else:
        raise TypeError("config must be None, a dict or a qlink.P2PConfig, got %s" % type(config).__name__)
    if whole.get("backend", "auto") == "auto" and _torch_is_rocm():
        whole["backend"] = "hip"
    return json.dumps(whole)


def _torch_is_rocm():
    torch = sys.modules.get("torch")
    return bool(torch is not None and getattr(torch.version, "hip", None))
