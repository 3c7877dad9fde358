"""Stand-in for AutoRound: the modules its SignRound and RTN block quantizers and its block
inputs' preprocessing use."""
from . import algorithms, calibration, compressors, envs, logger, utils, wrapper  # noqa: F401
