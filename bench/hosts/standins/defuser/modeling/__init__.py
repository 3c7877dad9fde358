from . import replace_modules  # noqa: F401
