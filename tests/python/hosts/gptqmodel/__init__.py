"""Stand-in for GPTQModel: imports its looper, model and quantization modules eagerly, as the
real package does."""
from . import looper, models, nn_modules, quantization, utils  # noqa: F401
