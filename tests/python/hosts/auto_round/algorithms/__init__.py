from . import block_runner, quantization  # noqa: F401
