"""Stand-in for GPTQModel: imports its looper, model and quantization modules eagerly, as the
real package does."""
from . import looper, models, quantization, utils  # noqa: F401
