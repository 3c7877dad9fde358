from . import _Progress as ProgressBar  # noqa: F401
