"""Stand-in for gptqmodel.looper.gptq_processor: the processor whose hooks feed GPTQ, and
the module-level GPTQ it builds its tasks from (GPTQModel's preprocess calls GPTQ(...))."""
from ..quantization.gptq import GPTQ  # noqa: F401 (the name the processor builds its tasks from)


class GPTQProcessor:
    pass
