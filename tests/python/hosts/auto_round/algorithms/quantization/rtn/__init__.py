from . import quantizer  # noqa: F401
