"""Stand-in for gptqmodel.nn_modules."""
from . import qlinear  # noqa: F401
