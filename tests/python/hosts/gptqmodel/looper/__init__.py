from . import forward_executor, module_looper  # noqa: F401
