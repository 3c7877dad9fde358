"""Stand-in for auto_round.envs: its settings read from the environment when asked for."""
import os


def __getattr__(name):
    if name == "AR_SEARCH_SCALE_RATIO":
        value = os.getenv(name)
        return float(value) if value is not None else None
    raise AttributeError(name)
