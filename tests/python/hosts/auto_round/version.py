"""Stand-in for auto_round.version."""
__version__ = "0.15.0"
