"""Stand-in for gptqmodel.nn_modules."""
from . import hooked_linear, qlinear  # noqa: F401
