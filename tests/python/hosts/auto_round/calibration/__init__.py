"""Stand-in for auto_round.calibration: the block inputs' preprocessing."""
from . import inputs  # noqa: F401
