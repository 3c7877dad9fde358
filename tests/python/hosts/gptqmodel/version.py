"""Stand-in for gptqmodel.version."""
__version__ = "7.3.4"
