from . import quantizer, sign_sgd  # noqa: F401
