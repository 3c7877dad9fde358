"""Stand-in for defuser: no fused blocks to split in a plain LLaMA, so every call leaves
the model as it is."""
from . import modeling  # noqa: F401


def convert_model(model, cleanup_original=True, **kwargs):
    return False


def replace_fused_blocks(model_type, **kwargs):
    return None
