"""Stand-in for gptqmodel.looper.gptq_processor: the processor whose hooks feed GPTQ."""


class GPTQProcessor:
    pass
