"""Stand-in for AutoRound: the modules its SignRound and RTN block quantizers use."""
from . import algorithms, compressors, logger, utils, wrapper  # noqa: F401
