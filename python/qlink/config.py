"""The context configuration, shaped like GPTQModel's P2PConfig (a plain dict works too)."""
import dataclasses
import json


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
    back as InvalidArgumentError naming the field."""
    if config is None:
        return "{}"
    if isinstance(config, P2PConfig):
        return json.dumps({"p2p": dataclasses.asdict(config)})
    if isinstance(config, dict):
        whole = dict(config)
        if isinstance(whole.get("p2p"), P2PConfig):
            whole["p2p"] = dataclasses.asdict(whole["p2p"])
        return json.dumps(whole)
    raise TypeError("config must be None, a dict or a qlink.P2PConfig, got %s" % type(config).__name__)
