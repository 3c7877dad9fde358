from . import config, gptq, quantizer  # noqa: F401
