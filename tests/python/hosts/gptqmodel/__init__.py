"""Stand-in for GPTQModel: imports its looper and quantization modules eagerly, as the real
package does."""
from . import looper, quantization, utils  # noqa: F401
