from . import fallback, looper_helpers, model  # noqa: F401
